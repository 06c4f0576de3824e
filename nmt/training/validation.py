"""Validation during training: loss, perplexity, BLEU and chrF on the validation split, and ranking the score.

Part of the Trainer (a mixin reading its model, data, translator and stopping state). With torchrun,
rank 0 validates and the others receive its figures, so every process takes the same decisions.
"""

from __future__ import annotations

import math

import torch

from nmt.data.batching import token_batches
from nmt.engine import decoding_copy
from nmt.evaluation.metrics import corpus_score
from nmt.training.checkpoint import BEST
from nmt.translation import Translator, decode_settings


class Validation:
    """validate, validate_all and after_validation of the Trainer."""

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Loss and perplexity (no smoothing) on the validation split, and BLEU and chrF of its translation."""
        split = self.data.splits["valid"]
        self.model.eval()
        total, tokens = 0.0, 0
        src_lens, tgt_lens = split.lengths()
        for indices in token_batches(src_lens, tgt_lens, self.cfg.train.batch_tokens, 0, 0, shuffle=False):
            batch = split.batch(indices).to(self.device)
            with self.precision.autocast():
                total += float(self.loss(batch, 0.0, self.model))  # the bare model: only rank 0 validates
            tokens += batch.target_tokens
        n = self.cfg.train.valid_bleu_sentences or len(split)
        hyps = self.validation_translator().translate(split.src_text[:n])
        bleu, chrf = corpus_score("bleu", hyps, split.tgt_text[:n]), corpus_score("chrf", hyps, split.tgt_text[:n])
        loss = total / max(tokens, 1)
        result = {
            "valid_loss": loss,
            "valid_ppl": math.exp(min(loss, 50)),
            "valid_bleu": bleu.score,
            "valid_chrf": chrf.score,
        }
        self.log(
            f"step {self.step} | valid loss {loss:.3f} ppl {result['valid_ppl']:.2f} | BLEU {bleu.score:.2f} chrF "
            f"{chrf.score:.2f} ({decode_settings(self.cfg.decode)}; {bleu.signature})"
        )
        self.bleu_signature = bleu.signature
        return result

    def validation_translator(self):
        """The translator of validation BLEU: in decode.precision, like nmt-translate
        (a converted copy of the model)."""
        precision = self.cfg.decode.precision
        if precision == "fp32":
            return self.translator
        converted = decoding_copy(self.model, precision)
        translator = Translator(
            converted, self.translator.tokenizer, self.cfg.decode, self.device, self.translator.warn
        )
        translator.generator = self.translator.generator  # sampling continues the run's stream (saved for resume)
        return translator

    def validate_all(self) -> dict[str, float]:
        """Rank 0 validates; every process gets its figures (its time is not training time: see clock.py)."""
        with self.clock.outside("valid"):
            return self.dist.broadcast(self.validate() if self.dist.main else None)

    def after_validation(self, result: dict[str, float], progress) -> tuple[bool, bool]:
        """Log the scalars and rank the score: (a new best?, worth keeping a checkpoint for?)."""
        self.last_valid = {"step": self.step, **result}
        progress.scalars({key.replace("_", "/", 1): value for key, value in result.items()}, self.step)
        metric = self.stopping.metric
        improved, ranked = self.stopping.update(self.step, result[f"valid_{metric}"])
        if improved:
            self.log(f"step {self.step} | new best valid {metric} {result[f'valid_{metric}']:.4g}, saved {BEST}")
        if self.stopping.should_stop:
            step, score = self.stopping.best[0]
            self.log(
                f"step {self.step} | early stop: valid {metric} not improved for {self.stopping.patience} validations "
                f"(best {score:.4g} at step {step})"
            )
        return improved, ranked
