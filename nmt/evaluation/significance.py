"""Is a BLEU difference real? sacrebleu's paired bootstrap resampling test (Koehn 2004), with the delta's interval.

sacrebleu's `PairedTest(test_type="bs")` draws `samples` test sets of the same size from the sentences
(with replacement, the same draws for every system), scores the baseline and each system on every draw,
and gives each system's p-value: the share of draws whose |delta| exceeds the observed one by more than
the draws' mean |delta| (the Moses script `bootstrap-hypothesis-difference-significance.pl`). sacrebleu
reports a confidence interval for each system's score, not for the difference; `paired_bootstrap` redraws
the very same index sets (the same seeded generator call) to give the 95% interval of the delta too:
the 2.5th and 97.5th percentiles of (system - baseline) over the draws, as sacrebleu's `estimate_ci` cuts them.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest


@dataclass
class PairedResult:
    """One system against the baseline on the same sentences."""

    score: float  # the system's corpus BLEU
    baseline: float  # the baseline's corpus BLEU
    delta: float  # score - baseline
    ci_low: float  # the 95% interval of the delta over the bootstrap draws
    ci_high: float
    p_value: float  # sacrebleu's paired bootstrap p-value
    sentences: int

    def as_dict(self) -> dict[str, float | int]:
        return dict(vars(self))


@contextmanager
def _sacrebleu_seed(seed: int) -> Iterator[None]:
    """PairedTest reads its seed from SACREBLEU_SEED; set it for the duration of the test."""
    before = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SACREBLEU_SEED", None)
        else:
            os.environ["SACREBLEU_SEED"] = before


def bootstrap_indices(sentences: int, samples: int, seed: int) -> np.ndarray:
    """(samples, sentences) the draws sacrebleu's paired bootstrap makes with this seed (significance._paired_bs_test)."""
    return np.random.default_rng(seed).choice(sentences, size=(samples, sentences), replace=True)


def resampled_bleu(hyps: list[str], refs: list[str], indices: np.ndarray) -> np.ndarray:
    """(samples,) corpus BLEU on each draw, from sacrebleu's per-sentence sufficient statistics."""
    metric = BLEU()
    stats = np.array(metric._extract_corpus_statistics(hyps, [refs]), dtype="float32")
    return np.array([metric._compute_score_from_stats(draw.sum(0)).score for draw in stats[indices]])


def interval(values: np.ndarray) -> tuple[float, float]:
    """The 95% interval of bootstrap values, cut as sacrebleu's estimate_ci cuts it (n // 40 from each end)."""
    ordered = np.sort(values)
    cut = len(ordered) // 40
    return float(ordered[cut]), float(ordered[len(ordered) - cut - 1])


def paired_bootstrap(baseline: list[str], systems: dict[str, list[str]], refs: list[str], samples: int = 1000, seed: int = 12345) -> tuple[str, dict[str, PairedResult]]:
    """Each system against the baseline: sacrebleu's paired bootstrap p-value and the delta's 95% interval.

    Returns the test's signature (sacrebleu's BLEU signature with the resamples and the seed) and a result per system.
    """
    if not systems:
        return "", {}
    if seed == 0:
        raise ValueError("seed 0 makes sacrebleu draw unseeded resamples; use a positive seed")
    with _sacrebleu_seed(seed):
        test = PairedTest([("baseline", baseline), *systems.items()], {"BLEU": BLEU()}, [refs], test_type="bs", n_samples=samples)
        signatures, scores = test()
    signature = signatures["BLEU"].format()
    base_result = scores["BLEU"][0]
    indices = bootstrap_indices(len(refs), samples, seed)
    base_draws = resampled_bleu(baseline, refs, indices)
    results = {}
    for name, result in zip(scores["System"][1:], scores["BLEU"][1:]):
        low, high = interval(resampled_bleu(systems[name], refs, indices) - base_draws)
        results[name] = PairedResult(result.score, base_result.score, result.score - base_result.score, low, high, float(result.p_value), len(refs))
    return signature, results
