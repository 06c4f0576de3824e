"""Training throughput: target tokens/s of train steps for any recipe, median of several runs.

    python scripts/bench_train.py data=multi30k_en_de data.root=../shared/data/multi30k model=transformer
    python scripts/bench_train.py --steps 20 --runs 5 experiment=quickstart

Each run times `--steps` optimizer steps on consecutive training batches (after `--warmup` untimed
steps) and counts target tokens (no padding). Prints tokens/s per run, the median, sentences/s and
peak resident memory. Uses torch's default thread count unless train.threads is given.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time

import torch

from nmt.cli.common import compose
from nmt.data.batching import token_batches
from nmt.training.trainer import Trainer


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    args, overrides = parser.parse_known_args(argv)
    cfg = compose("config", overrides + ["train.progress=false"])
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(cfg, run_dir, log=lambda line: print(line, file=sys.stderr))
        train = trainer.data.splits["train"]
        batches = token_batches(*train.lengths(), cfg.train.batch_tokens, cfg.train.seed, 0)
        position, rates, sentence_rates = 0, [], []
        for run in range(args.runs):
            for _ in range(args.warmup):
                trainer.train_step([train.batch(batches[position % len(batches)])])
                position += 1
            tokens = sentences = 0
            start = time.perf_counter()
            for _ in range(args.steps):
                indices = batches[position % len(batches)]
                batch = train.batch(indices)
                trainer.train_step([batch])
                tokens += batch.target_tokens
                sentences += len(indices)
                position += 1
            elapsed = time.perf_counter() - start
            rates.append(tokens / elapsed)
            sentence_rates.append(sentences / elapsed)
            print(f"run {run + 1}: {tokens / elapsed:,.0f} target tokens/s, {sentences / elapsed:,.1f} sentences/s")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"median: {statistics.median(rates):,.0f} target tokens/s, {statistics.median(sentence_rates):,.1f} sentences/s | "
        f"model {cfg.model.arch} d{cfg.model.dim} x{cfg.model.layers}, batch_tokens {cfg.train.batch_tokens}, "
        f"threads {torch.get_num_threads()}, device {trainer.device} | peak RSS {peak_mb:,.0f} MB"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
