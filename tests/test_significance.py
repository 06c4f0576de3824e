"""The comparison's tests: BLEU from sufficient statistics equals sacrebleu's, the cluster bootstrap and Welch's test
against numbers worked by hand, Holm's correction by hand, and a simulation of the whole decision's calibration."""

import math
import random

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

from nmt.compare.summary import decide, excludes_zero
from nmt.evaluation.significance import (
    bleu_from_stats,
    cluster_bootstrap,
    draw_weights,
    holm,
    sentence_stats,
    welch_test,
)


@pytest.fixture(scope="module")
def systems():
    rng = random.Random(0)
    refs = [" ".join(rng.choice("abcdefghij") for _ in range(rng.randint(4, 12))) for _ in range(150)]
    noisy = lambda p: [" ".join(w if rng.random() > p else "zz" for w in r.split()) for r in refs]  # noqa: E731
    return refs, noisy(0.4), {"better": noisy(0.2), "similar": noisy(0.4)}


def test_bleu_from_summed_statistics_is_sacrebleus_corpus_bleu(systems):
    refs, baseline, others = systems
    for hyps in (baseline, *others.values(), ["zz"] * len(refs), [""] * len(refs), refs):
        ours = float(bleu_from_stats(sentence_stats(hyps, refs).sum(0)))
        assert ours == pytest.approx(BLEU().corpus_score(hyps, [refs]).score, abs=1e-9)
    # a subset, as a bootstrap draw makes it (sentence 3 twice, 7 once)
    picked = [3, 3, 7]
    stats = sentence_stats(baseline, refs)
    assert float(bleu_from_stats(stats[picked].sum(0))) == pytest.approx(
        BLEU().corpus_score([baseline[i] for i in picked], [[refs[i] for i in picked]]).score, abs=1e-9
    )


def test_draw_weights_count_each_sentence_as_often_as_it_is_drawn():
    weights = draw_weights(50, 20, seed=3)
    assert weights.shape == (20, 50) and (weights.sum(1) == 50).all()
    assert not np.array_equal(weights[0], weights[1])
    assert np.array_equal(weights, draw_weights(50, 20, seed=3))


def test_one_seed_bootstrap_delta_is_the_bleu_difference_and_a_clear_win_is_found(systems):
    refs, baseline, others = systems
    base = sentence_stats(baseline, refs)[None]
    better = cluster_bootstrap(base, sentence_stats(others["better"], refs)[None], [1], samples=400, seed=7)
    expected = BLEU().corpus_score(others["better"], [refs]).score - BLEU().corpus_score(baseline, [refs]).score
    assert better.delta == pytest.approx(expected, abs=1e-9) and better.delta > 5
    assert better.ci_low > 0 and better.p_value < 0.01
    similar = cluster_bootstrap(base, sentence_stats(others["similar"], refs)[None], [1], samples=400, seed=7)
    assert similar.ci_low < similar.delta < similar.ci_high and similar.p_value > 0.05


def test_identical_outputs_have_a_zero_interval_and_p_one(systems):
    refs, baseline, _ = systems
    stats = sentence_stats(baseline, refs)[None]
    result = cluster_bootstrap(stats, stats.copy(), [1], samples=200, seed=1)
    assert (result.delta, result.ci_low, result.ci_high, result.p_value) == (0.0, 0.0, 0.0, 1.0)


def test_bootstrap_seed_zero_is_refused(systems):
    refs, baseline, _ = systems
    stats = sentence_stats(baseline, refs)[None]
    with pytest.raises(ValueError, match="positive"):
        cluster_bootstrap(stats, stats, [1], samples=10, seed=0)


def test_several_seeds_are_averaged_per_draw_and_kept_together():
    """Two seeds, two sentences worked by hand: a draw of sentence 0 twice scores each seed on sentence 0 alone."""
    refs = ["a b c d", "e f g h"]
    base_hyps = [["a b c d", "x x x x"], ["x x x x", "e f g h"]]  # seed 1 gets sentence 0 right, seed 2 sentence 1
    system_hyps = [["a b c d", "e f g h"], ["a b c d", "e f g h"]]
    base = np.stack([sentence_stats(h, refs) for h in base_hyps])
    system = np.stack([sentence_stats(h, refs) for h in system_hyps])
    result = cluster_bootstrap(base, system, [1, 2], samples=2, seed=5, weights=np.array([[2.0, 0.0], [1.0, 1.0]]))
    half = BLEU().corpus_score(["a b c d", "x x x x"], [refs]).score  # one sentence right of two
    assert result.delta == pytest.approx(100 - half)
    # draw 1 (sentence 0 twice): seed 1 of the baseline 100, seed 2 0 -> mean 50; the system 100 -> delta 50;
    # draw 2 (the test set itself): delta 100 - half. The interval spans those two values.
    assert result.ci_low == pytest.approx(min(50, 100 - half), abs=2) and result.ci_high == pytest.approx(
        max(50, 100 - half), abs=2
    )


def test_welch_against_numbers_worked_by_hand():
    # means 31 and 34, both variances 1, n = 3: se = sqrt(2/3), t = 3 / se = 3.674, Welch df = 4,
    # two-sided p = 2 * (1 - T_4(3.674)) = 0.02131, interval 3 -/+ t_{0.975,4} se = 3 -/+ 2.7764 * 0.8165
    result = welch_test([30.0, 31.0, 32.0], [33.0, 34.0, 35.0])
    assert result.delta == pytest.approx(3.0)
    assert result.t == pytest.approx(3 / math.sqrt(2 / 3), rel=1e-6) and result.df == pytest.approx(4.0)
    assert result.p_value == pytest.approx(0.02131, abs=5e-5)
    assert (result.ci_low, result.ci_high) == (
        pytest.approx(3 - 2.7764 * 0.8165, abs=1e-3),
        pytest.approx(3 + 2.7764 * 0.8165, abs=1e-3),
    )
    assert welch_test([30.0, 31.0], [33.0, 34.0, 35.0]) is None  # fewer than 3 seeds: no seed test
    assert welch_test([30.0, 30.0, 30.0], [30.0, 30.0, 30.0]).p_value == 1.0


def test_holm_by_hand():
    # k = 3 at 0.05: thresholds 0.0167, 0.025, 0.05 in order of p
    assert holm({"a": 0.01, "b": 0.04, "c": 0.03}, 0.05) == {
        "a": True,
        "b": False,
        "c": False,
    }  # c = 0.03 >= 0.025 stops it
    assert holm({"a": 0.01, "b": 0.02, "c": 0.04}, 0.05) == {"a": True, "b": True, "c": True}
    assert holm({"a": 0.02, "b": 0.5}, 0.05) == {"a": True, "b": False}  # 0.02 < 0.05 / 2
    assert holm({"a": 0.03, "b": 0.04}, 0.05) == {"a": False, "b": False}  # 0.03 >= 0.025 stops at the first


def test_decision_needs_both_tests():
    boot = {"delta": 1.0, "ci_low": 0.5, "ci_high": 1.5, "holm": True}
    assert decide(boot, {"delta": 1.0, "holm": True}) == "yes"
    assert decide(boot, {"delta": 1.0, "holm": False}) == "no"
    assert decide(boot, {"delta": -1.0, "holm": True}) == "no"
    assert decide(boot, None) == "bootstrap only: yes"
    assert excludes_zero(boot) and not excludes_zero({"ci_low": -1, "ci_high": 1})


# --- calibration: the decision on simulated systems --------------------------------------------------------
SENTENCES, SEEDS, SAMPLES, ALPHA = 120, 3, 200, 0.05


def simulated_stats(
    rng: np.random.Generator, difficulty: np.ndarray, lengths: np.ndarray, quality: float
) -> np.ndarray:
    """(N, 10) BLEU statistics of one trained system: each token right with probability sigmoid(quality - difficulty);
    an n-gram matches when its n tokens are right; hypotheses as long as the references."""
    right_p = 1 / (1 + np.exp(-(quality - difficulty)))
    sentence = np.repeat(np.arange(len(lengths)), lengths)  # each token's sentence
    # one draw per token, in order: the same numbers as a draw of `length` per sentence, sentence after sentence
    right = rng.random(len(sentence)) < right_p[sentence]
    stats = np.zeros((len(lengths), 10))
    stats[:, 0] = stats[:, 1] = lengths
    run = right.copy()  # at n: whether tokens j .. j+n-1 are all right and of one sentence
    for n in range(1, 5):
        if n > 1:
            run[: 1 - n] &= right[n - 1 :] & (sentence[n - 1 :] == sentence[: 1 - n])
            run[1 - n :] = False
        stats[:, 1 + n] = np.bincount(sentence[run], minlength=len(lengths))
        stats[:, 5 + n] = np.maximum(lengths - n + 1, 0)
    return stats


def simulated_decision(rng: np.random.Generator, gain: float) -> tuple[bool, bool, bool]:
    """One comparison of a baseline and a system `gain` better (in logits), 3 seeds each:
    (bootstrap, seed test, both)."""
    lengths = rng.integers(5, 20, SENTENCES)
    difficulty = rng.normal(
        0, 1.5, SENTENCES
    )  # shared by every system and seed: what makes outputs of one sentence correlate

    def system(quality: float) -> np.ndarray:
        # each training seed shifts the model's quality (seed variance) and draws its own outputs
        return np.stack(
            [simulated_stats(rng, difficulty, lengths, quality + rng.normal(0, 0.15)) for _ in range(SEEDS)]
        )

    base, other = system(1.0), system(1.0 + gain)
    boot = cluster_bootstrap(base, other, [1, 2, 3], SAMPLES, int(rng.integers(1, 10**6)))
    per_seed = lambda stats: [float(bleu_from_stats(s.sum(0))) for s in stats]  # noqa: E731
    welch = welch_test(per_seed(base), per_seed(other))
    boot_yes, seed_yes = boot.p_value < ALPHA and excludes_zero(boot.as_dict()), welch.p_value < ALPHA
    return boot_yes, seed_yes, boot_yes and seed_yes and (boot.delta > 0) == (welch.delta > 0)


def test_identical_systems_are_called_different_in_about_5_percent_and_a_real_gain_in_most():
    rng = np.random.default_rng(2026)
    null = np.array([simulated_decision(rng, 0.0) for _ in range(200)])
    boot_rate, seed_rate, both_rate = null.mean(0)
    # 200 draws at 5%: 10 expected, s.d. 3.1; the seed test is exact for normal per-seed BLEU
    assert 0.01 <= seed_rate <= 0.10, seed_rate
    # the sentence bootstrap alone holds the seeds fixed, so training-seed variance makes it call identical systems
    # different far more often than 5% (the flaw of pooling seeds as if they were sentences); the decision needs both
    assert boot_rate > seed_rate
    assert both_rate <= 0.10, both_rate
    power = np.array([simulated_decision(rng, 0.6) for _ in range(40)]).mean(0)
    assert power[2] >= 0.8, power
