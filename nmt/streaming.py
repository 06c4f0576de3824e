"""Translations that stream: the search's output after every decoding step (nmt.Model.stream, nmt-serve's
POST /v1/translate/stream).

The search is the one `Model.translate` runs for a line, on the same decoding copy of the model: nmt.translation's
`Translator.steps` for a batch of one sentence, read after each of its steps (nmt.search.Progress). Nothing here
computes a token, so the final event holds exactly the translation `Model.translate` returns with the same
settings. What each step's event shows:

    greedy, sampling  the output so far (the search's one path)
    beam search       the hypothesis at the top of the beam: the highest summed log-probability among those still
                      being extended. It may change course between steps (`keep` says how much of the previous
                      event still stands), and it is not yet the answer: the search ranks finished hypotheses by
                      the normalised score (nmt.search). With finished_only=True, an event comes only when the
                      best finished hypothesis so far changes, and shows it.
    the final event   the translation: the search's best hypothesis, its normalised score, final=True

What streams: greedy and beam search, sampling (one sample), a target prefix (every event starts with it),
repetition control, ensembles, shortlists, every precision. What does not is refused before any decoding with
`NotStreamable`, a ValueError of one line naming the option: n-best lists (nbest > 1: a stream shows one
hypothesis) and constraints / avoid (lexically constrained search, nmt.constraints, is a search of its own).

Shape legend: S source tokens (EOS included), T output steps of the hypothesis shown (an EOS step included).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch

from nmt.config import DecodeConfig
from nmt.data.tokenizer import EOS
from nmt.errors import NmtError
from nmt.search import Hypothesis, Prefilled, Progress, length_penalty
from nmt.translation import Translator, eval_mode


class NotStreamable(NmtError, ValueError):
    """A setting a stream cannot honour; the message names it (one line)."""


@dataclass
class StreamEvent:
    """The hypothesis shown after a decoding step, or the translation (final=True)."""

    step: int  # decoding steps run so far (a prefix's teacher-forced steps not counted)
    ids: list[int]  # its target ids, a prefix included; no BOS, no EOS
    tokens: list[str]  # their subword pieces
    text: str  # detokenised
    length: int  # its output steps: the tokens, and an EOS step once it has one
    keep: int  # leading output steps (tokens and attention rows) the same as the previous event's
    finished: bool  # it has ended (EOS, or its length limit)
    final: bool  # the search is over and this is the translation
    attention: np.ndarray | None = None  # (T, S) one row per output step, when asked; row -1 is this step's
    score: float | None = None  # its normalised score, where it has one (finished hypotheses)


def check_streamable(decode: DecodeConfig, constraints: object, avoid: object, prefix: str | None) -> None:
    """Refuse, in one line naming the option, what a stream cannot do (see the module's docstring)."""
    if decode.nbest > 1:
        raise NotStreamable(
            f"nbest={decode.nbest}: a stream shows one hypothesis; expected nbest=1 "
            "(Model.translate gives n-best lists)"
        )
    for name, value in (("constraints", constraints), ("avoid", avoid)):
        if value:
            raise NotStreamable(
                f"{name}: lexically constrained search does not stream; use Model.translate(..., {name}=...)"
            )
    if decode.sampling and prefix:
        raise NmtError("a target prefix with decode.sampling=true: prefixes are for greedy and beam search")


@dataclass
class _Shown:
    """A hypothesis in the search's own ids: its steps' tokens (an EOS step included), their attention rows."""

    steps: list[int]
    rows: list[np.ndarray] | None
    finished: bool
    score: float | None = None


class _OnePath:
    """Greedy search and sampling: the output so far of row 0 (the one sentence, its one sample)."""

    def __init__(self, attention: bool):
        self.steps: list[int] = []
        self.rows: list[np.ndarray] | None = [] if attention else None

    def read(self, progress: Progress) -> _Shown:
        t = progress.t
        if t == 0 and progress.pre is not None:
            self.steps = list(progress.pre.tokens[0])
            if self.rows is not None:
                self.rows = list(_prefix_rows(progress.pre))
        token = int(progress.tokens[0, t])
        self.steps.append(token)
        if self.rows is not None:
            self.rows.append(progress.attention[0, t].float().cpu().numpy())  # (S,)
        return _Shown(list(self.steps), None if self.rows is None else list(self.rows), token == EOS)


class _Beam:
    """Beam search of one sentence: the top of its beam, or the best finished hypothesis so far.

    Keeps host copies of each step's back-pointers and tokens (K each) and, when asked, attention rows, and
    follows a hypothesis back through them as nmt.search's `_Beams._trace` does.
    """

    def __init__(self, attention: bool, alpha: float, finished_only: bool):
        self.attention, self.alpha, self.finished_only = attention, alpha, finished_only
        self.back: list[list[int]] = []  # per step t: the row of step t each next row extends
        self.token: list[list[int]] = []  # per step t: the token each next row added
        self.attn: list[np.ndarray] = []  # per step t: (rows_t, S)
        self.best: _Shown | None = None  # the best finished hypothesis so far (normalised score)

    def read(self, progress: Progress) -> _Shown | None:
        t, beams, pre = progress.t, progress.beams, progress.pre
        self.back.append(beams.back[t].tolist())
        self.token.append(beams.token[t].tolist())
        if self.attention:
            self.attn.append(beams.attn[t].float().cpu().numpy())
        improved = False
        if beams.finished and beams.finished[-1][0] == t:  # hypotheses that finished at this step
            _, rows, last, scores, _ = beams.finished[-1]
            for row, token, score in zip(rows.tolist(), last.tolist(), scores.tolist()):
                norm = score / length_penalty(t + 1 + beams.offset, self.alpha)  # as _Beams.best ranks them
                if self.best is None or norm > self.best.score:  # ties: the first finished stays first
                    self.best = self._trace(t, row, token, pre, True, norm)
                    improved = True
        if self.finished_only:
            return self.best if improved else None
        if not self.back[t]:  # no live hypothesis left: the search is over
            return self.best
        return self._trace(t, self.back[t][0], self.token[t][0], pre, False)  # next row 0: the beam's top

    def _trace(self, t: int, row: int, last: int, pre: Prefilled | None, done: bool, score=None) -> _Shown:
        """The hypothesis that ends at step t in `row` (a row of step t) with token `last`."""
        steps, rows = [last], [row]
        for s in range(t - 1, -1, -1):
            steps.append(self.token[s][row])
            row = self.back[s][row]
            rows.append(row)
        steps.reverse()
        rows.reverse()
        attn = [self.attn[s][r] for s, r in enumerate(rows)] if self.attention else None
        if pre is not None:
            steps = list(pre.tokens[0]) + steps
            attn = list(_prefix_rows(pre)) + attn if attn is not None else None
        return _Shown(steps, attn, done, score)


def _prefix_rows(pre: Prefilled) -> np.ndarray:
    return pre.attention[0].float().cpu().numpy()  # (P, S)


@torch.inference_mode()
def stream_steps(
    translator: Translator, src_ids: list[int], prefix_ids: list[int] | None, attention: bool, finished_only: bool
) -> Generator[StreamEvent, None, list[Hypothesis]]:
    """Decode one sentence (source ids, target prefix ids or None) as `translator.search` does, yielding an event
    after each step (see the module's docstring) and the final one; returns the search's hypotheses."""
    d = translator.decode
    model, vocab, prefixes, _, _ = translator.search_model([src_ids], [prefix_ids] if prefix_ids else None)
    to_ids = (lambda local: local) if vocab is None else (lambda local: [vocab[i] for i in local])
    view = _Beam(attention, d.alpha, finished_only) if not d.sampling and d.beam > 1 else _OnePath(attention)
    steps = translator.steps(model, [src_ids], prefixes)
    before: list[int] = []  # the previous event's output steps
    step = 0
    while True:
        try:
            progress = next(steps)
        except StopIteration as done:
            found = done.value[0] if vocab is None else [replace(h, tokens=to_ids(h.tokens)) for h in done.value[0]]
            break
        step = progress.t + 1
        shown = view.read(progress)
        if shown is None or (finished_only and not shown.finished):
            continue
        event = _event(translator, step, to_ids(shown.steps), shown, before, False)
        before = to_ids(shown.steps)
        yield event
    final = _Shown([], [] if attention else None, True)
    if found:
        best = found[0]
        eos = [EOS] if best.attention.size(0) > len(best.tokens) else []  # cut at its length limit: no EOS step
        final = _Shown(best.tokens + eos, list(best.attention.numpy()) if attention else None, True, best.norm_score)
    yield _event(translator, step, final.steps, final, before, True)
    return found


def _event(
    translator: Translator, step: int, steps: list[int], shown: _Shown, before: list[int], final: bool
) -> StreamEvent:
    """The event of a hypothesis given by its output steps in global ids (an EOS step included where it has one)."""
    ids = steps[:-1] if steps and steps[-1] == EOS else steps
    keep = 0
    while keep < min(len(steps), len(before)) and steps[keep] == before[keep]:
        keep += 1
    rows = shown.rows
    attention = None if rows is None else np.stack(rows) if rows else np.zeros((0, 0), dtype=np.float32)  # (T, S)
    tokenizer = translator.tokenizer
    pieces = [tokenizer.tgt.id_to_piece(i) for i in ids]
    # the final text as Model.translate makes it; a step's by the one-sentence call, which gives the same text
    # without the batch call's thread pool (1-2 ms a call, more than a step of a small model)
    text = tokenizer.decode_tgt([ids])[0] if final else tokenizer.tgt.decode(ids)
    return StreamEvent(step, ids, pieces, text, len(steps), keep, shown.finished, final, attention, shown.score)


def blank_event(attention: bool) -> StreamEvent:
    """The one event of a blank line: no search, the text "" (as Model.translate gives)."""
    return StreamEvent(0, [], [], "", 0, 0, True, True, np.zeros((0, 0), dtype=np.float32) if attention else None)


def events(
    translator: Translator, src_ids: list[int], prefix_ids: list[int] | None, attention: bool, finished_only: bool
) -> Iterator[StreamEvent]:
    """Every event of `stream_steps`, the final one last (what Model.stream returns)."""
    with eval_mode(translator.model):
        yield from stream_steps(translator, src_ids, prefix_ids, attention, finished_only)
