"""Translate lists of sentences with a trained model: search settings, batching by length, input order kept.

Every input line gets exactly one result, in order; blank lines get none and never reach the model. A
source longer than decode.max_src_len subword tokens is cut to that length, with a warning naming its line.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from nmt.config import DecodeConfig
from nmt.data.batching import make_batch
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.models.seq2seq import Seq2Seq
from nmt.search import Hypothesis, Progress, Repetition, beam_steps, drain, greedy_steps, max_lengths, sample_steps


@dataclass
class Translation:
    """One input line: its source ids as translated (cut if too long; no EOS), and hypotheses, best first."""

    src_ids: list[int]
    hyps: list[Hypothesis]  # [] for a blank line


def unscored(decode: DecodeConfig) -> DecodeConfig:
    """`decode` for a caller that shows no hypothesis score (text out): decode.scores false unless set."""
    return decode if decode.scores is not None else replace(decode, scores=False)


def decode_settings(decode: DecodeConfig) -> str:
    """The search settings printed beside every score."""
    if decode.sampling:
        search = (
            f"sampling temperature={decode.temperature} top_k={decode.top_k} top_p={decode.top_p} seed={decode.seed}"
        )
    else:
        search = f"beam={decode.beam} alpha={decode.alpha}"
    settings = f"{search} max_len={decode.max_len_a}*src+{decode.max_len_b}" + (
        f" min_len={decode.min_len}" if decode.min_len else ""
    )
    if decode.no_repeat_ngram_size:
        settings += f" no_repeat_ngram={decode.no_repeat_ngram_size}"
    if decode.repetition_penalty != 1.0:
        settings += f" repetition_penalty={decode.repetition_penalty}"
    if decode.shortlist:
        settings += f" shortlist={Path(decode.shortlist).name}"
    return settings + (f" precision={decode.precision}" if decode.precision != "fp32" else "")


def repetition(decode: DecodeConfig) -> Repetition:
    return Repetition(decode.no_repeat_ngram_size, decode.repetition_penalty)


def check_beam(decode: DecodeConfig, vocab_size: int) -> None:
    """A beam (or n-best list) cannot be wider than the tokens the search may emit (all but PAD and BOS)."""
    emittable = vocab_size - 2
    width = decode.nbest if decode.sampling else decode.beam
    if not decode.sampling and width > emittable:
        raise NmtError(
            f"decode.beam={width}: wider than the {emittable} tokens the target vocabulary can emit; "
            f"expected at most {emittable}"
        )


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """model.eval() inside the block, the previous mode restored after (nothing to do, and no walk over every module
    twice per call, when no module is training: a server's requests)."""
    if not any(module.training for module in model.modules()):
        yield
        return
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


class Translator:
    """A model, its tokenizer and search settings; `warn` receives one-line warnings (stderr by default)."""

    def __init__(
        self,
        model: Seq2Seq,
        tokenizer: Tokenizer,
        decode: DecodeConfig,
        device: torch.device,
        warn: Callable[[str], None] | None = None,
    ):
        check_beam(decode, tokenizer.tgt_vocab_size)
        self.model, self.tokenizer, self.decode, self.device = model, tokenizer, decode, device
        self.warn = warn or (lambda message: print(message, file=sys.stderr))
        self.generator = torch.Generator(device=device).manual_seed(decode.seed)
        self.shortlist = None
        if decode.shortlist:
            from nmt.shortlist import read_shortlist

            self.shortlist = read_shortlist(decode.shortlist, tokenizer)
            width = decode.nbest if decode.sampling else decode.beam
            if len(self.shortlist.fixed) - 2 < width:
                raise NmtError(
                    f"decode.shortlist={decode.shortlist}: its {len(self.shortlist.fixed)} fixed candidates are "
                    f"fewer than decode.beam={width} + 2; build it with more frequent tokens (nmt-shortlist frequent=N)"
                )
        self.pool = (
            None  # a nmt.workers.SearchPool: batches are then searched in its processes (nmt-translate workers=N)
        )

    def search(
        self,
        src_ids: list[list[int]],
        prefix_ids: list[list[int]] | None = None,
        constraints: list[list[tuple[int, ...]]] | None = None,
        avoid: list[list[tuple[int, ...]]] | None = None,
    ) -> list[list[Hypothesis]]:
        """Decode one batch of encoded sentences (in the given order); hypotheses best first. prefix_ids: each
        sentence's target prefix, all of one length (`batches` groups them so); every output starts with it.
        constraints / avoid: per sentence, target phrases (ids) its output must contain / must not contain
        (nmt.constraints: lexically constrained beam search)."""
        model, vocab, prefix_ids, constraints, avoid = self.search_model(src_ids, prefix_ids, constraints, avoid)
        found = self._search(model, src_ids, prefix_ids, constraints, avoid)
        if vocab is None:
            return found
        return [[replace(h, tokens=[vocab[t] for t in h.tokens]) for h in hyps] for hyps in found]

    def search_model(self, src_ids, prefix_ids=None, constraints=None, avoid=None):
        """The model a batch is searched with, and the ids it reads and writes: without a shortlist, the model and
        the arguments as they are (vocab None); with one, the model scoring only the batch's candidate tokens,
        `vocab` (its local ids' global ids), and the prefixes and phrases in local ids."""
        if self.shortlist is None:
            return self.model, None, prefix_ids, constraints, avoid
        from nmt.engine.shortlist import Shortlisted, local_ids

        phrases = [p for group in (constraints or []) + (avoid or []) for p in group]
        extra = [t for p in prefix_ids or [] for t in p] + [t for p in phrases for t in p]
        vocab = self.shortlist.candidates(src_ids, extra)
        local = lambda groups: (  # noqa: E731
            [[tuple(local_ids(vocab, p)) for p in group] for group in groups] if groups else groups
        )
        prefixes = [local_ids(vocab, p) for p in prefix_ids] if prefix_ids else prefix_ids
        model = Shortlisted(self.model, torch.tensor(vocab, dtype=torch.long, device=self.device))
        return model, vocab, prefixes, local(constraints), local(avoid)

    def _search(self, model, src_ids, prefix_ids, constraints, avoid) -> list[list[Hypothesis]]:
        if (constraints and any(constraints)) or (avoid and any(avoid)):
            d = self.decode
            batch = make_batch(src_ids).to(self.device)
            src, mask, max_len = batch.src, batch.src_mask, max_lengths(batch.src_mask, d.max_len_a, d.max_len_b)
            if d.sampling:
                raise NmtError(
                    "constraints with decode.sampling=true: constraints are for greedy and beam search (drop "
                    "decode.sampling, or the constraints)"
                )
            from nmt.constraints import constrained_beam_search

            empty: list[list[tuple[int, ...]]] = [[] for _ in src_ids]
            return constrained_beam_search(
                model,
                src,
                mask,
                max_len,
                d.beam,
                constraints or empty,
                avoid or empty,
                d.alpha,
                d.min_len,
                d.nbest,
                [list(p) for p in prefix_ids] if prefix_ids is not None else None,
                repetition(d),
            )
        return drain(self.steps(model, src_ids, prefix_ids))

    def steps(
        self, model, src_ids: list[list[int]], prefix_ids: list[list[int]] | None = None
    ) -> Generator[Progress, None, list[list[Hypothesis]]]:
        """The search of one batch (by `model`, from `search_model`) one decoding step at a time: greedy, beam or
        sampling as decode.* says; yields the search's Progress after each step and returns what `search` does."""
        d = self.decode
        batch = make_batch(src_ids).to(self.device)
        src, mask, max_len = batch.src, batch.src_mask, max_lengths(batch.src_mask, d.max_len_a, d.max_len_b)
        rep = repetition(d)
        prefix = None
        if prefix_ids is not None and any(prefix_ids):
            if len({len(p) for p in prefix_ids}) != 1:
                raise ValueError("a batch's prefixes must have one length (Translator.batches groups them so)")
            prefix = torch.tensor(prefix_ids, dtype=torch.long, device=self.device)
        if d.sampling:
            if prefix is not None:
                raise NmtError("a target prefix with decode.sampling=true: prefixes are for greedy and beam search")
            sampling = (d.nbest, d.temperature, d.top_k, d.top_p, self.generator, d.min_len, d.alpha, rep)
            return (yield from sample_steps(model, src, mask, max_len, *sampling))
        if d.beam == 1:
            scores = d.scores is not False
            found = yield from greedy_steps(model, src, mask, max_len, d.min_len, d.alpha, prefix, rep, scores)
            return [[h] for h in found]
        return (yield from beam_steps(model, src, mask, max_len, d.beam, d.alpha, d.min_len, d.nbest, prefix, rep))

    def encode(self, lines: list[str], first_line: int = 1) -> list[list[int]]:
        """Source ids per line, cut to decode.max_src_len with a warning naming the line
        (first_line is lines[0]'s number)."""
        ids = self.tokenizer.encode_src(lines)
        limit = self.decode.max_src_len
        for i, seq in enumerate(ids):
            if len(seq) > limit:
                self.warn(
                    f"warning: line {first_line + i}: {len(seq)} subword tokens, cut to decode.max_src_len={limit}"
                )
                ids[i] = seq[:limit]
        return ids

    def encode_prefixes(self, prefixes: list[str | None]) -> list[list[int]]:
        """Target ids of each line's prefix ([] for none or an empty one)."""
        texts = [p or "" for p in prefixes]
        ids = self.tokenizer.encode_tgt(texts) if any(texts) else [[] for _ in texts]
        return [seq if text.strip() else [] for seq, text in zip(ids, texts)]

    def batches(
        self, ids: list[list[int]], rows: list[int], prefix_ids: list[list[int]] | None = None
    ) -> Iterator[list[int]]:
        """`rows` shortest first, in batches of at most batch_size sentences and batch_tokens beam rows x source
        tokens; with prefixes, a batch's prefixes are all of one length (sorted by it first)."""
        width = self.decode.nbest if self.decode.sampling else self.decode.beam
        plen = (lambda i: len(prefix_ids[i])) if prefix_ids else (lambda i: 0)
        batch: list[int] = []
        for i in sorted(rows, key=lambda i: (plen(i), len(ids[i]))):
            if batch and (
                len(batch) == self.decode.batch_size
                or (len(batch) + 1) * (len(ids[i]) + 1) * width > self.decode.batch_tokens
                or plen(i) != plen(batch[0])
            ):
                yield batch
                batch = []
            batch.append(i)
        if batch:
            yield batch

    def encode_phrases(self, phrases: list[list[str]] | None) -> list[list[tuple[int, ...]]] | None:
        """Each line's target phrases as ids (blank phrases dropped); None when no line has any."""
        if not phrases or not any(phrases):
            return None
        out = []
        for line in phrases:
            kept = [p for p in (line or []) if p.strip()]
            out.append([tuple(ids) for ids in self.tokenizer.encode_tgt(kept)] if kept else [])
        return out

    def translate_lines(
        self,
        lines: list[str],
        first_line: int = 1,
        progress: Callable[[int], None] | None = None,
        prefixes: list[str | None] | None = None,
        constraints: list[list[str]] | None = None,
        avoid: list[list[str]] | None = None,
    ) -> list[Translation]:
        """One Translation per line, in input order; lines are searched shortest first. prefixes: per line, the
        target text its output must start with (None or "" for none); constraints / avoid: per line, target
        phrases its output must contain / must not contain."""
        ids = self.encode(lines, first_line)
        prefix_ids = self.encode_prefixes(prefixes) if prefixes and any(prefixes) else None
        need, ban = self.encode_phrases(constraints), self.encode_phrases(avoid)
        hyps: list[list[Hypothesis]] = [[] for _ in lines]
        report = progress or (lambda n: None)
        filled = [i for i, line in enumerate(lines) if line.strip()]
        report(len(lines) - len(filled))
        batches = list(self.batches(ids, filled, prefix_ids))
        if self.pool:  # longest first: the workers' last batches are the short ones, so none waits long for another
            batches.reverse()
        work = [
            (
                [ids[i] for i in batch],
                [prefix_ids[i] for i in batch] if prefix_ids else None,
                [need[i] for i in batch] if need else None,
                [ban[i] for i in batch] if ban else None,
            )
            for batch in batches
        ]
        with eval_mode(self.model):
            searched_all = self.pool.search(work) if self.pool else (self.search(*job) for job in work)
            for batch, searched in zip(batches, searched_all):
                for i, found in zip(batch, searched):
                    hyps[i] = found
                report(len(batch))
        return [Translation(src, found) for src, found in zip(ids, hyps)]

    def detokenize(self, hyps: list[Hypothesis]) -> list[str]:
        return self.tokenizer.decode_tgt([h.tokens for h in hyps])

    def translate(self, lines: list[str], progress: Callable[[int], None] | None = None) -> list[str]:
        """One detokenized best output per input line, in input order ("" for a blank line)."""
        results = self.translate_lines(lines, progress=progress)
        best = self.tokenizer.decode_tgt([r.hyps[0].tokens if r.hyps else [] for r in results])
        return [text if r.hyps else "" for text, r in zip(best, results)]
