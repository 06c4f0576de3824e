"""The training loop: one trainer for every model.

Adam with a warm-up schedule, label-smoothed cross-entropy over the real target tokens, gradient
clipping, periodic validation (loss, perplexity, BLEU and chrF with the same search as nmt-translate),
step checkpoints, early stopping, and limits on steps, epochs and wall-clock time (train.max_time).
Beside it: position.py (the batches of each epoch and update), progress.py (what the user sees),
precision.py (fp32/bf16/fp16), distributed.py (torchrun and DDP), validation.py (scoring and ranking),
state.py (what a checkpoint holds for exact resume).

One update takes `train.accumulate` batches per process; the loss is summed over all of them (on all
processes) and divided by their target tokens, so the update equals that of one batch holding them all.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.profiler import record_function

from nmt.config import Config, config_to_yaml
from nmt.data.batching import Batch
from nmt.data.dataset import prepare_data
from nmt.data.tokenizer import PAD
from nmt.errors import NmtError
from nmt.fileio import atomic_open
from nmt.models.bahdanau_loop import looped_by
from nmt.models.builders import build_model
from nmt.models.dropout import drawn_by
from nmt.models.norm import normed_by
from nmt.runtime import resolve_device, seed_everything
from nmt.training.checkpoint import checkpoint_tokenizer, load_weights, remove_stale_temporaries
from nmt.training.clock import Clock
from nmt.training.distributed import Distributed
from nmt.training.kernel_cache import keep_compiled_kernels
from nmt.training.loss import smoothed_cross_entropy
from nmt.training.native_attention import resolve_decoder_loop
from nmt.training.native_dropout import resolve_dropout_kernel
from nmt.training.native_norm import resolve_norm_kernel
from nmt.training.position import DataPosition
from nmt.training.precision import Precision
from nmt.training.progress import Meter, Progress, RunLog
from nmt.training.schedule import lr_multiplier
from nmt.training.state import CheckpointState
from nmt.training.stopping import BadStepGuard, EarlyStopping, TrainingStopped
from nmt.training.validation import Validation
from nmt.translation import Translator, decode_settings


def oversubscribed(cores: int, threads: int, processes: int, load: float) -> bool:
    """Whether `processes` training processes of `threads` threads each are too many for `cores` cores with a
    1-minute load average of `load`: more threads than cores, or several threads each while other work keeps the
    cores busy. The load average counts this run's own processes (each at most one runnable thread while it
    prepares its data), so only what is above them is others' work."""
    total, others = threads * processes, max(0.0, load - processes)
    return total > cores or (threads > 1 and others + total > cores + 0.5)


class Trainer(CheckpointState, Validation, DataPosition):
    """Trains cfg.model on cfg.data into run_dir.

    With a loaded `checkpoint`, its tokenizer and weights are used; with cfg.resume set, its training
    state too (exact resume), otherwise the optimizer and counters start fresh (init_from, fine-tuning).
    """

    def __init__(
        self, cfg: Config, run_dir: Path, log: Callable[[str], None] | None = None, checkpoint: dict | None = None
    ):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise NmtError(f"run_dir={self.run_dir}: is a file, expected a folder (new, or a run's to resume)")
        train = cfg.train
        keep_compiled_kernels()  # before the first bf16 product: later epochs find their shapes' kernels compiled
        self.dist = Distributed.from_env()
        self.log = RunLog(log, enabled=self.dist.main)
        self.stopping = EarlyStopping(train.early_stop_metric, train.patience, train.keep_best)
        self.guard = BadStepGuard(train.max_bad_steps)
        if cfg.resume is None and any((self.run_dir / "checkpoints").glob("*.pt")):
            raise NmtError(
                f"run_dir={self.run_dir}: already holds a run's checkpoints; "
                f"continue it with resume={self.run_dir}, or choose another run_dir"
            )
        if train.threads:
            torch.set_num_threads(train.threads)
        self.device = self.dist.setup(resolve_device(train.device), train.dist_timeout_min)
        self.precision = Precision(train.precision, self.device)
        self.dropout_kernel = resolve_dropout_kernel(train.dropout_kernel, self.precision.name, self.device)
        self.norm_kernel = resolve_norm_kernel(train.norm_kernel, self.precision.name, self.device)
        self.decoder_loop = resolve_decoder_loop(train.decoder_loop, self.precision.name, self.device)
        seed_everything(train.seed)  # the same initial weights on every process
        self.data = self._prepare_data(checkpoint)
        tok = self.data.tokenizer
        self.model = build_model(cfg.model, tok.src_vocab_size, tok.tgt_vocab_size, tok.joint).to(self.device)
        if checkpoint is not None:
            load_weights(self.model, checkpoint)  # before the run dir exists: a mismatch leaves nothing behind
        self.net = self.dist.wrap(self.model, self.device)  # what training calls: DDP averages its gradients
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=train.lr, betas=(0.9, 0.98), eps=1e-9, fused=True
        )  # one kernel for all weights
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_multiplier(train.schedule, train.warmup, train.max_steps)
        )
        self.translator = Translator(self.model, tok, cfg.decode, self.device)
        self.step = self.epoch = self.batch_in_epoch = 0
        self.batching = self.batching_now()  # the current epoch's batches were made with these
        self.clock = Clock()  # training, validation and saving seconds, over every part of a resumed run
        self.saved_step: int | None = None  # the step of checkpoints/last.pt
        self.last_valid: dict[str, float] = {}
        self.bleu_signature: str | None = None
        self.timed_out = False
        self.batch_changes: list[dict] = []  # resumes that changed the global batch (world size, accumulate)
        self.train_pairs = self.data.splits[
            "train"
        ]  # this epoch's encoding of the training pairs (resampled with data.*_subword_alpha)
        self.src_lens, self.tgt_lens = (
            self.train_pairs.lengths()
        )  # in the cache's encoding: what identifies the pairs on resume
        self.epoch_lens = (self.src_lens, self.tgt_lens)  # in this epoch's encoding: what batching reads
        self._open_run_dir()
        n_params = sum(p.numel() for p in self.model.parameters())
        world = f", {self.dist.world} processes (torchrun)" if self.dist.enabled else ""
        self.log(
            f"model: {cfg.model.arch}, {n_params:,} parameters; device {self.device}, {self.precision.name}{world}"
        )
        self._warn_oversubscribed()
        if checkpoint is None and max(tok.src_vocab_size, tok.tgt_vocab_size) < cfg.data.vocab_size:
            self.log(
                f"warning: data.vocab_size={cfg.data.vocab_size} is more than this training corpus supports; "
                f"SentencePiece made {tok.src_vocab_size}/{tok.tgt_vocab_size} (source/target), used instead "
                "(results.json: vocab_size_used)"
            )
        if cfg.data.src_subword_alpha or cfg.data.tgt_subword_alpha:
            self.log(
                f"data: training subwords sampled afresh each epoch (alpha: source {cfg.data.src_subword_alpha}, "
                f"target {cfg.data.tgt_subword_alpha})"
            )
        if checkpoint is not None and cfg.resume is not None:
            self.restore(checkpoint)
        elif checkpoint is not None:
            self.log(
                f"init_from: weights of {checkpoint['path']} (step {checkpoint['step']}); fresh optimizer, "
                "schedule and counters"
            )
        if self.dist.rank and cfg.resume is None:
            torch.manual_seed(train.seed + 1000 * self.dist.rank)  # the same weights, but each process its own dropout

    def _prepare_data(self, checkpoint: dict | None):
        """Rank 0 prepares (and caches) the data first, the others waiting on a file, then they read its cache."""
        tokenizer = checkpoint_tokenizer(checkpoint) if checkpoint else None

        def prepare(main: bool):
            return prepare_data(self.cfg.data, self.log if main else (lambda line: None), tokenizer)

        return self.dist.main_first(prepare, Path(self.cfg.data.cache_dir))

    def _open_run_dir(self) -> None:
        """Create the run dir only now that the data and model are valid: a bad input leaves nothing behind."""
        if not self.dist.main:
            return
        try:
            (self.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(self.run_dir / "checkpoints")
        except OSError as err:
            raise NmtError(f"run_dir={self.run_dir}: cannot write ({err.strerror or err})") from None
        self.log.open(self.run_dir / "train.log")
        with atomic_open(self.run_dir / "config.yaml", key="run_dir") as f:
            f.write(config_to_yaml(self.cfg))

    def _warn_oversubscribed(self) -> None:
        """Two torch processes with several threads each on the same cores slow each other many times over."""
        processes = self.dist.world if self.device.type == "cpu" else 1
        cores, threads = os.cpu_count() or 1, torch.get_num_threads() * processes
        busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        if self.device.type == "cpu" and oversubscribed(cores, torch.get_num_threads(), processes, busy):
            self.log(
                f"warning: {threads} training threads on {cores} cores with a load average of {busy:.1f}: other "
                "processes share the CPU and OpenMP threads will wait on each other; "
                "set train.threads=1 for runs side by side"
            )

    # --- one update ----------------------------------------------------------------------------
    def loss(self, batch: Batch, smoothing: float, net: torch.nn.Module | None = None) -> torch.Tensor:
        """Summed token cross-entropy over the real (non-padding) target tokens; `net` defaults to the training one."""
        live = batch.tgt_out != PAD  # (B, T)
        with (
            record_function("forward"),
            drawn_by(self.dropout_kernel),
            normed_by(self.norm_kernel),
            looped_by(self.decoder_loop),
        ):
            logits = (net or self.net)(batch.src, batch.src_mask, batch.tgt_in, live)  # (N, V), N real target tokens
        with record_function("loss"):
            return smoothed_cross_entropy(logits, batch.tgt_out[live], smoothing, self.cfg.train.loss_kernel)

    def train_step(self, batches: list[Batch], total_tokens: int | None = None) -> float | None:
        """One update from this process's micro-batches; `total_tokens` counts the target tokens of all processes.

        Returns the mean token loss, or None when the update is skipped for a non-finite loss or gradient.
        """
        self.net.train()
        total = total_tokens or sum(b.target_tokens for b in batches)
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            with (
                nullcontext() if last or not self.dist.enabled else self.net.no_sync()
            ):  # gradients sync once per update
                with self.precision.autocast():
                    loss = self.loss(batch.to(self.device), self.cfg.train.label_smoothing)
                with record_function("backward"):
                    self.precision.backward(loss * (self.dist.world / max(total, 1)))  # DDP averages over processes
            loss_sum += float(loss.detach())
        loss_sum, bad_loss = self.dist.sum([loss_sum, float(not math.isfinite(loss_sum))], self.device)
        self.precision.unscale(self.optimizer)
        clip = self.cfg.train.clip_norm if self.cfg.train.clip_norm > 0 else math.inf
        with record_function("clip"):
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        if bad_loss or not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            self.precision.skipped()
            if bad_loss or not self.precision.overflows:  # fp16 probing its loss scale is no sign of divergence
                self.skipped_update()
            return None
        with record_function("optimizer"):
            self.precision.step(self.optimizer)
        self.scheduler.step()
        return loss_sum / max(total, 1)

    def skipped_update(self) -> None:
        """Count an update skipped for a non-finite value; too many in a row stop the run."""
        stop = self.guard.bad()
        self.log(
            f"step {self.step + 1} | non-finite loss or gradient: update skipped ({self.guard.in_a_row} in a row, "
            f"{self.guard.total} in all)"
        )
        if stop:
            last = (
                f"{self.run_dir / 'checkpoints' / 'last.pt'} (step {self.saved_step})"
                if self.saved_step is not None
                else "none saved yet"
            )
            raise TrainingStopped(
                f"step {self.step + 1}: {self.guard.in_a_row} updates in a row had a non-finite loss or gradient "
                f"(train.max_bad_steps={self.cfg.train.max_bad_steps}), training stopped at epoch {self.epoch} batch "
                f"{self.batch_in_epoch}; last good checkpoint: {last}; lower train.lr or check the data"
            )

    # --- the loop ------------------------------------------------------------------------------
    def elapsed(self) -> float:
        """Seconds of training by train.budget_clock (validation and checkpoint saving not counted), all parts."""
        return self.clock.train_seconds(self.cfg.train.budget_clock)

    def fit(self) -> dict:
        """Train until a limit (steps, epochs, time) or early stopping; returns and writes results.json."""
        cfg = self.cfg.train
        self.clock.start()
        total = Meter()
        max_time_s = cfg.max_time * 60 if cfg.max_time is not None else None
        progress = Progress(
            self.log,
            self.run_dir / "tb" if self.dist.main else None,
            cfg.max_steps,
            max_time_s,
            self.step,
            self.elapsed(),
            cfg.progress,
            smoothed=cfg.label_smoothing > 0,
        )
        try:
            self.snapshot()  # resumed at a snapshot step whose link a kill prevented
            self._loop(progress, total, max_time_s)
            has_valid = "valid" in self.data.splits
            improved = False
            if has_valid and self.last_valid.get("step") != self.step:
                improved, _ = self.after_validation(self.validate_all(), progress)
            self.save(best=improved or not has_valid)
        finally:
            progress.close()
        results = self.results(total)
        if self.dist.main:
            with atomic_open(self.run_dir / "results.json", key="run_dir") as f:
                f.write(json.dumps(results, indent=2) + "\n")
        self.log("results: " + json.dumps(results))
        return results

    def _running(self) -> bool:
        cfg = self.cfg.train
        return (
            self.step < cfg.max_steps
            and (cfg.max_epochs is None or self.epoch < cfg.max_epochs)
            and not self.stopping.should_stop
            and not self.timed_out
        )

    def _loop(self, progress: Progress, total: Meter, max_time_s: float | None) -> None:
        """Updates from the current data position until a limit or early stopping."""
        cfg = self.cfg.train
        self._batches = self.epoch_batches()
        while self._running():
            group = self.next_group()
            if group is None:
                continue
            t0 = time.perf_counter()
            tokens = sum(
                self.epoch_lens[1][i] + 1 for indices in group for i in indices
            )  # + EOS: every process's target tokens
            loss = self.train_step(self.my_batches(group), tokens)
            if loss is None:
                continue
            self.guard.good()
            self.step += 1
            seconds = time.perf_counter() - t0
            total.add(loss, tokens, seconds)
            self.clock.tokens += tokens
            progress.update(loss, tokens, seconds)
            if self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
                progress.report(
                    self.step,
                    self.epoch + self.batch_in_epoch / len(self._batches),
                    self.scheduler.get_last_lr()[0],
                    self.elapsed(),
                )
            if max_time_s is not None:
                self.timed_out = self.dist.agree(self.elapsed() >= max_time_s, self.device)
                if self.timed_out:
                    self.log(
                        f"step {self.step} | train.max_time={cfg.max_time} minutes of training ({cfg.budget_clock} "
                        f"clock) reached after {self.elapsed():.0f} s: stopping"
                    )
            self._after_update(progress)

    def _after_update(self, progress: Progress) -> None:
        """Validate and save when due; a score among the best M, or an early stop, saves too."""
        cfg = self.cfg.train
        improved = ranked = False
        if "valid" in self.data.splits and (self.step % cfg.valid_every == 0 or self.step == cfg.max_steps):
            improved, ranked = self.after_validation(self.validate_all(), progress)
        if self.step % cfg.save_every == 0 or ranked or self.stopping.should_stop:
            self.save(best=improved)
        self.snapshot()

    def results(self, total: Meter) -> dict:
        best = self.stopping.best[0] if self.stopping.best else None
        return {
            "steps": self.step,
            "epochs": round(self.epoch + self.batch_in_epoch / max(1, len(self._batches)), 3),
            **self.clock.summary(),
            "budget_clock": self.cfg.train.budget_clock,
            "threads": torch.get_num_threads(),
            **{k: round(v, 4) for k, v in self.last_valid.items() if k != "step"},
            "best": {"metric": self.stopping.metric, "score": round(best[1], 4), "step": best[0]} if best else None,
            "early_stopped": self.stopping.should_stop,
            "timed_out": self.timed_out,
            "skipped_updates": self.guard.total,
            "bleu_signature": self.bleu_signature,
            "decode": decode_settings(self.cfg.decode),
            "precision": self.precision.name,
            "world_size": self.dist.world,
            "accumulate": self.cfg.train.accumulate,
            "global_batch_changes": self.batch_changes,
            "vocab_size_used": [self.data.tokenizer.src_vocab_size, self.data.tokenizer.tgt_vocab_size],
        }
