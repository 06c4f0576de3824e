// nmt-serve page: plain JavaScript, no build step, nothing fetched but this server's API.
// It reads GET /v1/models once, sends POST /v1/translate (attention for the lines it draws) for each chosen model, and
// draws per input line and model: the translation, the n-best list, the subword tokens and the attention
// heat map (rows: target tokens, columns: source tokens, each row sums to 1). Hovering a target token
// (or a cell) paints the source tokens by the weight it gives them; hovering a source token paints the
// target tokens by the weight they give it. Tokens within half the row's (column's) largest weight are bold.
"use strict";

const $ = (id) => document.getElementById(id);
let MODELS = [];

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
}

async function getJSON(url, options) {
  const response = await fetch(url, options);
  let body;
  try {
    body = await response.json();
  } catch {
    body = { error: `${response.status} ${response.statusText}` };
  }
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

function count(n) {
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)}M`;
  if (n >= 1e3) return `${Math.round(n / 1e3)}k`;
  return String(n);
}

function modelLine(m) {
  return `${count(m.steps)} steps · ${count(m.parameters)} parameters · vocab ${m.src_vocab_size}/${m.tgt_vocab_size}`;
}

// A subword piece: the word-start mark "▁" in grey, "</s>" muted.
function piece(text) {
  if (text === "</s>") return el("span", { class: "end", text });
  if (text.startsWith("\u2581")) {
    const span = el("span", {}, el("span", { class: "sp", text: "\u2581" }));
    span.append(text.slice(1));
    return span;
  }
  return el("span", { text });
}

async function init() {
  let info;
  try {
    info = await getJSON("/v1/models");
  } catch (err) {
    return showError(`Cannot read /v1/models: ${err.message}`);
  }
  MODELS = info.models;
  $("models").replaceChildren(...MODELS.map((m) => el("div", { class: "card model-card" },
    el("div", {}, el("span", { class: "badge", text: m.name }), el("span", { class: "title", text: m.title })),
    el("div", { text: `${m.label} · ${modelLine(m)}` }))));
  const select = $("model");
  if (MODELS.length > 1) select.append(el("option", { value: "*", text: MODELS.map((m) => m.name).join(" and ") + " side by side" }));
  for (const m of MODELS) select.append(el("option", { value: m.name, text: `${m.name}: ${m.title}` }));
  $("beam").value = info.decode.beam;
  $("beam").title = `at most ${Math.min(...MODELS.map((m) => m.max_beam))}`;
  $("nbest").value = info.decode.nbest;
  $("text").maxLength = info.limits.max_chars;
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

async function translate(event) {
  event.preventDefault();
  const lines = $("text").value.split("\n");
  while (lines.length > 1 && !lines[lines.length - 1].trim()) lines.pop();
  if (!lines.some((line) => line.trim())) return showError("Type a sentence first.");
  const chosen = $("model").value;
  const names = chosen === "*" ? MODELS.map((m) => m.name) : [chosen];
  const beam = Number($("beam").value), nbest = Math.min(Number($("nbest").value), beam);
  const drawn = lines.flatMap((line, i) => (line.trim() ? [i] : []));  // attention only for the lines drawn
  showError("");
  $("go").disabled = true;
  $("status").textContent = "translating…";
  const started = performance.now();
  try {
    const replies = await Promise.all(names.map((model) => getJSON("/v1/translate", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ text: lines, beam, nbest, attention: drawn, model }),
    })));
    render(lines, replies);
    $("status").textContent = `${Math.round(performance.now() - started)} ms · ${replies[0].decode}`;
  } catch (err) {
    showError(err.message);
    $("status").textContent = "";
  } finally {
    $("go").disabled = false;
  }
}

function render(lines, replies) {
  const blocks = [];
  const warnings = replies.flatMap((r) => r.warnings.map((w) => `model ${r.model.name}: ${w}`));
  if (warnings.length) blocks.push(el("div", { class: "warning", text: warnings.join("\n") }));
  lines.forEach((line, i) => {
    if (!line.trim()) return;
    blocks.push(el("div", { class: "line" }, ...replies.map((reply) => panel(reply.model, reply.translations[i]))));
  });
  $("results").replaceChildren(...blocks);
}

function panel(model, result) {
  const box = el("div", { class: "card panel" },
    el("div", { class: "panel-head" }, el("span", { class: "badge", text: model.name }), el("span", { class: "title", text: model.title })),
    el("div", { class: "translation", text: result.text }),
    el("div", { class: "score", text: `score ${result.score.toFixed(3)} (length-normalised log-probability)` }));
  if (result.nbest.length > 1) {
    box.append(el("table", { class: "nbest" }, ...result.nbest.map((h, k) =>
      el("tr", {}, el("td", { class: "num", text: `${k + 1}.` }), el("td", { class: "num", text: h.score.toFixed(3) }), el("td", { text: h.text })))));
  }
  const att = result.attention;
  const view = el("div", { class: "attention" },
    tokenRow("source", att.src, "data-src"),
    tokenRow("target", att.tgt, "data-tgt"),
    el("div", { class: "heat-wrap" }, heatMap(att)),
    el("div", { class: "score readout", text: "hover a token or a cell" }));
  hover(view, att.weights);
  box.append(view);
  return box;
}

function tokenRow(side, pieces, key) {
  return el("div", { class: "tokens" }, el("span", { class: "side", text: side }),
    ...pieces.map((p, k) => el("span", { class: `tok ${side === "source" ? "src" : "tgt"}`, [key]: k }, piece(p))));
}

function heatMap(att) {
  const head = el("tr", {}, el("th", { class: "corner", text: "target \u2193 source \u2192" }),
    ...att.src.map((p, j) => el("th", { class: "src", "data-src": j }, piece(p))));
  const rows = att.tgt.map((p, i) => el("tr", {}, el("th", { class: "tgt", "data-tgt": i }, piece(p)),
    ...att.weights[i].map((w, j) => {
      const cell = el("td", { class: "cell", "data-tgt": i, "data-src": j, title: `${att.tgt[i]} \u2190 ${att.src[j]}: ${w.toFixed(3)}` });
      cell.style.background = `rgba(var(--accent), ${w})`;
      return cell;
    })));
  return el("table", { class: "heat" }, el("thead", {}, head), el("tbody", {}, ...rows));
}

// Paint the tokens of one side by `weights` (amber, alpha = weight); bold those within half of the largest.
function paint(nodes, key, weights) {
  const top = Math.max(...weights);
  for (const node of nodes) {
    const w = weights[Number(node.getAttribute(key))];
    node.style.background = `rgba(var(--hover), ${w})`;
    node.classList.toggle("hl", top > 0 && w >= top / 2);
  }
}

function hover(view, W) {
  const srcTokens = view.querySelectorAll(".tok.src, th.src");
  const tgtTokens = view.querySelectorAll(".tok.tgt, th.tgt");
  const readout = view.querySelector(".readout");
  const clear = () => {
    for (const node of [...srcTokens, ...tgtTokens]) {
      node.style.background = "";
      node.classList.remove("hl");
    }
    for (const node of view.querySelectorAll(".focus")) node.classList.remove("focus");
  };
  view.addEventListener("mouseover", (event) => {
    const node = event.target.closest("[data-src], [data-tgt]");
    if (!node) return;
    clear();
    const i = node.getAttribute("data-tgt"), j = node.getAttribute("data-src");
    if (i !== null) {
      paint(srcTokens, "data-src", W[Number(i)]);
      for (const n of view.querySelectorAll(`[data-tgt="${i}"]`)) n.classList.add("focus");
      readout.textContent = j !== null ? `weight ${W[i][j].toFixed(3)}` : "source tokens painted by this target token's attention";
    } else {
      paint(tgtTokens, "data-tgt", W.map((row) => row[Number(j)]));
      for (const n of view.querySelectorAll(`[data-src="${j}"]`)) n.classList.add("focus");
      readout.textContent = "target tokens painted by the attention they give this source token";
    }
  });
  view.addEventListener("mouseleave", () => {
    clear();
    readout.textContent = "hover a token or a cell";
  });
}

document.addEventListener("DOMContentLoaded", () => {
  $("form").addEventListener("submit", translate);
  $("text").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("form").requestSubmit();
  });
  init();
});
