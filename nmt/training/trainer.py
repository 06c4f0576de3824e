"""The training loop: one trainer for every model.

Adam with a warm-up schedule, label-smoothed cross-entropy, gradient clipping, periodic validation
(loss, perplexity, BLEU with the same search as nmt-translate), best/last checkpoints, TensorBoard
scalars and a results.json with the final figures.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from nmt.config import Config, config_to_yaml
from nmt.data.batching import Batch, make_batch, token_batches
from nmt.data.dataset import Split, prepare_data
from nmt.data.tokenizer import PAD
from nmt.evaluation.metrics import corpus_score
from nmt.models.seq2seq import build_model
from nmt.training.checkpoint import BEST, LAST, load_checkpoint, save_checkpoint
from nmt.training.schedule import lr_multiplier
from nmt.runtime import resolve_device, seed_everything
from nmt.translation import Translator, decode_settings


def batches_of(split: Split, indices: list[int]) -> Batch:
    return make_batch([split.src_ids[i] for i in indices], [split.tgt_ids[i] for i in indices])


class Trainer:
    """Trains cfg.model on cfg.data into run_dir."""

    def __init__(self, cfg: Config, run_dir: Path, log: Callable[[str], None] | None = None):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "checkpoints").mkdir(exist_ok=True)
        self._log_file = open(self.run_dir / "train.log", "a", encoding="utf-8")
        self._echo = log or (lambda line: tqdm.write(line, file=sys.stdout))
        (self.run_dir / "config.yaml").write_text(config_to_yaml(cfg), encoding="utf-8")
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        seed_everything(cfg.train.seed)
        self.device = resolve_device(cfg.train.device)
        self.data = prepare_data(cfg.data, self.log)
        tok = self.data.tokenizer
        self.model = build_model(cfg.model, tok.src_vocab_size, tok.tgt_vocab_size, tok.joint).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.train.lr, betas=(0.9, 0.98), eps=1e-9)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_multiplier(cfg.train.schedule, cfg.train.warmup))
        self.translator = Translator(self.model, tok, cfg.decode, self.device)
        self.step = self.epoch = self.batch_in_epoch = 0
        self.best_bleu = -1.0
        self.last_valid: dict[str, float] = {}
        self.bleu_signature: str | None = None
        n_params = sum(p.numel() for p in self.model.parameters())
        self.log(f"model: {cfg.model.arch}, {n_params:,} parameters; device {self.device}")

    def log(self, line: str) -> None:
        self._echo(line)
        self._log_file.write(line + "\n")
        self._log_file.flush()

    # --- checkpoints -------------------------------------------------------------------------
    def train_state(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "best_bleu": self.best_bleu,
            "rng": {"python": random.getstate(), "torch": torch.get_rng_state()},
        }

    def save(self, name: str) -> None:
        path = self.run_dir / "checkpoints" / name
        save_checkpoint(path, self.model, self.cfg, self.data.tokenizer, self.step, self.train_state())

    def restore(self, path: Path) -> None:
        """Continue from a checkpoint of this run: weights, optimizer, schedule, counters, RNG, data position."""
        payload = load_checkpoint(path, self.device)
        state = payload["train_state"]
        self.model.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.epoch, self.batch_in_epoch = payload["step"], state["epoch"], state["batch_in_epoch"]
        self.best_bleu = state["best_bleu"]
        random.setstate(state["rng"]["python"])
        torch.set_rng_state(state["rng"]["torch"])
        self.log(f"resumed from {path} at step {self.step} (epoch {self.epoch}, batch {self.batch_in_epoch})")

    # --- training ----------------------------------------------------------------------------
    def loss(self, batch: Batch, smoothing: float) -> torch.Tensor:
        """Summed token cross-entropy over non-padding targets."""
        logits = self.model(batch.src, batch.src_mask, batch.tgt_in)  # (B, T, V)
        return F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), batch.tgt_out.reshape(-1), ignore_index=PAD, label_smoothing=smoothing, reduction="sum"
        )

    def train_step(self, batch: Batch) -> tuple[float, int]:
        self.model.train()
        tokens = batch.target_tokens
        loss = self.loss(batch, self.cfg.train.label_smoothing) / tokens
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.train.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.clip_norm)
        self.optimizer.step()
        self.scheduler.step()
        return float(loss.detach()), tokens

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Loss and perplexity (no smoothing) on the validation split, and BLEU of its translation."""
        split = self.data.splits["valid"]
        self.model.eval()
        total, tokens = 0.0, 0
        for indices in token_batches([len(s) for s in split.src_ids], [len(t) for t in split.tgt_ids], self.cfg.train.batch_tokens, 0, 0, shuffle=False):
            batch = batches_of(split, indices).to(self.device)
            total += float(self.loss(batch, 0.0))
            tokens += batch.target_tokens
        n = self.cfg.train.valid_bleu_sentences or len(split)
        hyps = self.translator.translate(split.src_text[:n])
        bleu = corpus_score("bleu", hyps, split.tgt_text[:n])
        loss = total / max(tokens, 1)
        result = {"valid_loss": loss, "valid_ppl": math.exp(min(loss, 50)), "valid_bleu": bleu.score}
        self.log(
            f"step {self.step} | valid loss {loss:.3f} ppl {result['valid_ppl']:.2f} | "
            f"BLEU {bleu.score:.2f} ({decode_settings(self.cfg.decode)}; {bleu.signature})"
        )
        self.bleu_signature = bleu.signature
        return result

    def fit(self) -> dict:
        """Train until train.max_steps (or train.max_epochs); returns and writes results.json."""
        from torch.utils.tensorboard import SummaryWriter

        cfg = self.cfg.train
        train = self.data.splits["train"]
        src_lens, tgt_lens = [len(s) for s in train.src_ids], [len(t) for t in train.tgt_ids]
        has_valid = "valid" in self.data.splits
        writer = SummaryWriter(str(self.run_dir / "tb"))
        bar = tqdm(total=cfg.max_steps, initial=self.step, disable=None if cfg.progress else True, file=sys.stderr, unit="step", dynamic_ncols=True)
        start, train_time, train_tokens = time.perf_counter(), 0.0, 0
        window_loss, window_tokens, window_time = 0.0, 0, 0.0
        batches = token_batches(src_lens, tgt_lens, cfg.batch_tokens, cfg.seed, self.epoch)
        while self.step < cfg.max_steps and (cfg.max_epochs is None or self.epoch < cfg.max_epochs):
            if self.batch_in_epoch >= len(batches):
                self.epoch, self.batch_in_epoch = self.epoch + 1, 0
                batches = token_batches(src_lens, tgt_lens, cfg.batch_tokens, cfg.seed, self.epoch)
                continue
            t0 = time.perf_counter()
            batch = batches_of(train, batches[self.batch_in_epoch]).to(self.device)
            loss, tokens = self.train_step(batch)
            elapsed = time.perf_counter() - t0
            self.step += 1
            self.batch_in_epoch += 1
            train_time, train_tokens = train_time + elapsed, train_tokens + tokens
            window_loss, window_tokens, window_time = window_loss + loss * tokens, window_tokens + tokens, window_time + elapsed
            bar.update(1)
            if self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
                lr = self.scheduler.get_last_lr()[0]
                bar.set_postfix(loss=f"{window_loss / window_tokens:.3f}", lr=f"{lr:.2e}", tok_s=f"{window_tokens / window_time:.0f}")
                writer.add_scalar("train/loss", window_loss / window_tokens, self.step)
                writer.add_scalar("train/lr", lr, self.step)
                writer.add_scalar("train/tokens_per_s", window_tokens / window_time, self.step)
                window_loss, window_tokens, window_time = 0.0, 0, 0.0
            if has_valid and (self.step % cfg.valid_every == 0 or self.step == cfg.max_steps):
                self.after_validation(self.validate(), writer)
            if self.step % cfg.save_every == 0:
                self.save(LAST)
        bar.close()
        if has_valid and self.last_valid.get("step") != self.step:
            self.after_validation(self.validate(), writer)
        self.save(LAST)
        if not has_valid:
            self.save(BEST)
        writer.close()
        results = {
            "steps": self.step,
            "epochs": round(self.epoch + self.batch_in_epoch / len(batches), 3),
            "wall_s": round(time.perf_counter() - start, 2),
            "train_tokens_per_s": round(train_tokens / train_time, 1) if train_time else 0.0,
            **{k: round(v, 4) for k, v in self.last_valid.items() if k != "step"},
            "best_valid_bleu": round(self.best_bleu, 4) if has_valid else None,
            "bleu_signature": self.bleu_signature,
            "decode": decode_settings(self.cfg.decode),
        }
        (self.run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        self.log("results: " + json.dumps(results))
        return results

    def after_validation(self, result: dict[str, float], writer) -> None:
        """Log the scalars; keep the checkpoint with the best validation BLEU."""
        self.last_valid = {"step": self.step, **result}
        for key, value in result.items():
            writer.add_scalar(key.replace("_", "/", 1), value, self.step)
        if result["valid_bleu"] > self.best_bleu:
            self.best_bleu = result["valid_bleu"]
            self.save(BEST)
            self.log(f"step {self.step} | new best BLEU {self.best_bleu:.2f}, saved {BEST}")
