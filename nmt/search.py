"""Decoding through the decoder interface (`init_state` / `step`); no search asks which model it runs.

    greedy_search   the most probable token at each step
    beam_search     K hypotheses per sentence, all sentences of a batch at once (one function for every model)
    sample_search   each token drawn from the model's distribution, sharpened by a temperature and cut
                    to the top-k tokens and/or the top-p nucleus (Holtzman et al. 2020)

A hypothesis' score is the sum of the log-probabilities of its output tokens, EOS included. Hypotheses
are ranked by the normalised score, score / lp(Y), with the GNMT length penalty (Wu et al. 2016, eq. 14)
    lp(Y) = ((5 + |Y|) / 6) ** alpha,    |Y| = output steps (tokens + EOS; tokens alone if cut at max length)
alpha = 0 ranks by the plain sum. An output has at most max_len[b] steps (see `max_lengths`); EOS is
forbidden before min_len tokens.

Every search but sampling takes a target **prefix** (B, P) (the same length P for the batch's sentences): BOS and
the prefix go through the decoder in one teacher-forced pass (`prefill`), and the search continues from there. The
outputs start with the prefix; their scores, lengths and attention count the prefix's steps, so a hypothesis scores
as the same tokens do under teacher forcing. **Repetition control**, for greedy, beam and sampling alike:
`no_repeat` N > 0 forbids any token that would repeat an n-gram of N tokens already in the row's output (prefix
included); `repetition_penalty` p != 1 divides the logits of tokens already in the row's output by p where
positive and multiplies them by p where negative (Keskar et al. 2019). With either, scores are those of the
adjusted distribution.

Every search is also a generator of its steps (`greedy_steps`, `sample_steps`, `beam_steps`): it yields a
`Progress` after each decoding step and returns the hypotheses; `greedy_search` and the others run it to the end
(`drain`), so a streamed translation (nmt.streaming) is the same search as a translated one.

Shape legend: B batch, S source length, T output steps so far, V vocab, K beam, N samples per sentence.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F

from nmt.data.tokenizer import BOS, EOS, PAD
from nmt.engine import native
from nmt.models.seq2seq import Seq2Seq, prefill, reorder


@dataclass
class Hypothesis:
    """One output: tokens without BOS/EOS, summed and normalised log-probability, attention (steps, S)."""

    tokens: list[int]
    score: float
    norm_score: float
    attention: torch.Tensor  # one row per output step (the EOS step included), one column per source token; its own
    # storage (not a view of the batch's padded tensor), so a chunk of results holds only what it needs


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016, eq. 14)."""
    return ((5 + length) / 6) ** alpha


def max_lengths(src_mask: torch.Tensor, a: float, b: int) -> torch.Tensor:
    """(B,) output length limits a * source length + b (source length without EOS)."""
    return ((src_mask.sum(1) - 1).float() * a + b).long().clamp(min=1)


def log_probs(logits: torch.Tensor, step: int, min_len: int) -> torch.Tensor:
    """(B, V) log-softmax in float32, with the tokens no output may hold made impossible.

    PAD and BOS are never emitted (label smoothing gives them some mass, so a model can rank them);
    EOS is impossible while fewer than min_len tokens are out. Every search reads its scores from here.
    """
    logp = logits.float().log_softmax(-1)
    logp[:, forbidden(step, min_len)] = float("-inf")
    return logp


def forbidden(step: int, min_len: int) -> list[int]:
    """The tokens no output may hold at `step` (see `log_probs`)."""
    return [PAD, BOS, EOS] if step < min_len else [PAD, BOS]


def candidates(logits: torch.Tensor, step: int, min_len: int, count: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each row's `count` best log_probs(logits, step, min_len) and tokens (best first), found by one C pass per
    row that writes no (B, V) log-softmax (nmt.engine.native); None where that kernel cannot (no kernels, too
    few tokens): then the caller computes log_probs. The same candidates up to the last bits of the log-sum-exp."""
    banned = forbidden(step, min_len)
    rows, width = logits.shape
    if not (native.usable(logits) and logits.is_contiguous() and count <= 64 and width - len(banned) >= count):
        return None
    return native.log_softmax_topk(logits, count, banned)


def row_argmax(x: torch.Tensor, banned: list[int] | None = None) -> torch.Tensor:
    """x.argmax(dim=1) for a wide (R, V) x, through a fast max per block (torch's argmax on a CPU reads a
    row several times slower): the block holding a row's first largest value is the first whose maximum
    is largest, and that value's place in the block is the first largest there. The same index as argmax.
    banned: tokens taken as -inf, x[:, banned] = -inf first (written into x where the kernels are not built)."""
    rows, width = x.shape
    if native.usable(x) and x.is_contiguous() and width:
        return native.row_argmax(x, banned or ())  # one pass per row in C (nmt.engine.native), x not written
    if banned:
        x[:, banned] = float("-inf")
    block = next((b for b in BLOCKS if width % b == 0 and width // b > 1), None)
    if block is None:
        return x.argmax(1)
    count = width // block
    best = x.view(rows, count, block).amax(2).argmax(1)  # (R,) the block of each row's largest value
    first = torch.arange(rows, device=x.device) * count
    return best * block + x.reshape(rows * count, block).index_select(0, best + first).argmax(1)


def greedy_choice(
    logits: torch.Tensor, step: int, min_len: int, scores: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The argmax of log_probs(logits, step, min_len) and its log-probability, (B,) each, without writing the
    (B, V) log-softmax: log p(y) = logit_y - logsumexp(logits) for the same forbidden tokens. `logits` must be
    the search's own (where the kernels are not built, the forbidden tokens are masked in place). scores=False: no
    log-probability (None), so no logsumexp, the greater part of this function's time (the token is the same:
    normalising shifts a row, never reorders it)."""
    logits = logits.float()
    lse = logits.logsumexp(-1) if scores else None  # (B,) over every token, as log_softmax normalises
    tokens = row_argmax(logits, forbidden(step, min_len))  # never a forbidden token: its logit is as it was
    return tokens, None if lse is None else logits.gather(1, tokens[:, None]).squeeze(1) - lse


def _hypothesis(tokens: list[int], score: float, attention: torch.Tensor, alpha: float) -> Hypothesis:
    """A finished output; `tokens` are all steps, a final EOS is dropped from them (not from attention)."""
    steps = len(tokens)
    tokens = tokens[:-1] if tokens and tokens[-1] == EOS else tokens
    return Hypothesis(tokens, score, score / length_penalty(steps, alpha), attention)


@dataclass
class Repetition:
    """Repetition control (see the module's docstring); the default does nothing."""

    no_repeat: int = 0
    penalty: float = 1.0

    @property
    def active(self) -> bool:
        return self.no_repeat > 0 or self.penalty != 1.0

    def logits(self, logits: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        """(R, V) logits with the repetition penalty applied to the tokens of each row's history (R, L)."""
        if self.penalty == 1.0 or history.size(1) == 0:
            return logits
        seen = logits.gather(1, history)
        return logits.scatter(1, history, torch.where(seen > 0, seen / self.penalty, seen * self.penalty))

    def ban(self, logp: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        """(R, V) log-probs with -inf for each token that would end an n-gram already in the row's history."""
        n, length = self.no_repeat, history.size(1)
        if n <= 0 or length < n:  # no n-gram out yet
            return logp
        if n == 1:
            return logp.scatter(1, history, float("-inf"))
        grams = history.unfold(1, n, 1)  # (R, L - n + 1, n)
        match = (grams[:, :, :-1] == history[:, length - n + 1 :][:, None, :]).all(2)  # (R, L - n + 1)
        rows, at = match.nonzero(as_tuple=True)
        logp[rows, grams[rows, at, -1]] = float("-inf")
        return logp


NO_REPETITION = Repetition()


def scores_of(logits: torch.Tensor, step: int, min_len: int, history: torch.Tensor, repetition: Repetition):
    """The log-probs a search ranks by: `log_probs`, after repetition control when it is on."""
    if not repetition.active:
        return log_probs(logits, step, min_len)
    return repetition.ban(log_probs(repetition.logits(logits, history), step, min_len), history)


@dataclass
class Prefilled:
    """A batch's prefix after `start`: what the search's first step reads, and what each output starts with."""

    logits: torch.Tensor  # (B, V) the first free step's logits
    attn: torch.Tensor  # (B, S) and attention
    score: torch.Tensor  # (B,) the prefix's log-probability
    tokens: list[list[int]]  # per sentence, the prefix
    attention: torch.Tensor  # (B, P, S) the prefix steps' attention

    @property
    def length(self) -> int:
        return self.attention.size(1)


def start(model, enc: dict, state: dict, prefix: torch.Tensor | None, min_len: int, repetition: Repetition):
    """The state after BOS + prefix, and the Prefilled record (None without a prefix: the search starts at BOS)."""
    if prefix is None or prefix.size(1) == 0:
        return state, None
    bos = prefix.new_full((prefix.size(0), 1), BOS)
    logits, state, attn = prefill(model, torch.cat([bos, prefix], 1), enc, state)  # (B, P + 1, *)
    length = prefix.size(1)
    score = torch.zeros(prefix.size(0), device=prefix.device)
    for i in range(length):
        logp = scores_of(logits[:, i], i, min_len, prefix[:, :i], repetition)
        score += logp.gather(1, prefix[:, i : i + 1]).squeeze(1)
    return state, Prefilled(logits[:, length], attn[:, length], score, prefix.tolist(), attn[:, :length].float())


def with_prefix(hyps: list[Hypothesis], pre: Prefilled, b: int, alpha: float) -> list[Hypothesis]:
    """Sentence b's hypotheses of the free steps, made whole: the prefix's tokens, score, steps and attention first."""
    out = []
    for h in hyps:
        steps = pre.length + h.attention.size(0)
        score = h.score  # already counts the prefix (the search started from its score)
        attention = torch.cat([pre.attention[b, :, : h.attention.size(1)].cpu(), h.attention], 0)
        out.append(Hypothesis(pre.tokens[b] + h.tokens, score, score / length_penalty(steps, alpha), attention))
    return out


@dataclass
class Progress:
    """A search after its decoding step t (the prefix's steps not counted), as its steps generator yields it. The
    tensors are the search's own, read before the next step: one path (greedy, sampling) writes step t of `tokens`
    (B + 1, T) and `attention` (B + 1, T, S), by original row; beam search's step is in `beams`."""

    t: int
    pre: Prefilled | None
    tokens: torch.Tensor | None = None
    attention: torch.Tensor | None = None
    beams: _Beams | None = None


Found = TypeVar("Found")


def drain(steps: Generator[Progress, None, Found]) -> Found:
    """Run a search's steps to the end; what it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


# --- one path per row: greedy and sampling -----------------------------------------------------

Chooser = Callable[[torch.Tensor], torch.Tensor]  # log-probs (B, V) -> next tokens (B,)


compact_share = 0.1  # _one_path_steps: ended rows leave the batch once they are this share of its rows (0: at once)


@torch.inference_mode()
def _one_path_steps(
    model: Seq2Seq,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len: torch.Tensor,
    choose: Chooser | None,
    min_len: int,
    alpha: float,
    prefix: torch.Tensor | None = None,
    repetition: Repetition = NO_REPETITION,
    scores_needed: bool = True,
) -> Generator[Progress, None, list[Hypothesis]]:
    """Follow one token per step in every row (`choose`; None: the most probable); a row leaves the batch when it
    emits EOS or hits max_len. scores_needed=False: the most probable token's log-probability is not computed
    where only it is needed (`greedy_choice`), and the hypotheses' scores are NaN."""
    enc = model.encode(src, src_mask)
    state, pre = start(model, enc, model.init_state(enc), prefix, min_len, repetition)
    offset = pre.length if pre else 0
    max_len = (max_len - offset).clamp(min=1)
    batch, steps = src.size(0), int(max_len.max())
    # A row that ends stays in the batch, writing into a spare last row (`sink`) of the outputs, until a
    # `compact_share` of the rows have ended: then they leave together. A row's result does not depend on the
    # other rows (bit for bit in int8; fp32 products of other row counts can differ in the last bits), so when they
    # leave changes no output (tests/test_native.py). Copying every cache each time a row ended cost 7-13% of a
    # greedy search of 64-sentence batches; a Transformer decoding copy's caches are no longer copied (shared_
    # entries), and 0.1 measured 1.07x 0.25 and 1.03x leaving at once (int8, 1,000 test2016 sentences, 1 thread).
    # Sampling leaves at once: a row kept after its end would still draw from the random stream, and change the
    # draws of the rows after it.
    sink, share = batch, compact_share if choose is None else 0.0
    active = torch.arange(batch, device=src.device)  # original row of each row (sink: ended)
    prev = torch.full((batch,), BOS, dtype=torch.long, device=src.device)
    out = torch.full((batch + 1, steps), EOS, dtype=torch.long, device=src.device)  # (B + 1, T)
    scores = torch.zeros(batch + 1, device=src.device)
    if pre:
        scores[:batch] = pre.score
    attn_out = torch.zeros(batch + 1, steps, src.size(1), device=src.device)  # (B + 1, T, S)
    lengths = torch.full((batch + 1,), steps, dtype=torch.long, device=src.device)
    limit = F.pad(max_len, (0, 1))  # the sink's is 0: never live
    history = F.pad(prefix if pre else src.new_zeros(batch, 0), (0, 0, 0, 1))
    for t in range(steps):
        if t == 0 and pre is not None:
            logits, attn = pre.logits, pre.attn
        else:
            logits, state, attn = model.step(prev, enc, state)  # (B, V), state, (B, S)
        if choose is None and not repetition.active and not (t == 0 and pre is not None):
            prev, gained = greedy_choice(logits, t + offset, min_len, scores_needed)  # no (B, V) log-softmax
        else:
            if repetition.active:
                history_t = torch.cat([history[active], out[active, :t]], 1)
                logp = scores_of(logits, t + offset, min_len, history_t, repetition)
            else:
                logp = log_probs(logits, t + offset, min_len)
            prev = row_argmax(logp) if choose is None else choose(logp)
            gained = logp.gather(1, prev[:, None]).squeeze(1)
        out[active, t], attn_out[active, t] = prev, attn.float()
        if gained is not None:
            scores[active] += gained
        yield Progress(t, pre, out, attn_out)
        live = (prev != EOS) & (limit[active] > t + 1)
        if not bool(live.all()):
            lengths[active[~live]] = t + 1  # (the sink's length is never read)
            active = torch.where(live, active, sink)
            ended = int((~live).sum())
            if ended == live.numel():
                break
            if ended >= max(1, int(live.numel() * share)):
                keep = live.nonzero().squeeze(1)
                active, prev = active[keep], prev[keep]
                enc, state = reorder(enc, keep), reorder(state, keep)
    if not scores_needed and choose is None and not repetition.active:
        scores.fill_(float("nan"))  # what greedy_choice did not compute (a prefix's score too: no half a score)
    src_lens, lengths, out, scores, attn_out = (
        src_mask.sum(1).tolist(),
        lengths[:batch].tolist(),
        out[:batch].tolist(),
        scores[:batch].tolist(),
        attn_out[:batch].cpu(),
    )
    hyps = [
        _hypothesis(out[b][: lengths[b]], scores[b], attn_out[b, : lengths[b], : src_lens[b]].clone(), alpha)
        for b in range(batch)
    ]
    return [with_prefix([h], pre, b, alpha)[0] for b, h in enumerate(hyps)] if pre else hyps


def greedy_search(
    model: Seq2Seq,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len: torch.Tensor,
    min_len: int = 0,
    alpha: float = 0.0,
    prefix: torch.Tensor | None = None,
    repetition: Repetition = NO_REPETITION,
    scores: bool = True,
) -> list[Hypothesis]:
    """The most probable token at each step; one hypothesis per sentence (alpha only sets norm_score).
    scores=False: the hypotheses' scores are NaN, and not computed (see `_one_path_steps`)."""
    return drain(greedy_steps(model, src, src_mask, max_len, min_len, alpha, prefix, repetition, scores))


def greedy_steps(
    model: Seq2Seq,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len: torch.Tensor,
    min_len: int = 0,
    alpha: float = 0.0,
    prefix: torch.Tensor | None = None,
    repetition: Repetition = NO_REPETITION,
    scores: bool = True,
) -> Generator[Progress, None, list[Hypothesis]]:
    """`greedy_search` one step at a time."""
    return _one_path_steps(model, src, src_mask, max_len, None, min_len, alpha, prefix, repetition, scores)


def filter_logits(logp: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """(B, V) log-probs / temperature, with -inf outside the top_k tokens (0: all) and the top_p nucleus."""
    logits = logp / temperature
    if 0 < top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ordered, index = logits.sort(-1, descending=True)
        probs = ordered.softmax(-1)
        outside = probs.cumsum(-1) - probs >= top_p  # mass before this token already reaches p
        logits = logits.scatter(-1, index, ordered.masked_fill(outside, float("-inf")))
    return logits


def sample_search(
    model: Seq2Seq,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len: torch.Tensor,
    n: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    min_len: int = 0,
    alpha: float = 0.0,
    repetition: Repetition = NO_REPETITION,
) -> list[list[Hypothesis]]:
    """n samples per sentence, best normalised score first; scores are the model's own log-probabilities."""
    return drain(
        sample_steps(model, src, src_mask, max_len, n, temperature, top_k, top_p, generator, min_len, alpha, repetition)
    )


def sample_steps(
    model: Seq2Seq,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len: torch.Tensor,
    n: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    min_len: int = 0,
    alpha: float = 0.0,
    repetition: Repetition = NO_REPETITION,
) -> Generator[Progress, None, list[list[Hypothesis]]]:
    """`sample_search` one step at a time; its rows are sentence-major, n per sentence (B*N)."""

    def draw(logp: torch.Tensor) -> torch.Tensor:
        probs = filter_logits(logp, temperature, top_k, top_p).softmax(-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)

    tile = torch.arange(src.size(0), device=src.device).repeat_interleave(n)  # (B*N,)
    hyps = yield from _one_path_steps(
        model, src[tile], src_mask[tile], max_len[tile], draw, min_len, alpha, repetition=repetition
    )
    return [sorted(hyps[b * n : (b + 1) * n], key=lambda h: -h.norm_score) for b in range(src.size(0))]


# --- beam search -------------------------------------------------------------------------------

BLOCKS = (64, 50, 40, 32)  # row_topk and row_argmax cut a row into blocks of the first of these sizes that divides it


def row_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x.topk(k, dim=1) for a wide (R, V) x, reading it mostly through a fast max per block.

    The k largest values of a row lie in the k blocks whose maxima are largest (a block outside them
    has k larger maxima elsewhere, each at least as large as its every value), so one topk over those
    k blocks finds them. Ties between equal values may pick other columns than torch.topk.
    """
    rows, width = x.shape
    block = next((b for b in BLOCKS if width % b == 0 and width // b > k), None)
    if block is None:
        return x.topk(k, dim=1)
    count = width // block
    best = x.view(rows, count, block).amax(2).topk(k, dim=1).indices  # (R, k) the blocks that hold the k largest
    first = torch.arange(rows, device=x.device)[:, None] * count
    chosen = x.reshape(rows * count, block).index_select(0, (best + first).view(-1))  # (R*k, block)
    values, index = chosen.view(rows, k * block).topk(k, dim=1)
    return values, best.gather(1, index // block) * block + index % block


class _Beams:
    """The live beams of the sentences still being searched, and the finished hypotheses of all.

    Rows of the model's state are sentence-major: row i * width + j is beam j of live sentence i. The
    first step runs on one row per sentence (its K beams would all be the same); its reorder tiles them.
    No history is copied per step: each step keeps its tokens, its attention and, per row, the row of
    the step before that it extends (a back-pointer); finished hypotheses are traced back once, in `best`.
    """

    early_exit = True  # end a sentence once no live hypothesis can beat its finished ones (tests turn it off)

    def __init__(
        self,
        src_mask: torch.Tensor,
        max_len: torch.Tensor,
        k: int,
        alpha: float,
        base: torch.Tensor | None = None,
        offset: int = 0,
        nbest: int = 1,
    ):
        """base (B,): each sentence's starting score (a prefix's); offset: steps before the first (the prefix's);
        nbest: the hypotheses asked for (the early exit waits for that many)."""
        batch, device = src_mask.size(0), src_mask.device
        self.k, self.alpha, self.offset, self.nbest = k, alpha, offset, nbest
        # (n, nbest) the best normalised scores finished so far, and (n,) the largest length penalty a live
        # hypothesis can still reach (at its length limit): the early exit's two sides
        self.done_best = torch.full((batch, nbest), float("-inf"), device=device)
        self.lp_limit = ((5 + max_len.float() + offset) / 6) ** alpha
        self.sent = torch.arange(batch, device=device)  # (n,) original index of each live sentence
        self.max_len = max_len  # (n,)
        self.n_done = torch.zeros(batch, dtype=torch.long, device=device)  # (n,) finished hypotheses
        self.scores = (  # (n, width) summed log-probs; width 1, then K
            torch.zeros(batch, 1, device=device) if base is None else base[:, None].clone()
        )
        self.src_lens = src_mask.sum(1).tolist()
        self.attn: list[torch.Tensor] = []  # per step t: (rows_t, S) the attention of step t's rows
        self.back: list[torch.Tensor] = []  # per step t: (rows_t+1,) the row of step t each next row extends
        self.token: list[torch.Tensor] = []  # per step t: (rows_t+1,) the token each next row added at step t
        self.finished: list[
            tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
        ] = []  # (t, rows_t, tokens, scores, sentences)

    def advance(
        self,
        logp: torch.Tensor | None,
        attn: torch.Tensor,
        t: int,
        top: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Extend every beam by step t's log-probs (n*width, V) and attention (n*width, S).

        Takes the top 2K of the (n, width*V) candidates: those ending in EOS among the top K are finished
        (all of the top K at the length limit), and the best K that do not end in EOS live on. A sentence
        is done once it holds K finished hypotheses, reaches its length limit, or (the early exit) none of its
        live hypotheses can beat its nbest-th finished one: a summed log-probability only falls as tokens are
        added, so a live score s can reach at best s / lp(length limit); the outputs are those the search
        would return without the exit.
        Returns the state rows to keep (n'*K,), the live sentences' rows of the encoder output when
        some sentences are done (else None), and the next input tokens (n'*K,).
        """
        (n, width), k = self.scores.shape, self.k
        # The best 2K of a sentence's width*V candidates are among each row's best 2K tokens (a row's
        # score shifts all its tokens alike), so the full (n*width, V) matrix is read once, by row_topk
        # (or, `top`, each row's best already found from the logits: `candidates`).
        row_top, row_token = top if top is not None else row_topk(logp, min(2 * k, logp.size(1)))  # (n*width, 2K)
        cand = row_top.size(1)
        top, index = (
            (self.scores.view(-1, 1) + row_top).view(n, width * cand).topk(min(2 * k, width * cand), dim=1)
        )  # (n, 2K)
        first_row = torch.arange(n, device=row_top.device)[:, None] * width  # (n, 1) each sentence's first row
        rows = index // cand + first_row  # (n, 2K) the row each candidate extends
        token = row_token.view(n, width * cand).gather(1, index)  # (n, 2K)
        eos = token == EOS
        final = (eos | (self.max_len == t + 1)[:, None]) & top.isfinite()
        final[:, k:] = False
        self.attn.append(attn)
        self._finish(t, final, rows, token, top)
        pick = eos.to(torch.uint8).argsort(dim=1, stable=True)[
            :, :k
        ]  # first K candidates without EOS (one EOS per beam at most)
        rows, token, scores = (x.gather(1, pick) for x in (rows, token, top))
        if bool(final.any()):
            norm = torch.where(final, top / ((5 + t + 1 + self.offset) / 6) ** self.alpha, float("-inf"))
            self.done_best = torch.cat([self.done_best, norm], 1).topk(self.nbest, dim=1).values
        live = (self.n_done < k) & (self.max_len > t + 1)  # (n,)
        if self.early_exit:
            reachable = scores[:, 0] / self.lp_limit  # (n,) the best normalised score a live hypothesis can reach
            live &= reachable > self.done_best[:, -1]
        rows, token, self.scores = rows[live], token[live], scores[live]
        enc_rows = None
        if not bool(live.all()):
            enc_rows = live.nonzero().squeeze(1)  # (n',) the live sentences' rows of the encoder output
            self.sent, self.max_len, self.n_done = self.sent[live], self.max_len[live], self.n_done[live]
            self.done_best, self.lp_limit = self.done_best[live], self.lp_limit[live]
        rows, token = rows.reshape(-1), token.reshape(-1)
        self.back.append(rows)
        self.token.append(token)
        return rows, enc_rows, token

    def _finish(self, t: int, final: torch.Tensor, rows: torch.Tensor, token: torch.Tensor, top: torch.Tensor) -> None:
        """Record the candidates marked in `final` (n, 2K) as finished hypotheses of their sentences."""
        self.n_done += final.sum(1)
        which, col = final.nonzero(as_tuple=True)
        if which.numel():
            self.finished.append((t, rows[which, col], token[which, col], top[which, col], self.sent[which]))

    def _trace(self, t_end: torch.Tensor, row: torch.Tensor, last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens (F, T) and attention (F, T, S) of F hypotheses ending at step t_end (F,) in row
        (F,) with token last (F,)."""
        steps = int(t_end.max()) + 1
        tokens = torch.full((row.size(0), steps), EOS, dtype=torch.long, device=row.device)
        attention = row.new_zeros(row.size(0), steps, self.attn[0].size(1), dtype=self.attn[0].dtype)
        row = row.clone()
        for t in range(steps - 1, -1, -1):
            older = (t_end > t).nonzero().squeeze(1)  # ended later: row is a row of step t + 1
            tokens[older, t] = self.token[t][row[older]]
            row[older] = self.back[t][row[older]]
            here = (t_end == t).nonzero().squeeze(1)
            tokens[here, t] = last[here]
            alive = (t_end >= t).nonzero().squeeze(1)
            attention[alive, t] = self.attn[t][row[alive]]
        return tokens, attention

    def best(self, nbest: int) -> list[list[Hypothesis]]:
        """Each sentence's nbest finished hypotheses, best normalised score first (ties: the first finished first)."""
        if not self.finished:
            return [[] for _ in self.src_lens]
        t_end = torch.cat([torch.full_like(f[1], f[0]) for f in self.finished])
        row, last, score, sent = (torch.cat([f[i] for f in self.finished]) for i in range(1, 5))
        scores, steps, sents = score.tolist(), (t_end + 1).tolist(), sent.tolist()
        norms = [s / length_penalty(n + self.offset, self.alpha) for s, n in zip(scores, steps)]
        ranked: list[list[int]] = [[] for _ in self.src_lens]
        for i in sorted(range(len(norms)), key=lambda i: -norms[i]):  # stable: ties stay in finishing order
            if len(ranked[sents[i]]) < nbest:
                ranked[sents[i]].append(i)
        keep = [i for r in ranked for i in r]
        index = torch.tensor(keep, dtype=torch.long, device=row.device)
        tokens, attention = self._trace(t_end[index], row[index], last[index])
        tokens, attention = tokens.tolist(), attention.float().cpu()
        hyps: list[list[Hypothesis]] = [[] for _ in self.src_lens]
        for j, i in enumerate(keep):
            s = sents[i]
            hyps[s].append(
                _hypothesis(
                    tokens[j][: steps[i]], scores[i], attention[j, : steps[i], : self.src_lens[s]].clone(), self.alpha
                )
            )
        return hyps


def beam_search(
    model: Seq2Seq,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len: torch.Tensor,
    k: int,
    alpha: float = 0.0,
    min_len: int = 0,
    nbest: int = 1,
    prefix: torch.Tensor | None = None,
    repetition: Repetition = NO_REPETITION,
) -> list[list[Hypothesis]]:
    """Beam search of width k for every sentence of the batch at once; nbest (<= k) hypotheses each.

    The encoder output stays one row per sentence; the decoder state has one row per hypothesis,
    sentence-major (rows b*k .. b*k+k-1 are sentence b's beams; the first step's single row per
    sentence is tiled by its reorder). After each step the state is reordered once, one index_select
    per tensor, to follow the surviving beams; sentences that are done leave the batch and the
    encoder output. beam_search(k=1) equals greedy_search. With repetition control each row's output so far
    is kept too (reordered like the state); without, nothing is.
    """
    return drain(beam_steps(model, src, src_mask, max_len, k, alpha, min_len, nbest, prefix, repetition))


@torch.inference_mode()
def beam_steps(
    model: Seq2Seq,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len: torch.Tensor,
    k: int,
    alpha: float = 0.0,
    min_len: int = 0,
    nbest: int = 1,
    prefix: torch.Tensor | None = None,
    repetition: Repetition = NO_REPETITION,
) -> Generator[Progress, None, list[list[Hypothesis]]]:
    """`beam_search` one step at a time: each Progress holds the beams just advanced by step t."""
    enc = model.encode(src, src_mask)
    state, pre = start(model, enc, model.init_state(enc), prefix, min_len, repetition)
    offset = pre.length if pre else 0
    max_len = (max_len - offset).clamp(min=1) if pre else max_len
    beams = _Beams(src_mask, max_len, k, alpha, pre.score if pre else None, offset, nbest)
    prev = torch.full((src.size(0),), BOS, dtype=torch.long, device=src.device)
    history = (prefix if pre else src.new_zeros(src.size(0), 0)) if repetition.active else None
    for t in range(int(max_len.max())):
        if t == 0 and pre is not None:
            logits, attn = pre.logits, pre.attn
        else:
            logits, state, attn = model.step(prev, enc, state)  # (n*width, V), state, (n*width, S)
        top = candidates(logits, t + offset, min_len, 2 * k) if history is None else None
        if top is not None:
            rows, enc_rows, prev = beams.advance(None, attn, t, top)
        else:
            logp = log_probs(logits, t + offset, min_len) if history is None else None
            if logp is None:
                logp = scores_of(logits, t + offset, min_len, history, repetition)
            rows, enc_rows, prev = beams.advance(logp, attn, t)
        yield Progress(t, pre, beams=beams)
        if rows.numel() == 0:
            break
        state = reorder(state, rows)
        if history is not None:
            history = torch.cat([history.index_select(0, rows), prev[:, None]], 1)
        if enc_rows is not None:
            enc = reorder(enc, enc_rows)
    found = beams.best(nbest)
    return [with_prefix(hyps, pre, b, alpha) for b, hyps in enumerate(found)] if pre else found
