"""Is a BLEU difference real? Two tests, one for each source of variance, and Holm's correction across variants.

A comparison's number is "variant A's BLEU, averaged over its training seeds". It varies for two reasons:
the test sentences are a sample of the language, and a training seed is a sample of the runs one could
have trained. Each test below resamples exactly one of them.

1. **Paired cluster bootstrap over test sentences** (Koehn 2004's paired bootstrap, with the sentence as
   the unit: Efron & Tibshirani 1993, ch. 8). A draw picks N test sentences with replacement and takes
   every seed's output of each picked sentence, for both systems, so the outputs of one sentence over
   seeds (which are correlated) stay together. On each draw each system scores the mean over its seeds
   of corpus BLEU (from summed sacrebleu sufficient statistics, as sacrebleu scores a corpus), and the
   draw's delta is the difference of the two means. The 95% interval is the 2.5th-97.5th percentile of
   the draws' deltas; p is the two-sided bootstrap p-value of the null "no difference" (the draws shifted
   by the observed delta to be centred on 0, the share at least as far from 0 as the observed delta,
   counted as (k + 1) / (B + 1)).
   It holds the trained models fixed: it says whether *these* runs differ on sentences like these.
2. **Welch's t-test over seeds** (unequal variances; scipy.stats.ttest_ind), on the per-seed corpus BLEU
   of each system, with its 95% interval of the difference of means. It says whether the variants differ
   beyond training-seed noise, which is what "is variant A better than B" usually asks. It needs 3 or
   more seeds per system.

Across the k variants tested against one baseline, Holm-Bonferroni (Holm 1979) keeps the chance of any
false call at alpha: sort the p-values, the i-th smallest (from 0) must be below alpha / (k - i).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from sacrebleu.metrics import BLEU

ORDER = 4  # BLEU's n-gram order; a statistics row is [hyp len, ref len, correct 1..4, total 1..4]
MIN_SEEDS = 3  # per system, for the seed-level test


def sentence_stats(hyps: list[str], refs: list[str]) -> np.ndarray:
    """(N, 10) sacrebleu's BLEU sufficient statistics of each sentence (13a tokenization, mixed case)."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references")
    return np.asarray(BLEU()._extract_corpus_statistics(hyps, [refs]), dtype=np.float64).reshape(
        len(hyps), 2 + 2 * ORDER
    )


def bleu_from_stats(stats: np.ndarray) -> np.ndarray:
    """Corpus BLEU (sacrebleu's formula: exp smoothing, brevity penalty) of summed statistics (..., 10) -> (...)."""
    sys_len, ref_len = stats[..., 0], stats[..., 1]
    correct, total = stats[..., 2 : 2 + ORDER], stats[..., 2 + ORDER :]
    with np.errstate(divide="ignore", invalid="ignore"):
        zero = correct == 0
        halvings = np.cumsum(zero, axis=-1)  # the k-th order with no match gets 100 / (2^k total)
        precision = np.where(zero, 100.0 / (2.0**halvings * total), 100.0 * correct / total)
        log_mean = np.log(precision).mean(-1)
        bp = np.where(sys_len < ref_len, np.exp(1 - ref_len / np.where(sys_len > 0, sys_len, 1)), 1.0)
        score = bp * np.exp(log_mean)
    dead = (sys_len == 0) | (total == 0).any(-1) | ~(correct > 0).any(-1)
    return np.where(dead, 0.0, score)


def draw_weights(sentences: int, samples: int, seed: int) -> np.ndarray:
    """(samples, sentences): how often each test sentence is picked in each bootstrap draw."""
    picks = np.random.default_rng(seed).integers(0, sentences, size=(samples, sentences))
    return np.stack([np.bincount(row, minlength=sentences) for row in picks]).astype(np.float64)


@dataclass
class BootstrapResult:
    """The paired cluster bootstrap of one system against the baseline, on the seeds both have."""

    delta: float  # mean over seeds of the system's corpus BLEU minus the baseline's, on the full test set
    ci_low: float  # the 95% percentile interval of the delta over the draws
    ci_high: float
    p_value: float  # two-sided bootstrap p-value of "no difference"
    samples: int
    sentences: int
    seeds: list[int]

    def as_dict(self) -> dict:
        return asdict(self)


def mean_bleu(stats: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """stats (seeds, N, 10) -> the mean over seeds of corpus BLEU: a scalar, or (samples,) for weights (samples, N)."""
    if weights is None:
        return bleu_from_stats(stats.sum(1)).mean()
    return np.stack([bleu_from_stats(weights @ per_seed) for per_seed in stats]).mean(0)


def cluster_bootstrap(
    baseline: np.ndarray,
    system: np.ndarray,
    seeds: list[int],
    samples: int,
    seed: int,
    weights: np.ndarray | None = None,
) -> BootstrapResult:
    """baseline, system: (seeds, N, 10) statistics of each seed's output (the same seeds in the same order).

    `weights` (samples, N) may be given to reuse the same draws for every variant (draw_weights).
    """
    if seed <= 0:
        raise ValueError(f"bootstrap seed {seed}: expected a positive seed")
    sentences = baseline.shape[1]
    weights = draw_weights(sentences, samples, seed) if weights is None else weights
    observed = float(mean_bleu(system) - mean_bleu(baseline))
    draws = mean_bleu(system, weights) - mean_bleu(baseline, weights)  # (samples,)
    low, high = np.percentile(draws, [2.5, 97.5])
    beyond = int(np.sum(np.abs(draws - observed) >= abs(observed) - 1e-9))  # the draws shifted onto the null
    return BootstrapResult(
        observed, float(low), float(high), (beyond + 1) / (samples + 1), samples, sentences, list(seeds)
    )


@dataclass
class SeedTestResult:
    """Welch's t-test on per-seed BLEU: the system's seeds against the baseline's."""

    delta: float  # difference of the mean BLEU over seeds
    ci_low: float  # 95% Welch interval of that difference
    ci_high: float
    p_value: float
    t: float
    df: float
    seeds: int  # of the system
    baseline_seeds: int

    def as_dict(self) -> dict:
        return asdict(self)


def welch_test(baseline: list[float], system: list[float]) -> SeedTestResult | None:
    """Welch's t-test of mean(system) - mean(baseline); None with fewer than MIN_SEEDS seeds on either side."""
    if min(len(baseline), len(system)) < MIN_SEEDS:
        return None
    from scipy import stats

    delta = float(np.mean(system) - np.mean(baseline))
    if np.var(system) == 0 and np.var(baseline) == 0:  # no seed variance at all: the test is undefined
        same = delta == 0
        return SeedTestResult(
            delta,
            delta,
            delta,
            1.0 if same else 0.0,
            0.0 if same else math.copysign(math.inf, delta),
            float(len(system) + len(baseline) - 2),
            len(system),
            len(baseline),
        )
    result = stats.ttest_ind(system, baseline, equal_var=False)
    interval = result.confidence_interval(0.95)
    return SeedTestResult(
        delta,
        float(interval.low),
        float(interval.high),
        float(result.pvalue),
        float(result.statistic),
        float(result.df),
        len(system),
        len(baseline),
    )


def holm(p_values: dict[str, float], alpha: float) -> dict[str, bool]:
    """Holm-Bonferroni: which of these hypotheses are rejected with the family-wise error rate held at alpha."""
    rejected: dict[str, bool] = dict.fromkeys(p_values, False)
    for rank, (name, p) in enumerate(sorted(p_values.items(), key=lambda item: item[1])):
        if p >= alpha / (len(p_values) - rank):
            break  # this one and every larger p are kept
        rejected[name] = True
    return rejected


def smallest_bootstrap_p(samples: int) -> float:
    """The smallest p-value the bootstrap can give with this many draws."""
    return 1 / (samples + 1)
