"""Where a run's time goes: training, validation and checkpoint saving, in wall-clock and CPU seconds.

A wall-clock budget (train.max_time) counts training only: the updates and the batching between them.
Validation (which runs a search over the validation sentences) and checkpoint saving are timed apart, so a
variant with a slower decoder, or an untrained one that emits max-length output, does not lose updates.
`train.budget_clock=cpu` counts the training CPU time of this process instead of wall-clock time: with one
thread it equals wall-clock time on an idle core, and it does not shrink when other processes take the core
(the fair budget for runs side by side on a shared machine).

Totals carry over a resume (they are part of the checkpoint's training state).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

CLOCKS = ("wall", "cpu")
PHASES = ("valid", "save")  # timed apart from training


class Clock:
    """Cumulative wall and CPU seconds of a run, split into training and the phases outside it."""

    def __init__(self) -> None:
        self.before = {
            "wall": 0.0,
            "cpu": 0.0,
            **{f"{p}_wall": 0.0 for p in PHASES},
            **{f"{p}_cpu": 0.0 for p in PHASES},
        }
        self.now = dict.fromkeys(self.before, 0.0)  # this process's share since start()
        self.tokens_before = 0  # target tokens trained on in earlier parts of a resumed run
        self.tokens = 0
        self._wall0 = self._cpu0 = None

    def start(self) -> None:
        self._wall0, self._cpu0 = time.perf_counter(), time.process_time()

    def _total(self, key: str) -> float:
        if key == "wall" and self._wall0 is not None:
            return self.before["wall"] + time.perf_counter() - self._wall0
        if key == "cpu" and self._cpu0 is not None:
            return self.before["cpu"] + time.process_time() - self._cpu0
        return self.before[key] + self.now[key]

    @contextmanager
    def outside(self, phase: str) -> Iterator[None]:
        """Time a block as `phase` (validation or saving), not as training."""
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.now[f"{phase}_wall"] += time.perf_counter() - wall
            self.now[f"{phase}_cpu"] += time.process_time() - cpu

    def wall(self) -> float:
        """Every second since the run started (training, validation, saving), over all its parts."""
        return self._total("wall")

    def train_seconds(self, clock: str = "wall") -> float:
        """Seconds of training only, by the wall clock or this process's CPU time."""
        return self._total(clock) - sum(self._total(f"{p}_{clock}") for p in PHASES)

    def phase_seconds(self, phase: str, clock: str = "wall") -> float:
        return self._total(f"{phase}_{clock}")

    def state(self) -> dict:
        return {**{key: self._total(key) for key in self.before}, "tokens": self.tokens_before + self.tokens}

    def load(self, state: dict | None, elapsed: float = 0.0) -> None:
        """Totals of the earlier parts; a checkpoint from before this clock gives only `elapsed` (all wall-clock)."""
        if state:
            self.before = {key: float(state.get(key, 0.0)) for key in self.before}
            self.tokens_before = int(state.get("tokens", 0))
        else:
            self.before["wall"] = elapsed

    def summary(self) -> dict:
        """The figures results.json reports, each covering the whole run (all its resumed parts)."""
        train = self.train_seconds("wall")
        tokens = self.tokens_before + self.tokens
        return {
            "wall_s": round(self.wall(), 2),
            "train_s": round(train, 2),
            "valid_s": round(self.phase_seconds("valid"), 2),
            "save_s": round(self.phase_seconds("save"), 2),
            "train_cpu_s": round(self.train_seconds("cpu"), 2),
            "cpu_s": round(self._total("cpu"), 2),
            "train_tokens": tokens,
            "train_tokens_per_s": round(tokens / train, 1) if train > 0 else 0.0,
        }
