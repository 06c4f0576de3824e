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

The declared claims (nmt/compare/claims.py) use the same two sources of variance for other questions:
a margin (non-inferiority: one-sided tests against -margin, by the bootstrap's draws and by Welch's t), a
difference of differences (the cluster bootstrap of four systems, or of two systems in two length strata; and
the generalised Welch test of a linear contrast of seed means), the seeds' variances (the F test), counts of
troubled runs (Fisher's exact test), and timings (Welch's t on log times, reported as a ratio).
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


# --- the declared claims' tests (nmt/compare/claims.py) ------------------------------------------------------------


def holm_adjusted(p_values: dict[str, float]) -> dict[str, float]:
    """Holm-adjusted p: max over the j <= i smallest of min(1, (k - j) p_(j)); below alpha where holm rejects."""
    adjusted, running = {}, 0.0
    for rank, (name, p) in enumerate(sorted(p_values.items(), key=lambda item: item[1])):
        running = max(running, min(1.0, (len(p_values) - rank) * p))
        adjusted[name] = running
    return adjusted


def bootstrap_p(draws: np.ndarray, observed: float, null: float = 0.0, alternative: str = "two-sided") -> float:
    """The bootstrap p-value of H0: theta = null ("two-sided"), theta <= null ("greater") or theta >= null ("less").

    The draws are shifted to centre on the null (draw - observed + null); p is the share of shifted draws at least as
    far from the null as the observed value, in the alternative's direction, counted as (k + 1) / (B + 1) (Davison &
    Hinkley 1997, sec. 4.4). Ties count as beyond (the conservative side).
    """
    shift, gap = draws - observed, observed - null  # shifted draw - null = shift; observed - null = gap
    if alternative == "two-sided":
        beyond = np.abs(shift) >= abs(gap) - 1e-9
    elif alternative == "greater":
        beyond = shift >= gap - 1e-9
    elif alternative == "less":
        beyond = shift <= gap + 1e-9
    else:
        raise ValueError(f"alternative={alternative!r}: expected two-sided, greater or less")
    return (int(beyond.sum()) + 1) / (draws.size + 1)


def contrast_draws(
    systems: list[np.ndarray], coefficients: list[float], weights: np.ndarray
) -> tuple[float, np.ndarray]:
    """sum_i c_i * (mean over seeds of corpus BLEU of system i), on the test set and on each draw: (value, (samples,)).

    systems: each (seeds, N, 10) statistics over the same N sentences (the seeds may differ between systems); a draw
    (a row of weights, draw_weights) picks the sentences once for every system, all seeds of a sentence together.
    """
    observed = float(sum(c * mean_bleu(s) for c, s in zip(coefficients, systems)))
    draws = np.sum([c * mean_bleu(s, weights) for c, s in zip(coefficients, systems)], axis=0)
    return observed, draws


def did_bootstrap(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    d: np.ndarray,
    seeds: list[int],
    samples: int,
    seed: int,
    weights: np.ndarray | None = None,
    strata: bool = False,
) -> BootstrapResult:
    """Cluster bootstrap over test sentences of a difference in differences, (A - B) - (C - D), of mean-over-seeds BLEU.

    a, b, c, d: (seeds, N, 10) statistics. strata=False: all four over the same N sentences, and a draw resamples
    them once for all four (`weights` may be given to share draws). strata=True: a, b over one set of sentences and
    c, d over another (e.g. one pair of variants on the longest and on the shortest sources), each stratum resampled
    within itself, independently (a stratified bootstrap). Interval: the 2.5-97.5th percentiles of the draws; p: the
    two-sided bootstrap p of "no difference in differences" (bootstrap_p).
    """
    if seed <= 0:
        raise ValueError(f"bootstrap seed {seed}: expected a positive seed")
    if strata:
        first = contrast_draws([a, b], [1.0, -1.0], draw_weights(a.shape[1], samples, seed))
        second = contrast_draws([c, d], [1.0, -1.0], draw_weights(c.shape[1], samples, seed + 1))
        observed, draws = first[0] - second[0], first[1] - second[1]
        sentences = a.shape[1] + c.shape[1]
    else:
        weights = draw_weights(a.shape[1], samples, seed) if weights is None else weights
        observed, draws = contrast_draws([a, b, c, d], [1.0, -1.0, -1.0, 1.0], weights)
        sentences = a.shape[1]
    low, high = np.percentile(draws, [2.5, 97.5])
    return BootstrapResult(
        observed, float(low), float(high), bootstrap_p(draws, observed), samples, sentences, list(seeds)
    )


@dataclass
class MarginResult:
    """One-sided tests of a difference (system - baseline) against -margin: above it (non-inferior) or below it."""

    delta: float
    lower: float  # the one-sided 95% lower bound of the difference
    upper: float  # the one-sided 95% upper bound
    p_above: float  # H0: delta <= -margin; rejected: the system loses less than the margin
    p_below: float  # H0: delta >= -margin; rejected: the system loses more than the margin
    margin: float
    t: float | None = None  # the seed test's t of (delta + margin) / se and its Welch-Satterthwaite df
    df: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def non_inferiority_bootstrap(
    baseline: np.ndarray, system: np.ndarray, margin: float, samples: int, seed: int, weights: np.ndarray | None = None
) -> MarginResult:
    """Non-inferiority by the paired cluster bootstrap over test sentences (baseline, system: (seeds, N, 10)).

    The draws of the delta (as cluster_bootstrap's), shifted to centre on -margin, give the one-sided p-values
    (bootstrap_p, (k + 1) / (B + 1)); the one-sided 95% bounds are the basic (reflected) bootstrap's, delta minus the
    95th and 5th percentiles of (draw - delta), so that p_above < 0.05 where lower > -margin, as the p-values count.
    """
    if seed <= 0:
        raise ValueError(f"bootstrap seed {seed}: expected a positive seed")
    weights = draw_weights(baseline.shape[1], samples, seed) if weights is None else weights
    observed, draws = contrast_draws([system, baseline], [1.0, -1.0], weights)
    spread_low, spread_high = np.percentile(draws - observed, [5.0, 95.0])
    return MarginResult(
        observed,
        float(observed - spread_high),
        float(observed - spread_low),
        bootstrap_p(draws, observed, -margin, "greater"),
        bootstrap_p(draws, observed, -margin, "less"),
        margin,
    )


@dataclass
class ContrastResult:
    """A linear contrast of independent group means, sum_i c_i mean_i, with Welch's standard error and df."""

    estimate: float
    ci_low: float  # the 95% interval
    ci_high: float
    p_value: float  # two-sided, of "the contrast is 0"
    t: float
    df: float
    se: float
    sizes: list[int]

    def as_dict(self) -> dict:
        return asdict(self)


def contrast_test(groups: list[list[float]], coefficients: list[float]) -> ContrastResult:
    """The generalised Welch test of L = sum_i c_i mean_i over independent groups (e.g. training seeds per variant).

    Assumes each group's values are independent draws from a normal distribution with its own variance.
    se^2 = sum_i c_i^2 s_i^2 / n_i; df = se^4 / sum_i (c_i^2 s_i^2 / n_i)^2 / (n_i - 1) (Welch-Satterthwaite);
    t = L / se, p two-sided from Student's t with df. Two groups with c = (1, -1) give Welch's t-test. With no
    variance in any group the test is undefined: p is 1 for L = 0, else 0.
    """
    from scipy import stats

    if len(groups) != len(coefficients) or any(len(g) < 2 for g in groups):
        sizes = [len(g) for g in groups]
        raise ValueError(f"contrast_test: {len(coefficients)} coefficients for groups of sizes {sizes}; 2+ values each")
    sizes = [len(g) for g in groups]
    estimate = float(sum(c * np.mean(g) for c, g in zip(coefficients, groups)))
    parts = [c * c * np.var(g, ddof=1) / len(g) for c, g in zip(coefficients, groups)]  # c_i^2 s_i^2 / n_i
    se = float(math.sqrt(sum(parts)))
    if se == 0:
        same = estimate == 0
        df = float(sum(n - 1 for n in sizes))
        t = 0.0 if same else math.copysign(math.inf, estimate)
        return ContrastResult(estimate, estimate, estimate, 1.0 if same else 0.0, t, df, 0.0, sizes)
    df = float(se**4 / sum(part**2 / (n - 1) for part, n in zip(parts, sizes)))
    t = estimate / se
    half = float(stats.t.ppf(0.975, df)) * se
    return ContrastResult(
        estimate, estimate - half, estimate + half, float(2 * stats.t.sf(abs(t), df)), t, df, se, sizes
    )


def non_inferiority_welch(baseline: list[float], system: list[float], margin: float) -> MarginResult | None:
    """Non-inferiority by Welch's t over seeds: t = (delta + margin) / se with Welch-Satterthwaite df, one-sided.

    p_above = P(T >= t) tests H0: delta <= -margin; p_below = P(T <= t) tests H0: delta >= -margin; the one-sided 95%
    bounds are delta -/+ t_0.95(df) se. Assumes normal seed scores. None with fewer than MIN_SEEDS seeds a side.
    """
    if min(len(baseline), len(system)) < MIN_SEEDS:
        return None
    from scipy import stats

    found = contrast_test([system, baseline], [1.0, -1.0])
    delta, se, df = found.estimate, found.se, found.df
    if se == 0:
        above = delta > -margin
        return MarginResult(delta, delta, delta, 0.0 if above else 1.0, 1.0 if above else 0.0, margin, None, df)
    t = (delta + margin) / se
    half = float(stats.t.ppf(0.95, df)) * se
    return MarginResult(
        delta, delta - half, delta + half, float(stats.t.sf(t, df)), float(stats.t.cdf(t, df)), margin, t, df
    )


@dataclass
class VarianceResult:
    """The F test of two samples' variances: ratio = s_B^2 / s_A^2 (above 1: A varies less)."""

    ratio: float
    ci_low: float  # the 95% interval of sigma_B^2 / sigma_A^2
    ci_high: float
    p_greater: float  # H0: sigma_B^2 <= sigma_A^2; rejected: A varies less
    p_less: float  # H0: sigma_B^2 >= sigma_A^2; rejected: A varies more
    dfn: int  # n_B - 1
    dfd: int  # n_A - 1
    critical: float  # the smallest ratio this test calls (one-sided, at alpha): what these seeds can detect
    alpha: float

    def as_dict(self) -> dict:
        return asdict(self)


def variance_ratio_test(a: list[float], b: list[float], alpha: float = 0.05) -> VarianceResult | None:
    """F = s_B^2 / s_A^2 against F(n_B - 1, n_A - 1): one-sided p-values each way, and the critical ratio at alpha.

    Assumes normal scores: the F test is very sensitive to heavier tails (a single outlying seed can make it call a
    difference; Box 1953), so read it with the troubled-run counts. None with fewer than MIN_SEEDS values a side, or
    when a side has no variance at all (the ratio is then undefined).
    """
    if min(len(a), len(b)) < MIN_SEEDS:
        return None
    var_a, var_b = float(np.var(a, ddof=1)), float(np.var(b, ddof=1))
    if var_a == 0 or var_b == 0:
        return None
    from scipy import stats

    dfn, dfd = len(b) - 1, len(a) - 1
    ratio = var_b / var_a
    return VarianceResult(
        ratio,
        ratio / float(stats.f.ppf(0.975, dfn, dfd)),
        ratio / float(stats.f.ppf(0.025, dfn, dfd)),
        float(stats.f.sf(ratio, dfn, dfd)),
        float(stats.f.cdf(ratio, dfn, dfd)),
        dfn,
        dfd,
        float(stats.f.isf(alpha, dfn, dfd)),
        alpha,
    )


@dataclass
class RatioResult:
    """Welch's t-test on log values: the ratio of geometric means A / B with its 95% interval."""

    ratio: float
    ci_low: float
    ci_high: float
    p_value: float  # two-sided, of "the ratio is 1"
    t: float
    df: float
    sizes: list[int]

    def as_dict(self) -> dict:
        return asdict(self)


def log_ratio_test(a: list[float], b: list[float]) -> RatioResult:
    """Welch's t-test of mean log(a) - mean log(b) (independent repeated timings; assumes log-normal ones), reported
    as exp of the difference and of its 95% interval. Needs 2+ positive values a side."""
    found = contrast_test([np.log(a).tolist(), np.log(b).tolist()], [1.0, -1.0])
    return RatioResult(
        math.exp(found.estimate),
        math.exp(found.ci_low),
        math.exp(found.ci_high),
        found.p_value,
        found.t,
        found.df,
        found.sizes,
    )


def fisher_counts(troubled_a: int, runs_a: int, troubled_b: int, runs_b: int) -> tuple[float, float]:
    """Fisher's exact test of two counts of troubled runs: the one-sided p that A's share is lower than B's, and higher.

    Conditions on the margins of the 2x2 table (troubled or not, A or B): exact for any number of runs.
    """
    from scipy import stats

    table = [[troubled_a, runs_a - troubled_a], [troubled_b, runs_b - troubled_b]]
    return float(stats.fisher_exact(table, alternative="less").pvalue), float(
        stats.fisher_exact(table, alternative="greater").pvalue
    )
