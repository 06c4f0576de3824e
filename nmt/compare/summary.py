"""The comparison's numbers, computed from the runs' files: means and spreads over seeds, paired tests, length buckets.

Scores of one run are read from its eval.json (sacrebleu, written when the run was scored); the only
numbers computed here are statistics over those files: means and sample standard deviations over seeds,
BLEU of length buckets (sacrebleu on the runs' test.hyp), and the paired bootstrap tests.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from nmt.compare.collect import RunRecord, TestData
from nmt.compare.runner import contention, train_seconds
from nmt.evaluation.metrics import corpus_score
from nmt.evaluation.significance import (
    MIN_SEEDS,
    cluster_bootstrap,
    draw_weights,
    holm,
    sentence_stats,
    smallest_bootstrap_p,
    welch_test,
)

SCORES = ("bleu", "chrf", "chrf++", "ter", "bleu_lc")
ATTENTION = ("entropy", "max_weight", "coverage", "under_attended", "over_attended", "p_t_diagonal_distance")
ALIGNMENT = ("aer", "precision", "recall")
ALPHA = 0.05  # the family-wise error rate of the tests against the baseline (Holm-Bonferroni over the variants)


def spread(values: list[float | None]) -> dict:
    """Mean and sample standard deviation (None with fewer than two values) of the values that exist."""
    present = [v for v in values if v is not None]
    return {
        "mean": statistics.fmean(present) if present else None,
        "std": statistics.stdev(present) if len(present) > 1 else None,
        "values": present,
    }


def length_buckets(src: list[str], count: int) -> list[tuple[str, list[int]]]:
    """Test lines grouped by source length in words into about `count` buckets of similar size: (label, lines)."""
    lengths = np.array([len(line.split()) for line in src])
    if lengths.size == 0:
        return []
    cuts = np.unique(np.quantile(lengths, np.linspace(0, 1, count + 1)[1:-1], method="lower"))
    group = np.searchsorted(cuts, lengths, side="left")  # bucket k holds cuts[k-1] < length <= cuts[k]
    buckets = []
    for k in range(len(cuts) + 1):
        lines = np.nonzero(group == k)[0]
        if lines.size:
            low, high = int(lengths[lines].min()), int(lengths[lines].max())
            buckets.append((f"{low}-{high}" if low != high else str(low), lines.tolist()))
    return buckets


def excludes_zero(result: dict) -> bool:
    return result["ci_low"] > 0 or result["ci_high"] < 0


def decide(boot: dict | None, seeds: dict | None) -> str:
    """The report's sig.: yes only when both tests (Holm-corrected) call the difference, in the same direction."""
    if boot is None:
        return "n/a"
    if seeds is None:
        return "bootstrap only: " + ("yes" if boot["holm"] else "no")
    same_sign = (boot["delta"] > 0) == (seeds["delta"] > 0)
    return "yes" if boot["holm"] and seeds["holm"] and same_sign else "no"


@dataclass
class Significance:
    """Each variant against the baseline: the sentence bootstrap (seeds clustered), the seed test, and per seed."""

    tests: dict[str, dict]  # variant -> {"bootstrap": ..., "seeds": ..., "decision": ...}
    by_seed: dict[str, dict[int, dict]]
    notes: list[str]


def significance(
    runs: dict[str, list[RunRecord]], baseline: str, refs: list[str], samples: int, seed: int, alpha: float = ALPHA
) -> Significance:
    """Paired cluster bootstrap over test sentences (on the seeds both finished) and Welch's t-test over seeds,
    Holm-corrected."""
    finished = {name: {r.seed: r for r in group if r.finished} for name, group in runs.items()}
    base = finished.get(baseline, {})
    names = [name for name in finished if name != baseline and finished[name]]
    stats = {name: {s: sentence_stats(r.hyps, refs) for s, r in seeds.items()} for name, seeds in finished.items()}
    weights = draw_weights(len(refs), samples, seed) if refs else None  # the same draws for every variant
    boot, seed_test, by_seed = {}, {}, {name: {} for name in names}
    for name in names:
        common = sorted(set(finished[name]) & set(base))
        if common:
            result = cluster_bootstrap(
                np.stack([stats[baseline][s] for s in common]),
                np.stack([stats[name][s] for s in common]),
                common,
                samples,
                seed,
                weights,
            )
            boot[name] = {
                **result.as_dict(),
                "significant_raw": result.p_value < alpha and excludes_zero(result.as_dict()),
            }
        welch = welch_test([r.score("bleu") for r in base.values()], [r.score("bleu") for r in finished[name].values()])
        if welch is not None:
            seed_test[name] = {**welch.as_dict(), "significant_raw": welch.p_value < alpha}
        for s in common:
            one = cluster_bootstrap(stats[baseline][s][None], stats[name][s][None], [s], samples, seed, weights)
            by_seed[name][s] = one.as_dict()
    tests, notes = corrected_tests(names, boot, seed_test, samples, alpha)
    return Significance(tests, by_seed, notes)


def corrected_tests(
    names: list[str], boot: dict[str, dict], seed_test: dict[str, dict], samples: int, alpha: float
) -> tuple[dict[str, dict], list[str]]:
    """Holm over the variants for each test on its own, the decision per variant, and a note when the bootstrap has
    too few draws for any p to pass the correction."""
    for results in (boot, seed_test):
        corrected = holm({name: r["p_value"] for name, r in results.items()}, alpha)
        for name, r in results.items():
            r["holm"] = corrected[name] and excludes_zero(r)
    tests = {
        name: {
            "bootstrap": boot.get(name),
            "seeds": seed_test.get(name),
            "decision": decide(boot.get(name), seed_test.get(name)),
        }
        for name in names
    }
    notes = []
    if boot and smallest_bootstrap_p(samples) >= alpha / len(boot):
        notes.append(
            f"with bootstrap={samples} the smallest bootstrap p is 1/{samples + 1} = "
            f"{smallest_bootstrap_p(samples):.4f}, not below Holm's first threshold alpha/{len(boot)} = "
            f"{alpha / len(boot):.4f}: no variant can pass the corrected test; give "
            f"bootstrap={int(len(boot) / alpha) * 2} or more"
        )
    return tests, notes


def comet_summary(
    comet: dict[str, dict[int, dict]], baseline: str, sentences: int, samples: int, seed: int, alpha: float = ALPHA
) -> dict:
    """COMET of every variant from its runs' segment scores ({variant: {seed: {"segments", "system", "signature"}}},
    finished runs at the shared budget): the mean ± s.d. over seeds of the system scores (each the mean of its
    segments), Δ of those means against the baseline, the paired cluster bootstrap over segment scores on the seeds
    both finished (all seeds of a sentence drawn together; nmt.evaluation.comet.segment_bootstrap) and Welch's test
    over per-seed system scores, each Holm-corrected over the variants as for BLEU."""
    from nmt.evaluation.comet import segment_bootstrap

    base = comet.get(baseline, {})
    names = [name for name in comet if name != baseline and comet[name]]
    weights = draw_weights(sentences, samples, seed) if sentences else None  # the same draws as BLEU's
    boot, seed_test = {}, {}
    for name in names:
        common = sorted(set(comet[name]) & set(base))
        if common:
            result = segment_bootstrap(
                np.array([base[s]["segments"] for s in common]),
                np.array([comet[name][s]["segments"] for s in common]),
                common,
                samples,
                seed,
                weights,
            )
            boot[name] = {
                **result.as_dict(),
                "significant_raw": result.p_value < alpha and excludes_zero(result.as_dict()),
            }
        welch = welch_test([r["system"] for r in base.values()], [r["system"] for r in comet[name].values()])
        if welch is not None:
            seed_test[name] = {**welch.as_dict(), "significant_raw": welch.p_value < alpha}
    tests, notes = corrected_tests(names, boot, seed_test, samples, alpha)
    means = {name: spread([r["system"] for r in runs.values()]) for name, runs in comet.items()}
    variants = []
    for name, runs in comet.items():
        base_mean, mean = means.get(baseline, {}).get("mean"), means[name]["mean"]
        variants.append(
            {
                "name": name,
                "seeds": sorted(runs),
                "comet": means[name],
                "delta": mean - base_mean if name != baseline and None not in (mean, base_mean) else None,
                "significance": tests.get(name),
            }
        )
    signatures = sorted({r["signature"] for runs in comet.values() for r in runs.values()})
    return {"baseline": baseline, "signatures": signatures, "variants": variants, "notes": notes}


def bucket_bleu(run: RunRecord, refs: list[str], buckets: list[tuple[str, list[int]]]) -> list[float]:
    """sacrebleu BLEU of a run's test output in each length bucket."""
    hyps = run.hyps or []
    return [corpus_score("bleu", [hyps[i] for i in lines], [refs[i] for i in lines]).score for _, lines in buckets]


def best_valid_ppl(run: RunRecord) -> float | None:
    """Validation perplexity at the step of the checkpoint that was scored (best.pt), from train.log."""
    point = run.curve.at_step(run.evaluation["checkpoint_step"]) if run.evaluation else None
    return point[3] if point else None


def layer_means(records: list[dict | None]) -> dict | None:
    """A Transformer's test AER per decoder layer over seeds, and the layers chosen
    (on validation) for the main figure."""
    present = [r for r in records if r]
    if not present:
        return None
    layers = len(present[0]["test"])
    return {
        "test_aer": [spread([r["test"][i]["aer"] for r in present if len(r["test"]) == layers]) for i in range(layers)],
        "valid_aer": [spread([r["valid"][i]["aer"] for r in present if r.get("valid")]) for i in range(layers)],
        "best_layers": [r["best_layer"] + 1 for r in present],
        "chosen_on": sorted({r["chosen_on"] for r in present}),
    }


def budget_results(run: RunRecord, steps: int | None) -> dict:
    """results.json of a run as it stood at the shared budget: a run trained on past it (extend) has the figures of
    its first part in RUN/conditions.json."""
    results = run.results or {}
    if steps is None or results.get("steps", 0) <= steps:
        return results
    return next((p["results"] for p in run.conditions if p.get("to_step") == steps and p.get("results")), results)


def run_contention(run: RunRecord) -> float:
    """The run's largest ratio of training wall time to CPU time per thread (nmt.compare.runner.contention)."""
    return contention(run.results or {}, run.conditions)


def variant_summary(
    name: str,
    overrides: list[str],
    group: list[RunRecord],
    refs: list[str],
    buckets: list[tuple[str, list[int]]],
    budget_steps: int | None = None,
    limit: float = 1.15,
) -> dict:
    """One variant's figures over its finished seeds (training figures at the shared budget); the speeds only of
    runs that trained with their cores to themselves (contention at most `limit`)."""
    done = [r for r in group if r.finished]
    evals = [r.evaluation for r in done]
    ratios = [(r.seed, run_contention(r)) for r in done]
    clean = [budget_results(r, budget_steps) for r, (_, ratio) in zip(done, ratios) if ratio <= limit]
    results = [budget_results(r, budget_steps) for r in done]
    clean_evals = [r.evaluation for r, (_, ratio) in zip(done, ratios) if ratio <= limit]
    alignments = [e["alignment"] for e in evals if e.get("alignment")]  # type: ignore[union-attr]
    per_bucket = [bucket_bleu(r, refs, buckets) for r in done]
    return {
        "name": name,
        "overrides": overrides,
        "seeds": [r.seed for r in done],
        "missing_seeds": [r.seed for r in group if not r.finished],
        **{metric: spread([r.score(metric) for r in done]) for metric in SCORES},
        "valid_ppl": spread([best_valid_ppl(r) for r in done]),
        "parameters": evals[0]["parameters"] if evals else None,  # type: ignore[index]
        "steps": spread([res["steps"] for res in results]),  # type: ignore[index]
        "train_seconds": spread([train_seconds(res) for res in results]),  # type: ignore[arg-type]
        "wall_seconds": spread([res["wall_s"] for res in results]),  # type: ignore[index]
        "valid_seconds": spread([res.get("valid_s") for res in results]),  # type: ignore[union-attr]
        "train_cpu_seconds": spread([res.get("train_cpu_s") for res in results]),  # type: ignore[union-attr]
        "steps_per_s": spread([res["steps"] / train_seconds(res) if train_seconds(res) else None for res in clean]),
        "train_tokens_per_s": spread([res["train_tokens_per_s"] for res in clean]),
        "timed_out": sum(bool(res.get("timed_out")) for res in results),  # type: ignore[union-attr]
        "best_step": spread([e["checkpoint_step"] for e in evals]),  # type: ignore[index]
        "decode_sentences_per_s": spread([e["sentences_per_s"] for e in clean_evals]),
        "decode_sentences_per_cpu_s": spread([e.get("sentences_per_cpu_s") for e in clean_evals]),
        "train_tokens_per_cpu_s": spread(
            [
                r["train_tokens"] / r["train_cpu_s"] if r.get("train_cpu_s") and "train_tokens" in r else None
                for r in clean
            ]
        ),
        "contention": {
            "values": [ratio for _, ratio in ratios],
            "flagged": [(seed, ratio) for seed, ratio in ratios if ratio > limit],
        },
        "attention": {key: spread([e["attention"][key] for e in evals]) for key in ATTENTION},  # type: ignore[index]
        "alignment": {
            **{key: spread([a[key] for a in alignments]) for key in ALIGNMENT},
            "scored": [a.get("scored") for a in alignments],
            "skipped": [a.get("skipped") for a in alignments],
            "layer": sorted({a.get("layer") or "last, mean over heads" for a in alignments}),
        }
        if alignments
        else None,
        "alignment_by_layer": layer_means([e.get("alignment_by_layer") for e in evals]),  # type: ignore[union-attr]
        "length_bleu": [spread([b[k] for b in per_bucket]) for k in range(len(buckets))],
    }


CONDITIONS = (
    "threads",
    "precision",
    "batch_tokens",
    "accumulate",
    "budget_clock",
    "jobs",
    "device",
    "cpu",
)  # how a run trained
TRAINED = ("precision", "batch_tokens", "accumulate")  # the conditions that change what an update computes: under an
# update budget the others (threads, runs side by side, device, CPU, the clock) change a run's speed, not what it
# trained (the same updates on the same batches; only float rounding can differ between CPUs)
SPEED = tuple(key for key in CONDITIONS if key not in TRAINED)  # the conditions that change only a run's speed


def run_conditions(run: RunRecord, keys: tuple[str, ...] = CONDITIONS) -> list[tuple]:
    """The training conditions (`keys` of them) of each part of a run (a resumed run has several):
    RUN/conditions.json, else results.json."""
    results = run.results or {}
    parts = run.conditions or [{"threads": results.get("threads"), "precision": results.get("precision")}]
    # Records from before the precision was resolved say `auto`: results.json says what it became.
    parts = [{**p, "precision": results.get("precision", "auto")} if p.get("precision") == "auto" else p for p in parts]
    return [tuple(part.get(key) for key in keys) for part in parts]


def _odd_ones(done: list[RunRecord], keys: tuple[str, ...]) -> tuple[list[tuple], list[str]]:
    """The distinct conditions (`keys`) of the runs' parts, and the runs with a part unlike the most common."""
    conditions = sorted({c for r in done for c in run_conditions(r, keys)}, key=str)
    usual = max(conditions, key=lambda c: sum(c in run_conditions(r, keys) for r in done)) if conditions else None
    odd = [f"{r.variant} seed {r.seed}" for r in done if any(c != usual for c in run_conditions(r, keys))]
    return conditions, odd


def consistency(runs: list[RunRecord], extended: dict[str, int] | None = None, updates: bool = False) -> dict:
    """What must be equal across the finished runs for the comparison to be fair, with the values found. A variant
    in `extended` (variant -> its longer train.max_steps) had the shared budget in its first part. updates: the
    budget is a number of updates, so only the conditions in TRAINED must be equal ("conditions"); the others
    ("speed_conditions") change the runs' speed columns, not their scores."""
    extended = extended or {}
    done = [r for r in runs if r.finished]
    found = lambda get: sorted({get(r) for r in done}, key=str)  # noqa: E731
    conditions, other = _odd_ones(done, TRAINED if updates else CONDITIONS)
    speed, speed_other = _odd_ones(done, SPEED) if updates else ([], [])
    shared = {r.config.train.max_steps for r in done if r.config and r.variant not in extended}

    def steps(r: RunRecord) -> int:
        own = r.config.train.max_steps
        return next(iter(shared)) if r.variant in extended and own == extended[r.variant] and len(shared) == 1 else own

    return {
        "tokenizer_sha256": found(lambda r: r.evaluation["tokenizer_sha256"]),
        "test_sha256": found(lambda r: r.evaluation["test_sha256"]),
        "decode": found(lambda r: r.evaluation["decode"]),
        "signatures": {metric: found(lambda r, m=metric: r.evaluation["scores"][m]["signature"]) for metric in SCORES},
        "budget": found(
            lambda r: (
                (steps(r), r.config.train.max_time, r.config.train.max_epochs, r.config.train.budget_clock)
                if r.config
                else None
            )
        ),
        "conditions": [dict(zip(TRAINED if updates else CONDITIONS, c)) for c in conditions],
        "other_conditions": other,
        "speed_conditions": [dict(zip(SPEED, c)) for c in speed],
        "speed_other_conditions": speed_other,
        "updates": updates,
    }


def differences(check: dict) -> list[str]:
    """What the finished runs do not share (empty: the headline 'same data, tokenizer, budget, decoding' holds)."""
    names = {
        "tokenizer_sha256": "tokenizer",
        "test_sha256": "test set",
        "decode": "decoding settings",
        "budget": "training budget",
        "conditions": "training conditions ("
        + ("precision, batching" if check.get("updates") else "threads, precision, batching, runs side by side, CPU")
        + ")",
    }
    return [label for key, label in names.items() if len(check[key]) > 1]


def summarize(
    runs: dict[str, list[RunRecord]],
    overrides: dict[str, list[str]],
    baseline: str,
    test: TestData,
    bucket_count: int,
    samples: int,
    seed: int,
    extended: dict[str, int] | None = None,
    budget_steps: int | None = None,
    limit: float = 1.15,
) -> dict:
    """Everything the report shows, as plain values (results.json holds this)."""
    buckets = length_buckets(test.src, bucket_count)
    variants = [
        variant_summary(name, overrides[name], group, test.ref, buckets, budget_steps, limit)
        for name, group in runs.items()
    ]
    tests = significance(runs, baseline, test.ref, samples, seed)
    means = {v["name"]: v["bleu"]["mean"] for v in variants}
    for variant in variants:
        name = variant["name"]
        variant["delta_bleu"] = (
            means[name] - means[baseline]
            if name != baseline and None not in (means[name], means.get(baseline))
            else None
        )
        variant["significance"] = tests.tests.get(name)
        variant["significance_by_seed"] = tests.by_seed.get(name, {})
    return {
        "baseline": baseline,
        "variants": variants,
        "length_buckets": [{"words": label, "sentences": len(lines)} for label, lines in buckets],
        "bootstrap": {"samples": samples, "seed": seed, "alpha": ALPHA, "min_seeds": MIN_SEEDS, "notes": tests.notes},
        "consistency": consistency([r for group in runs.values() for r in group], extended, budget_steps is not None),
    }
