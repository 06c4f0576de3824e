"""The report folder: report.md (tables and figures), results.csv (one row per variant), results.json, PNG figures.

`build_report(out)` reads OUT/comparison.yaml, the test set copied into OUT and every run's files, and
writes the report; it trains and translates nothing, so `nmt-compare report_only=true` runs it alone.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from nmt.compare import figures
from nmt.compare.collect import RunRecord, read_plan, read_run, read_sessions, read_test
from nmt.compare.markdown import main_table, markdown_report
from nmt.compare.summary import ATTENTION, SCORES, summarize
from nmt.config import CompareConfig
from nmt.fileio import atomic_open

FIGURES = {"bars": "bleu_bars.png", "curves": "learning_curves.png", "lengths": "bleu_by_length.png", "heatmaps": "attention_heatmaps.png"}


def load_runs(out: Path, plan: CompareConfig) -> dict[str, list[RunRecord]]:
    return {name: [read_run(out, name, seed) for seed in plan.seeds] for name in plan.selected()}


def csv_rows(summary: dict) -> list[dict]:
    """One row per variant: the means (and standard deviations) the report's tables show."""
    rows = []
    for v in summary["variants"]:
        sig = v["significance"] or {}
        row = {"variant": v["name"], "overrides": " ".join(v["overrides"]), "seeds": " ".join(map(str, v["seeds"]))}
        for metric in SCORES:
            row[f"{metric}_mean"], row[f"{metric}_std"] = v[metric]["mean"], v[metric]["std"]
        row |= {
            "delta_bleu": sig.get("delta"), "delta_ci_low": sig.get("ci_low"), "delta_ci_high": sig.get("ci_high"),
            "p_value": sig.get("p_value"), "significant": sig.get("significant"),
            "valid_ppl": v["valid_ppl"]["mean"], "parameters": v["parameters"], "steps": v["steps"]["mean"],
            "train_seconds": v["train_seconds"]["mean"], "train_tokens_per_s": v["train_tokens_per_s"]["mean"],
            "decode_sentences_per_s": v["decode_sentences_per_s"]["mean"],
        }
        row |= {key: v["attention"][key]["mean"] for key in ATTENTION}
        for key in ("aer", "precision", "recall"):
            row[key] = v["alignment"][key]["mean"] if v["alignment"] else None
        rows.append(row)
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]) if rows else ["variant"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    with atomic_open(path, key="out") as f:
        f.write(buffer.getvalue())


def draw_figures(out: Path, summary: dict, runs: dict[str, list[RunRecord]], gold) -> dict[str, str]:
    """Write the PNGs; returns the name of each one drawn."""
    drawn = {}
    variants = [v for v in summary["variants"] if v["seeds"]]
    if variants:
        kinds = [
            "baseline" if v["name"] == summary["baseline"] else "same" if not (v["significance"] or {}).get("significant")
            else "better" if v["significance"]["delta"] > 0 else "worse"
            for v in variants
        ]
        figures.bleu_bars([v["name"] for v in variants], [v["bleu"]["mean"] for v in variants], [v["bleu"]["std"] for v in variants],
                          [v["bleu"]["values"] for v in variants], kinds, f"baseline: {summary['baseline']}", out / FIGURES["bars"])
        drawn["bars"] = FIGURES["bars"]
        figures.bleu_by_length([b["words"] for b in summary["length_buckets"]],
                               {v["name"]: [b["mean"] for b in v["length_bleu"]] for v in variants}, out / FIGURES["lengths"])
        drawn["lengths"] = FIGURES["lengths"]
    curves = {name: [r.curve for r in group if r.curve.valid] for name, group in runs.items()}
    if any(curves.values()):
        figures.learning_curves({k: v for k, v in curves.items() if v}, out / FIGURES["curves"])
        drawn["curves"] = FIGURES["curves"]
    heat = {name: next((r.heatmaps for r in group if r.finished and r.heatmaps), []) for name, group in runs.items()}
    heat = {name: records for name, records in heat.items() if records}
    if heat:
        figures.attention_grid(heat, dict(enumerate(gold)) if gold else {}, out / FIGURES["heatmaps"])
        drawn["heatmaps"] = FIGURES["heatmaps"]
    return drawn


def build_report(out: Path, plan: CompareConfig | None = None) -> str:
    """Write OUT/report.md, results.csv, results.json and the figures from the files in OUT; returns the main table."""
    plan = plan or read_plan(out)
    test = read_test(out)
    runs = load_runs(out, plan)
    summary = summarize(runs, plan.overrides, plan.baseline_name(), test, plan.length_buckets, plan.bootstrap, plan.bootstrap_seed)
    sessions = read_sessions(out)
    drawn = draw_figures(out, summary, runs, test.gold)
    configs = {name: next((r.config for r in group if r.config is not None), None) for name, group in runs.items()}
    document = {"name": plan.name, "out": str(out), "seeds": plan.seeds, "test_sentences": len(test.src),
                "gold_alignments": test.gold is not None, **summary, "sessions": sessions, "figures": drawn}
    with atomic_open(out / "results.json", key="out") as f:
        f.write(json.dumps(document, indent=2, default=str) + "\n")
    write_csv(csv_rows(summary), out / "results.csv")
    with atomic_open(out / "report.md", key="out") as f:
        f.write(markdown_report(plan, summary, test, sessions, drawn, configs, runs))
    return main_table(summary)
