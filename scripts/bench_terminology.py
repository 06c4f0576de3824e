"""A terminology test: the first N Multi30k test sentences, each with one or two words of its reference as
constraints (the longest reference words of at least 4 letters that the unconstrained output lacks, or, where it
has them all, its longest), translated with beam search with and without the constraints.

    python scripts/bench_terminology.py --checkpoint RUN [--data ../shared/data/multi30k] [--sentences 200]

Prints the constraint-satisfaction rate (every phrase of a line in its output, as text), BLEU of the N sentences
with and without constraints (sacrebleu, beam --beam), and the time each took (sentences/s). Run it on an idle
machine.
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import nmt  # noqa: E402


def read(path: Path, n: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for _, line in zip(range(n), f)]


def pick_terms(reference: str, output: str, count: int) -> list[str]:
    """Up to `count` reference words (4+ letters): the longest ones the output lacks first."""
    words = sorted({w for w in re.findall(r"\w+", reference) if len(w) >= 4}, key=lambda w: (-len(w), w))
    missing = [w for w in words if w not in output.split()]
    return (missing + [w for w in words if w not in missing])[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    src = read(args.data / "test_2016_flickr.en.gz", args.sentences)
    ref = read(args.data / "test_2016_flickr.de.gz", args.sentences)
    model = nmt.load(args.checkpoint, threads=args.threads, beam=args.beam)
    started = time.perf_counter()
    plain = model.translate(src)
    plain_s = time.perf_counter() - started
    terms = [pick_terms(r, o, 1 + i % 2) for i, (r, o) in enumerate(zip(ref, plain))]
    started = time.perf_counter()
    constrained = model.translate(src, constraints=terms)
    constrained_s = time.perf_counter() - started
    met = sum(all(t in out for t in ts) for ts, out in zip(terms, constrained))
    met_plain = sum(all(t in out for t in ts) for ts, out in zip(terms, plain))
    phrases = sum(len(ts) for ts in terms)
    bleu_plain = nmt.score(plain, ref, metrics=["bleu"])["bleu"]
    bleu_constrained = nmt.score(constrained, ref, metrics=["bleu"])["bleu"]
    print(
        f"terminology test: {args.checkpoint}, the first {len(src)} test_2016_flickr sentences, {phrases} reference "
        f"words as constraints (1 or 2 per sentence), beam {args.beam}, {args.threads} threads"
    )
    print("| | sentences with every constraint in the output | BLEU | sentences/s |")
    print("|---|---:|---:|---:|")
    print(
        f"| no constraints | {met_plain} ({100 * met_plain / len(src):.1f}%) | {bleu_plain.score:.2f} "
        f"| {len(src) / plain_s:.1f} |"
    )
    print(
        f"| constrained | {met} ({100 * met / len(src):.1f}%) | {bleu_constrained.score:.2f} "
        f"| {len(src) / constrained_s:.1f} |"
    )
    print(f"speed cost: {constrained_s / plain_s:.2f}x the time; BLEU signature {bleu_plain.signature}")


if __name__ == "__main__":
    main()
