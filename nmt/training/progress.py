"""What a training run tells its user: train.log and stdout lines, a progress bar, TensorBoard scalars.

Every `train.log_every` updates one line goes to train.log and stdout, so a run in the background
(`nohup`, a batch job) shows its progress in its log as established toolkits do:

    step 400/10000 | epoch 1.35 | loss 4.213 (label-smoothed) | lr 1.00e-03 | 2,410 tok/s | 3m12s | ETA 1h17m

(target tokens per second over the window; ETA to the nearest of train.max_steps and train.max_time).
A tqdm bar is drawn as well when stderr is a terminal. With torchrun, only rank 0 writes.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from nmt.errors import NmtError


@dataclass
class Meter:
    """Token-weighted loss, target tokens and seconds summed over updates."""

    loss: float = 0.0
    tokens: int = 0
    seconds: float = 0.0

    def add(self, loss: float, tokens: int, seconds: float) -> None:
        self.loss, self.tokens, self.seconds = self.loss + loss * tokens, self.tokens + tokens, self.seconds + seconds

    @property
    def mean_loss(self) -> float:
        return self.loss / max(self.tokens, 1)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def duration(seconds: float) -> str:
    """3725 -> '1h02m', 192 -> '3m12s', 9 -> '9s'."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class RunLog:
    """Lines to stdout (above any progress bar) and to RUN/train.log; lines before the run dir exists wait for it.

    `enabled=False` (ranks other than 0) drops every line.
    """

    def __init__(self, echo: Callable[[str], None] | None = None, enabled: bool = True):
        self.enabled = enabled
        self._echo = echo or (lambda line: tqdm.write(line, file=sys.stdout))
        self._pending: list[str] = []
        self._file = None

    def __call__(self, line: str) -> None:
        if not self.enabled:
            return
        self._echo(line)
        if self._file is None:
            self._pending.append(line)
        else:
            self._file.write(line + "\n")
            self._file.flush()

    def open(self, path: Path) -> None:
        """Start writing to `path` (appending), beginning with the lines logged so far."""
        if not self.enabled:
            return
        try:
            self._file = open(path, "a", encoding="utf-8")
        except OSError as err:
            raise NmtError(f"run_dir={path.parent}: cannot write ({err.strerror or err})") from None
        self._file.writelines(line + "\n" for line in self._pending)
        self._file.flush()
        self._pending = []

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class Progress:
    """The bar, the periodic progress line and the TensorBoard scalars of one `fit`."""

    def __init__(
        self,
        log: RunLog,
        tb_dir: Path | None,
        max_steps: int,
        max_time_s: float | None,
        step: int,
        elapsed: float,
        bar: bool,
        smoothed: bool = False,
    ):
        """tb_dir None: no TensorBoard and no bar (ranks other than 0). `step`/`elapsed`: where this fit starts.
        smoothed: the training loss is label-smoothed, so its exponent is no perplexity and is not shown as one."""
        from torch.utils.tensorboard import SummaryWriter

        self.log, self.max_steps, self.max_time_s, self.smoothed = log, max_steps, max_time_s, smoothed
        self.first_step, self.first_elapsed = step, elapsed  # a resumed run's ETA uses the pace of its own steps
        self.writer = SummaryWriter(str(tb_dir)) if tb_dir is not None else None
        self.bar = tqdm(
            total=max_steps,
            initial=step,
            disable=None if bar and tb_dir is not None else True,
            file=sys.stderr,
            unit="step",
            dynamic_ncols=True,
        )
        self.window = Meter()

    def update(self, loss: float, tokens: int, seconds: float) -> None:
        self.window.add(loss, tokens, seconds)
        self.bar.update(1)

    def report(self, step: int, epoch: float, lr: float, elapsed: float) -> None:
        """The progress line and scalars for the updates since the last report."""
        w = self.window
        if w.tokens == 0:
            return
        loss, speed = w.mean_loss, w.tokens_per_s
        eta = self.eta(step, elapsed)
        self.log(
            f"step {step}/{self.max_steps} | epoch {epoch:.2f} | loss {loss:.3f} "
            + ("(label-smoothed)" if self.smoothed else f"ppl {math.exp(min(loss, 50)):.1f}")
            + f" | lr {lr:.2e} | {speed:,.0f} tok/s | {duration(elapsed)}"
            + (f" | ETA {duration(eta)}" if eta is not None else "")
        )
        self.bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{speed:.0f}")
        self.scalars({"train/loss": loss, "train/lr": lr, "train/tokens_per_s": speed}, step)
        self.window = Meter()

    def eta(self, step: int, elapsed: float) -> float | None:
        """Seconds to the nearest limit: the remaining steps at this fit's pace, or train.max_time."""
        candidates = []
        if step > self.first_step:
            pace = (elapsed - self.first_elapsed) / (step - self.first_step)
            candidates.append((self.max_steps - step) * pace)
        if self.max_time_s is not None:
            candidates.append(max(self.max_time_s - elapsed, 0.0))
        return min(candidates) if candidates else None

    def scalars(self, values: dict[str, float], step: int) -> None:
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.bar.close()
        if self.writer is not None:
            self.writer.close()
