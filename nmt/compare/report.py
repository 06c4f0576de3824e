"""The report folder: report.md (tables and figures), results.csv (one row per variant), results.json, PNG figures.

`build_report(out)` reads OUT/comparison.yaml, the test set copied into OUT and every run's files, and
writes the report; it trains and translates nothing, so `nmt-compare report_only=true` runs it alone. Two scores are
computed here rather than read from eval.json: chrF++ of runs scored before it was added (from their test.hyp, the
same sacrebleu call; eval.json is left as it is), and COMET when comet.model= is given (cached in OUT/comet_cache,
so a second report scores nothing again).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path

from nmt.compare import figures
from nmt.compare.collect import RunRecord, read_plan, read_run, read_sessions, read_test
from nmt.compare.evaluate import SCORED, TestSet, eval_settings
from nmt.compare.markdown import comet_section, main_table, markdown_report
from nmt.compare.plan import TEST_ALIGN
from nmt.compare.summary import ATTENTION, SCORES, comet_summary, summarize
from nmt.config import CompareConfig
from nmt.data.corpus import read_lines
from nmt.errors import NmtError
from nmt.evaluation.metrics import corpus_score
from nmt.fileio import atomic_open

COST_CURVES = "attention_cost.json"
COMET_CACHE = "comet_cache"  # OUT/comet_cache: COMET scores of the runs' test.hyp (nmt.evaluation.comet)
FIGURES = {
    "budgets": "bleu_by_budget.png",
    "bars": "bleu_bars.png",
    "curves": "learning_curves.png",
    "lengths": "bleu_by_length.png",
    "heatmaps": "attention_heatmaps.png",
}


def load_runs(out: Path, plan: CompareConfig) -> dict[str, list[RunRecord]]:
    return {name: [read_run(out, name, seed) for seed in plan.seeds_of(name)] for name in plan.selected()}


def fill_scores(runs: dict[str, list[RunRecord]], refs: list[str]) -> list[str]:
    """Scores eval.json lacks because the run was scored before the metric was added (chrF++), computed in memory from
    the run's own translations (test.hyp, test.atN.hyp) with the same sacrebleu call; returns "variant seed N" of
    each run filled in. A translation whose line count does not match the references gets n/a."""
    filled = []
    for name, group in runs.items():
        for run in group:
            evaluation = run.evaluation or {}
            targets = [(evaluation.get("scores"), run.hyps)]
            targets += [
                (f.get("scores"), run.point_hyps.get(int(p))) for p, f in (evaluation.get("points") or {}).items()
            ]
            missing = False
            for scores, hyps in targets:
                if scores is None or hyps is None:
                    continue
                for metric in (m for m in SCORED if m not in scores):
                    missing = True
                    if len(hyps) == len(refs):
                        found = corpus_score(metric, hyps, refs)
                        scores[metric] = {"score": round(found.score, 4), "signature": found.signature}
                    else:
                        scores[metric] = {"score": None, "signature": f"n/a ({len(hyps)} lines for {len(refs)})"}
                    scores[metric]["filled_by_report"] = True
            if missing:
                filled.append(f"{name} seed {run.seed}")
    return filled


def comet_scores(out: Path, plan: CompareConfig, runs: dict[str, list[RunRecord]], test) -> dict[str, dict[int, dict]]:
    """COMET of every finished run's test output (test.hyp, at the shared budget) with plan.comet's model:
    {variant: {seed: {"segments", "system", "signature", "cached"}}}; cached in OUT/comet_cache (or comet.cache)."""
    from nmt.evaluation.comet import CometScorer

    settings = plan.comet
    scorer = CometScorer(
        settings.model,
        settings.batch_size,
        settings.device,
        settings.progress,
        settings.cache or out / COMET_CACHE,
        key="comet.model",
    )
    found: dict[str, dict[int, dict]] = {}
    for name, group in runs.items():
        found[name] = {}
        for run in group:
            if run.finished and len(run.hyps) == len(test.ref):
                result = scorer.score(test.src, run.hyps, test.ref)
                found[name][run.seed] = {
                    "segments": result.segments,
                    "system": result.system,
                    "signature": result.signature,
                    "cached": result.cached,
                }
    return found


def comet_csv(comet: dict | None) -> dict[str, dict]:
    """results.csv's COMET columns of each variant (none without comet.model)."""
    if comet is None:
        return {}
    rows = {}
    for v in comet["variants"]:
        sig = v["significance"] or {}
        boot, seeds = sig.get("bootstrap") or {}, sig.get("seeds") or {}
        rows[v["name"]] = {
            "comet_mean": v["comet"]["mean"],
            "comet_std": v["comet"]["std"],
            "delta_comet": v["delta"],
            "comet_bootstrap_delta": boot.get("delta"),
            "comet_bootstrap_ci_low": boot.get("ci_low"),
            "comet_bootstrap_ci_high": boot.get("ci_high"),
            "comet_bootstrap_p": boot.get("p_value"),
            "comet_bootstrap_significant_holm": boot.get("holm"),
            "comet_seed_test_ci_low": seeds.get("ci_low"),
            "comet_seed_test_ci_high": seeds.get("ci_high"),
            "comet_seed_test_p": seeds.get("p_value"),
            "comet_seed_test_significant_holm": seeds.get("holm"),
            "comet_significant": sig.get("decision"),
        }
    return rows


def csv_rows(summary: dict) -> list[dict]:
    """One row per variant: the means (and standard deviations) the report's tables show."""
    rows = []
    for v in summary["variants"]:
        sig = v["significance"] or {}
        boot, seeds = sig.get("bootstrap") or {}, sig.get("seeds") or {}
        row = {"variant": v["name"], "overrides": " ".join(v["overrides"]), "seeds": " ".join(map(str, v["seeds"]))}
        for metric in SCORES:
            row[f"{metric}_mean"], row[f"{metric}_std"] = v[metric]["mean"], v[metric]["std"]
        row |= {
            "delta_bleu": v["delta_bleu"],
            "bootstrap_seeds": " ".join(map(str, boot.get("seeds", []))),
            "bootstrap_delta": boot.get("delta"),
            "bootstrap_ci_low": boot.get("ci_low"),
            "bootstrap_ci_high": boot.get("ci_high"),
            "bootstrap_p": boot.get("p_value"),
            "bootstrap_significant_raw": boot.get("significant_raw"),
            "bootstrap_significant_holm": boot.get("holm"),
            "seed_test_ci_low": seeds.get("ci_low"),
            "seed_test_ci_high": seeds.get("ci_high"),
            "seed_test_p": seeds.get("p_value"),
            "seed_test_significant_raw": seeds.get("significant_raw"),
            "seed_test_significant_holm": seeds.get("holm"),
            "significant": sig.get("decision"),
            "valid_ppl": v["valid_ppl"]["mean"],
            "parameters": v["parameters"],
            "steps": v["steps"]["mean"],
            "train_seconds": v["train_seconds"]["mean"],
            "train_tokens_per_s": v["train_tokens_per_s"]["mean"],
            "decode_sentences_per_s": v["decode_sentences_per_s"]["mean"],
        }
        row |= comet_csv(summary.get("comet")).get(v["name"], {})
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
            "baseline"
            if v["name"] == summary["baseline"]
            else "same"
            if (v["significance"] or {}).get("decision") != "yes"
            else "better"
            if v["delta_bleu"] > 0
            else "worse"
            for v in variants
        ]
        figures.bleu_bars(
            [v["name"] for v in variants],
            [v["bleu"]["mean"] for v in variants],
            [v["bleu"]["std"] for v in variants],
            [v["bleu"]["values"] for v in variants],
            kinds,
            f"baseline: {summary['baseline']}",
            out / FIGURES["bars"],
        )
        drawn["bars"] = FIGURES["bars"]
        figures.bleu_by_length(
            [b["words"] for b in summary["length_buckets"]],
            {v["name"]: [b["mean"] for b in v["length_bleu"]] for v in variants},
            out / FIGURES["lengths"],
        )
        drawn["lengths"] = FIGURES["lengths"]
    curves = {name: [r.curve for r in group if r.curve.valid] for name, group in runs.items()}
    if any(curves.values()):
        clocks = {r.config.train.budget_clock for group in runs.values() for r in group if r.curve.valid and r.config}
        clock = clocks.pop() if len(clocks) == 1 else "mixed"
        figures.learning_curves({k: v for k, v in curves.items() if v}, out / FIGURES["curves"], clock)
        drawn["curves"] = FIGURES["curves"]
    heat = {name: next((r.heatmaps for r in group if r.finished and r.heatmaps), []) for name, group in runs.items()}
    heat = {name: records for name, records in heat.items() if records}
    if heat:
        figures.attention_grid(heat, dict(enumerate(gold)) if gold else {}, out / FIGURES["heatmaps"])
        drawn["heatmaps"] = FIGURES["heatmaps"]
    return drawn


def check_scored(out: Path, plan: CompareConfig) -> None:
    """report_only: every scored run must have been scored with the settings the report states; it never relabels."""
    test = read_test(out)
    align = out / TEST_ALIGN
    digest = (
        hashlib.sha256("\n".join(read_lines(align)).encode("utf-8", "surrogatepass")).hexdigest()
        if align.is_file()
        else None
    )
    scoring = TestSet(
        test.src, test.ref, test.gold, plan.heatmap_lines, plan.under_attended, plan.over_attended, digest
    )
    for name, group in load_runs(out, plan).items():
        for run in group:
            if run.evaluation is None or run.config is None:
                continue
            scored, expected = run.evaluation.get("settings") or {}, eval_settings(scoring, run.config.decode)
            for key, value in expected.items():
                if scored.get(key) != value:
                    raise NmtError(
                        f"report_only=true: {name} seed {run.seed} was scored with "
                        f"{key}={scored.get(key, 'not recorded')}, but the report would state {key}={value}; run "
                        "nmt-compare with the same out= (without report_only) to score the runs again with these "
                        "settings (no run is retrained)"
                    )


def shared_budget(runs: dict[str, list[RunRecord]]) -> int | None:
    """The updates every variant trained (extended variants trained more afterwards): the smallest train.max_steps."""
    steps = [r.config.train.max_steps for group in runs.values() for r in group if r.finished and r.config]
    return min(steps) if steps else None


def cost_curves(out: Path) -> dict | None:
    """scripts/bench_attention.py --json written into OUT (attention_cost.json), for the cost claims."""
    path = out / COST_CURVES
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def build_report(out: Path, plan: CompareConfig | None = None) -> str:
    """Write OUT/report.md, results.csv, results.json and the figures from the files in OUT; returns the main table."""
    from nmt.compare.budgets import crossover, order_changes, point_table, scored_points, time_matched
    from nmt.compare.provenance import provenance
    from nmt.compare.sections import (
        budget_section,
        conditions_section,
        crossover_section,
        provenance_section,
        speed_section,
    )
    from nmt.compare.speed import read_probes

    plan = plan or read_plan(out)
    test = read_test(out)
    runs = load_runs(out, plan)
    filled = fill_scores(runs, test.ref)
    comet = comet_scores(out, plan, runs, test) if plan.comet.model else None  # before anything is written
    steps = shared_budget(runs) if plan.budget == "updates" else None
    baseline, limit = plan.baseline_name(), plan.contention_limit
    summary = summarize(
        runs,
        plan.overrides,
        baseline,
        test,
        plan.length_buckets,
        plan.bootstrap,
        plan.bootstrap_seed,
        plan.extend,
        steps,
        limit,
    )
    summary["filled_by_report"] = filled
    summary["comet"] = (
        {
            "model": plan.comet.model,
            **comet_summary(comet, baseline, len(test.ref), plan.bootstrap, plan.bootstrap_seed),
        }
        if comet is not None
        else None
    )
    sessions = read_sessions(out)
    drawn = draw_figures(out, summary, runs, test.gold)
    main_points = [p for p in scored_points(runs) if steps is None or p <= steps]
    tables = [point_table(runs, p, baseline, test.ref, plan.bootstrap, plan.bootstrap_seed) for p in main_points]
    changes = order_changes(tables)
    cross = crossover(runs, list(plan.extend), test.ref, plan.bootstrap, plan.bootstrap_seed)
    probes = read_probes(out)
    matched = time_matched(runs, probes, limit, main_points) if main_points else None
    prov = provenance(runs, sessions)
    claims, claims_lines = [], []
    if plan.claims:
        from nmt.compare.claims import evaluate_claims
        from nmt.compare.claims_report import claims_markdown

        claims = evaluate_claims(
            plan.claims, runs, test, probes, cost_curves(out), plan.bootstrap, plan.bootstrap_seed, plan.length_buckets
        )
        claims_lines = ["## Claims", "", claims_markdown(claims), ""]
    if len(scored_points(runs)) > 1:
        figures.bleu_by_budget(budget_curves(runs), out / FIGURES["budgets"])
        drawn["budgets"] = FIGURES["budgets"]
    configs = {name: next((r.config for r in group if r.config is not None), None) for name, group in runs.items()}
    document = {
        "name": plan.name,
        "out": str(out),
        "seeds": {name: plan.seeds_of(name) for name in plan.selected()},
        "test_sentences": len(test.src),
        "gold_alignments": test.gold is not None,
        **summary,
        "budget": {"kind": plan.budget, "updates": steps, "points": main_points},
        "budget_tables": tables,
        "order_changes": changes,
        "crossover": cross,
        "probes": probes,
        "time_matched": matched,
        "claims": claims,
        "provenance": prov,
        "sessions": sessions,
        "figures": drawn,
    }
    with atomic_open(out / "results.json", key="out") as f:
        f.write(json.dumps(document, indent=2, default=str) + "\n")
    write_csv(csv_rows(summary), out / "results.csv")
    early = (
        comet_section(summary)
        + budget_section(tables, changes, baseline, drawn.get("budgets"))
        + crossover_section(cross, plan.extend)
    )
    late = (
        speed_section(matched, probes, limit)
        + conditions_section(summary, limit)
        + claims_lines
        + provenance_section(prov)
    )
    with atomic_open(out / "report.md", key="out") as f:
        f.write(markdown_report(plan, summary, test, sessions, drawn, configs, runs, early, late, prov))
    return main_table(summary)


def budget_curves(runs: dict[str, list[RunRecord]]) -> dict[str, list[tuple[int, float, float | None]]]:
    """Per variant: (budget point, mean test BLEU over seeds, standard deviation) at every point scored."""
    from nmt.compare.budgets import scored_points
    from nmt.compare.summary import spread

    found = {}
    for name, group in runs.items():
        points = []
        for point in scored_points({name: group}):
            stat = spread([r.point_score(point) for r in group if r.finished])
            if stat["mean"] is not None:
                points.append((point, stat["mean"], stat["std"]))
        found[name] = points
    return found
