"""A terminology test: the first N Multi30k test sentences, each with one or two words of its reference as
constraints (the longest reference words of at least 4 letters that the unconstrained output lacks, or, where it
has them all, its longest), translated with beam search with and without the constraints.

    python scripts/bench_terminology.py --checkpoint RUN [--data ../shared/data/multi30k] [--sentences 200]
    python scripts/bench_terminology.py --checkpoint RUN --prefix-words 3    # the interactive case too

With --prefix-words K the first K words of each reference are also given as a typed prefix (the translator has
written the start), with and without the constraints; the constraints are then picked from the reference's words
after the prefix, so that the prefix does not meet them by itself.

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


def pick_terms(reference: str, output: str, count: int, skip: int = 0) -> list[str]:
    """Up to `count` reference words (4+ letters) after its first `skip` words: the longest ones the output lacks
    first."""
    rest = " ".join(reference.split()[skip:])
    words = sorted({w for w in re.findall(r"\w+", rest) if len(w) >= 4}, key=lambda w: (-len(w), w))
    missing = [w for w in words if w not in output.split()]
    return (missing + [w for w in words if w not in missing])[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prefix-words", type=int, default=0, help="also give the first K reference words as a prefix")
    args = parser.parse_args()
    src = read(args.data / "test_2016_flickr.en.gz", args.sentences)
    ref = read(args.data / "test_2016_flickr.de.gz", args.sentences)
    model = nmt.load(args.checkpoint, threads=args.threads, beam=args.beam)
    rows = [("no constraints", {})]
    prefixes = [" ".join(r.split()[: args.prefix_words]) for r in ref] if args.prefix_words else None
    plain, plain_s = timed(model, src, {})
    terms = [pick_terms(r, o, 1 + i % 2, args.prefix_words) for i, (r, o) in enumerate(zip(ref, plain))]
    rows.append(("constrained", {"constraints": terms}))
    if prefixes:
        rows.append((f"prefix ({args.prefix_words} reference words)", {"prefix": prefixes}))
        rows.append(("prefix + constrained", {"prefix": prefixes, "constraints": terms}))
    phrases = sum(len(ts) for ts in terms)
    print(
        f"terminology test: {args.checkpoint}, the first {len(src)} test_2016_flickr sentences, {phrases} reference "
        f"words as constraints (1 or 2 per sentence"
        + (f", after the first {args.prefix_words} words" if prefixes else "")
        + f"), beam {args.beam}, {args.threads} threads"
    )
    print("| | sentences with every constraint in the output | prefix kept | BLEU | sentences/s |")
    print("|---|---:|---:|---:|---:|")
    signature, costs = "", []
    for name, options in rows:
        outputs, seconds = (plain, plain_s) if not options else timed(model, src, options)
        met = sum(all(t in out for t in ts) for ts, out in zip(terms, outputs))
        kept = (
            f"{sum(o.startswith(p) for o, p in zip(outputs, prefixes))}/{len(src)}"
            if prefixes and "prefix" in options
            else ""
        )
        bleu = nmt.score(outputs, ref, metrics=["bleu"])["bleu"]
        signature = bleu.signature
        print(
            f"| {name} | {met} ({100 * met / len(src):.1f}%) | {kept} | {bleu.score:.2f} | {len(src) / seconds:.1f} |"
        )
        costs.append(f"{name}: {seconds / plain_s:.2f}x")
    print(f"time against no constraints: {'; '.join(costs[1:])}; BLEU signature {signature}")
    if empty := sum(not ts for ts in terms):
        print(f"{empty} sentences had no reference word of 4+ letters to constrain (counted as met)")


def timed(model, src: list[str], options: dict) -> tuple[list[str], float]:
    started = time.perf_counter()
    outputs = model.translate(src, **options)
    return outputs, time.perf_counter() - started


if __name__ == "__main__":
    main()
