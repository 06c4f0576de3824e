"""What a step checkpoint holds besides the weights, and how a resumed run takes it back (part of the Trainer).

Exact resume: the optimizer, schedule, counters, early-stopping and bad-step state, the data position
(epoch, batch within it, and the batching settings of that epoch), the seconds trained so far, the
random states of every process and of validation's sampling, and fp16's loss scale. A run continued
from its last checkpoint repeats the uninterrupted run bit for bit on CPU.

A resumed run does what `resume: setting differs` prints, from the next update on:
- train.lr, train.schedule, train.warmup: the new peak rate and schedule, at the step reached;
- train.batch_tokens, train.seed, data.src/tgt_subword_alpha: the current epoch keeps its batches (so no
  pair is skipped or seen twice), the new batching starts with the next epoch;
- training data that encode to other pairs: refused mid-epoch (the position would point elsewhere);
- train.early_stop_metric: refused (best.pt and patience were ranked by the old metric; see cli/train.py).
Every other training or decoding setting simply applies from then on.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from nmt.errors import NmtError
from nmt.runtime import rng_state, set_rng_state
from nmt.training.checkpoint import (
    BEST,
    LAST,
    link_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    step_checkpoints,
    step_name,
)


def snapshot_name(step: int) -> str:
    """checkpoints/best_at_N.pt: the best checkpoint by validation among the first N updates (train.snapshot_at)."""
    return f"best_at_{step}.pt"


def pairs_fingerprint(src_lens: list[int], tgt_lens: list[int]) -> str:
    """What the data position depends on: the training pairs' lengths, in order."""
    return hashlib.sha256(np.asarray([src_lens, tgt_lens], dtype=np.int64).tobytes()).hexdigest()[:16]


class CheckpointState:
    """train_state, save and restore of the Trainer."""

    def train_state(self) -> dict:
        """Everything besides the weights that exact resume needs
        (call on every process: it gathers their RNG states)."""
        rng_by_rank = self.dist.gather(rng_state())
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "batching": {
                "batch_tokens": self.batching[0],
                "seed": self.batching[1],
                "subword_alphas": list(self.batching[2]),
            },
            "pairs": pairs_fingerprint(self.src_lens, self.tgt_lens),
            "elapsed": self.clock.wall(),
            "clock": self.clock.state(),
            "stopping": self.stopping.state(),
            "bad_steps": self.guard.state(),
            "last_valid": self.last_valid,
            "rng": rng_by_rank[0],
            "rng_by_rank": rng_by_rank,
            "sampling_rng": self.translator.generator.get_state(),
            "precision": self.precision.state(),
            "world_size": self.dist.world,
            "accumulate": self.cfg.train.accumulate,
            "batch_changes": self.batch_changes,
        }

    def save(self, best: bool = False) -> None:
        """Write checkpoints/step_N.pt (once per step), point last.pt (and best.pt) at it, drop old ones (rank 0)."""
        with self.clock.outside("save"):
            self._save(best)

    def _save(self, best: bool) -> None:
        folder = self.run_dir / "checkpoints"
        path = folder / step_name(self.step)
        if self.saved_step != self.step:
            state = self.train_state()
            if self.dist.main:
                save_checkpoint(path, self.model, self.cfg, self.data.tokenizer, self.step, state)
                link_checkpoint(path, folder / LAST)
            self.saved_step = self.step
        if not self.dist.main:
            return
        if best:
            link_checkpoint(path, folder / BEST)
        recent = [s for s in step_checkpoints(folder) if s <= self.step][-self.cfg.train.keep_last :]
        prune_checkpoints(folder, set(recent) | self.stopping.best_steps)

    def snapshot(self) -> None:
        """At a train.snapshot_at step, link checkpoints/best_at_N.pt to the best checkpoint so far by validation (the
        newest without a validation split). Made once: a run resumed at that step keeps the link it made, or makes
        it if a kill came between the step's checkpoint and its link."""
        if self.step not in self.cfg.train.snapshot_at:
            return
        folder = self.run_dir / "checkpoints"
        has_valid = "valid" in self.data.splits
        if not has_valid or self.saved_step != self.step:
            self.save(best=not has_valid)  # every process: saving gathers their random states
        if not self.dist.main or (folder / snapshot_name(self.step)).is_file():
            return
        best_step = self.stopping.best[0][0] if has_valid and self.stopping.best else self.step
        target = folder / step_name(best_step)
        link_checkpoint(target if target.is_file() else folder / BEST, folder / snapshot_name(self.step))
        self.log(f"step {self.step} | {snapshot_name(self.step)}: the best checkpoint so far (step {best_step})")

    def restore(self, payload: dict) -> None:
        """Continue from a checkpoint of this run (its weights already loaded): optimizer, schedule, counters, RNG,
        data position."""
        state, where = payload.get("train_state"), payload["path"]
        if not isinstance(state, dict):
            raise NmtError(
                f"{where}: holds no training state (an averaged or exported checkpoint?); "
                "start from it with init_from= instead"
            )
        try:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.step, self.epoch, self.batch_in_epoch = payload["step"], state["epoch"], state["batch_in_epoch"]
            self.stopping.load(state["stopping"])
            self.guard.load(state["bad_steps"])
            self.last_valid = dict(state["last_valid"])
            by_rank = state.get("rng_by_rank") or [state["rng"]]
            set_rng_state(by_rank[self.dist.rank] if len(by_rank) == self.dist.world else state["rng"])
            if len(by_rank) != self.dist.world and self.dist.rank:
                torch.manual_seed(
                    self.cfg.train.seed + 1000 * self.dist.rank + self.step
                )  # another world size: fresh dropout streams
            if "sampling_rng" in state:
                self.translator.generator.set_state(state["sampling_rng"])
            self.precision.load(state.get("precision", {}))
            self.clock.load(state.get("clock"), float(state.get("elapsed", 0.0)))
            saved_batching = state.get("batching")
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as err:
            raise NmtError(
                f"{where}: its training state is incomplete or corrupt ({type(err).__name__}: {err})"
            ) from None
        if saved_batching is not None:
            alphas = tuple(
                float(a) for a in saved_batching.get("subword_alphas", (0.0, 0.0))
            )  # none before sampling existed
            self.batching = (int(saved_batching["batch_tokens"]), int(saved_batching["seed"]), alphas)
        self._check_pairs(state.get("pairs"), where)
        self.batch_changes = list(state.get("batch_changes", []))
        self._note_global_batch(
            int(state.get("world_size", len(by_rank))), int(state.get("accumulate", self.cfg.train.accumulate))
        )
        self._apply_schedule()
        self.saved_step = self.step
        folder = self.run_dir / "checkpoints"
        if self.dist.main and self.stopping.best and (best := folder / step_name(self.stopping.best[0][0])).is_file():
            link_checkpoint(best, folder / BEST)  # a killed run may have moved best.pt past this checkpoint
        self.log(f"resumed from {where} at step {self.step} (epoch {self.epoch}, batch {self.batch_in_epoch})")
        now = self.batching_now()
        if now != self.batching and self.batch_in_epoch > 0:
            (tokens, seed, alphas), (new_tokens, new_seed, new_alphas) = self.batching, now
            subwords = (
                f", subword alphas {alphas[0]}/{alphas[1]} -> {new_alphas[0]}/{new_alphas[1]}"
                if alphas != new_alphas
                else ""
            )
            self.log(
                f"resume: train.batch_tokens/seed {tokens}/{seed} -> {new_tokens}/{new_seed}{subwords} from epoch "
                f"{self.epoch + 1}; epoch {self.epoch} finishes with its own batches, "
                "so no pair is skipped or repeated"
            )
        elif self.batch_in_epoch == 0:
            self.batching = now

    def _note_global_batch(self, world: int, accumulate: int) -> None:
        """Another world size (or train.accumulate) changes the global batch: say so in the log and results.json.

        The data position counts batches, not updates, so the epoch goes on from the next batch either way."""
        before, now = accumulate * world, self.cfg.train.accumulate * self.dist.world
        if before != now:
            change = (
                f"world size {world} -> {self.dist.world}, train.accumulate {accumulate} -> "
                f"{self.cfg.train.accumulate}: global batch x{now / before:g}"
            )
            self.log(f"resume: {change} (each update now takes {now} batches of train.batch_tokens)")
            self.batch_changes.append({"step": self.step, "change": change})

    def _check_pairs(self, saved: str | None, where: str) -> None:
        """Mid-epoch, the position means something only in the same training pairs."""
        if saved is not None and self.batch_in_epoch > 0 and saved != pairs_fingerprint(self.src_lens, self.tgt_lens):
            raise NmtError(
                f"resume: the training data now give other pairs than in {where} (a data.* setting or file changed), "
                f"so its position (epoch {self.epoch}, batch {self.batch_in_epoch}) would skip or repeat pairs; "
                "resume with the same data, or start a new run from its weights with init_from="
            )

    def _apply_schedule(self) -> None:
        """Honour train.lr / schedule / warmup on resume: the next update uses the new peak rate at the step reached.

        The same arithmetic as LambdaLR (base rate x multiplier(step)), so unchanged settings give the very same rate.
        """
        lr = self.cfg.train.lr
        self.scheduler.base_lrs = [lr] * len(self.optimizer.param_groups)
        factor = self.scheduler.lr_lambdas[0](self.scheduler.last_epoch)
        for group in self.optimizer.param_groups:
            group["initial_lr"], group["lr"] = lr, lr * factor
        self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]
