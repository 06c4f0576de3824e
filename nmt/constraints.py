"""Lexically constrained beam search: outputs that contain given target phrases (terminology), and avoid others.

Dynamic beam allocation (Post & Vilar 2018): a hypothesis' progress is the number of constraint tokens it has
met (whole phrases met, plus the tokens of a phrase it is in the middle of). At each step every sentence's
candidates are the usual best K extensions, each live hypothesis' own best token, and for each live hypothesis the
next token of every phrase it has not met yet (starting or continuing it). The K places of the beam are divided
among "banks" of equal progress (K // (C + 1) each, C the sentence's constraint tokens, the rest to the most
advanced banks, and places a bank cannot fill go to the others, most advanced first), so that hypotheses that
have met more constraints are not crowded out by likelier ones that have met fewer. A phrase counts as met once
its tokens appear in a row; a hypothesis that leaves a phrase half-way loses that phrase's progress. EOS is
allowed only once every phrase is met. A sentence is done with K finished hypotheses or at its length limit,
where hypotheses that have not met every phrase finish too, ranked after every one that has (the constraint is
then not satisfied: the beam was too narrow, or the length limit too short). Negative constraints: a token that
would complete a forbidden phrase is never chosen. Finished hypotheses are ranked by GNMT's normalised score, as
in `nmt.search.beam_search`.

Every model, through the decoder interface: one `step` for all sentences' rows, K rows per sentence (a sentence
with fewer live hypotheses repeats one, its copies scored -inf). The bookkeeping per hypothesis is Python, the
model's work batched: the cost over plain beam search is that bookkeeping, paid per step.

Shape legend: B batch, S source length, K beam, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nmt.data.tokenizer import BOS, EOS
from nmt.models.seq2seq import Seq2Seq, reorder
from nmt.search import NO_REPETITION, Hypothesis, Repetition, length_penalty, log_probs, scores_of

Phrase = tuple[int, ...]


@dataclass
class _Hyp:
    tokens: list[int]
    score: float
    progress: tuple[int, ...]  # per phrase: its tokens matched so far (len(phrase): met)
    attention: list[torch.Tensor] = field(default_factory=list)

    def met(self, phrases: list[Phrase]) -> int:
        return sum(self.progress)

    def done(self, phrases: list[Phrase]) -> bool:
        return all(p == len(phrase) for p, phrase in zip(self.progress, phrases))


def advance_progress(progress: tuple[int, ...], tokens: list[int], phrases: list[Phrase]) -> tuple[int, ...]:
    """Each phrase's progress after `tokens` (whose last token is new): met phrases stay met; otherwise the longest
    start of the phrase that ends the output."""
    out = []
    for p, phrase in zip(progress, phrases):
        if p == len(phrase):
            out.append(p)
            continue
        longest = 0
        for k in range(min(p + 1, len(phrase)), 0, -1):
            if tuple(tokens[-k:]) == phrase[:k]:
                longest = k
                break
        out.append(longest)
    return tuple(out)


def forbidden(tokens: list[int], negative: list[Phrase]) -> set[int]:
    """Tokens that would complete a forbidden phrase after `tokens`."""
    banned = set()
    for phrase in negative:
        head = phrase[:-1]
        if not head or tuple(tokens[-len(head) :]) == head:
            banned.add(phrase[-1])
    return banned


def allocate(k: int, banks: dict[int, list], total: int) -> list:
    """Dynamic beam allocation: K places over banks of equal progress (0..total), each bank's candidates best
    first; returns the chosen candidates."""
    levels = list(range(total, -1, -1))  # most advanced first
    share = {level: k // (total + 1) for level in levels}
    for level in levels[: k - sum(share.values())]:
        share[level] += 1
    chosen, spare = [], 0
    for level in levels:
        take = banks.get(level, [])[: share[level]]
        chosen += take
        spare += share[level] - len(take)
    if spare:
        taken = set(map(id, chosen))
        for level in levels:
            for cand in banks.get(level, []):
                if spare and id(cand) not in taken:
                    chosen.append(cand)
                    spare -= 1
    return chosen


@torch.inference_mode()
def constrained_beam_search(
    model: Seq2Seq,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len: torch.Tensor,
    k: int,
    constraints: list[list[Phrase]],
    negative: list[list[Phrase]] | None = None,
    alpha: float = 0.0,
    min_len: int = 0,
    nbest: int = 1,
    prefix: list[list[int]] | None = None,
    repetition: Repetition = NO_REPETITION,
) -> list[list[Hypothesis]]:
    """Beam search of width k whose outputs contain every phrase of constraints[b] (target ids) where the beam
    allows, and no phrase of negative[b]; nbest hypotheses per sentence, those that met every phrase first.

    prefix[b]: target ids sentence b's output starts with (an interactive translator's typed start): its tokens
    are forced one per step, scored as the model scores them, and a constraint they already contain counts as met.
    `repetition` (no-repeat n-grams, the repetition penalty) applies to every chosen token after the prefix, the
    prefix counting as output, as in `nmt.search.beam_search`."""
    batch = src.size(0)
    negative = negative or [[] for _ in range(batch)]
    prefix = prefix or [[] for _ in range(batch)]
    forcing_until = max((len(p) for p in prefix), default=0)
    enc = model.encode(src, src_mask)
    state = model.init_state(enc)
    src_lens = src_mask.sum(1).tolist()
    limits = max_len.tolist()
    live: list[list[_Hyp]] = [[_Hyp([], 0.0, tuple(0 for _ in constraints[b]))] for b in range(batch)]
    finished: list[list[_Hyp]] = [[] for _ in range(batch)]
    width = 1  # rows per sentence in the state: 1 at the first step, then k
    prev = torch.full((batch,), BOS, dtype=torch.long, device=src.device)
    history: list[list[int]] = [[] for _ in range(batch)]  # each row's output so far (B * width rows of t tokens)
    for t in range(int(max(limits))):
        logits, state, attn = model.step(prev, enc, state)  # (B * width, V), state, (B * width, S)
        rows_history = torch.tensor(history, dtype=torch.long, device=src.device).view(len(history), t)
        logp = scores_of(logits, t, min_len, rows_history, repetition)
        forced = log_probs(logits, t, min_len) if t < forcing_until else None  # the prefix: no repetition control
        top_values, top_tokens = logp.topk(min(2 * k, logp.size(1)), dim=1)  # (B * width, 2K)
        top_values, top_tokens, logp_cpu = top_values.tolist(), top_tokens.tolist(), logp
        rows, tokens_next, history_next = [], [], []
        for b in range(batch):
            phrases, hyps = constraints[b], live[b]
            if len(finished[b]) >= k or not hyps:
                rows += [b * width] * k
                tokens_next += [EOS] * k
                history_next += [[EOS] * (t + 1)] * k
                live[b] = []
                continue
            total = sum(len(p) for p in phrases)
            candidates: dict[tuple[int, int], tuple[float, int, int]] = {}  # (hyp, token) -> (score, hyp, token)
            if t < len(prefix[b]):  # the prefix's next token, on the one live hypothesis
                token = prefix[b][t]
                candidates[(0, token)] = (hyps[0].score + float(forced[b * width, token]), 0, token)
            for h, hyp in enumerate(hyps if t >= len(prefix[b]) else []):
                row = b * width + h
                wanted = {phrase[p] for p, phrase in zip(hyp.progress, phrases) if p < len(phrase)}
                wanted |= {phrase[0] for p, phrase in zip(hyp.progress, phrases) if p < len(phrase)}
                options = list(zip(top_values[row][:k], top_tokens[row][:k])) + [
                    (top_values[row][0], top_tokens[row][0])
                ]
                options += [(float(logp_cpu[row, token]), token) for token in wanted]
                banned = forbidden(hyp.tokens, negative[b])
                for value, token in options:
                    if token in banned or value == float("-inf"):
                        continue
                    if token == EOS and not hyp.done(phrases):
                        continue
                    candidates[(h, token)] = (hyp.score + value, h, token)
            at_limit = t + 1 >= limits[b]
            banks: dict[int, list] = {}
            for score, h, token in sorted(candidates.values(), key=lambda c: -c[0]):
                hyp = hyps[h]
                tokens = hyp.tokens + [token]
                progress = hyp.progress if token == EOS else advance_progress(hyp.progress, tokens, phrases)
                new = _Hyp(tokens, score, progress, hyp.attention + [attn[b * width + h]])
                new.row = b * width + h  # type: ignore[attr-defined]
                banks.setdefault(sum(progress), []).append(new)
            chosen = allocate(k, banks, total)
            survivors = []
            for new in sorted(chosen, key=lambda c: -c.score):
                if new.tokens[-1] == EOS or at_limit:
                    finished[b].append(new)
                else:
                    survivors.append(new)
            live[b] = survivors if not at_limit and len(finished[b]) < k else []
            picked = live[b] or [None]
            for j in range(k):
                hyp = picked[j % len(picked)]
                rows.append(hyp.row if hyp is not None else b * width)  # type: ignore[attr-defined]
                tokens_next.append(hyp.tokens[-1] if hyp is not None else EOS)
                history_next.append(hyp.tokens if hyp is not None else [EOS] * (t + 1))
        if not any(live):
            break
        index = torch.tensor(rows, dtype=torch.long, device=src.device)
        state = reorder(state, index)
        prev = torch.tensor(tokens_next, dtype=torch.long, device=src.device)
        history = history_next
        width = k
    results = []
    for b in range(batch):
        pool = finished[b] + live[b]
        phrases = constraints[b]

        def rank(h: _Hyp, phrases: list[Phrase] = phrases) -> tuple[bool, float]:
            return (h.done(phrases), h.score / length_penalty(len(h.tokens), alpha))

        best = sorted(pool, key=rank, reverse=True)[:nbest]
        out = []
        for h in best:
            steps = len(h.tokens)
            tokens = h.tokens[:-1] if h.tokens and h.tokens[-1] == EOS else h.tokens
            attention = torch.stack([a.float().cpu() for a in h.attention])[:, : src_lens[b]]
            out.append(Hypothesis(tokens, h.score, h.score / length_penalty(steps, alpha), attention))
        results.append(out)
    return results


def satisfied(tokens: list[int], phrases: list[Phrase]) -> bool:
    """Whether every phrase occurs in `tokens`, its tokens in a row."""
    return all(any(tuple(tokens[i : i + len(p)]) == p for i in range(len(tokens) - len(p) + 1)) for p in phrases)
