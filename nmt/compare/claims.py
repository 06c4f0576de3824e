"""A comparison's declared claims (nmt.config.ClaimSpec), each decided by tests of its kind, Holm-corrected by family.

A verdict is one of "supported", "not supported", "cannot tell" ("not run" when a variant of the claim has no
finished run). Quality is judged at the full shared budget on two sources of variance, each with its own test
(nmt.evaluation.significance): the test sentences (a cluster bootstrap: a draw picks sentences, every seed's output
of a picked sentence goes with it) and the training seeds (Welch's t, or its generalisation to a contrast of means).

- better: A - B, the paired cluster bootstrap (on the seeds both finished) and Welch's t over per-seed BLEU.
- non_inferior: A - B against -margin, one-sided, by the bootstrap's draws and by Welch's t with the shifted null.
- interaction: (A - B) - (C - D), the bootstrap resampling sentences once for all four systems (on the seeds all four
  finished) and the generalised Welch test of the contrast of the four seed means.
- long_range: (A - B on the longest-source bucket) - (A - B on the shortest), the bootstrap stratified by bucket and
  Welch's t on each run's BLEU(longest) - BLEU(shortest).
- stability: the F test of the seeds' variances (one-sided) and Fisher's exact test on the counts of troubled runs
  (updates skipped for non-finite values, or stopped by them).
- cheaper: isolated measurements only, never the comparison's runs: Welch's t on log times at the longest length of
  the claim's cost curves (scripts/bench_attention.py --json) when it names curves, else on log updates/s of the
  clean speed probes (nmt-compare probe=true) of one CPU model.

Each claim's result holds every test's estimate, interval, raw p, Holm-adjusted p and call, the evidence without a
test (Δ at each budget point, A - B by length bucket, cost-curve growth, the F test's detectable ratio), and `why`.
A test "calls" a direction when Holm's correction over its family rejects its null at alpha: the quality claims'
sentence-level p-values form one family and their seed-level p-values another (each test corrected on its own, as
nmt.compare.summary does for variants), the stability tests a third, the cost tests a fourth. A one-sided pair
(non-inferiority, variances, Fisher) enters the family with the p of the side its estimate lies on.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

import numpy as np

from nmt.compare.collect import RunRecord, TestData
from nmt.compare.summary import length_buckets
from nmt.config import ClaimSpec
from nmt.evaluation.significance import (
    MIN_SEEDS,
    ContrastResult,
    MarginResult,
    RatioResult,
    bleu_from_stats,
    cluster_bootstrap,
    contrast_test,
    did_bootstrap,
    draw_weights,
    fisher_counts,
    holm,
    holm_adjusted,
    log_ratio_test,
    non_inferiority_bootstrap,
    non_inferiority_welch,
    sentence_stats,
    variance_ratio_test,
    welch_test,
)

ALPHA = 0.05
SUPPORTED, NOT_SUPPORTED, CANNOT_TELL, NOT_RUN = "supported", "not supported", "cannot tell", "not run"
QUALITY = ("better", "non_inferior", "interaction", "long_range")
FAMILIES = {  # family -> what it holds
    "sentence": "quality claims, sentence level (cluster bootstrap over test sentences)",
    "seeds": "quality claims, seed level (Welch's t and its generalisation over training seeds)",
    "stability": "stability claims (F tests of seed variances, Fisher's tests of troubled runs)",
    "cost": "cost claims (Welch's t on log timings)",
}
NON_FINITE = "non-finite loss or gradient"  # what train.log says of a skipped update (nmt.training.trainer)
RULES = {  # kind -> (what "supported" means, what "not supported" means)
    "better": (
        "both the sentence bootstrap and the seed test call A ahead of B",
        "both call B ahead of A",
    ),
    "non_inferior": (
        "both one-sided tests reject 'A - B <= -margin' (A loses less than the margin)",
        "both reject 'A - B >= -margin' (A loses more than the margin)",
    ),
    "interaction": (
        "both the four-system bootstrap and the seed contrast call (A - B) - (C - D) above 0",
        "both call it below 0",
    ),
    "long_range": (
        "both the stratified bootstrap and the seed test call (A - B)(longest) - (A - B)(shortest) above 0",
        "both call it below 0",
    ),
    "stability": (
        "the F test calls A's seed variance lower, or Fisher's test A's troubled runs fewer, and neither the reverse",
        "one of them calls the reverse and neither calls A more stable",
    ),
    "cheaper": (
        "the timing test calls A faster (time A/B below 1; from the cost curves when the claim names them)",
        "it calls A slower",
    ),
}


@dataclass
class Inputs:
    """What every claim reads: finished runs per variant and seed, the test set, the bootstrap settings."""

    runs: dict[str, list[RunRecord]]
    test: TestData
    samples: int
    seed: int
    buckets: int
    alpha: float
    weights: np.ndarray | None
    cache: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)

    def finished(self, variant: str) -> dict[int, RunRecord]:
        return {r.seed: r for r in self.runs.get(variant, []) if r.finished}

    def stats(self, variant: str, seeds: list[int], lines: list[int] | None = None) -> np.ndarray:
        """(seeds, N, 10) sentence statistics of the variant's test output (only `lines`, if given)."""
        for s in seeds:
            if (variant, s) not in self.cache:
                self.cache[variant, s] = sentence_stats(self.finished(variant)[s].hyps, self.test.ref)
        found = np.stack([self.cache[variant, s] for s in seeds])
        return found if lines is None else found[:, lines]

    def scores(self, variant: str) -> list[float]:
        return [r.score("bleu") for r in self.finished(variant).values()]

    def common(self, *variants: str) -> list[int]:
        return sorted(set.intersection(*(set(self.finished(v)) for v in variants)))


DELTA, DID = "Δ BLEU (A - B)", "DiD BLEU"
TEST_KEYS = ("test", "family", "statistic", "estimate", "ci_low", "ci_high", "interval", "p", "direction", "details")


@dataclass
class Found:
    """One claim's tests (before Holm's correction), why a test could not run, and evidence without a test."""

    tests: list[dict] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)


def sign(value: float) -> int:
    return int(value > 0) - int(value < 0)


def entry(label, family, statistic, estimate, bounds, p, direction, details, interval="95%") -> dict:
    """One test's figures; direction +1 when the estimate lies on the claimed side of the null, -1 against.
    family None: evidence, in no Holm family."""
    return dict(zip(TEST_KEYS, (label, family, statistic, estimate, *bounds, interval, p, direction, details)))


def difference(label: str, family: str, statistic: str, r) -> dict:
    """A two-sided test of a difference claimed above 0 (BootstrapResult, SeedTestResult, ContrastResult)."""
    estimate = r.estimate if isinstance(r, ContrastResult) else r.delta
    return entry(label, family, statistic, estimate, (r.ci_low, r.ci_high), r.p_value, sign(estimate), r.as_dict())


def margin(label: str, family: str, r: MarginResult) -> dict:
    """A one-sided pair against -margin: it enters Holm with the p of the side the estimate lies on."""
    above = r.p_above <= r.p_below
    bounds, p = (r.lower, r.upper), min(r.p_above, r.p_below)
    return entry(label, family, DELTA, r.delta, bounds, p, 1 if above else -1, r.as_dict(), "one-sided 95% bounds")


def ratio(label: str, family: str | None, statistic: str, r: RatioResult, claimed: int) -> dict:
    """A ratio test; claimed +1 when a ratio above 1 is the claimed side, -1 when below."""
    direction = claimed * sign(math.log(r.ratio))
    return entry(label, family, statistic, r.ratio, (r.ci_low, r.ci_high), r.p_value, direction, r.as_dict())


def few_seeds(given: Inputs, *variants: str) -> str:
    counts = ", ".join(f"{v} {len(given.finished(v))}" for v in variants)
    return f"fewer than {MIN_SEEDS} finished seeds on a side ({counts}): no seed test"


def no_common(*variants: str) -> str:
    return f"no seed finished by all of {', '.join(variants)}: no sentence bootstrap"


def better_tests(claim: ClaimSpec, given: Inputs, found: Found) -> None:
    """A - B (better: two-sided; non_inferior: against -margin): the paired cluster bootstrap on the seeds both
    finished, and Welch's t over all finished seeds."""
    if claim.kind == "non_inferior":
        found.evidence.append(f"margin {claim.margin:g} BLEU, stated before the runs")
    common = given.common(claim.a, claim.b)
    if common:
        a, b = given.stats(claim.a, common), given.stats(claim.b, common)
        if claim.kind == "better":
            boot = cluster_bootstrap(b, a, common, given.samples, given.seed, given.weights)
            found.tests.append(difference("sentence bootstrap", "sentence", DELTA, boot))
        else:
            boot = non_inferiority_bootstrap(b, a, claim.margin, given.samples, given.seed, given.weights)
            found.tests.append(margin("sentence bootstrap", "sentence", boot))
    else:
        found.missing.append(no_common(claim.a, claim.b))
    base, system = given.scores(claim.b), given.scores(claim.a)
    seeds = welch_test(base, system) if claim.kind == "better" else non_inferiority_welch(base, system, claim.margin)
    if seeds is None:
        found.missing.append(few_seeds(given, claim.a, claim.b))
    elif claim.kind == "better":
        found.tests.append(difference("seed Welch t", "seeds", DELTA, seeds))
    else:
        found.tests.append(margin("seed Welch t", "seeds", seeds))


def interaction_tests(claim: ClaimSpec, given: Inputs, found: Found) -> None:
    """(A - B) - (C - D): the bootstrap over sentences (one draw for all four), the seeds' generalised Welch test."""
    names = claim.variants()
    common = given.common(*names)
    if common:
        boot = did_bootstrap(*(given.stats(v, common) for v in names), common, given.samples, given.seed, given.weights)
        found.tests.append(difference("sentence bootstrap", "sentence", DID, boot))
    else:
        found.missing.append(no_common(*names))
    weights: dict[str, int] = {}  # a variant named twice (e.g. (A - B) - (A - C)) is one group of seeds
    for name, weight in zip(names, (1, -1, -1, 1)):
        weights[name] = weights.get(name, 0) + weight
    groups = [given.scores(v) for v in weights]
    if min(len(g) for g in groups) < MIN_SEEDS:
        found.missing.append(few_seeds(given, *weights))
    else:
        contrast = contrast_test(groups, list(weights.values()))
        found.tests.append(difference("seed contrast (Welch)", "seeds", DID, contrast))


def bucket_gap(given: Inputs, variant: str, long: list[int], short: list[int]) -> list[float]:
    """Each finished run's corpus BLEU on the longest-source bucket minus on the shortest."""
    seeds = sorted(given.finished(variant))
    gap = bleu_from_stats(given.stats(variant, seeds, long).sum(1)) - bleu_from_stats(
        given.stats(variant, seeds, short).sum(1)
    )
    return gap.tolist()


def long_range_tests(claim: ClaimSpec, given: Inputs, found: Found) -> None:
    """(A - B)(longest bucket) - (A - B)(shortest): a bootstrap stratified by bucket, Welch's t on per-run gaps."""
    buckets = length_buckets(given.test.src, given.buckets)
    if len(buckets) < 2:
        found.missing.append("the test set has a single source-length bucket: nothing to compare")
        return
    (short_label, short), (long_label, long) = buckets[0], buckets[-1]
    common = given.common(claim.a, claim.b)
    if common:
        a, b = given.stats(claim.a, common), given.stats(claim.b, common)
        boot = did_bootstrap(
            a[:, long], b[:, long], a[:, short], b[:, short], common, given.samples, given.seed, strata=True
        )
        found.tests.append(difference("sentence bootstrap (by bucket)", "sentence", DID, boot))
        gap = lambda lines: float(
            bleu_from_stats(a[:, lines].sum(1)).mean() - bleu_from_stats(b[:, lines].sum(1)).mean()
        )
        gaps = ", ".join(f"{label} (n={len(lines)}) {gap(lines):+.2f}" for label, lines in buckets)
        found.evidence.append(f"A - B by source length in words (seeds {', '.join(map(str, common))}): {gaps}")
    else:
        found.missing.append(no_common(claim.a, claim.b))
    seeds = welch_test(bucket_gap(given, claim.b, long, short), bucket_gap(given, claim.a, long, short))
    if seeds is None:
        found.missing.append(few_seeds(given, claim.a, claim.b))
    else:
        found.tests.append(difference("seed Welch t (by bucket)", "seeds", DID, seeds))
    found.evidence.append(
        f"longest bucket {long_label} words ({len(long)} lines), shortest {short_label} ({len(short)})"
    )


def troubled(run: RunRecord) -> bool | None:
    """True: the run skipped updates for a non-finite loss or gradient, or stopped for them; False: it trained
    cleanly; None: it has not finished training (not counted)."""
    if run.results is not None:
        return run.results.get("skipped_updates", 0) > 0  # results.json from before the guard has no count
    log = run.run_dir / "train.log"
    return True if log.is_file() and NON_FINITE in log.read_text(encoding="utf-8", errors="replace") else None


def stability_tests(claim: ClaimSpec, given: Inputs, found: Found) -> None:
    """The F test of seed variances (A's lower: claimed) and Fisher's exact test on troubled-run counts."""
    counted = [[t for r in given.runs.get(v, []) if (t := troubled(r)) is not None] for v in (claim.a, claim.b)]
    (bad_a, n_a), (bad_b, n_b) = ((sum(c), len(c)) for c in counted)
    scores = [given.scores(v) for v in (claim.a, claim.b)]
    sd = [f"{statistics.stdev(s):.2f} ({len(s)} seeds)" if len(s) > 1 else "n/a" for s in scores]
    found.evidence.append(
        f"seed s.d. of BLEU: A {sd[0]}, B {sd[1]}; troubled runs (updates skipped or stopped for non-finite values): "
        f"A {bad_a}/{n_a}, B {bad_b}/{n_b}"
    )
    if min(n_a, n_b) < MIN_SEEDS:
        found.missing.append(f"fewer than {MIN_SEEDS} trained runs on a side: neither test is run")
        return
    r = variance_ratio_test(*scores, given.alpha)
    if r is None:
        found.missing.append(f"no F test: fewer than {MIN_SEEDS} scored seeds on a side, or a side without variance")
    else:
        bounds, p, direction = (r.ci_low, r.ci_high), min(r.p_greater, r.p_less), 1 if r.p_greater <= r.p_less else -1
        found.tests.append(
            entry("F test of seed variances", "stability", "s_B²/s_A²", r.ratio, bounds, p, direction, r.as_dict())
        )
        found.evidence.append(
            f"with {r.dfd + 1} and {r.dfn + 1} seeds the F test calls (one-sided, alpha {r.alpha}) only a variance "
            f"ratio above {r.critical:.1f}"
        )
    if bad_a / n_a != bad_b / n_b:
        fewer, more = fisher_counts(bad_a, n_a, bad_b, n_b)
        details = {"a": [bad_a, n_a], "b": [bad_b, n_b], "p_fewer": fewer, "p_more": more}
        share, p, direction = bad_a / n_a - bad_b / n_b, min(fewer, more), 1 if fewer <= more else -1
        label, statistic = "Fisher, troubled runs", "share troubled A - B"
        found.tests.append(entry(label, "stability", statistic, share, (None, None), p, direction, details, None))


def clean_probes(probes: list[dict]) -> tuple[str | None, dict[str, list[float]]]:
    """The CPU with the most uncontended probes, and each variant's updates/s on it."""
    for k, probe in enumerate(probes):
        for key in ("variant", "updates_per_s", "cpu", "contended"):
            if key not in probe:
                raise ValueError(f"probes[{k}]: no '{key}'; expected nmt-compare's probes.json records")
    clean = [p for p in probes if not p["contended"]]
    cpus = [p["cpu"] for p in clean]
    chosen = max(sorted(set(cpus)), key=cpus.count) if cpus else None
    speeds: dict[str, list[float]] = {}
    for probe in clean:
        if probe["cpu"] == chosen:
            speeds.setdefault(probe["variant"], []).append(float(probe["updates_per_s"]))
    return chosen, speeds


def probe_test(claim: ClaimSpec, probes: list[dict], family: str | None, found: Found) -> None:
    """Welch's t on log updates/s of A's and B's clean probes (one CPU model): the speed ratio A/B."""
    cpu, speeds = clean_probes(probes)
    short = [v for v in (claim.a, claim.b) if len(speeds.get(v, [])) < 2]
    if short:
        reason = f"fewer than 2 clean probes of {' and '.join(short)} on {cpu or 'any CPU'}: no speed test"
        (found.missing if family else found.evidence).append(reason)
        return
    label = f"speed probes ({cpu}; {len(speeds[claim.a])} and {len(speeds[claim.b])})"
    found.tests.append(ratio(label, family, "updates/s A/B", log_ratio_test(speeds[claim.a], speeds[claim.b]), 1))


def run_times(row: dict) -> list[float] | None:
    """Every run's milliseconds of one curve point (bench_attention writes runs_ms; all_ms is accepted too)."""
    return row.get("all_ms", row.get("runs_ms"))


def growth(rows: dict[int, dict], low: int, high: int) -> float:
    """Time growth per doubling of the length between two lengths of one curve."""
    return (rows[high]["ms"] / rows[low]["ms"]) ** (1 / math.log2(high / low))


def curve_test(claim: ClaimSpec, curves: dict | None, found: Found) -> None:
    """At the longest length both of the claim's curves have: Welch's t on log run times, time A/B."""
    if curves is None:
        found.missing.append("the claim names cost curves but none were given (scripts/bench_attention.py --json)")
        return
    absent = [name for name in claim.curves if name not in curves["results"]]
    if absent:
        found.missing.append(f"no cost curve named {', '.join(absent)} (have: {', '.join(curves['results'])})")
        return
    rows = [{row["n"]: row for row in curves["results"][name]} for name in claim.curves]
    lengths = sorted(set(rows[0]) & set(rows[1]))
    if not lengths:
        found.missing.append(f"the curves {' and '.join(claim.curves)} share no length")
        return
    top = lengths[-1]
    found.evidence.append(
        f"cost curves ({curves.get('title', 'untitled')}): {claim.curves[0]} / {claim.curves[1]} at n={top} "
        f"{rows[0][top]['ms'] / rows[1][top]['ms']:.2f}x time (medians)"
    )
    if len(lengths) > 1:
        low = lengths[-2]
        found.evidence.append(
            f"time per doubling from n={low} to {top}: A x{growth(rows[0], low, top):.2f}, "
            f"B x{growth(rows[1], low, top):.2f}"
        )
    times = [run_times(r[top]) for r in rows]
    if any(t is None or len(t) < 2 for t in times):
        found.missing.append(f"the curves keep only medians at n={top}: no interval is available, no test")
        return
    label = f"cost curves, n={top} ({len(times[0])} and {len(times[1])} runs)"
    found.tests.append(ratio(label, "cost", "time A/B", log_ratio_test(*times), -1))


def cost_tests(claim: ClaimSpec, probes: list[dict], curves: dict | None, found: Found) -> None:
    """The curves decide when the claim names them (the probes are then evidence at the training lengths)."""
    if claim.curves:
        curve_test(claim, curves, found)
    probe_test(claim, probes, None if claim.curves else "cost", found)


def point_value(claim: ClaimSpec, given: Inputs, point: int) -> float | None:
    """The claim's estimate (Δ, or difference in differences) at a budget point, from means over seeds; no test."""

    def mean(variant: str, lines: list[int] | None = None) -> float | None:
        values = []
        for r in given.finished(variant).values():
            if lines is not None and point in r.point_hyps:
                stats = sentence_stats([r.point_hyps[point][i] for i in lines], [given.test.ref[i] for i in lines])
                values.append(float(bleu_from_stats(stats.sum(0))))
            elif lines is None and (score := r.point_score(point)) is not None:
                values.append(score)
        return statistics.fmean(values) if values else None

    if claim.kind == "long_range":
        buckets = length_buckets(given.test.src, given.buckets)
        long, short = buckets[-1][1], buckets[0][1]
        found = [mean(claim.a, long), mean(claim.b, long), mean(claim.a, short), mean(claim.b, short)]
    else:
        found = [mean(v) for v in claim.variants()]
    if None in found:
        return None
    return found[0] - found[1] - (found[2] - found[3] if len(found) == 4 else 0.0)


def point_evidence(claim: ClaimSpec, given: Inputs) -> list[str]:
    points = sorted({p for v in claim.variants() for r in given.finished(v).values() for p in r.points()})
    if claim.kind == "long_range" and len(length_buckets(given.test.src, given.buckets)) < 2:
        return []
    found = [(p, value) for p in points if (value := point_value(claim, given, p)) is not None]
    if not found:
        return []
    what = "Δ (A - B)" if claim.kind in ("better", "non_inferior") else "difference in differences"
    return [f"{what} by budget point, means over seeds, no test: " + ", ".join(f"{p}: {v:+.2f}" for p, v in found)]


def claim_tests(claim: ClaimSpec, given: Inputs, probes: list[dict], curves: dict | None) -> Found:
    """One claim's tests, before Holm's correction."""
    found = Found()
    if claim.kind in ("better", "non_inferior"):
        better_tests(claim, given, found)
    elif claim.kind == "interaction":
        interaction_tests(claim, given, found)
    elif claim.kind == "long_range":
        long_range_tests(claim, given, found)
    elif claim.kind == "stability":
        stability_tests(claim, given, found)
    else:
        cost_tests(claim, probes, curves, found)
    if claim.kind in QUALITY:
        found.evidence += point_evidence(claim, given)
    return found


def not_run(claim: ClaimSpec, given: Inputs) -> list[str]:
    """The claim's variants with nothing to test: no finished run (stability: no trained run, diverged included)."""
    if claim.kind == "cheaper":
        return []
    if claim.kind == "stability":
        return [v for v in claim.variants() if all(troubled(r) is None for r in given.runs.get(v, []))]
    return [v for v in claim.variants() if not given.finished(v)]


def correct(results: list[dict], alpha: float) -> None:
    """Holm over each family: every test gets holm (rejected), p_holm (adjusted) and family_size."""
    for family in FAMILIES:
        members = {
            (i, j): t["p"] for i, r in enumerate(results) for j, t in enumerate(r["tests"]) if t["family"] == family
        }
        keyed = {f"{i}:{j}": p for (i, j), p in members.items()}
        rejected, adjusted = holm(keyed, alpha), holm_adjusted(keyed)
        for i, j in members:
            results[i]["tests"][j].update(
                holm=rejected[f"{i}:{j}"], p_holm=adjusted[f"{i}:{j}"], family_size=len(members)
            )


def decide(result: dict) -> str:
    """The verdict from the Holm-corrected tests (RULES)."""
    deciding = [t for t in result["tests"] if t["family"]]
    ways = {t["direction"] for t in deciding if t["holm"]}
    if result["kind"] == "stability":
        return {frozenset({1}): SUPPORTED, frozenset({-1}): NOT_SUPPORTED}.get(frozenset(ways), CANNOT_TELL)
    needed = 1 if result["kind"] == "cheaper" else 2
    if result["missing"] or len(deciding) < needed or not all(t["holm"] for t in deciding) or len(ways) != 1:
        return CANNOT_TELL
    return SUPPORTED if ways == {1} else NOT_SUPPORTED if ways == {-1} else CANNOT_TELL


def p_text(test: dict) -> str:
    return f"{test['test']} p {test['p']:.3g}, Holm {test['p_holm']:.3g}"


def explain(result: dict, verdict: str, alpha: float) -> str:
    """One sentence on how the verdict was reached."""
    if verdict == NOT_RUN:
        return f"no finished run of {', '.join(result['not_run'])}"
    deciding = [t for t in result["tests"] if t["family"]]
    called = [t for t in deciding if t["holm"]]
    rule = RULES[result["kind"]][0 if verdict == SUPPORTED else 1]
    if verdict != CANNOT_TELL:
        return f"{rule} at alpha {alpha} after Holm's correction ({'; '.join(p_text(t) for t in called)})"
    parts = list(result["missing"])
    if len({t["direction"] for t in called}) > 1:
        parts.append("the tests call opposite directions")
    quiet = [t for t in deciding if not t["holm"]]
    if quiet:
        parts.append(f"not significant at alpha {alpha} after Holm's correction: " + "; ".join(map(p_text, quiet)))
    if not parts:
        parts.append("the tests call the same direction only partly")
    return "; ".join(parts)


def evaluate_claims(
    claims: list[ClaimSpec],
    runs: dict[str, list[RunRecord]],
    test: TestData,
    probes: list[dict],
    curves: dict | None,
    samples: int = 1000,
    seed: int = 12345,
    buckets: int = 5,
    alpha: float = ALPHA,
) -> list[dict]:
    """Each claim's tests, Holm-corrected by family, and its verdict: one JSON-able dict per claim."""
    weights = draw_weights(len(test.ref), samples, seed) if test.ref else None  # the same draws for every claim
    given = Inputs(runs, test, samples, seed, buckets, alpha, weights)
    results = []
    for claim in claims:
        result = {
            "name": claim.name,
            "text": claim.text,
            "kind": claim.kind,
            "a": claim.a,
            "b": claim.b,
            "c": claim.c,
            "d": claim.d,
            "margin": claim.margin,
            "curves": list(claim.curves),
            "alpha": alpha,
            "seeds": {v: sorted(given.finished(v)) for v in claim.variants()},
            "not_run": not_run(claim, given),
        }
        result.update(asdict(Found() if result["not_run"] else claim_tests(claim, given, probes, curves)))
        results.append(result)
    correct(results, alpha)
    for result in results:
        result["verdict"] = NOT_RUN if result["not_run"] else decide(result)
        result["why"] = explain(result, result["verdict"], alpha)
    return results
