"""The attention study's verdicts: each claim of the essay behind the toolkit, tested on a finished nmt-compare folder.

    python scripts/study_claims.py runs/attention_multi30k_cpu --out docs/studies/attention-multi30k/claims.md

Each claim names a pair of variants (A claimed better, or cheaper, than B). Quality: the comparison's two tests
run on that pair (nmt.evaluation.significance: the paired cluster bootstrap over test sentences with every seed of a
sentence drawn together, and Welch's t-test over seeds), Holm-Bonferroni over the claims' quality tests. Cost:
training target tokens and decoded sentences per CPU second from the runs' files, A / B per seed among the seeds
whose two runs trained on the same CPU at the same precision, with a t-test on the logarithms of those ratios.
Verdicts: "supported" (both tests call the difference in the claimed direction after Holm's correction; for a cost,
the ratio favours A and its t-test agrees), "not supported" (a significant difference the other way, or, for
"loses little", a loss whose seed-test interval reaches below -1 BLEU), "cannot tell at this budget" otherwise.
Every number is read from the folder (results.json, RUN/eval.json, RUN/test.hyp, RUN/results.json).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import ttest_1samp

from nmt.compare.collect import read_plan, read_run, read_test
from nmt.compare.summary import CONDITIONS, length_buckets, run_conditions
from nmt.evaluation.significance import (
    MIN_SEEDS,
    bleu_from_stats,
    cluster_bootstrap,
    draw_weights,
    holm,
    sentence_stats,
    welch_test,
)

ALPHA, LITTLE = 0.05, 1.0  # "loses little": the seed test's interval stays above -LITTLE BLEU


@dataclass
class Claim:
    number: int
    text: str
    better: str  # variant claimed better (or cheaper)
    worse: str
    kind: str  # "quality" | "little loss" | "cost" | "stability" | "long range"
    note: str = ""
    curves: tuple[str, str] | None = None  # bench_attention variants (cheaper, dearer) whose cost curves bear on it


CLAIMS = [
    Claim(
        1,
        "Additive attention captures more complex query-key relations than dot-product attention (at a higher cost)",
        "luong_global_concat",
        "luong_global_dot",
        "quality",
        "Luong's concat score is the additive score v^T tanh(W [h_t; h_s]) on the same decoder",
    ),
    Claim(
        2,
        "Dot-product attention is simpler and faster than additive attention",
        "luong_global_dot",
        "luong_global_concat",
        "cost",
        curves=("dot", "concat"),
    ),
    Claim(
        3,
        "Local attention (a window around p_t) loses little quality against global attention",
        "luong_local_p_general",
        "luong_global_general",
        "little loss",
        "cheaper on long sequences: scripts/bench_attention.py's cost curves",
        curves=("local-p, banded", "general"),
    ),
    Claim(
        4,
        "Scaling dot products by 1/sqrt(d_k) makes training better and more stable (d_k = 64: 4 heads of 256)",
        "transformer",
        "transformer_unscaled",
        "quality",
    ),
    Claim(
        4,
        "... more so as d grows (d_k = 256: 1 head of 256)",
        "transformer_single_head",
        "transformer_single_head_unscaled",
        "quality",
    ),
    Claim(
        5,
        "Multi-head attention captures more than a single head (same parameters)",
        "transformer",
        "transformer_single_head",
        "quality",
    ),
    Claim(6, "Hard attention trains less stably than soft attention", "luong_global_general", "hard", "stability"),
    Claim(
        7,
        "Self-attention models long-range dependencies better than recurrent models",
        "transformer",
        "luong_global_general",
        "long range",
        "BLEU of the longest source-length bucket",
    ),
    Claim(
        8, "Input feeding helps Luong attention", "luong_global_general", "luong_global_general_no_feeding", "quality"
    ),
]


def per_seed(out: Path, plan, name: str) -> dict[int, object]:
    return {s: r for s in plan.seeds if (r := read_run(out, name, s)).finished}


def quality(out: Path, plan, refs: list[str], a: str, b: str, samples: int, seed: int, weights) -> dict | None:
    runs_a, runs_b = per_seed(out, plan, a), per_seed(out, plan, b)
    common = sorted(set(runs_a) & set(runs_b))
    if not common:
        return None
    stats = lambda runs: np.stack([sentence_stats(runs[s].hyps, refs) for s in common])  # noqa: E731
    boot = cluster_bootstrap(stats(runs_b), stats(runs_a), common, samples, seed, weights)  # a minus b
    welch = welch_test([r.score("bleu") for r in runs_b.values()], [r.score("bleu") for r in runs_a.values()])
    return {
        "a": [r.score("bleu") for r in runs_a.values()],
        "b": [r.score("bleu") for r in runs_b.values()],
        "boot": boot,
        "welch": welch,
    }


def by_length(out: Path, plan, test, a: str, b: str, samples: int, seed: int) -> list[dict]:
    """A minus B in each source-length bucket of the report (nmt.compare.summary.length_buckets): the cluster
    bootstrap over the bucket's sentences (all seeds of a sentence together) and Welch's test on the per-seed BLEU
    of the bucket."""
    runs_a, runs_b = per_seed(out, plan, a), per_seed(out, plan, b)
    common = sorted(set(runs_a) & set(runs_b))
    found = []
    for label, lines in length_buckets(test.src, plan.length_buckets) if common else []:
        refs = [test.ref[i] for i in lines]
        stats = {
            name: np.stack([sentence_stats([runs[s].hyps[i] for i in lines], refs) for s in common])
            for name, runs in (("a", runs_a), ("b", runs_b))
        }
        per_seed_bleu = {name: [float(bleu_from_stats(x.sum(0))) for x in stats[name]] for name in stats}
        found.append(
            {
                "words": label,
                "sentences": len(lines),
                "boot": cluster_bootstrap(stats["b"], stats["a"], common, samples, seed),
                "welch": welch_test(per_seed_bleu["b"], per_seed_bleu["a"]),
            }
        )
    return found


def host(run) -> tuple:
    """Where and how a run trained: (CPU, precision) of its first part (runs of a study made in parts on different
    hosts are compared for speed only with runs made on the same host the same way)."""
    conditions = run_conditions(run)
    first = dict(zip(CONDITIONS, conditions[0])) if conditions else {}
    return (first.get("cpu") or "CPU not recorded", first.get("precision"))


def cost(out: Path, plan, a: str, b: str) -> dict:
    """Training target tokens and decoded test sentences per CPU second (one thread: per core-second, which the
    other run beside it does not slow), A / B per seed. Only seeds whose A and B runs trained on the same CPU at the
    same precision count; the ratio is the geometric mean of those seeds' ratios, tested with a one-sample t-test on
    their logarithms (2+ seeds), so a host that is faster for both variants does not count as a difference."""
    runs_a, runs_b = per_seed(out, plan, a), per_seed(out, plan, b)
    same = [s for s in sorted(set(runs_a) & set(runs_b)) if host(runs_a[s]) == host(runs_b[s])]

    def train(run):
        return run.results["train_tokens"] / run.results["train_cpu_s"] if run.results.get("train_cpu_s") else None

    def decode(run):
        return run.evaluation.get("sentences_per_cpu_s")

    found = {}
    for key, get in (("train tokens/CPU-s", train), ("decode sentences/CPU-s", decode)):
        pairs = [(s, get(runs_a[s]), get(runs_b[s])) for s in same]
        pairs = [(s, va, vb) for s, va, vb in pairs if va and vb]
        if pairs:
            logs = [math.log(va / vb) for _, va, vb in pairs]
            found[key] = {
                "ratio": math.exp(statistics.fmean(logs)),
                "ratios": [math.exp(x) for x in logs],
                "p": float(ttest_1samp(logs, 0.0).pvalue) if len(logs) > 1 and np.std(logs) > 0 else None,
                "seeds": [s for s, _, _ in pairs],
            }
    return found


def curves(path: Path | None) -> dict | None:
    """scripts/bench_attention.py --json: forward+backward ms and peak MB per variant and length."""
    return json.loads(path.read_text()) if path else None


def curve_evidence(found: dict | None, faster: str, slower: str) -> str:
    """'A/B time at n=16 ... n=max' from the cost curves, for two of bench_attention's variant names."""
    if not found or faster not in found["results"] or slower not in found["results"]:
        return ""
    fa, fb = found["results"][faster], found["results"][slower]
    ends = [0, len(fa) - 1]
    parts = [
        f"n={fa[i]['n']} {fa[i]['ms'] / fb[i]['ms']:.2f}x time, {fa[i]['mb'] / max(fb[i]['mb'], 1e-9):.2f}x memory"
        for i in ends
    ]
    return f"cost curves ({found['title']}), {faster} / {slower}: " + "; ".join(parts)


def fmt(values: list[float]) -> str:
    return f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def interval(result) -> str:
    return (
        "n/a"
        if result is None
        else f"{result.delta:+.2f} [{result.ci_low:+.2f}, {result.ci_high:+.2f}], p {result.p_value:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--cost", type=Path, help="scripts/bench_attention.py --json output: the cost curves")
    args = parser.parse_args()
    cost_curves = curves(args.cost)
    out, plan = args.folder, read_plan(args.folder)
    test = read_test(out)
    summary = json.loads((out / "results.json").read_text())
    variants = {v["name"]: v for v in summary["variants"]}
    weights = draw_weights(len(test.ref), args.samples, args.seed)
    rows, tested = [], {}
    for claim in CLAIMS:
        if claim.better not in variants or claim.worse not in variants:
            rows.append((claim, None, None, "not run"))
            continue
        q = quality(out, plan, test.ref, claim.better, claim.worse, args.samples, args.seed, weights)
        rows.append((claim, q, cost(out, plan, claim.better, claim.worse), None))
        if q is not None and claim.kind in ("quality", "little loss"):
            tested[(claim.number, claim.better)] = q
    corrected_boot = holm({k: q["boot"].p_value for k, q in tested.items()}, ALPHA)
    corrected_seed = holm({k: q["welch"].p_value for k, q in tested.items() if q["welch"]}, ALPHA)
    lines = [
        "# The essay's claims, measured",
        "",
        f"From `{out}` ({summary.get('name')}): {len(plan.seeds)} seeds per variant, test set {len(test.ref)} "
        f"sentences. Δ is A minus B. Quality tests: paired cluster bootstrap over test sentences ({args.samples} "
        f"draws, seed {args.seed}) and Welch's t-test over seeds (needs {MIN_SEEDS}+ seeds), Holm-Bonferroni over the "
        f"{len(tested)} quality claims at alpha {ALPHA}. Costs: A / B per second of CPU time (one thread), per seed, "
        "only for seeds whose A and B runs trained on the same CPU at the same precision; the geometric mean of "
        "those ratios, with a one-sample t-test on their logarithms (2+ seeds).",
        "",
        "| # | claim | A | B | BLEU A | BLEU B | sentence bootstrap Δ [95% CI], p | seed test Δ [95% CI], p | "
        "other evidence | verdict |",
        "|---|---|---|---|---:|---:|---|---|---|---|",
    ]
    for claim, q, c, missing in rows:
        if missing:
            lines.append(f"| {claim.number} | {claim.text} | {claim.better} | {claim.worse} | | | | | | {missing} |")
            continue
        evidence, verdict = [], "cannot tell at this budget" if q else "not finished yet"
        for key, found in (c or {}).items():
            evidence.append(
                f"{key} A/B {found['ratio']:.2f} (seeds {', '.join(map(str, found['seeds']))}, each A and B on one "
                f"host: {', '.join(f'{r:.2f}' for r in found['ratios'])}"
                + (f"; t-test on log ratios p {found['p']:.3f})" if found["p"] is not None else ")")
            )
        if claim.curves and (curve := curve_evidence(cost_curves, *claim.curves)):
            evidence.append(curve)
        if claim.kind in ("quality", "little loss") and q:
            key = (claim.number, claim.better)
            both = (
                corrected_boot.get(key) and corrected_seed.get(key) and (q["boot"].delta > 0) == (q["welch"].delta > 0)
            )
            if both:
                verdict = "supported" if q["boot"].delta > 0 else "not supported (significant the other way)"
            if claim.kind == "little loss" and q["welch"]:
                verdict = (
                    "supported"
                    if q["welch"].ci_low > -LITTLE
                    else ("not supported" if q["welch"].ci_high < -LITTLE else verdict)
                )
        elif claim.kind == "cost" and c.get("train tokens/CPU-s"):
            found = c["train tokens/CPU-s"]
            if found["p"] is not None and found["p"] < ALPHA:
                verdict = "supported" if found["ratio"] > 1 else "not supported (the other is faster)"
        elif claim.kind == "stability" and q:
            spread_a, spread_b = np.std(q["a"], ddof=1), np.std(q["b"], ddof=1)
            skipped = sum(r.results.get("skipped_updates", 0) for r in per_seed(out, plan, claim.worse).values())
            evidence.append(
                f"seed s.d. A {spread_a:.2f}, B {spread_b:.2f}; skipped (non-finite) updates of B: {skipped}"
            )
            verdict = "supported" if spread_b > 2 * spread_a and q["welch"] and q["welch"].delta > 0 else verdict
        elif claim.kind == "long range":
            buckets = by_length(out, plan, test, claim.better, claim.worse, args.samples, args.seed)
            if buckets:
                short, long = buckets[0], buckets[-1]
                evidence.append(
                    "A - B by source length: "
                    + ", ".join(f"{b['words']} words (n={b['sentences']}) {b['boot'].delta:+.2f}" for b in buckets)
                    + f"; longest bucket: sentence bootstrap {interval(long['boot'])}, "
                    f"seed test {interval(long['welch'])}"
                )
                significant = long["boot"].p_value < ALPHA and long["welch"] and long["welch"].p_value < ALPHA
                if significant and long["boot"].delta > 0 and long["welch"].delta > 0:
                    verdict = "supported"
                elif significant and long["boot"].delta < 0 and long["boot"].delta <= short["boot"].delta:
                    verdict = "not supported (behind on the longest sentences, and no closer than on the shortest)"
        lines.append(
            f"| {claim.number} | {claim.text} | {claim.better} | {claim.worse} | {fmt(q['a']) if q else 'n/a'} | "
            f"{fmt(q['b']) if q else 'n/a'} | {interval(q['boot']) if q else 'n/a'} | "
            f"{interval(q['welch']) if q else 'n/a'} | {'; '.join(evidence) or claim.note} | {verdict} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
