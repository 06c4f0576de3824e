"""The attentional decoder of Luong, Pham and Manning 2015, "Effective Approaches to Attention-based
Neural Machine Translation". The RNN comes first; its output h_t is the query.

    h_t  = RNN(h_{t-1}, [E y_{t-1}; h~_{t-1}])    input feeding, sec. 3.3 (without it: RNN(h_{t-1}, E y_{t-1}))
    a_t  = align(h_t, h_s)                        eq. 7, with any score of eq. 8 / location (model.score),
                                                  global or local-m / local-p (sec. 3.2; model.window)
    c_t  = sum_s a_t(s) h_s
    h~_t = tanh(W_c [c_t; h_t])                   eq. 5 (the attentional vector)
    p(y_t | y_<t, x) = softmax(W_s h~_t)          eq. 6
Without input feeding the RNN does not depend on attention, so teacher forcing runs it over all
positions at once and attends for all of them in one call; with input feeding it goes step by step.

Shape legend: B batch, S source length, T target length, E embedding, H hidden, L layers, V vocab.
"""

from __future__ import annotations

import torch
from torch import nn

from nmt.models.attention import Attention
from nmt.models.dropout import Dropout
from nmt.models.rnn import Recurrent, RNNDecoder
from nmt.models.seq2seq import Enc, State


class LuongDecoder(RNNDecoder):
    """RNN first, then attention with h_t, then the attentional vector h~_t; optional input feeding."""

    def __init__(
        self,
        embed: nn.Embedding,
        vocab: int,
        cell: str,
        dim: int,
        layers: int,
        dropout: float,
        attention: Attention,
        input_feeding: bool,
        tie_output: bool,
    ):
        super().__init__()
        self.embed, self.dropout, self.attention, self.input_feeding = embed, Dropout(dropout), attention, input_feeding
        self.rnn = Recurrent(cell, embed.embedding_dim + (dim if input_feeding else 0), dim, layers, dropout)
        self.W_c = nn.Linear(2 * dim, dim, bias=False)
        self.output = nn.Linear(dim, vocab, bias=False)  # W_s
        if tie_output:
            self.output.weight = embed.weight

    def init_state(self, enc: Enc) -> State:
        """The shared state, plus "feed" = h~_0 = 0 (B, H) with input feeding."""
        state = super().init_state(enc)
        if self.input_feeding:
            state["feed"] = enc["memory"].new_zeros(enc["memory"].size(0), self.W_c.out_features)
        return state

    def attentional(
        self, h: torch.Tensor, enc: Enc, steps: torch.Tensor, need_attn: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """h_t (B, T, H) -> h~_t = tanh(W_c [c_t; h_t]) (B, T, H) (eq. 5), and a_t (B, T, S) (None unless
        need_attn)."""
        context, attn = self.attend(h, enc, steps, need_attn)
        return torch.tanh(self.W_c(torch.cat([context, h], -1))), attn

    def advance(
        self, emb: torch.Tensor, enc: Enc, state: State, need_attn: bool = True
    ) -> tuple[torch.Tensor, State, torch.Tensor | None]:
        x = torch.cat([emb, state["feed"]], -1) if self.input_feeding else emb  # (B, I)
        h, hidden = self.rnn(x[:, None], state)  # (B, 1, H)
        h_tilde, attn = self.attentional(h, enc, state["t"][:, None], need_attn)
        new_state = {**state, **hidden, "t": state["t"] + 1}
        if self.input_feeding:
            new_state["feed"] = h_tilde[:, 0]
        # logits: self.output of the first
        return self.dropout(h_tilde[:, 0]), new_state, None if attn is None else attn[:, 0]

    def features(
        self, tgt_in: torch.Tensor, enc: Enc, need_attn: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher forcing: the output layer's input (B, T, H), attention (B, T, S) if asked; without input
        feeding every h_t comes from one RNN call."""
        if self.input_feeding:
            return super().features(tgt_in, enc, need_attn)
        enc = self.prepare(enc)
        state = self.init_state(enc)
        h, _ = self.rnn(self.dropout(self.embed(tgt_in)), state)  # (B, T, H): every h_t in one call
        steps = torch.arange(tgt_in.size(1), device=tgt_in.device).expand(tgt_in.size(0), -1)  # (B, T)
        h_tilde, attn = self.attentional(h, enc, steps, need_attn)
        return self.dropout(h_tilde), attn
