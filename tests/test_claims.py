"""nmt.compare.claims on synthetic runs: every rule gives each verdict word from numbers made for it, the new tests in
nmt.evaluation.significance against numbers worked by hand, their false-positive rates by simulation, and Holm's
correction turning a raw call into "cannot tell".

A synthetic run copies the reference of each test sentence easier than its quality (u_i < q + offset + jitter) and
writes wrong words of the same length otherwise, so its BLEU is about 100 q; the offsets between seeds are seed noise.
"""

import math
import zlib
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from sacrebleu.metrics import BLEU
from scipy import stats

from nmt.compare import collect
from nmt.compare.claims import (
    CANNOT_TELL,
    NOT_RUN,
    NOT_SUPPORTED,
    SUPPORTED,
    evaluate_claims,
    troubled,
)
from nmt.compare.claims_report import claims_markdown
from nmt.compare.collect import RunRecord
from nmt.config import ClaimSpec
from nmt.evaluation.significance import (
    bootstrap_p,
    contrast_test,
    did_bootstrap,
    holm,
    holm_adjusted,
    log_ratio_test,
    non_inferiority_welch,
    sentence_stats,
    variance_ratio_test,
    welch_test,
)

N = 200
LENGTHS = [2 + (i * 7) % 12 for i in range(N)]  # 2..13 words, the same for source and reference
LONG = 8  # sentences longer than this get `boost` added to their quality
U = (np.arange(N) * 0.6180339887) % 1.0  # how hard each sentence is: spread evenly over [0, 1) in every bucket
REFS = [" ".join(f"r{i}w{k}" for k in range(n)) for i, n in enumerate(LENGTHS)]
TEST = collect.TestData([" ".join(f"s{i}w{k}" for k in range(n)) for i, n in enumerate(LENGTHS)], REFS, None)
SMALL = [-0.004, 0.0, 0.004, 0.002, -0.002]  # seed offsets of quality: about +-0.3 BLEU
WIDE = [-0.08, 0.0, 0.08, 0.05, -0.05]  # about +-6 BLEU
SAMPLES = 400
POINT = 1500


def outputs(variant: str, seed: int, q: float, boost: float = 0.0, jitter: float = 0.01) -> list[str]:
    rng = np.random.default_rng([seed, zlib.crc32(variant.encode())])
    limit = q + boost * (np.array(LENGTHS) > LONG) + rng.normal(0, jitter, N)
    return [ref if U[i] < limit[i] else " ".join(f"x{i}w{k}" for k in range(LENGTHS[i])) for i, ref in enumerate(REFS)]


@cache  # the runs are read, never changed
def run(variant: str, seed: int, q: float, boost: float = 0.0, skipped: int = 0, score: float | None = None):
    """A finished run; `score` overrides its eval.json BLEU (the seed test's input)."""
    hyps = outputs(variant, seed, q, boost)
    early = outputs(variant, seed + 100, q - 0.05, boost)  # the model chosen at an earlier budget point
    bleu = lambda h: BLEU().corpus_score(h, [REFS]).score  # noqa: E731
    evaluation = {
        "scores": {"bleu": {"score": bleu(hyps) if score is None else score}},
        "points": {str(POINT): {"scores": {"bleu": {"score": bleu(early)}}}},
    }
    return RunRecord(
        variant,
        seed,
        Path("/nonexistent"),
        results={"steps": 3000, "skipped_updates": skipped},
        evaluation=evaluation,
        hyps=hyps,
        point_hyps={POINT: early},
    )


def runs(variant: str, q: float, offsets: list[float] = SMALL, **kw) -> list[RunRecord]:
    return [run(variant, seed, q + offset, **kw) for seed, offset in enumerate(offsets, start=1)]


def claim(kind: str, name: str = "1", **kw) -> ClaimSpec:
    return ClaimSpec(name=name, text=f"a {kind} claim", kind=kind, a=kw.pop("a", "A"), b=kw.pop("b", "B"), **kw)


def judge(claims, variants, probes=(), curves=None) -> list[dict]:
    return evaluate_claims(claims, variants, TEST, list(probes), curves, samples=SAMPLES, seed=7)


def one(spec: ClaimSpec, variants, **kw) -> dict:
    return judge([spec], variants, **kw)[0]


# --- better ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("qa", "qb", "verdict"), [(0.6, 0.5, SUPPORTED), (0.5, 0.6, NOT_SUPPORTED), (0.55, 0.55, CANNOT_TELL)]
)
def test_better_gives_each_verdict(qa, qb, verdict):
    result = one(claim("better"), {"A": runs("A", qa), "B": runs("B", qb)})
    assert result["verdict"] == verdict, result["why"]
    sentence, seeds = result["tests"]
    assert sentence["family"] == "sentence" and seeds["family"] == "seeds"
    assert sentence["estimate"] == pytest.approx(100 * (qa - qb), abs=3)
    assert sentence["ci_low"] < sentence["estimate"] < sentence["ci_high"]


def test_better_needs_both_tests_and_three_seeds_a_side():
    noisy = {"A": runs("A", 0.6, [0.0, -0.12, 0.12]), "B": runs("B", 0.55, [0.0, 0.002, -0.002])}
    result = one(claim("better"), noisy)  # the sentences call A ahead; the seeds (s.d. 12 BLEU) cannot
    sentence, seeds = result["tests"]
    assert sentence["holm"] and sentence["direction"] == 1 and not seeds["holm"]
    assert result["verdict"] == CANNOT_TELL and "seed Welch t p" in result["why"]
    two = one(claim("better"), {"A": runs("A", 0.7, SMALL[:2]), "B": runs("B", 0.5)})
    assert two["verdict"] == CANNOT_TELL and "fewer than 3 finished seeds" in two["why"]
    assert one(claim("better"), {"A": runs("A", 0.7)})["verdict"] == NOT_RUN


# --- non-inferiority -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("qa", "offsets", "verdict"),
    [(0.605, SMALL, SUPPORTED), (0.52, SMALL, NOT_SUPPORTED), (0.59, WIDE, CANNOT_TELL)],
)
def test_non_inferiority_gives_each_verdict(qa, offsets, verdict):
    result = one(claim("non_inferior", margin=1.0), {"A": runs("A", qa, offsets), "B": runs("B", 0.6)})
    assert result["verdict"] == verdict, result["why"]
    for test in result["tests"]:
        assert test["interval"] == "one-sided 95% bounds" and test["ci_low"] < test["estimate"] < test["ci_high"]
    if verdict == SUPPORTED:
        assert all(t["ci_low"] > -1.0 for t in result["tests"])  # the one-sided lower bounds clear the margin
    if verdict == NOT_SUPPORTED:
        assert all(t["ci_high"] < -1.0 for t in result["tests"])


def test_non_inferiority_p_against_a_hand_computation():
    # delta = 10 - 11 = -1, se^2 = 1/3 + 1/3, df = (2/3)^2 / (2 (1/3)^2 / 2) = 4, t = (-1 + 2) / sqrt(2/3)
    found = non_inferiority_welch([10.0, 11.0, 12.0], [9.0, 10.0, 11.0], margin=2.0)
    t = 1 / math.sqrt(2 / 3)
    x = t / math.sqrt(4 + t * t)  # Student's t with 4 df: P(T <= t) = 1/2 + 3/4 x (1 - x^2 / 3)
    assert found.df == pytest.approx(4.0) and found.t == pytest.approx(t)
    assert found.p_above == pytest.approx(1 - (0.5 + 0.75 * x * (1 - x * x / 3)), rel=1e-9)
    assert found.p_above + found.p_below == pytest.approx(1.0)
    assert found.lower == pytest.approx(-1 - stats.t.ppf(0.95, 4) * math.sqrt(2 / 3))


def test_bootstrap_p_counts_the_draws_shifted_onto_the_null_at_or_beyond_the_observed():
    draws = np.array([0.5, 1.0, 1.5, 2.0, 2.5])  # observed 1.5: draw - observed = -1, -0.5, 0, 0.5, 1
    assert bootstrap_p(draws, 1.5, -1.0, "greater") == pytest.approx(1 / 6)  # shifted onto -1, none reaches 1.5
    assert bootstrap_p(draws, 1.5, 1.0, "greater") == pytest.approx(3 / 6)  # onto 1: 1.5, 2 reach 1.5
    assert bootstrap_p(draws, 1.5, 2.0, "less") == pytest.approx(3 / 6)  # onto 2: 1, 1.5 at or below 1.5
    assert bootstrap_p(draws, 1.5) == pytest.approx(1 / 6)  # onto 0: none as far as 1.5 from 0
    assert bootstrap_p(draws, 1.0) == pytest.approx(3 / 6)  # onto 0: -1, 1 (ties count) as far as 1.0


# --- interaction ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("qa", "qb", "verdict"), [(0.7, 0.5, SUPPORTED), (0.6, 0.6, NOT_SUPPORTED), (0.65, 0.55, CANNOT_TELL)]
)
def test_interaction_gives_each_verdict(qa, qb, verdict):
    # C - D is +10 BLEU: (A - B) of +20, 0, +10
    variants = {"A": runs("A", qa), "B": runs("B", qb), "C": runs("C", 0.6), "D": runs("D", 0.5)}
    result = one(claim("interaction", c="C", d="D"), variants)
    assert result["verdict"] == verdict, result["why"]
    assert [t["test"] for t in result["tests"]] == ["sentence bootstrap", "seed contrast (Welch)"]
    assert result["tests"][0]["estimate"] == pytest.approx(100 * (qa - qb - 0.1), abs=3)


def test_did_bootstrap_estimate_is_the_did_of_sacrebleu_corpus_bleus():
    systems = {v: runs(v, q)[:3] for v, q in (("A", 0.7), ("B", 0.5), ("C", 0.6), ("D", 0.55))}
    corpus = {v: np.mean([BLEU().corpus_score(r.hyps, [REFS]).score for r in rs]) for v, rs in systems.items()}
    statistics = [np.stack([sentence_stats(r.hyps, REFS) for r in systems[v]]) for v in "ABCD"]
    found = did_bootstrap(*statistics, [1, 2, 3], samples=200, seed=3)
    assert found.delta == pytest.approx(corpus["A"] - corpus["B"] - (corpus["C"] - corpus["D"]), abs=1e-9)
    assert found.ci_low < found.delta < found.ci_high
    long = [i for i, n in enumerate(LENGTHS) if n > LONG]
    short = [i for i, n in enumerate(LENGTHS) if n <= LONG]
    a, b = statistics[0], statistics[1]
    strata = did_bootstrap(a[:, long], b[:, long], a[:, short], b[:, short], [1, 2, 3], 200, 3, strata=True)
    bleu = lambda stats, lines: np.mean(
        [
            BLEU().corpus_score([h[i] for i in lines], [[REFS[i] for i in lines]]).score
            for h in (r.hyps for r in systems[stats])
        ]
    )  # noqa: E731
    expected = bleu("A", long) - bleu("B", long) - (bleu("A", short) - bleu("B", short))
    assert strata.delta == pytest.approx(expected, abs=1e-9) and strata.sentences == N


def test_contrast_test_against_a_hand_computation():
    # means 2, 4, 1, 2 and variances 1, 4, 1, 4 (3 values each): L = 2 - 4 - 1 + 2 = -1, se^2 = (1 + 4 + 1 + 4) / 3,
    # df = se^4 / sum((s_i^2 / 3)^2 / 2) = (100 / 9) / (34 / 18) = 200 / 34
    found = contrast_test([[1, 2, 3], [2, 4, 6], [0, 1, 2], [0, 2, 4]], [1, -1, -1, 1])
    se, df = math.sqrt(10 / 3), 200 / 34
    assert found.estimate == pytest.approx(-1.0) and found.se == pytest.approx(se) and found.df == pytest.approx(df)
    assert found.p_value == pytest.approx(2 * stats.t.sf(1 / se, df), rel=1e-12)
    assert found.ci_high == pytest.approx(-1 + stats.t.ppf(0.975, df) * se)
    a, b = [20.1, 21.5, 19.8, 22.0], [18.0, 18.9, 20.2]  # two groups, (1, -1): Welch's t-test
    welch, ours = welch_test(b, a), contrast_test([a, b], [1, -1])
    assert (ours.estimate, ours.p_value, ours.df) == pytest.approx((welch.delta, welch.p_value, welch.df))


def test_contrast_test_false_positive_rate_is_alpha_by_simulation():
    rng = np.random.default_rng(11)
    rejected = 0
    for _ in range(2000):  # four groups of 5 seeds, unequal variances, equal means: the null holds
        groups = [rng.normal(30.0, sd, 5).tolist() for sd in (1.0, 2.0, 1.0, 2.0)]
        rejected += contrast_test(groups, [1, -1, -1, 1]).p_value < 0.05
    assert 0.03 <= rejected / 2000 <= 0.07


# --- long range ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("boost", "verdict"), [(0.2, SUPPORTED), (-0.2, NOT_SUPPORTED), (0.0, CANNOT_TELL)])
def test_long_range_gives_each_verdict(boost, verdict):
    # A scores as B on short sentences, and `boost` better on long ones
    result = one(claim("long_range"), {"A": runs("A", 0.5, boost=boost), "B": runs("B", 0.5)})
    assert result["verdict"] == verdict, result["why"]
    sentence, seeds = result["tests"]
    assert sentence["test"] == "sentence bootstrap (by bucket)" and seeds["test"] == "seed Welch t (by bucket)"
    assert any(e.startswith("A - B by source length") for e in result["evidence"])


# --- stability -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "verdict"),
    [
        (runs("A", 0.5), runs("B", 0.5, WIDE), SUPPORTED),  # B's seeds vary 20x more
        (runs("A", 0.5, WIDE), runs("B", 0.5), NOT_SUPPORTED),
        (runs("A", 0.5), runs("B", 0.5, [-0.006, 0.0, 0.006, 0.003, -0.003]), CANNOT_TELL),
        (runs("A", 0.5), runs("B", 0.5, skipped=3), SUPPORTED),  # every run of B skipped updates: Fisher
        (runs("A", 0.5)[:2], runs("B", 0.5, WIDE), CANNOT_TELL),  # two runs of A
    ],
)
def test_stability_gives_each_verdict(a, b, verdict):
    result = one(claim("stability"), {"A": a, "B": b})
    assert result["verdict"] == verdict, result["why"]
    assert all(t["family"] == "stability" for t in result["tests"])
    if len(a) < 3:
        assert "fewer than 3 trained runs" in result["why"]


def test_variance_test_p_against_the_f_distribution():
    found = variance_ratio_test([1.0, 2.0, 3.0], [0.0, 3.0, 6.0])  # variances 1 and 9
    assert found.ratio == pytest.approx(9.0) and (found.dfn, found.dfd) == (2, 2)
    assert found.p_greater == pytest.approx(stats.f.sf(9.0, 2, 2)) == pytest.approx(1 / (1 + 9))  # F(2, 2): 1/(1+x)
    assert found.critical == pytest.approx(stats.f.isf(0.05, 2, 2)) == pytest.approx(19.0)  # 1/(1+x) = 0.05
    assert variance_ratio_test([1.0, 2.0], [0.0, 3.0, 6.0]) is None


def test_variance_test_false_positive_rate_is_alpha_by_simulation():
    rng = np.random.default_rng(5)
    rejected = sum(
        variance_ratio_test(rng.normal(0, 1, 5).tolist(), rng.normal(3, 1, 5).tolist()).p_greater < 0.05
        for _ in range(2000)
    )
    assert 0.03 <= rejected / 2000 <= 0.07


def test_a_run_that_stopped_for_non_finite_updates_counts_as_troubled(tmp_path):
    stopped = RunRecord("B", 1, tmp_path)
    (tmp_path / "train.log").write_text("step 7 | non-finite loss or gradient: update skipped (5 in a row, 5 in all)\n")
    unfinished = RunRecord("B", 2, tmp_path / "other")
    assert troubled(stopped) is True and troubled(unfinished) is None
    assert troubled(run("B", 3, 0.5)) is False and troubled(run("B", 3, 0.5, skipped=2)) is True


# --- cost ----------------------------------------------------------------------------------------------------------


def probes(speed_a: float, speed_b: float, count: int = 5) -> list[dict]:
    """Clean probes on one CPU, contended ones (left out) and a few on another CPU (fewer: left out)."""
    found = []
    for k in range(count):
        wobble = 1 + 0.02 * (k - count // 2)
        found += [
            {"variant": "A", "updates_per_s": speed_a * wobble, "cpu": "Zen", "contended": False},
            {"variant": "B", "updates_per_s": speed_b / wobble, "cpu": "Zen", "contended": False},
            {"variant": "A", "updates_per_s": speed_a / 3, "cpu": "Zen", "contended": True},
        ]
    return found + [{"variant": "A", "updates_per_s": 0.1, "cpu": "Other", "contended": False}] * 2


def curves(ms_a: float, ms_b: float, key: str = "runs_ms") -> dict:
    def curve(ms: float) -> list[dict]:
        rows = [{"n": 64, "ms": ms / 4, "mb": 1.0}, {"n": 128, "ms": ms, "mb": 2.0}]
        rows[1][key] = [ms * 0.98, ms, ms * 1.02]
        return rows

    return {"settings": {}, "title": "fixture", "results": {"dot": curve(ms_a), "concat": curve(ms_b), "x": curve(1)}}


@pytest.mark.parametrize(
    ("found", "verdict"),
    [(probes(2.0, 1.0), SUPPORTED), (probes(1.0, 2.0), NOT_SUPPORTED), (probes(1.0, 1.0), CANNOT_TELL)],
)
def test_cheaper_by_probes_gives_each_verdict(found, verdict):
    result = one(claim("cheaper"), {}, probes=found)
    assert result["verdict"] == verdict, result["why"]
    (test,) = result["tests"]
    assert test["family"] == "cost" and test["statistic"] == "updates/s A/B" and "Zen; 5 and 5" in test["test"]
    if verdict == SUPPORTED:
        assert test["estimate"] == pytest.approx(2.0, rel=0.01) and test["ci_low"] > 1


def test_cheaper_without_probes_of_a_variant_cannot_tell():
    result = one(claim("cheaper"), {}, probes=[p for p in probes(2.0, 1.0) if p["variant"] == "B"])
    assert result["verdict"] == CANNOT_TELL and "clean probes of A on Zen" in result["why"]


@pytest.mark.parametrize(
    ("ms_a", "ms_b", "key", "verdict"),
    [(1.0, 4.0, "runs_ms", SUPPORTED), (4.0, 1.0, "all_ms", NOT_SUPPORTED), (1.0, 4.0, "medians", CANNOT_TELL)],
)
def test_cheaper_by_cost_curves_gives_each_verdict_and_keeps_probes_as_evidence(ms_a, ms_b, key, verdict):
    spec = claim("cheaper", curves=["dot", "concat"])
    result = one(spec, {}, probes=probes(1.0, 2.0), curves=curves(ms_a, ms_b, key))  # the probes say A is slower
    assert result["verdict"] == verdict, result["why"]
    deciding = [t for t in result["tests"] if t["family"]]
    evidence = [t for t in result["tests"] if not t["family"]]
    assert len(evidence) == 1 and evidence[0]["statistic"] == "updates/s A/B"
    if key == "medians":
        assert not deciding and "no interval is available" in result["why"]
    else:
        assert deciding[0]["statistic"] == "time A/B" and deciding[0]["estimate"] == pytest.approx(ms_a / ms_b)
    assert any("per doubling from n=64 to 128: A x4.00" in e for e in result["evidence"])


def test_log_ratio_test_is_welch_on_logs():
    a, b = [2.0, 2.2, 1.9], [1.0, 1.1, 0.95, 1.05]
    found = log_ratio_test(a, b)
    welch = stats.ttest_ind(np.log(a), np.log(b), equal_var=False)
    assert found.ratio == pytest.approx(math.exp(np.log(a).mean() - np.log(b).mean()))
    assert found.p_value == pytest.approx(welch.pvalue) and found.ci_low < found.ratio < found.ci_high


# --- Holm, the report, the study's own claims -----------------------------------------------------------------------


def test_holm_adjusted_p_is_below_alpha_exactly_where_holm_rejects():
    p = {"a": 0.01, "b": 0.03, "c": 0.04, "d": 0.2}
    assert holm_adjusted(p) == pytest.approx({"a": 0.04, "b": 0.09, "c": 0.09, "d": 0.2})
    rejected = holm(p, 0.05)
    assert (
        {k: v < 0.05 for k, v in holm_adjusted(p).items()}
        == rejected
        == {"a": True, "b": False, "c": False, "d": False}
    )


def test_a_claim_significant_raw_but_not_after_holm_cannot_tell():
    # hand-set seed scores: Welch's p about 0.03, below alpha alone but not below alpha / 2 with a second such claim
    scores = {"A": [31.0, 32.0, 33.0, 32.5], "B": [29.9, 30.9, 31.4, 30.4]}
    assert 0.025 < welch_test(scores["B"], scores["A"]).p_value < 0.05
    variants = {v: [run(v, s + 1, q, score=x) for s, x in enumerate(scores[v])] for v, q in (("A", 0.7), ("B", 0.5))}
    alone = judge([claim("better")], variants)
    assert alone[0]["verdict"] == SUPPORTED, alone[0]["why"]
    twice = judge([claim("better"), claim("better", name="1 again")], variants)
    for result in twice:
        sentence, seeds = result["tests"]
        assert seeds["p"] < 0.05 and not seeds["holm"] and seeds["family_size"] == 2
        assert sentence["holm"] and result["verdict"] == CANNOT_TELL
        assert "seed Welch t p" in result["why"] and "Holm" in result["why"]


def test_markdown_states_each_claim_the_rules_and_the_families():
    variants = {"A": runs("A", 0.6), "B": runs("B", 0.5), "C": runs("C", 0.6), "D": runs("D", 0.5)}
    results = judge(
        [claim("better"), claim("interaction", name="2", c="C", d="D"), claim("cheaper", name="3")],
        variants,
        probes=probes(2.0, 1.0),
    )
    text = claims_markdown(results)
    assert "| # " in text and "estimate [95% CI] per test" in text
    for result in results:
        assert f"**{result['name']}** ({result['verdict']})" in text
    assert "supported when both the sentence bootstrap and the seed test call A ahead of B" in text
    assert "sentence level (cluster bootstrap over test sentences): 2 tests" in text
    assert "Welch's t on log timings): 1 test" in text and "alpha 0.05" in text
    assert "by budget point" in text and f"{POINT}: +" in text


def test_the_studys_declared_claims_all_get_a_verdict():
    recipe = Path(__file__).resolve().parents[1] / "nmt/recipes/experiment/compare_attention_multi30k_cpu.yaml"
    declared = [ClaimSpec(**c) for c in OmegaConf.to_container(OmegaConf.load(recipe))["claims"]]
    names = {v for c in declared for v in c.variants()}
    variants = {v: runs(v, 0.5 + 0.01 * (k % 5))[:3] for k, v in enumerate(sorted(names))}
    results = judge(declared, variants, probes=[], curves=None)
    assert len(results) == 11
    assert {r["verdict"] for r in results} <= {SUPPORTED, NOT_SUPPORTED, CANNOT_TELL}
    costs = [r for r in results if r["kind"] == "cheaper"]
    assert all(r["verdict"] == CANNOT_TELL and "none were given" in r["why"] for r in costs)
