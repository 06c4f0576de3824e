"""The attentional decoder of Bahdanau, Cho and Bengio 2014, "Neural Machine Translation by Jointly
Learning to Align and Translate" (RNNsearch). Attention comes before the RNN: the query is s_{i-1}.

    e_ij = a(s_{i-1}, h_j) = v_a^T tanh(W_a s_{i-1} + U_a h_j)     eq. 6, appendix A.1.2 (model.score)
    a_ij = exp(e_ij) / sum_k exp(e_ik)                              eq. 6
    c_i  = sum_j a_ij h_j                                           eq. 5
    t~_i = U_o s_{i-1} + V_o E y_{i-1} + C_o c_i                    appendix A.2.2 (readout)
    t_i  = [max(t~_{i,2k-1}, t~_{i,2k})]_k                          maxout, 2 pieces
    p(y_i | y_<i, x) = softmax(W_o t_i)                             appendix A.2.2
    s_i  = f(s_{i-1}, [E y_{i-1}; c_i])                             eq. 4 (f: GRU as in the paper, or LSTM)
With several layers, s is the top layer. The output is computed from s_{i-1} as in the appendix
(eq. 4 writes s_i; the appendix, which describes the trained model, uses s_{i-1}). W_o has size (V, E),
so the output layer can share the target embedding.

Shape legend: B batch, S source length, T target length, E embedding, H hidden, L layers, V vocab.
"""

from __future__ import annotations

import torch
from torch import nn

from nmt.models.attention import Additive, Attention
from nmt.models.bahdanau_loop import fused_features, loop_scores
from nmt.models.dropout import Dropout
from nmt.models.rnn import Recurrent, RNNDecoder
from nmt.models.seq2seq import Enc, State


class BahdanauDecoder(RNNDecoder):
    """Attend with s_{i-1}, predict y_i from a maxout readout, then update the RNN with [E y_{i-1}; c_i]."""

    def __init__(
        self,
        embed: nn.Embedding,
        vocab: int,
        cell: str,
        dim: int,
        layers: int,
        dropout: float,
        attention: Attention,
        tie_output: bool,
    ):
        super().__init__()
        embed_dim = embed.embedding_dim
        self.embed, self.dropout, self.attention = embed, Dropout(dropout), attention
        self.rnn = Recurrent(cell, embed_dim + dim, dim, layers, dropout)
        self.readout = nn.Linear(dim + embed_dim + dim, 2 * embed_dim)  # [U_o V_o C_o] (and a bias)
        self.output = nn.Linear(embed_dim, vocab, bias=False)  # W_o
        if tie_output:
            self.output.weight = embed.weight

    def advance(
        self, emb: torch.Tensor, enc: Enc, state: State, need_attn: bool = True
    ) -> tuple[torch.Tensor, State, torch.Tensor | None]:
        s_prev = state["h"][:, -1]  # (B, H): top layer of s_{i-1}
        context, attn = self.attend(s_prev[:, None], enc, state["t"][:, None], need_attn)  # (B, 1, H), (B, 1, S)
        context = context[:, 0]
        t_tilde = self.readout(torch.cat([s_prev, emb, context], -1))  # (B, 2E)
        t_i = t_tilde.view(t_tilde.size(0), -1, 2).amax(-1)  # (B, E) maxout
        _, hidden = self.rnn(torch.cat([emb, context], -1)[:, None], state)  # s_i
        # logits: self.output of the first
        return self.dropout(t_i), {**state, **hidden, "t": state["t"] + 1}, None if attn is None else attn[:, 0]

    def features(
        self, tgt_in: torch.Tensor, enc: Enc, need_attn: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher forcing: the output layer's input (B, T, E), attention (B, T, S) if asked. Within `looped_by`
        (training with train.decoder_loop) a GRU of one layer with the additive score runs as one operation
        (nmt/models/bahdanau_loop.py); otherwise, and whenever attention is asked for, one `advance` per step."""
        scores = loop_scores()
        if scores is None or need_attn or not self.fusable():
            return super().features(tgt_in, enc, need_attn)
        return fused_features(self, tgt_in, enc, scores), None

    def fusable(self) -> bool:
        """Whether bahdanau_loop covers this decoder: a GRU of one layer, the additive global soft score."""
        return not self.rnn.lstm and self.rnn.rnn.num_layers == 1 and type(self.attention) is Additive
