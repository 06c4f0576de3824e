"""Several trained models decoding as one (`nmt-translate checkpoint=a.pt,b.pt`).

At every step each model scores the next token from its own encoder output and decoder state, and
the ensemble's score is the mean of their log-probabilities,
    log p(y_t | y_<t, x) = 1/M sum_m log p_m(y_t | y_<t, x)       (renormalised by the search's softmax)
the log-linear combination most NMT toolkits use. The models must share the target vocabulary
(they may differ in architecture). The attention returned is the mean of the models' attention.

It implements the decoder interface of nmt.models.seq2seq, so search runs it like one model: the
encoder output and the state are one dict each, model m's entries under the prefix "m.".

Shape legend: B sentences, R rows (R // B per sentence), S source length, V vocab.
"""

from __future__ import annotations

import torch
from torch import nn

from nmt.models.seq2seq import Enc, State


def _split(tensors: dict[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
    """{"0.memory": a, "1.memory": b} -> [{"memory": a}, {"memory": b}]."""
    parts: list[dict[str, torch.Tensor]] = [{} for _ in range(count)]
    for name, value in tensors.items():
        index, _, key = name.partition(".")
        parts[int(index)][key] = value
    return parts


def _join(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {f"{m}.{key}": value for m, part in enumerate(parts) for key, value in part.items()}


class Ensemble(nn.Module):
    """The mean of several models' log-probabilities at every step, behind the one-model interface."""

    def __init__(self, models: list[nn.Module]):
        super().__init__()
        self.models = nn.ModuleList(models)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> Enc:
        return _join([model.encode(src, src_mask) for model in self.models])

    def init_state(self, enc: Enc) -> State:
        return _join([model.init_state(e) for model, e in zip(self.models, _split(enc, len(self.models)))])

    def step(
        self, prev: torch.Tensor, enc: Enc, state: State, output: list[nn.Module] | None = None
    ) -> tuple[torch.Tensor, State, torch.Tensor]:
        """prev (R,) -> mean log-probabilities (R, V), the new state, mean attention (R, S); `output`: one
        replacement output layer per model (a shortlist's rows)."""
        logps, states, attns = [], [], []
        outputs = output or [None] * len(self.models)
        parts = zip(self.models, _split(enc, len(self.models)), _split(state, len(self.models)), outputs)
        for model, e, s, out in parts:
            logits, new_state, attn = model.step(prev, e, s, output=out)
            logps.append(logits.float().log_softmax(-1))
            states.append(new_state)
            attns.append(attn.float())
        return torch.stack(logps).mean(0), _join(states), torch.stack(attns).mean(0)
