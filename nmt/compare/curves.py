"""Learning curves read back from a run's train.log (the lines nmt.training.progress and validation write).

    step 400/10000 | epoch 1.35 | loss 4.213 (label-smoothed) | lr 1.00e-03 | 2,410 tok/s | 3m12s | ETA 1h17m
    step 400 | valid loss 3.986 ppl 53.84 | BLEU 12.31 chrF 40.12 (...)

(logs written before 2026-12-02, and runs without label smoothing, show `ppl X` in place of `(label-smoothed)`).

The progress lines give the seconds of training at a step by the run's budget clock (validation and
checkpoint saving not counted; cumulative over resumes); a validation step between two of them gets the
time interpolated linearly (step 0 at 0 s, and the last step at results.json's training seconds). A resumed
run repeats the steps between its checkpoint and the kill; the last line written for a step is the one kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PROGRESS = re.compile(
    r"^step (\d+)/\d+ \| epoch [\d.]+ \| loss ([\d.]+|nan|inf) (?:ppl \S+|\(label-smoothed\)) \| lr \S+ "
    r"\| [\d,]+ tok/s \| (\S+)"
)
VALID = re.compile(r"^step (\d+) \| valid loss ([\d.]+|nan|inf) ppl (\S+) \| BLEU ([\d.]+) chrF ([\d.]+)")
DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def seconds(text: str) -> float | None:
    """'1h02m' -> 3720, '3m12s' -> 192, '9s' -> 9 (the format of nmt.training.progress.duration)."""
    match = DURATION.match(text)
    if match is None or not any(match.groups()):
        return None
    h, m, s = (int(g or 0) for g in match.groups())
    return float(3600 * h + 60 * m + s)


@dataclass
class Curve:
    """Validation points (step, seconds, loss, ppl, BLEU, chrF) and training-loss points (step, seconds, loss)."""

    valid: list[tuple[int, float, float, float, float, float]] = field(default_factory=list)
    train: list[tuple[int, float, float]] = field(default_factory=list)

    def at_step(self, step: int) -> tuple[int, float, float, float, float, float] | None:
        """The validation point of a step, if the run validated there."""
        return next((point for point in self.valid if point[0] == step), None)


def read_curve(log: Path, final_step: int | None = None, final_seconds: float | None = None) -> Curve:
    """The curves of one run; `final_step`/`final_seconds` (results.json) anchor the time of the last step."""
    progress: dict[int, tuple[float, float]] = {}
    valid: dict[int, tuple[float, float, float, float]] = {}
    if log.is_file():
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            if match := PROGRESS.match(line):
                elapsed = seconds(match.group(3))
                if elapsed is not None:
                    progress[int(match.group(1))] = (elapsed, float(match.group(2)))
            elif match := VALID.match(line):
                valid[int(match.group(1))] = tuple(float(g) for g in match.groups()[1:])  # type: ignore[assignment]
    anchors = {0: 0.0} | {step: elapsed for step, (elapsed, _) in progress.items()}
    if final_step is not None and final_seconds is not None:
        anchors[final_step] = final_seconds
    steps = sorted(anchors)
    times = [anchors[s] for s in steps]
    at = lambda step: float(np.interp(step, steps, times))  # noqa: E731
    return Curve(
        valid=[(step, at(step), *valid[step]) for step in sorted(valid)],
        train=[(step, elapsed, loss) for step, (elapsed, loss) in sorted(progress.items())],
    )
