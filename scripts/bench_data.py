"""Data pipeline at scale: prepare a corpus of millions of pairs and read one epoch of batches, in bounded memory.

    python scripts/bench_data.py                                   # 5M synthetic pairs under /tmp/nmt_bench_data
    python scripts/bench_data.py --pairs 200000 --num-proc 1       # smaller, one encoding process
    python scripts/bench_data.py --multi30k ../shared/data/multi30k  # the same figures for Multi30k en-de

Generates (once, streamed) a synthetic parallel corpus of random Zipf-distributed pseudo-words with a
word-for-word "translation", outside the repository; prepares it from scratch with `prepare_data`
(validation and hashing pass, SentencePiece on a sample, `datasets.map` encoding in `--num-proc`
processes, filters, the memory-mapped Arrow cache); prepares it again (a cache hit: the validation pass
and the memory map only); then builds every batch of one epoch (`token_batches` and `Split.batch`,
padded tensors). Prints pairs/s of each phase, and peak resident memory: this process's high-water mark
(ru_maxrss, which counts the pages of the memory-mapped cache it has touched), its anonymous memory at
the end (what the OS cannot drop), and the largest encoding worker's. Torch uses one thread.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from nmt.config import DataConfig
from nmt.data.batching import token_batches
from nmt.data.dataset import prepare_data

LEXICON = 30_000  # pseudo-words per side
CHUNK = 10_000  # pairs generated at a time (small: the generator must not set the memory high-water mark)


def _words(rng: np.random.Generator, count: int) -> np.ndarray:
    """`count` distinct pseudo-words of 1-4 syllables."""
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words: dict[str, None] = {}
    while len(words) < count:
        words["".join(syllables[i] for i in rng.integers(0, len(syllables), rng.integers(1, 5)))] = None
    return np.array(list(words))


def generate(prefix: Path, pairs: int, seed: int = 1) -> None:
    """PREFIX.src / PREFIX.tgt: `pairs` lines of 3-30 Zipf-drawn words,
    the target a word-for-word mapping with 10% dropped."""
    rng = np.random.default_rng(seed)
    src_words, tgt_words = _words(rng, LEXICON), _words(rng, LEXICON)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with (
        open(f"{prefix}.src.tmp", "w", encoding="utf-8") as src_f,
        open(f"{prefix}.tgt.tmp", "w", encoding="utf-8") as tgt_f,
    ):
        for start in range(0, pairs, CHUNK):
            lengths = rng.integers(3, 31, min(CHUNK, pairs - start))
            ids = (rng.zipf(1.1, lengths.sum()) - 1) % LEXICON  # a Zipf head; the long tail folded over the lexicon
            src, tgt = src_words[ids].tolist(), np.where(rng.random(len(ids)) < 0.1, "", tgt_words[ids]).tolist()
            end = np.cumsum(lengths).tolist()
            for a, b in zip([0] + end[:-1], end):
                src_f.write(" ".join(src[a:b]) + "\n")
                tgt_f.write(
                    (" ".join(word for word in tgt[a:b] if word) or tgt_words[ids[a]]) + "\n"
                )  # 10% of words dropped
    for side in ("src", "tgt"):
        Path(f"{prefix}.{side}.tmp").replace(f"{prefix}.{side}")


def peak_mb(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024


def anon_mb() -> float:
    """This process's anonymous resident memory now (heap, not file-backed pages)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed(label: str, start: float, pairs: int) -> None:
    seconds = time.perf_counter() - start
    print(f"{label}: {seconds:.1f} s, {pairs / seconds:,.0f} pairs/s | peak RSS {peak_mb():,.0f} MB", flush=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5_000_000)
    parser.add_argument(
        "--work", type=Path, default=Path("/tmp/nmt_bench_data"), help="corpus and cache folder (outside the repo)"
    )
    parser.add_argument(
        "--multi30k", type=Path, help="prepare Multi30k en-de from this folder instead of a synthetic corpus"
    )
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.multi30k is not None:
        data = DataConfig(train=str(args.multi30k / "train"), valid=str(args.multi30k / "val"), src="en", tgt="de")
        name = f"Multi30k en-de ({args.multi30k})"
    else:
        prefix = args.work / f"synthetic{args.pairs}" / "train"
        if not Path(f"{prefix}.tgt").exists():
            start = time.perf_counter()
            generate(prefix, args.pairs)
            timed(f"generated {args.pairs:,} pairs into {prefix}.{{src,tgt}}", start, args.pairs)
        data = DataConfig(train=str(prefix))
        name = f"synthetic, {args.pairs:,} pairs"
    cache = args.work / "cache"
    shutil.rmtree(cache, ignore_errors=True)  # prepare from scratch
    data.cache_dir, data.vocab_size, data.num_proc = str(cache), args.vocab, args.num_proc
    t0 = time.perf_counter()
    log = lambda line: print(f"  [{time.perf_counter() - t0:6.1f} s] {line}", flush=True)  # noqa: E731
    print(f"{name}: vocab {args.vocab}, num_proc {args.num_proc}, batch_tokens {args.batch_tokens}", flush=True)
    start = time.perf_counter()
    prepared = prepare_data(data, log)
    corpus = sum(len(split) for split in prepared.splits.values())
    timed(f"prepare from scratch ({corpus:,} pairs cached)", start, corpus)
    t0 = start = time.perf_counter()
    prepared = prepare_data(data, log)
    timed("prepare (cache hit: validation and hashing pass, memory map)", start, corpus)
    train = prepared.splits["train"]
    start = time.perf_counter()
    batches = token_batches(*train.lengths(), args.batch_tokens, seed=1, epoch=0)
    timed(f"lengths and token_batches ({len(batches):,} batches)", start, len(train))
    start, pairs, tokens, padded = time.perf_counter(), 0, 0, 0
    for indices in batches:
        batch = train.batch(indices)
        pairs += len(indices)
        tokens += batch.target_tokens
        padded += batch.tgt_out.numel()
    timed(
        f"one epoch of padded batches ({pairs:,} pairs, {tokens:,} target tokens, {1 - tokens / padded:.1%} padding)",
        start,
        pairs,
    )
    cache_mb = sum(f.stat().st_size for f in Path(prepared.cache_path).rglob("*") if f.is_file()) / 2**20
    print(
        f"peak RSS: {peak_mb():,.0f} MB (this process, counting touched pages of the {cache_mb:,.0f} MB cache), "
        f"anonymous now {anon_mb():,.0f} MB, largest encoding worker {peak_mb(resource.RUSAGE_CHILDREN):,.0f} MB"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
