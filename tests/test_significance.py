"""The paired bootstrap agrees with sacrebleu's own paired test, and adds the delta's interval from the same draws."""

import random

import pytest
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from nmt.evaluation.significance import bootstrap_indices, paired_bootstrap, resampled_bleu


@pytest.fixture(scope="module")
def systems():
    rng = random.Random(0)
    refs = [" ".join(rng.choice("abcdefghij") for _ in range(rng.randint(4, 12))) for _ in range(150)]
    noisy = lambda p: [" ".join(w if rng.random() > p else "zz" for w in r.split()) for r in refs]  # noqa: E731
    return refs, noisy(0.4), {"better": noisy(0.2), "similar": noisy(0.4)}


def test_p_values_and_scores_are_sacrebleus(systems, monkeypatch):
    refs, baseline, others = systems
    signature, results = paired_bootstrap(baseline, others, refs, samples=300, seed=7)
    monkeypatch.setenv("SACREBLEU_SEED", "7")
    _, theirs = PairedTest([("baseline", baseline), *others.items()], {"BLEU": BLEU()}, [refs], test_type="bs", n_samples=300)()
    assert "bs:300" in signature and "seed:7" in signature
    for name, result in zip(theirs["System"][1:], theirs["BLEU"][1:]):
        ours = results[name]
        assert ours.p_value == result.p_value
        assert ours.score == result.score and ours.baseline == theirs["BLEU"][0].score
        assert ours.delta == pytest.approx(result.score - theirs["BLEU"][0].score)
        # The same draws as sacrebleu's test: the mean of our resampled scores is the mean it reports.
        draws = resampled_bleu(others[name], refs, bootstrap_indices(len(refs), 300, 7))
        assert draws.mean() == pytest.approx(result.mean, abs=1e-9)
        assert ours.ci_low <= ours.delta <= ours.ci_high


def test_a_clearly_better_system_has_an_interval_above_zero(systems):
    refs, baseline, others = systems
    _, results = paired_bootstrap(baseline, others, refs, samples=300)
    assert results["better"].delta > 5 and results["better"].ci_low > 0 and results["better"].p_value < 0.05
    assert results["similar"].ci_low < results["similar"].delta < results["similar"].ci_high


def test_identical_outputs_have_a_zero_interval(systems):
    refs, baseline, _ = systems
    _, results = paired_bootstrap(baseline, {"copy": list(baseline)}, refs, samples=200)
    assert (results["copy"].delta, results["copy"].ci_low, results["copy"].ci_high) == (0.0, 0.0, 0.0)
    assert results["copy"].p_value == pytest.approx(1 / 201)  # sacrebleu's value: why the report also asks the interval to exclude 0
