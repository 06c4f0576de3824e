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
from nmt.evaluation.metrics import corpus_score
from nmt.evaluation.significance import paired_bootstrap

SCORES = ("bleu", "chrf", "ter", "bleu_lc")
ATTENTION = ("entropy", "max_weight", "coverage", "under_attended", "over_attended", "p_t_diagonal_distance")
ALIGNMENT = ("aer", "precision", "recall")
ALPHA = 0.05  # a difference is called significant when the paired bootstrap's p-value is below this (and its interval excludes 0)


def significant(result) -> bool:
    """p < ALPHA and a 95% interval without 0: sacrebleu gives identical outputs p = 1/(samples + 1), their delta 0 on every draw."""
    return result.p_value < ALPHA and (result.ci_low > 0 or result.ci_high < 0)


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


@dataclass
class Significance:
    """Paired bootstrap of each variant against the baseline, seeds pooled and seed by seed."""

    signature: str
    pooled: dict[str, dict]
    by_seed: dict[str, dict[int, dict]]


def significance(runs: dict[str, list[RunRecord]], baseline: str, refs: list[str], samples: int, seed: int) -> Significance:
    """Each variant's test output against the baseline's, on the seeds both finished.

    Pooled: the outputs of all those seeds laid end to end (the same seed's baseline output beside each),
    so a draw resamples (sentence, seed) pairs; by seed: one test per seed.
    """
    finished = {name: {r.seed: r.hyps for r in group if r.finished} for name, group in runs.items()}
    base = finished.get(baseline, {})
    common = {name: tuple(s for s in outputs if s in base) for name, outputs in finished.items() if name != baseline}
    signature, pooled, by_seed = "", {}, {name: {} for name, seeds in common.items() if seeds}
    for seeds in sorted(set(common.values()) - {()}):  # one test per set of seeds, all variants with that set at once
        names = [name for name, s in common.items() if s == seeds]
        signature, results = paired_bootstrap([h for s in seeds for h in base[s]], {n: [h for s in seeds for h in finished[n][s]] for n in names},
                                              refs * len(seeds), samples, seed)
        pooled |= {n: {**results[n].as_dict(), "seeds": list(seeds), "significant": significant(results[n])} for n in names}
    for s in base:
        names = [name for name, seeds in common.items() if s in seeds]
        _, results = paired_bootstrap(base[s], {n: finished[n][s] for n in names}, refs, samples, seed)
        for n in names:
            by_seed[n][s] = {**results[n].as_dict(), "significant": significant(results[n])}
    return Significance(signature, pooled, by_seed)


def bucket_bleu(run: RunRecord, refs: list[str], buckets: list[tuple[str, list[int]]]) -> list[float]:
    """sacrebleu BLEU of a run's test output in each length bucket."""
    hyps = run.hyps or []
    return [corpus_score("bleu", [hyps[i] for i in lines], [refs[i] for i in lines]).score for _, lines in buckets]


def best_valid_ppl(run: RunRecord) -> float | None:
    """Validation perplexity at the step of the checkpoint that was scored (best.pt), from train.log."""
    point = run.curve.at_step(run.evaluation["checkpoint_step"]) if run.evaluation else None
    return point[3] if point else None


def variant_summary(name: str, overrides: list[str], group: list[RunRecord], refs: list[str], buckets: list[tuple[str, list[int]]]) -> dict:
    """One variant's figures over its finished seeds."""
    done = [r for r in group if r.finished]
    evals = [r.evaluation for r in done]
    results = [r.results for r in done]
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
        "train_seconds": spread([res["wall_s"] for res in results]),  # type: ignore[index]
        "steps_per_s": spread([res["steps"] / res["wall_s"] if res["wall_s"] else None for res in results]),  # type: ignore[index]
        "train_tokens_per_s": spread([res["train_tokens_per_s"] for res in results]),  # type: ignore[index]
        "timed_out": sum(bool(res.get("timed_out")) for res in results),  # type: ignore[union-attr]
        "best_step": spread([e["checkpoint_step"] for e in evals]),  # type: ignore[index]
        "decode_sentences_per_s": spread([e["sentences_per_s"] for e in evals]),  # type: ignore[index]
        "attention": {key: spread([e["attention"][key] for e in evals]) for key in ATTENTION},  # type: ignore[index]
        "alignment": {key: spread([a[key] for a in alignments]) for key in ALIGNMENT} if alignments else None,
        "length_bleu": [spread([b[k] for b in per_bucket]) for k in range(len(buckets))],
    }


def consistency(runs: list[RunRecord]) -> dict:
    """What must be equal across the finished runs for the comparison to be fair, with the values found."""
    done = [r for r in runs if r.finished]
    found = lambda get: sorted({get(r) for r in done})  # noqa: E731
    return {
        "tokenizer_sha256": found(lambda r: r.evaluation["tokenizer_sha256"]),
        "test_sha256": found(lambda r: r.evaluation["test_sha256"]),
        "decode": found(lambda r: r.evaluation["decode"]),
        "signatures": {metric: found(lambda r, m=metric: r.evaluation["scores"][m]["signature"]) for metric in SCORES},
        "budget": found(lambda r: (r.config.train.max_steps, r.config.train.max_time, r.config.train.max_epochs) if r.config else None),
    }


def summarize(runs: dict[str, list[RunRecord]], overrides: dict[str, list[str]], baseline: str, test: TestData,
              bucket_count: int, samples: int, seed: int) -> dict:
    """Everything the report shows, as plain values (results.json holds this)."""
    buckets = length_buckets(test.src, bucket_count)
    variants = [variant_summary(name, overrides[name], group, test.ref, buckets) for name, group in runs.items()]
    tests = significance(runs, baseline, test.ref, samples, seed)
    for variant in variants:
        variant["significance"] = tests.pooled.get(variant["name"])
        variant["significance_by_seed"] = tests.by_seed.get(variant["name"], {})
    return {
        "baseline": baseline,
        "variants": variants,
        "length_buckets": [{"words": label, "sentences": len(lines)} for label, lines in buckets],
        "bootstrap": {"signature": tests.signature, "samples": samples, "seed": seed},
        "consistency": consistency([r for group in runs.values() for r in group]),
    }
