"""Attention diagnostics on hand-made matrices: entropy, max weight, coverage, local-p's distance to the diagonal."""

import math

import numpy as np
import pytest

from nmt.evaluation.diagnostics import AttentionStats, coverage, diagonal_distance, row_entropy


def test_entropy_of_uniform_one_hot_and_unnormalised_rows():
    rows = np.array(
        [[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0], [0.2, 0.2, 0.0, 0.0]]
    )  # the last sums to 0.4 (local-p)
    np.testing.assert_allclose(row_entropy(rows), [math.log(4), 0.0, math.log(2)])


def test_coverage_leaves_out_the_end_column():
    np.testing.assert_allclose(coverage(np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])), [0.6, 0.4])


def test_summary_over_two_sentences():
    # Sentence 1: 3 source tokens + </s>; rows uniform (entropy log 4, max 0.25) and one-hot (0, 1);
    # coverage [1.25, 0.25, 0.25]: two of three under 0.5, none over 2.
    first = np.array([[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0]])
    # Sentence 2: 2 source tokens + </s>; entropies log 2, 0, 0; maxima 0.5, 1, 1;
    # coverage [0.5, 2.5]: 0.5 is not under 0.5, 2.5 is over 2.
    second = np.array([[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    stats = AttentionStats(under=0.5, over=2.0)
    stats.add(first)
    stats.add(second)
    summary = stats.as_dict()
    # 5 steps: entropy (log 4 + log 2) / 5 = 3 log 2 / 5; max (0.25 + 1 + 0.5 + 1 + 1) / 5 = 0.75.
    # 5 source tokens: coverage (1.75 + 3.0) / 5 = 0.95; under 2/5, over 1/5.
    assert summary["entropy"] == pytest.approx(3 * math.log(2) / 5)
    assert summary["max_weight"] == pytest.approx(0.75)
    assert summary["coverage"] == pytest.approx(0.95)
    assert (summary["under_attended"], summary["over_attended"]) == (pytest.approx(0.4), pytest.approx(0.2))
    assert summary["p_t_diagonal_distance"] is None


def test_local_p_distance_to_the_diagonal():
    # 3 output steps over 4 source tokens + </s> (S_b = 5): the diagonal is t * 4 / 2 = 0, 2, 4.
    np.testing.assert_allclose(diagonal_distance(np.array([0.0, 2.0, 5.0]), 5), [0.0, 0.0, 1.0])
    stats = AttentionStats()
    stats.add(np.full((3, 5), 0.2), np.array([0.0, 2.0, 5.0]))
    assert stats.as_dict()["p_t_diagonal_distance"] == pytest.approx(1 / 3)
