"""Word alignments of translations, from the model's attention: Pharaoh `i-j` links (source word i, target word j,
both counted from 0), as nmt-translate alignments_out=FILE, the API (`return_alignments`) and the server give them.

The attention of a hypothesis (one row per output step, one column per source subword, EOS and </s> included) is
merged to words (nmt.evaluation.alignment.merge_to_words: a target word's row is the mean of its pieces' rows, a
source word's column the sum of its pieces' columns); then each target word is linked to the source word it
attends to most (`method="argmax"`), or to every source word that gets at least `threshold` of its attention
(`method="threshold"`; a word with none over it is left unlinked). EOS and </s> never take part.

Which attention: by default the one the search records (an RNN's attention; a Transformer's last decoder layer,
mean over its heads). For a Transformer, `layer` (0 = the first decoder layer; negative counts from the last) and
`head` (None: the mean over heads) pick another, read by teacher-forcing the output once; nmt-compare's per-layer
alignment error rate says which layer aligns best (often not the last: Garg et al. 2019).
"""

from __future__ import annotations

import numpy as np
import torch

from nmt.data.batching import make_batch
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.evaluation.alignment import argmax_links, merge_to_words, word_index
from nmt.translation import Translation, eval_mode

METHODS = ("argmax", "threshold")


def links(word_attention: np.ndarray, method: str = "argmax", threshold: float = 0.5) -> list[tuple[int, int]]:
    """(target words, source words) attention -> sorted (i, j) links."""
    if method == "argmax":
        found = argmax_links(word_attention)
    else:
        tgt, src = np.nonzero(word_attention >= threshold)
        found = {(int(i), int(j)) for j, i in zip(tgt, src)}
    return sorted(found, key=lambda link: (link[1], link[0]))


def pharaoh(found: list[tuple[int, int]]) -> str:
    return " ".join(f"{i}-{j}" for i, j in found)


def layer_attention(
    model: torch.nn.Module,
    src_ids: list[int],
    tgt_ids: list[int],
    layer: int,
    head: int | None,
    device: torch.device,
) -> np.ndarray:
    """A Transformer's teacher-forced cross-attention of one decoder layer (one head, or their mean) for one pair:
    (T + 1, S + 1)."""
    decoder = getattr(model, "decoder", None)
    maps = getattr(decoder, "attention_maps", None)
    if maps is None:
        raise NmtError(
            "align.layer/align.head: only a Transformer has decoder layers and heads to choose from; "
            "for this model leave them unset (its attention is used)"
        )
    layers, heads = len(decoder.layers), decoder.layers[0].cross_attn.heads
    if not -layers <= layer < layers:
        raise NmtError(f"align.layer={layer}: the model has {layers} decoder layers (0 to {layers - 1}, or -1 ...)")
    if head is not None and not 0 <= head < heads:
        raise NmtError(f"align.head={head}: the model has {heads} heads per layer (0 to {heads - 1})")
    batch = make_batch([src_ids], [tgt_ids]).to(device)
    with eval_mode(model), torch.inference_mode():
        weights = maps(batch.tgt_in, model.encode(batch.src, batch.src_mask))[0, layer]  # (N, T + 1, S + 1)
    chosen = weights.mean(0) if head is None else weights[head]
    return chosen.float().cpu().numpy()


class Aligner:
    """Word alignments of translations' best hypotheses, with one choice of attention and method."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Tokenizer,
        device: torch.device,
        method: str = "argmax",
        threshold: float = 0.5,
        layer: int | None = None,
        head: int | None = None,
    ):
        if method not in METHODS:
            raise NmtError(f"align.method={method}: unknown; expected one of {', '.join(METHODS)}")
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.method, self.threshold, self.layer, self.head = method, threshold, layer, head
        if layer is not None or head is not None:  # checked before any translation
            layer_attention(model, [4], [4], layer if layer is not None else -1, head, device)

    def word_attention(self, result: Translation, hyp: int = 0) -> np.ndarray:
        """The hypothesis' attention merged to words: (target words, source words)."""
        if not result.hyps:
            return np.zeros((0, 0))
        h = result.hyps[hyp]
        if self.layer is None and self.head is None:
            attention = h.attention.float().numpy()
        else:
            attention = layer_attention(
                self.model, result.src_ids, h.tokens, -1 if self.layer is None else self.layer, self.head, self.device
            )
        src_pieces = [self.tokenizer.src.id_to_piece(i) for i in result.src_ids]
        tgt_pieces = [self.tokenizer.tgt.id_to_piece(i) for i in h.tokens]
        # pieces only: the EOS row and the </s> column are dropped (and renormalised over the real source words)
        pieces = attention[: len(tgt_pieces), : len(src_pieces)]
        pieces = pieces / np.maximum(pieces.sum(1, keepdims=True), 1e-9)
        return merge_to_words(pieces, word_index(src_pieces), word_index(tgt_pieces))

    def links(self, result: Translation, hyp: int = 0) -> list[tuple[int, int]]:
        return links(self.word_attention(result, hyp), self.method, self.threshold)

    def pharaoh(self, result: Translation, hyp: int = 0) -> str:
        """One line of `i-j` links ("" for a blank line or an empty output)."""
        return pharaoh(self.links(result, hyp))
