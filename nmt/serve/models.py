"""A checkpoint loaded for serving: what it is (GET /v1/models) and its translations as JSON-ready results.

A request's lines are encoded here (cut to decode.max_src_len with a warning naming the line, as nmt-translate
does), searched by the lanes (nmt.serve.lanes), and turned back into results: detokenized n-best lists, scores and,
for the lines that asked, the attention through `attention_record`, as in nmt-translate. The server's responses
name a model by its label (the run folder's name), never by the checkpoint's path on this host.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nmt.attention_io import attention_record
from nmt.config import Config, DecodeConfig, ModelConfig
from nmt.search import Hypothesis
from nmt.translation import Translation, Translator

ARCH_NAMES = {"transformer": "Transformer", "bahdanau": "Bahdanau", "luong": "Luong"}
WINDOWS = {"global": "global", "local_m": "local-m", "local_p": "local-p"}


def attention_label(m: ModelConfig) -> str:
    """The attention variant in a few words, e.g. "scaled dot-product, 4 heads" or "general score, local-p (D=10)"."""
    if m.arch == "transformer":
        return f"{'scaled' if m.scale else 'unscaled'} dot-product, {m.heads} head{'s' if m.heads > 1 else ''}"
    window = WINDOWS[m.window] + ("" if m.window == "global" else f" (D={m.window_size})")
    return f"{m.score} score, {window}" + (", hard" if m.attention == "hard" else "")


def variant_keys(m: ModelConfig) -> dict[str, Any]:
    """The model.* keys that choose the attention variant of this arch."""
    if m.arch == "transformer":
        return {"heads": m.heads, "scale": m.scale}
    return {"score": m.score, "window": m.window, "window_size": m.window_size, "attention": m.attention}


@dataclass
class ServedModel:
    """One loaded checkpoint under a name ("a", "b")."""

    name: str
    translator: Translator  # with the server's default search settings
    config: Config  # the config it was trained with
    steps: int  # training steps of the checkpoint
    checkpoint: str  # the file it was read from (for the operator's console only)

    @property
    def label(self) -> str:
        """The run folder's name (runs/m30k/checkpoints/best.pt -> m30k), or the file's name outside a run."""
        path = Path(self.checkpoint)
        return path.parent.parent.name if path.parent.name == "checkpoints" else path.name

    @property
    def widest_beam(self) -> int:
        """The target tokens a hypothesis may end in (all but PAD and BOS) bound the beam."""
        return self.translator.tokenizer.tgt_vocab_size - 2

    @cached_property
    def info(self) -> dict[str, Any]:
        """Name, architecture, attention variant, size, vocabularies and training steps."""
        m, tokenizer = self.config.model, self.translator.tokenizer
        return {
            "name": self.name,
            "label": self.label,
            "arch": m.arch,
            "title": f"{ARCH_NAMES.get(m.arch, m.arch)}: {attention_label(m)}",
            "attention": attention_label(m),
            "variant": variant_keys(m),
            "dim": m.dim,
            "layers": m.layers,
            "parameters": sum(p.numel() for p in self.translator.model.parameters()),
            "src_vocab_size": tokenizer.src_vocab_size,
            "tgt_vocab_size": tokenizer.tgt_vocab_size,
            "steps": self.steps,
        }

    def encode(
        self, lines: list[str], prefixes: list[str | None] | None = None, constraints=None, avoid=None
    ) -> tuple[list[list[int]], list[tuple], list[str]]:
        """Source ids per line (cut to decode.max_src_len); per line its search options (target prefix ids,
        constraint and avoided phrases as ids); and a warning for each cut line, naming it (from 1)."""
        found: list[str] = []
        t = self.translator
        ids = Translator(t.model, t.tokenizer, t.decode, t.device, warn=found.append).encode(lines)
        prefix_ids = t.encode_prefixes(list(prefixes)) if prefixes else [[] for _ in lines]
        needs = t.encode_phrases([list(p) for p in constraints]) if constraints else None
        avoids = t.encode_phrases([list(p) for p in avoid]) if avoid else None
        options = [(prefix_ids[i], needs[i] if needs else [], avoids[i] if avoids else []) for i in range(len(lines))]
        return ids, options, [message.removeprefix("warning: ") for message in found]

    @cached_property
    def aligner(self):
        from nmt.alignments import Aligner

        return Aligner(self.translator.model, self.translator.tokenizer, self.translator.device)

    def results(
        self,
        src_ids: list[list[int]],
        hyps: list[list[Hypothesis]],
        attention: frozenset[int],
        alignments: bool = False,
    ) -> list[dict[str, Any]]:
        """One JSON-ready result per line: best text and score, the n-best list, and for the lines in `attention`
        the attention.

        `score` is the length-normalised log-probability that ranks hypotheses, `log_prob` the plain sum
        (both rounded to 4 decimals, as nmt-translate prints them); attention weights are rounded to 4 too.
        """
        tokenizer = self.translator.tokenizer
        texts = iter(tokenizer.decode_tgt([h.tokens for found in hyps for h in found]))
        out = []
        for i, (src, found) in enumerate(zip(src_ids, hyps)):
            nbest = [
                {"text": next(texts), "score": round(h.norm_score, 4), "log_prob": round(h.score, 4)} for h in found
            ]
            result = {
                "text": nbest[0]["text"] if nbest else "",
                "score": nbest[0]["score"] if nbest else None,
                "nbest": nbest,
            }
            if alignments:
                result["alignment"] = self.aligner.pharaoh(Translation(src, found))
            if i in attention:
                record = attention_record(0, Translation(src, found), tokenizer)
                weights = np.round(record.attention.astype(np.float64), 4).tolist()
                result["attention"] = {"src": record.src, "tgt": record.tgt, "weights": weights}
            out.append(result)
        return out


def load_model(name: str, checkpoint: str, decode: DecodeConfig, device: torch.device) -> ServedModel:
    """Read a checkpoint file or run dir (its best checkpoint) once, for serving."""
    from nmt.api import load_model as load

    loaded = load(checkpoint, decode.precision, device)  # the API's one loading path: decode.precision as everywhere
    loaded.model.eval()  # the lanes' threads share it: nothing may switch it to training and back
    return ServedModel(
        name, Translator(loaded.model, loaded.tokenizer, decode, device), loaded.config, loaded.step, loaded.path
    )
