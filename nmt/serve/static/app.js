// nmt-serve page: plain JavaScript, no build step, nothing fetched but this server's API.
// It reads GET /v1/models once, then for each chosen model streams POST /v1/translate/stream (attention for the lines
// it draws): while a line is decoded its translation is written and its heat map drawn row by row, as the
// server's events come (a row per decoding step; rows a beam search takes back are redrawn). Each line's final event
// draws the full result: the translation, the n-best list, the subword tokens and the attention heat map (rows:
// target tokens, columns: source tokens, each row sums to 1). N-best lists (not streamed), a server without the
// stream, or a browser that cannot read one use the plain POST /v1/translate. Hovering a target token
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
  const request = (model, extra = {}) => ({
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ text: lines, beam, attention: drawn, model, ...extra }),
  });
  const plain = () => Promise.all(names.map((model) => getJSON("/v1/translate", request(model, { nbest }))));
  showError("");
  $("go").disabled = true;
  $("status").textContent = "translating…";
  const started = performance.now();
  try {
    let replies;
    if (nbest > 1) replies = await plain();  // n-best lists are not streamed
    else {
      try {
        replies = await streamAll(lines, names, (model) => request(model));
      } catch (err) {
        if (!(err instanceof StreamUnavailable)) throw err;
        replies = await plain();
      }
    }
    render(lines, replies);
    $("status").textContent = `${Math.round(performance.now() - started)} ms · ${replies[0].decode}`;
  } catch (err) {
    showError(err.message);
    $("status").textContent = "";
  } finally {
    $("go").disabled = false;
  }
}

// The stream could not be used (no such route, a network failure, no readable body): the plain call is made.
class StreamUnavailable extends Error {}

// Each model's stream at once, drawing into live panels; the replies, as POST /v1/translate gives them.
async function streamAll(lines, names, request) {
  const live = names.map((name) => lines.map((line) => (line.trim() ? livePanel(MODELS.find((m) => m.name === name)) : null)));
  $("results").replaceChildren(...lines.flatMap((line, i) => (line.trim() ? [el("div", { class: "line" }, ...live.map((panels) => panels[i].box))] : [])));
  return Promise.all(names.map((model, k) => streamOne(model, request(model), lines.length, live[k])));
}

async function streamOne(model, options, count, live) {
  let response;
  try {
    response = await fetch("/v1/translate/stream", options);
  } catch {
    throw new StreamUnavailable("the stream could not be fetched");
  }
  if ([404, 405, 501].includes(response.status) || (response.ok && !response.body)) throw new StreamUnavailable(`HTTP ${response.status}`);
  if (!response.ok) {
    let body;
    try { body = await response.json(); } catch { body = {}; }
    throw new Error(body.error || `HTTP ${response.status}`);
  }
  const translations = new Array(count);
  for await (const { name, data } of events(response)) {
    if (name === "error") throw new Error(data.error);
    if (name === "done") return { ...data, translations };
    if (data.final) {
      translations[data.line] = data.result;
      if (live[data.line]) live[data.line].box.replaceWith(panel(live[data.line].model, data.result));
    } else if (live[data.line]) drawStep(live[data.line], data);
  }
  throw new Error("the stream ended before its last event");
}

// Server-Sent Events of a fetch response: {name, data (parsed JSON)} for each event.
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let name = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data += line.slice(5).trim();
      }
      if (data) yield { name, data: JSON.parse(data) };
    }
  }
}

// A panel that a line's stream writes into: the translation so far and its heat map, a row per decoding step.
function livePanel(model) {
  const text = el("div", { class: "translation", text: "\u2026" });
  const table = el("table", { class: "heat live" }, el("thead"), el("tbody"));
  const box = el("div", { class: "card panel live" },
    el("div", { class: "panel-head" }, el("span", { class: "badge", text: model.name }), el("span", { class: "title", text: model.title })),
    text, el("div", { class: "score", text: "translating\u2026" }),
    el("div", { class: "attention" }, el("div", { class: "heat-wrap" }, table)));
  return { box, text, table, src: [], model };
}

function drawStep(live, step) {
  live.text.textContent = step.text;
  if (!step.attention) return;
  if (step.src) {
    live.src = step.src;
    live.table.tHead.replaceChildren(el("tr", {}, el("th", { class: "corner", text: "target \u2193 source \u2192" }),
      ...step.src.map((p, j) => el("th", { class: "src", "data-src": j }, piece(p)))));
  }
  const body = live.table.tBodies[0];
  while (body.rows.length > step.keep) body.deleteRow(-1);  // rows the beam took back
  step.attention.forEach((weights, k) => {
    const i = step.keep + k, label = i < step.tokens.length ? step.tokens[i] : "</s>";
    body.append(el("tr", {}, el("th", { class: "tgt", "data-tgt": i }, piece(label)),
      ...weights.map((w, j) => heatCell(label, live.src[j], w, i, j))));
  });
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
    ...att.weights[i].map((w, j) => heatCell(att.tgt[i], att.src[j], w, i, j))));
  return el("table", { class: "heat" }, el("thead", {}, head), el("tbody", {}, ...rows));
}

function heatCell(tgt, src, w, i, j) {
  const cell = el("td", { class: "cell", "data-tgt": i, "data-src": j, title: `${tgt} \u2190 ${src}: ${w.toFixed(3)}` });
  cell.style.background = `rgba(var(--accent), ${w})`;
  return cell;
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
