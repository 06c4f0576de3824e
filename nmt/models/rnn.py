"""Recurrent encoder-decoders: a (bi)directional GRU/LSTM encoder and what the attentional decoders share.

Encoder (Bahdanau et al. 2014, sec. 3.2): h_j = [h->_j; h<-_j], the forward and backward states of
position j, read over packed sequences so padding never enters a sentence (on a CPU by nmt.models.recurrence,
which computes what nn.GRU / nn.LSTM computes with a cheaper backward pass). Each direction has dim / 2
units, so the memory is (B, S, H) like the decoder state.
Bridge: the initial decoder state of layer l is tanh(W_b [h->_final; h<-_final]_l) (Bahdanau et al.
2014, appendix A.2.2, use s_0 = tanh(W_s h<-_1); this reads both directions' final states), or zeros.
The decoders (bahdanau.py, luong.py) keep their recurrent state in the state dict as "h" (and "c"
for LSTMs) (R, L, H) and the target position as "t" (R,), one row per hypothesis; the prepared
attention keys "keys" (B, S, *) are computed once per sentence (`prepare`) and read by all its rows.

Shape legend: B batch, S source length, T target length, E embedding, H hidden (= model.dim),
L layers, V vocab.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmt.data.tokenizer import PAD
from nmt.models.attention import Attention
from nmt.models.checks import BRIDGES, check_rnn, check_rnn_names  # noqa: F401 (re-exported)
from nmt.models.dropout import Dropout
from nmt.models.recurrence import packed_rnn
from nmt.models.seq2seq import Enc, State, by_sentence

CELLS = {"gru": nn.GRU, "lstm": nn.LSTM}


class ScaledEmbedding(nn.Embedding):
    """Token embeddings stored as N(0, 1/E) and read out times sqrt(E)
    (as the Transformer scales its own), PAD's row zero.

    Both ends of a tied embedding get the scale they need: the GRU/LSTM reads unit-scale inputs, which suit
    nn.GRU/nn.LSTM's default weights (inputs of std 1/sqrt(E) made the toy comparison's d64 RNNs learn next to
    nothing in its 250 updates), while the output layer, which shares the stored weights, starts with logits
    of unit scale (with N(0, 1) weights a 256-wide readout gives logits of standard deviation ~16 and the
    first hundreds of updates go to shrinking them). Multi30k en-de, Bahdanau 256, the 10-minute recipe's
    settings: validation loss after 500 / 1,000 updates 2.97 / 2.57 with this, 3.36 / 2.76 with N(0, 1/E)
    unscaled, 5.14 / 4.29 with N(0, 1). Over its whole 10 minutes, though, Bahdanau (whose maxout readout
    reads the embedding directly) ends better unscaled: validation loss 2.09 against 2.26 and greedy BLEU
    30.2 against 26.9 (1 thread each, side by side, 2026-12-02), so model.embed_scale=false reads the
    embeddings out as stored, and the Multi30k Bahdanau recipes set it (chosen on validation).
    """

    def __init__(self, vocab: int, dim: int, scaled: bool = True):
        super().__init__(vocab, dim, padding_idx=PAD)
        nn.init.normal_(self.weight, std=dim**-0.5)
        with torch.no_grad():
            self.weight[PAD].zero_()
        self.scale = dim**0.5 if scaled else 1.0  # model.embed_scale

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return super().forward(tokens) * self.scale  # (B, T, E)


def embedding(vocab: int, dim: int, scaled: bool = True) -> nn.Embedding:
    """The RNN models' token embeddings (ScaledEmbedding; scaled=False reads them out as stored)."""
    return ScaledEmbedding(vocab, dim, scaled)


class Recurrent(nn.Module):
    """A stacked nn.GRU / nn.LSTM whose hidden state travels in the state dict as "h" (and "c"), (B, L, H)."""

    def __init__(self, cell: str, input_dim: int, dim: int, layers: int, dropout: float):
        super().__init__()
        self.lstm = cell == "lstm"
        self.rnn = CELLS[cell](input_dim, dim, layers, batch_first=True, dropout=dropout if layers > 1 else 0.0)

    def forward(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """x (B, T, I) -> top-layer outputs (B, T, H) and the new {"h", "c"} (B, L, H)."""
        h = state["h"].transpose(0, 1).contiguous()  # (L, B, H)
        if self.lstm:
            out, (h, c) = self.rnn(x, (h, state["c"].transpose(0, 1).contiguous()))
            return out, {"h": h.transpose(0, 1), "c": c.transpose(0, 1)}
        out, h = self.rnn(x, h)
        return out, {"h": h.transpose(0, 1)}


class RNNEncoder(nn.Module):
    """Embeddings, a packed (bi)directional GRU/LSTM, and the bridge to the decoder's initial state."""

    def __init__(
        self, embed: nn.Embedding, cell: str, dim: int, layers: int, dropout: float, bidirectional: bool, bridge: str
    ):
        super().__init__()
        self.directions = 2 if bidirectional else 1
        self.embed, self.dropout, self.lstm = embed, Dropout(dropout), cell == "lstm"
        self.rnn = CELLS[cell](
            embed.embedding_dim,
            dim // self.directions,
            layers,
            batch_first=True,
            dropout=dropout if layers > 1 else 0.0,
            bidirectional=bidirectional,
        )
        self.bridge_h = nn.Linear(dim, dim) if bridge == "bridge" else None
        self.bridge_c = nn.Linear(dim, dim) if bridge == "bridge" and self.lstm else None

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor) -> Enc:
        x = self.dropout(self.embed(src))  # (B, S, E)
        packed = pack_padded_sequence(x, src_mask.sum(1).cpu(), batch_first=True, enforce_sorted=False)
        backward = x.device.type == "cpu" and torch.is_grad_enabled()  # training: torch's numbers, cheaper backward
        out, final = packed_rnn(self.rnn, packed) if backward else self.rnn(packed)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=src.size(1))  # (B, S, H)
        enc = {"memory": memory, "src_mask": src_mask}
        if self.lstm:
            enc["init_h"], enc["init_c"] = self.initial(final[0], self.bridge_h), self.initial(final[1], self.bridge_c)
        else:
            enc["init_h"] = self.initial(final, self.bridge_h)
        return enc

    def initial(self, final: torch.Tensor, bridge: nn.Linear | None) -> torch.Tensor:
        """Final states (L * directions, B, H / directions) -> initial decoder state (B, L, H)."""
        layers = self.rnn.num_layers
        final = final.view(layers, self.directions, final.size(1), -1).permute(2, 0, 1, 3).flatten(2)  # (B, L, H)
        return (
            torch.zeros_like(final) if bridge is None else torch.tanh(bridge(final)).to(final.dtype)
        )  # fp32 even with a bf16 bridge (decode.precision)


class RNNDecoder(nn.Module):
    """The state layout, `step` and the teacher-forcing loop that Bahdanau's and Luong's decoders share.

    A subclass sets embed, dropout, rnn (Recurrent), attention (Attention), output (the output layer) and
    writes `advance`, one step from an embedded previous token to the output layer's input.
    """

    embed: nn.Embedding
    dropout: Dropout
    rnn: Recurrent
    attention: Attention

    def prepare(self, enc: Enc) -> Enc:
        """enc plus the attention's prepared keys "keys" (B, S, *), computed once per sentence."""
        return {**enc, "keys": self.attention.prepare(enc["memory"])}

    def init_state(self, enc: Enc) -> State:
        """Initial "h"/"c" (B, L, H) from the encoder's bridge and position "t" (B,)."""
        state = {"h": enc["init_h"]}
        if self.rnn.lstm:
            state["c"] = enc["init_c"]
        state["t"] = torch.zeros(enc["memory"].size(0), dtype=torch.long, device=enc["memory"].device)
        return state

    def advance(
        self, emb: torch.Tensor, enc: Enc, state: State, need_attn: bool = True
    ) -> tuple[torch.Tensor, State, torch.Tensor | None]:
        """Embedded previous tokens (B, E) -> the output layer's input (B, E'), new state, attention (B, S)
        (None unless need_attn)."""
        raise NotImplementedError

    def attend(
        self, query: torch.Tensor, enc: Enc, steps: torch.Tensor, need_attn: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Queries (R, T, H) at target positions steps (R, T) -> context (R, T, H), weights (R, T, S) (None
        unless need_attn: a local window then never builds them).

        R // B rows per sentence of enc: a sentence's rows query its keys in one call.
        """
        rows, sentences = query.shape[:2], enc["src_mask"].size(0)
        context, weights = self.attention(
            by_sentence(query, sentences),
            enc["keys"],
            enc["memory"],
            enc["src_mask"],
            by_sentence(steps, sentences),
            need_weights=need_attn,
        )
        return context.reshape(*rows, -1), None if weights is None else weights.reshape(*rows, -1)

    def step(
        self, prev: torch.Tensor, enc: Enc, state: State, output: nn.Module | None = None
    ) -> tuple[torch.Tensor, State, torch.Tensor]:
        """One token per sentence: prev (B,) -> logits (B, V), new state, attention (B, S); `output` replaces the
        output layer (a shortlist's: V its rows)."""
        features, state, attn = self.advance(self.dropout(self.embed(prev)), enc, state)
        return (output or self.output)(features), state, attn

    def features(
        self, tgt_in: torch.Tensor, enc: Enc, need_attn: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher forcing, one `advance` per position: the output layer's input (B, T, E'),
        attention (B, T, S) if asked.

        The output layer runs once, after the loop, on every position together (`forward`) or on the live
        target positions only (training, `Seq2Seq.forward`): one large product instead of T small ones.
        """
        enc = self.prepare(enc)
        state = self.init_state(enc)
        emb = self.dropout(self.embed(tgt_in))  # (B, T, E)
        features, attn = [], []
        for emb_t in emb.unbind(1):  # (B, E) each; one backward for all (emb[:, t] zero-filled a (B, T, E) per step)
            out, state, weights = self.advance(emb_t, enc, state, need_attn)
            features.append(out)
            attn.append(weights)
        return torch.stack(features, 1), torch.stack(attn, 1) if need_attn else None

    def forward(
        self, tgt_in: torch.Tensor, enc: Enc, need_attn: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher forcing: logits (B, T, V), attention (B, T, S) if asked."""
        features, attn = self.features(tgt_in, enc, need_attn)
        return self.output(features), attn
