"""A deterministic toy language pair that needs attention to be learned well.

The source language has a small grammar (determiner, adjectives, noun, verb, preposition,
conjunction). The target language is built from it by three rules a model must learn:

1. a lexicon maps every source word to a target word; some words translate to two tokens;
2. adjective-noun swap: "DET ADJ ADJ NOUN" becomes "DET' NOUN' ADJ' ADJ'";
3. verb-final clauses: "SUBJ VERB OBJ PP" becomes "SUBJ' OBJ' PP' VERB'".

Every pair comes with its gold word alignment in Pharaoh format ("i-j": source word i is
aligned to target word j, 0-based), so attention can be scored against it.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

CATEGORY_SIZES = {"DET": 4, "ADJ": 16, "NOUN": 36, "VERB": 18, "PREP": 6, "CONJ": 2}
SRC_SYLLABLES = ["ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "vu", "ze", "bo", "di"]
TGT_SYLLABLES = ["gar", "hel", "jun", "kor", "lis", "mab", "nef", "orb", "pul", "quo", "rex", "sut"]
TWO_TOKEN_RATE = 0.15
SPLIT_SIZES = {"train": 12000, "valid": 500, "test": 500}
MIN_LEN, MAX_LEN = 3, 30


@dataclass
class Token:
    """A source word with its category and its target translation (one or two tokens)."""

    word: str
    category: str
    translation: tuple[str, ...]


def _make_words(rng: random.Random, syllables: list[str], count: int, taken: set[str]) -> list[str]:
    """Draw `count` new distinct pseudo-words of 1-3 syllables."""
    words: list[str] = []
    while len(words) < count:
        word = "".join(rng.choice(syllables) for _ in range(rng.randint(1, 3)))
        if word not in taken:
            taken.add(word)
            words.append(word)
    return words


class ToyLanguage:
    """A lexicon and grammar drawn deterministically from a seed."""

    def __init__(self, seed: int = 1):
        rng = random.Random(seed)
        src_taken: set[str] = set()
        tgt_taken: set[str] = set()
        self.lexicon: dict[str, list[Token]] = {}
        for category, size in CATEGORY_SIZES.items():
            tokens = []
            for word in _make_words(rng, SRC_SYLLABLES, size, src_taken):
                n_target = 2 if category in ("NOUN", "VERB", "ADJ") and rng.random() < TWO_TOKEN_RATE else 1
                translation = tuple(_make_words(rng, TGT_SYLLABLES, n_target, tgt_taken))
                tokens.append(Token(word, category, translation))
            self.lexicon[category] = tokens

    def _noun_phrase(self, rng: random.Random) -> list[Token]:
        n_adj = rng.choice([0, 0, 1, 1, 2])
        adjs = [rng.choice(self.lexicon["ADJ"]) for _ in range(n_adj)]
        return [rng.choice(self.lexicon["DET"]), *adjs, rng.choice(self.lexicon["NOUN"])]

    def _clause(self, rng: random.Random) -> tuple[list[Token], list[int]]:
        """A source clause and the order of its tokens in the target (indices into the clause)."""
        subj = self._noun_phrase(rng)
        verb = [rng.choice(self.lexicon["VERB"])]
        obj = self._noun_phrase(rng) if rng.random() < 0.7 else []
        pp = [rng.choice(self.lexicon["PREP"]), *self._noun_phrase(rng)] if rng.random() < 0.4 else []
        tokens = subj + verb + obj + pp
        # target order: NP' (noun before adjectives), objects, PP, verb last
        spans, start = [], 0
        for part in (subj, verb, obj, pp):
            spans.append(list(range(start, start + len(part))))
            start += len(part)
        subj_i, verb_i, obj_i, pp_i = spans
        order = _swap_np(subj_i) + _swap_np(obj_i)
        if pp_i:
            order += [pp_i[0]] + _swap_np(pp_i[1:])
        return tokens, order + verb_i

    def sentence(self, rng: random.Random) -> tuple[str, str, str]:
        """One (source, target, alignment) triple with MIN_LEN..MAX_LEN source words."""
        while True:
            tokens: list[Token] = []
            order: list[int] = []
            for c in range(rng.choice([1, 1, 2, 2, 3])):
                if c:
                    order.append(len(tokens))
                    tokens.append(rng.choice(self.lexicon["CONJ"]))
                clause, clause_order = self._clause(rng)
                order += [len(tokens) + i for i in clause_order]
                tokens += clause
            if MIN_LEN <= len(tokens) <= MAX_LEN:
                break
        target, links = [], []
        for i in order:
            for piece in tokens[i].translation:
                links.append(f"{i}-{len(target)}")
                target.append(piece)
        return " ".join(t.word for t in tokens), " ".join(target), " ".join(links)


def _swap_np(indices: list[int]) -> list[int]:
    """DET ADJ* NOUN -> DET NOUN ADJ* (indices of one noun phrase)."""
    if len(indices) <= 2:
        return indices
    return [indices[0], indices[-1], *indices[1:-1]]


def generate_toy_corpus(out_dir: str | Path, seed: int = 1, sizes: dict[str, int] | None = None) -> Path:
    """Write {train,valid,test}.{src,tgt,align} under out_dir; no sentence appears in two splits."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    language = ToyLanguage(seed)
    rng = random.Random(seed + 1)
    seen: set[str] = set()
    for split, size in (sizes or SPLIT_SIZES).items():
        rows = []
        while len(rows) < size:
            src, tgt, align = language.sentence(rng)
            if src not in seen:
                seen.add(src)
                rows.append((src, tgt, align))
        for column, ext in enumerate(("src", "tgt", "align")):
            tmp = out / f"{split}.{ext}.tmp"
            tmp.write_text("".join(row[column] + "\n" for row in rows), encoding="utf-8")
            tmp.replace(out / f"{split}.{ext}")
    return out


def main(argv: list[str] | None = None) -> None:
    """Command line: python -m nmt.data.synthetic --out data/toy --seed 1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/toy")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    print(generate_toy_corpus(args.out, args.seed))


if __name__ == "__main__":
    main()
