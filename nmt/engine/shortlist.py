"""A decoding copy cut to a batch's vocabulary shortlist (nmt.shortlist reads the map and gives the candidates):
its output layer scores only the W candidate tokens, and token ids in and out of the search are positions among
them, so the search runs the smaller vocabulary as it runs any model.

Shape legend: V full target vocabulary, W shortlist (candidates), E the output layer's input features, R rows,
P positions per row.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from nmt.data.tokenizer import EOS, PAD
from nmt.errors import NmtError
from nmt.models.seq2seq import prefill
from nmt.shortlist import SPECIALS


def restrict(layer: nn.Module, vocab: torch.Tensor) -> nn.Module:
    """The output layer cut to the rows of `vocab` (W,): the same kind of layer (fp32, bf16 or int8), W outputs."""
    if hasattr(layer, "rows"):
        return layer.rows(vocab)
    if not isinstance(layer, nn.Linear):
        raise NmtError(f"decode.shortlist: the output layer is a {type(layer).__name__}; expected a linear layer")
    return Rows(layer.weight.index_select(0, vocab), None if layer.bias is None else layer.bias.index_select(0, vocab))


class Rows(nn.Module):
    """A linear layer of given weight (W, E) and bias (W,): an fp32 output layer cut to a shortlist."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.weight, self.bias = weight.detach(), None if bias is None else bias.detach()
        self.out_features = weight.size(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def _inner(model: nn.Module) -> nn.Module:
    """The model under wrappers that only intercept step() (nmt.serve.lanes.Stoppable)."""
    return getattr(model, "_model", model)


def outputs_for(model: nn.Module, vocab: torch.Tensor):
    """What `step(..., output=)` takes for this model: its output layer cut to `vocab`; for an ensemble, a list."""
    inner = _inner(model)
    if hasattr(inner, "models"):
        return [outputs_for(m, vocab) for m in inner.models]
    return restrict(inner.decoder.output, vocab)


def _layers(output) -> list[nn.Module]:
    """The cut output layers of `outputs_for` (one, or an ensemble's nested list)."""
    if isinstance(output, list):
        return [layer for part in output for layer in _layers(part)]
    return [output]


class Shortlisted(nn.Module):
    """A model whose vocabulary is a batch's candidates: token ids in and out are positions in `vocab` (W,)
    (sorted, SPECIALS first, so PAD/UNK/BOS/EOS keep their ids)."""

    def __init__(self, model: nn.Module, vocab: torch.Tensor):
        super().__init__()
        if vocab.numel() < SPECIALS or int(vocab[EOS]) != EOS:
            raise ValueError("a shortlist's candidates must start with the special ids 0..3")
        self.output = outputs_for(model, vocab)
        # a cut may have more outputs than candidates (an int8 cut has whole blocks of the kernel's), each -inf:
        # never a token, so mapped to PAD
        widths = {layer.out_features for layer in _layers(self.output)}
        if len(widths) != 1:
            raise ValueError(f"an ensemble's shortlisted output layers have different widths {sorted(widths)}")
        extra = widths.pop() - vocab.numel()
        self.model, self.vocab = model, F.pad(vocab, (0, extra), value=PAD) if extra > 0 else vocab

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor):
        return self.model.encode(src, src_mask)

    def init_state(self, enc):
        return self.model.init_state(enc)

    def step(self, prev: torch.Tensor, enc, state):
        """prev (R,) local ids -> logits (R, W) over the candidates (W: self.vocab's size; places past the
        candidates -inf), the new state, attention (R, S)."""
        return self.model.step(self.vocab[prev], enc, state, output=self.output)

    def prefill(self, tokens: torch.Tensor, enc, state):
        """tokens (R, P) local ids -> logits (R, P, W), the state after them, attention (R, P, S)."""
        return prefill(self.model, self.vocab[tokens], enc, state, output=self.output)


def local_ids(vocab: list[int], ids: Iterable[int]) -> list[int]:
    """Full-vocabulary ids -> positions in the sorted candidate list (each id must be a candidate)."""
    where = {v: i for i, v in enumerate(vocab)}
    return [where[i] for i in ids]
