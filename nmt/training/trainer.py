"""The training loop: one trainer for every model.

Adam with a warm-up schedule, label-smoothed cross-entropy, gradient clipping, periodic validation
(loss, perplexity, BLEU and chrF with the same search as nmt-translate), step checkpoints (the newest
`train.keep_last` and the best `train.keep_best`), early stopping, TensorBoard scalars and a
results.json with the final figures.

Exact resume: every checkpoint holds the optimizer, schedule, counters, early-stopping state, RNG
states and the data position (epoch, batch within it; an epoch's batches depend only on the seed and
the epoch), so a run continued from its last checkpoint repeats the uninterrupted run bit for bit on CPU.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from nmt.config import Config, config_to_yaml
from nmt.data.batching import Batch, make_batch, token_batches
from nmt.data.dataset import Split, prepare_data
from nmt.data.tokenizer import PAD
from nmt.errors import NmtError
from nmt.evaluation.metrics import corpus_score
from nmt.fileio import atomic_open
from nmt.models.seq2seq import build_model
from nmt.runtime import resolve_device, rng_state, seed_everything, set_rng_state
from nmt.training.checkpoint import (
    BEST, LAST, checkpoint_tokenizer, link_checkpoint, load_weights, prune_checkpoints, remove_stale_temporaries, save_checkpoint, step_checkpoints, step_name,
)
from nmt.training.schedule import lr_multiplier
from nmt.training.stopping import BadStepGuard, EarlyStopping, TrainingStopped
from nmt.translation import Translator, decode_settings


def batches_of(split: Split, indices: list[int]) -> Batch:
    return make_batch([split.src_ids[i] for i in indices], [split.tgt_ids[i] for i in indices])


@dataclass
class Meter:
    """Token-weighted loss, target tokens and seconds summed over updates."""

    loss: float = 0.0
    tokens: int = 0
    seconds: float = 0.0

    def add(self, loss: float, tokens: int, seconds: float) -> None:
        self.loss, self.tokens, self.seconds = self.loss + loss * tokens, self.tokens + tokens, self.seconds + seconds


class Trainer:
    """Trains cfg.model on cfg.data into run_dir.

    With a loaded `checkpoint`, its tokenizer and weights are used; with cfg.resume set, its training
    state too (exact resume), otherwise the optimizer and counters start fresh (init_from, fine-tuning).
    """

    def __init__(self, cfg: Config, run_dir: Path, log: Callable[[str], None] | None = None, checkpoint: dict | None = None):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self._pending: list[str] = []  # log lines written to train.log once the run dir exists
        self._log_file = None
        self._echo = log or (lambda line: tqdm.write(line, file=sys.stdout))
        train = cfg.train
        self.stopping = EarlyStopping(train.early_stop_metric, train.patience, train.keep_best)
        self.guard = BadStepGuard(train.max_bad_steps)
        if train.keep_last < 1:
            raise NmtError(f"train.keep_last={train.keep_last}: expected at least 1 (resume needs the last checkpoint)")
        if cfg.resume is None and any((self.run_dir / "checkpoints").glob("*.pt")):
            raise NmtError(f"run_dir={self.run_dir}: already holds a run's checkpoints; continue it with resume={self.run_dir}, or choose another run_dir")
        if train.threads:
            torch.set_num_threads(train.threads)
        seed_everything(train.seed)
        self.device = resolve_device(train.device)
        self.data = prepare_data(cfg.data, self.log, checkpoint_tokenizer(checkpoint) if checkpoint else None)
        tok = self.data.tokenizer
        self.model = build_model(cfg.model, tok.src_vocab_size, tok.tgt_vocab_size, tok.joint).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=train.lr, betas=(0.9, 0.98), eps=1e-9)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_multiplier(train.schedule, train.warmup))
        self.translator = Translator(self.model, tok, cfg.decode, self.device)
        self.step = self.epoch = self.batch_in_epoch = 0
        self.saved_step: int | None = None  # the step of checkpoints/last.pt
        self.last_valid: dict[str, float] = {}
        self.bleu_signature: str | None = None
        if checkpoint is not None:
            load_weights(self.model, checkpoint)  # before the run dir exists: a mismatch leaves nothing behind
        self._open_run_dir()
        n_params = sum(p.numel() for p in self.model.parameters())
        self.log(f"model: {cfg.model.arch}, {n_params:,} parameters; device {self.device}")
        if checkpoint is not None and cfg.resume is not None:
            self.restore(checkpoint)
        elif checkpoint is not None:
            self.log(f"init_from: weights of {checkpoint['path']} (step {checkpoint['step']}); fresh optimizer, schedule and counters")

    def _open_run_dir(self) -> None:
        """Create the run dir only now that the data and model are valid: a bad input leaves nothing behind."""
        try:
            (self.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(self.run_dir / "checkpoints")
            self._log_file = open(self.run_dir / "train.log", "a", encoding="utf-8")
        except OSError as err:
            raise NmtError(f"run_dir={self.run_dir}: cannot write ({err.strerror or err})") from None
        with atomic_open(self.run_dir / "config.yaml", key="run_dir") as f:
            f.write(config_to_yaml(self.cfg))
        for line in self._pending:
            self._log_file.write(line + "\n")
        self._log_file.flush()

    def log(self, line: str) -> None:
        self._echo(line)
        if self._log_file is None:
            self._pending.append(line)
        else:
            self._log_file.write(line + "\n")
            self._log_file.flush()

    # --- checkpoints -------------------------------------------------------------------------
    def train_state(self) -> dict:
        """Everything besides the weights that exact resume needs."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "stopping": self.stopping.state(),
            "bad_steps": self.guard.state(),
            "last_valid": self.last_valid,
            "rng": rng_state(),
        }

    def save(self, best: bool = False) -> None:
        """Write checkpoints/step_N.pt (once per step), point last.pt (and best.pt) at it, drop old ones."""
        folder = self.run_dir / "checkpoints"
        path = folder / step_name(self.step)
        if self.saved_step != self.step:
            save_checkpoint(path, self.model, self.cfg, self.data.tokenizer, self.step, self.train_state())
            link_checkpoint(path, folder / LAST)
            self.saved_step = self.step
        if best:
            link_checkpoint(path, folder / BEST)
        recent = [s for s in step_checkpoints(folder) if s <= self.step][-self.cfg.train.keep_last :]
        prune_checkpoints(folder, set(recent) | self.stopping.best_steps)

    def restore(self, payload: dict) -> None:
        """Continue from a checkpoint of this run (its weights already loaded): optimizer, schedule, counters, RNG, data position."""
        state, where = payload.get("train_state"), payload["path"]
        if not isinstance(state, dict):
            raise NmtError(f"{where}: holds no training state (an averaged or exported checkpoint?); start from it with init_from= instead")
        try:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.step, self.epoch, self.batch_in_epoch = payload["step"], state["epoch"], state["batch_in_epoch"]
            self.stopping.load(state["stopping"])
            self.guard.load(state["bad_steps"])
            self.last_valid = dict(state["last_valid"])
            set_rng_state(state["rng"])
        except (KeyError, TypeError, ValueError, RuntimeError) as err:
            raise NmtError(f"{where}: its training state is incomplete or corrupt ({type(err).__name__}: {err})") from None
        self.saved_step = self.step
        folder = self.run_dir / "checkpoints"
        if self.stopping.best and (best := folder / step_name(self.stopping.best[0][0])).is_file():
            link_checkpoint(best, folder / BEST)  # a killed run may have moved best.pt past this checkpoint
        self.log(f"resumed from {where} at step {self.step} (epoch {self.epoch}, batch {self.batch_in_epoch})")

    # --- training ----------------------------------------------------------------------------
    def loss(self, batch: Batch, smoothing: float) -> torch.Tensor:
        """Summed token cross-entropy over non-padding targets."""
        logits = self.model(batch.src, batch.src_mask, batch.tgt_in)  # (B, T, V)
        return F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), batch.tgt_out.reshape(-1), ignore_index=PAD, label_smoothing=smoothing, reduction="sum"
        )

    def train_step(self, batch: Batch) -> float | None:
        """One update; None (and no update) when the loss or the gradient norm is not finite."""
        self.model.train()
        loss = self.loss(batch, self.cfg.train.label_smoothing) / batch.target_tokens
        self.optimizer.zero_grad(set_to_none=True)
        if not torch.isfinite(loss):
            return None
        loss.backward()
        clip = self.cfg.train.clip_norm if self.cfg.train.clip_norm > 0 else math.inf
        if not torch.isfinite(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)):
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.optimizer.step()
        self.scheduler.step()
        return float(loss.detach())

    def skipped_update(self) -> None:
        """Count an update skipped for a non-finite value; too many in a row stop the run."""
        stop = self.guard.bad()
        self.log(f"step {self.step + 1} | non-finite loss or gradient: update skipped ({self.guard.in_a_row} in a row, {self.guard.total} in all)")
        if stop:
            last = f"{self.run_dir / 'checkpoints' / LAST} (step {self.saved_step})" if self.saved_step is not None else "none saved yet"
            raise TrainingStopped(
                f"step {self.step + 1}: {self.guard.in_a_row} updates in a row had a non-finite loss or gradient "
                f"(train.max_bad_steps={self.cfg.train.max_bad_steps}), training stopped at epoch {self.epoch} batch {self.batch_in_epoch}; "
                f"last good checkpoint: {last}; lower train.lr or check the data"
            )

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Loss and perplexity (no smoothing) on the validation split, and BLEU and chrF of its translation."""
        split = self.data.splits["valid"]
        self.model.eval()
        total, tokens = 0.0, 0
        for indices in token_batches([len(s) for s in split.src_ids], [len(t) for t in split.tgt_ids], self.cfg.train.batch_tokens, 0, 0, shuffle=False):
            batch = batches_of(split, indices).to(self.device)
            total += float(self.loss(batch, 0.0))
            tokens += batch.target_tokens
        n = self.cfg.train.valid_bleu_sentences or len(split)
        hyps = self.translator.translate(split.src_text[:n])
        bleu, chrf = corpus_score("bleu", hyps, split.tgt_text[:n]), corpus_score("chrf", hyps, split.tgt_text[:n])
        loss = total / max(tokens, 1)
        result = {"valid_loss": loss, "valid_ppl": math.exp(min(loss, 50)), "valid_bleu": bleu.score, "valid_chrf": chrf.score}
        self.log(
            f"step {self.step} | valid loss {loss:.3f} ppl {result['valid_ppl']:.2f} | BLEU {bleu.score:.2f} chrF {chrf.score:.2f} "
            f"({decode_settings(self.cfg.decode)}; {bleu.signature})"
        )
        self.bleu_signature = bleu.signature
        return result

    def after_validation(self, result: dict[str, float], writer) -> tuple[bool, bool]:
        """Log the scalars and rank the score: (a new best?, worth keeping a checkpoint for?)."""
        self.last_valid = {"step": self.step, **result}
        for key, value in result.items():
            writer.add_scalar(key.replace("_", "/", 1), value, self.step)
        metric = self.stopping.metric
        improved, ranked = self.stopping.update(self.step, result[f"valid_{metric}"])
        if improved:
            self.log(f"step {self.step} | new best valid {metric} {result[f'valid_{metric}']:.4g}, saved {BEST}")
        if self.stopping.should_stop:
            step, score = self.stopping.best[0]
            self.log(f"step {self.step} | early stop: valid {metric} not improved for {self.stopping.patience} validations (best {score:.4g} at step {step})")
        return improved, ranked

    def fit(self) -> dict:
        """Train until train.max_steps, train.max_epochs or early stopping; returns and writes results.json."""
        from torch.utils.tensorboard import SummaryWriter

        start, total = time.perf_counter(), Meter()
        writer = SummaryWriter(str(self.run_dir / "tb"))
        try:
            self._loop(writer, total)
            has_valid = "valid" in self.data.splits
            improved = False
            if has_valid and self.last_valid.get("step") != self.step:
                improved, _ = self.after_validation(self.validate(), writer)
            self.save(best=improved or not has_valid)
        finally:
            writer.close()
        best = self.stopping.best[0] if self.stopping.best else None
        results = {
            "steps": self.step,
            "epochs": round(self.epoch + self.batch_in_epoch / max(1, len(self._batches)), 3),
            "wall_s": round(time.perf_counter() - start, 2),
            "train_tokens_per_s": round(total.tokens / total.seconds, 1) if total.seconds else 0.0,
            **{k: round(v, 4) for k, v in self.last_valid.items() if k != "step"},
            "best": {"metric": self.stopping.metric, "score": round(best[1], 4), "step": best[0]} if best else None,
            "early_stopped": self.stopping.should_stop,
            "skipped_updates": self.guard.total,
            "bleu_signature": self.bleu_signature,
            "decode": decode_settings(self.cfg.decode),
        }
        with atomic_open(self.run_dir / "results.json", key="run_dir") as f:
            f.write(json.dumps(results, indent=2) + "\n")
        self.log("results: " + json.dumps(results))
        return results

    def _loop(self, writer, total: Meter) -> None:
        """Updates from the current data position until a limit or early stopping."""
        cfg = self.cfg.train
        train = self.data.splits["train"]
        src_lens, tgt_lens = [len(s) for s in train.src_ids], [len(t) for t in train.tgt_ids]
        bar = tqdm(total=cfg.max_steps, initial=self.step, disable=None if cfg.progress else True, file=sys.stderr, unit="step", dynamic_ncols=True)
        window = Meter()
        self._batches = token_batches(src_lens, tgt_lens, cfg.batch_tokens, cfg.seed, self.epoch)
        try:
            while self.step < cfg.max_steps and (cfg.max_epochs is None or self.epoch < cfg.max_epochs) and not self.stopping.should_stop:
                if self.batch_in_epoch >= len(self._batches):
                    self.epoch, self.batch_in_epoch = self.epoch + 1, 0
                    self._batches = token_batches(src_lens, tgt_lens, cfg.batch_tokens, cfg.seed, self.epoch)
                    continue
                t0 = time.perf_counter()
                batch = batches_of(train, self._batches[self.batch_in_epoch]).to(self.device)
                loss = self.train_step(batch)
                self.batch_in_epoch += 1
                if loss is None:
                    self.skipped_update()
                    continue
                self.guard.good()
                self.step += 1
                for meter in (total, window):
                    meter.add(loss, batch.target_tokens, time.perf_counter() - t0)
                bar.update(1)
                if self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
                    self._log_window(window, writer, bar)
                    window = Meter()
                self._after_update(writer)
        finally:
            bar.close()

    def _log_window(self, window: Meter, writer, bar: tqdm) -> None:
        lr = self.scheduler.get_last_lr()[0]
        loss, speed = window.loss / window.tokens, window.tokens / max(window.seconds, 1e-9)
        bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{speed:.0f}")
        writer.add_scalar("train/loss", loss, self.step)
        writer.add_scalar("train/lr", lr, self.step)
        writer.add_scalar("train/tokens_per_s", speed, self.step)

    def _after_update(self, writer) -> None:
        """Validate and save when due; a score among the best M, or an early stop, saves too."""
        cfg = self.cfg.train
        improved = ranked = False
        if "valid" in self.data.splits and (self.step % cfg.valid_every == 0 or self.step == cfg.max_steps):
            improved, ranked = self.after_validation(self.validate(), writer)
        if self.step % cfg.save_every == 0 or ranked or self.stopping.should_stop:
            self.save(best=improved)
