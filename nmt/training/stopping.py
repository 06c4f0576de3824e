"""When to stop: early stopping on a validation metric, and a guard against non-finite updates.

Both keep only plain numbers, saved in every checkpoint, so a resumed run stops exactly where an
uninterrupted one would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from nmt.errors import NmtError

HIGHER_IS_BETTER = {"bleu": True, "chrf": True, "loss": False}


class TrainingStopped(NmtError):
    """Training cannot go on (e.g. the loss keeps diverging); exit code 3 sets it apart from bad input."""

    exit_code = 3


@dataclass
class EarlyStopping:
    """Tracks the best validation scores of one metric; patience counts validations without a new best."""

    metric: str
    patience: Optional[int]
    keep_best: int
    best: list[tuple[int, float]] = field(default_factory=list)  # (step, score), best first, at most keep_best
    since_best: int = 0  # validations in a row without a new best

    def better(self, a: float, b: float) -> bool:
        return a > b if HIGHER_IS_BETTER[self.metric] else a < b

    def update(self, step: int, score: float) -> tuple[bool, bool]:
        """Record a validation score: (a new best?, among the keep_best best, so worth a checkpoint?)."""
        improved = not self.best or self.better(score, self.best[0][1])
        self.since_best = 0 if improved else self.since_best + 1
        ranked = [(s, v) for s, v in self.best if s != step] + [(step, score)]
        ranked.sort(
            key=lambda sv: -sv[1] if HIGHER_IS_BETTER[self.metric] else sv[1]
        )  # stable: earlier step wins a tie
        self.best = ranked[: self.keep_best]
        return improved, any(s == step for s, _ in self.best)

    @property
    def should_stop(self) -> bool:
        return self.patience is not None and self.since_best >= self.patience

    @property
    def best_steps(self) -> set[int]:
        return {s for s, _ in self.best}

    def state(self) -> dict:
        return {"best": [list(sv) for sv in self.best], "since_best": self.since_best}

    def load(self, state: dict) -> None:
        self.best = [(int(s), float(v)) for s, v in state["best"]][: self.keep_best]
        self.since_best = int(state["since_best"])


@dataclass
class BadStepGuard:
    """Counts updates skipped for a non-finite loss or gradient; too many in a row stop training."""

    max_in_a_row: int
    in_a_row: int = 0
    total: int = 0

    def good(self) -> None:
        self.in_a_row = 0

    def bad(self) -> bool:
        """Count a skipped update; True when training should stop."""
        self.in_a_row += 1
        self.total += 1
        return self.in_a_row >= self.max_in_a_row

    def state(self) -> dict:
        return {"in_a_row": self.in_a_row, "total": self.total}

    def load(self, state: dict) -> None:
        self.in_a_row, self.total = int(state["in_a_row"]), int(state["total"])
