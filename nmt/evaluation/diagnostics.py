"""What attention looks like, summed over a test set: entropy, peak weight, coverage, local-p's p_t.

Each matrix is one sentence's attention (T output steps, S source tokens + </s>), rows a_t. Every
figure is computed on rows renormalised to sum to 1, for every variant alike: local-p multiplies its
softmax weights by a Gaussian (Luong et al. 2015, eq. 10) and does not renormalise, so its raw rows sum
to less than 1 and would show less coverage and smaller peaks for that reason alone (for the other
variants the renormalisation changes nothing but rounding):
    entropy     H(a_t) = -sum_s a_t(s) log a_t(s)   in nats (0 log 0 = 0); 0 for one-hot rows, log S for uniform ones
    max weight  max_s a_t(s)
    coverage    c_s = sum_t a_t(s), the attention mass source token s receives over the whole output
                (the </s> column is left out); a token with c_s < `under` is under-attended, one with
                c_s > `over` over-attended (the quantities the coverage model of Tu et al. 2016 tracks)
Local-p (Luong et al. 2015, eq. 9) predicts an aligned position p_t; its distance to the diagonal is
|p_t - t (S_b - 1) / (T - 1)|, source tokens between p_t and the straight line from the first output step
on the first source token to the last step (EOS) on the last (</s>), S_b the source length with </s>.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def renormalised(matrix: np.ndarray) -> np.ndarray:
    """(T, S) rows scaled to sum to 1 (an all-zero row stays zero)."""
    rows = np.asarray(matrix, dtype=np.float64)
    return rows / np.maximum(rows.sum(1, keepdims=True), 1e-30)


def row_entropy(matrix: np.ndarray) -> np.ndarray:
    """(T,) entropy in nats of each row renormalised to sum to 1."""
    p = renormalised(matrix)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(p), 0.0)
    return terms.sum(1)


def coverage(matrix: np.ndarray) -> np.ndarray:
    """(S,) attention mass of each source token summed over the output steps, the </s> column left out."""
    return np.asarray(matrix, dtype=np.float64)[:, :-1].sum(0)


def diagonal_distance(positions: np.ndarray, source_length: int) -> np.ndarray:
    """(T,) |p_t - t (S_b - 1) / (T - 1)| for predicted positions p_t (T,) of one sentence of S_b tokens with </s>."""
    steps = len(positions)
    diagonal = np.arange(steps) * (source_length - 1) / max(steps - 1, 1)
    return np.abs(np.asarray(positions, dtype=np.float64) - diagonal)


@dataclass
class AttentionStats:
    """Sums over a test set, averaged at the end: per output step (entropy, max) and per source token (coverage)."""

    under: float = 0.5
    over: float = 2.0
    steps: int = 0
    entropy: float = 0.0
    max_weight: float = 0.0
    tokens: int = 0
    coverage: float = 0.0
    under_count: int = 0
    over_count: int = 0
    positions: int = 0
    distance: float = 0.0

    def add(self, matrix: np.ndarray, positions: np.ndarray | None = None) -> None:
        """One sentence's attention (T, S + 1) and, for local-p, its predicted positions p_t (T,)."""
        if matrix.size == 0:
            return
        matrix = renormalised(matrix)
        self.steps += matrix.shape[0]
        self.entropy += float(row_entropy(matrix).sum())
        self.max_weight += float(np.asarray(matrix).max(1).sum())
        mass = coverage(matrix)
        self.tokens += len(mass)
        self.coverage += float(mass.sum())
        self.under_count += int((mass < self.under).sum())
        self.over_count += int((mass > self.over).sum())
        if positions is not None:
            self.positions += len(positions)
            self.distance += float(diagonal_distance(positions, matrix.shape[1]).sum())

    def as_dict(self) -> dict[str, float | int | None]:
        steps, tokens = max(self.steps, 1), max(self.tokens, 1)
        return {
            "entropy": self.entropy / steps,
            "max_weight": self.max_weight / steps,
            "coverage": self.coverage / tokens,
            "under_attended": self.under_count / tokens,
            "over_attended": self.over_count / tokens,
            "under_threshold": self.under,
            "over_threshold": self.over,
            "steps": self.steps,
            "source_tokens": self.tokens,
            "p_t_diagonal_distance": self.distance / self.positions if self.positions else None,
        }
