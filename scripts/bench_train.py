"""Training throughput of recipes: target tokens/s, padding, peak memory and model-FLOPs utilisation.

    python scripts/bench_train.py experiment=bench_transformer data.root=../shared/data/multi30k
    python scripts/bench_train.py --precisions fp32,bf16 --runs 5 experiment=bench_rnn data.root=../shared/data/multi30k
    python scripts/bench_train.py --steps 20 experiment=quickstart
    python scripts/bench_train.py --precisions bf16 --epochs 3 experiment=bench_transformer data.root=...

For each precision, each run times `--steps` updates on consecutive training batches of epoch 0 (after
`--warmup` untimed updates), counts target tokens (EOS included, no padding) and prints tokens/s per run
and the median. Also printed: the padding fraction of the epoch's batches (padded positions that hold no
token, source and target), peak resident memory, and model-FLOPs utilisation: the FLOPs of one update
(forward and backward, counted by torch.utils.flop_counter) times updates/s, over the matmul peak this
script measures on this machine for the same precision (a 2048 x 2048 x 2048 product, best of 5).
Uses torch's default thread count unless train.threads is given; measure on an otherwise idle machine.
With --epochs N it instead trains every batch of epochs 0..N-1 in order, as a run does, and prints each epoch's
tokens/s and the peak resident memory so far: what a long run sees once its first epoch has compiled the
kernels of its batches' shapes (nmt/training/kernel_cache.py). With --repeat every run times the same --steps
batches after one untimed pass over them: the steady state of shapes already met, without the first pass's kernel
compilations, for A/B comparisons of one change (e.g. train.dropout_kernel=torch against the default):

    python scripts/bench_train.py --precisions bf16 --repeat --steps 12 --runs 4 experiment=bench_transformer ...

With --ab KEY=A,B (and --epochs N) it builds two trainers, one with each value of the setting, and trains every
batch of each epoch with both, one right after the other (A first on even updates, B first on odd ones): a VM's
speed drifts by 10-40% within minutes here, far more than a change's effect, while two updates of one batch are a
second apart, so the ratio of their summed times (and the median of the per-update ratios) is read from one run:

    python scripts/bench_train.py --precisions bf16 --epochs 2 --ab train.decoder_loop=steps,fused \
        experiment=bench_rnn data.root=data/multi30k train.threads=2

Under torchrun it times data-parallel training (nmt-train's own, nmt.training.distributed): each of the N
processes takes every N-th batch, an update holds N batches, and tokens/s counts all processes' tokens; the
matmul peak is one process's (all measuring at once) times N. Two single-threaded processes, against one
process of two threads:

    torchrun --standalone --nproc_per_node 2 scripts/bench_train.py experiment=bench_rnn data.root=... \
        train.threads=1 train.batch_tokens=2048      # the same ~4k-token update as one process's 4096
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import replace

import torch
from torch.utils.flop_counter import FlopCounterMode

from nmt.cli.common import compose
from nmt.data.batching import token_batches
from nmt.memory import tune_allocator
from nmt.training.trainer import Trainer

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def matmul_peak(precision: str, device: torch.device, n: int = 2048) -> float:
    """FLOP/s of the best of 5 n x n x n matrix products in this precision."""
    a = torch.randn(n, n, device=device, dtype=DTYPES[precision])
    b = torch.randn(n, n, device=device, dtype=DTYPES[precision])
    best = float("inf")
    for _ in range(6):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def padding(src_lens: list[int], tgt_lens: list[int], batches: list[list[int]]) -> tuple[float, float]:
    """Share of padded positions that hold no token, (source, target), over the batches (EOS/BOS counted as tokens)."""
    fractions = []
    for lens in (src_lens, tgt_lens):
        real = padded = 0
        for batch in batches:
            longest = max(lens[i] for i in batch) + 1
            real += sum(lens[i] + 1 for i in batch)
            padded += longest * len(batch)
        fractions.append(1 - real / padded)
    return fractions[0], fractions[1]


def update_flops(trainer: Trainer, batch) -> float:
    """FLOPs of one update's forward and backward on this batch."""
    counter = FlopCounterMode(display=False)
    with counter:
        trainer.train_step([batch])
    return float(counter.get_total_flops())


def bench(cfg, precision: str, steps: int, warmup: int, runs: int, repeat: bool = False) -> dict:
    cfg = replace(cfg, train=replace(cfg.train, precision=precision))
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(cfg, run_dir, log=lambda line: print(line, file=sys.stderr))
        train = trainer.data.splits["train"]
        src_lens, tgt_lens = train.lengths()
        batches = token_batches(src_lens, tgt_lens, cfg.train.batch_tokens, cfg.train.seed, 0)
        world, rank = trainer.dist.world, trainer.dist.rank

        def update(position: int) -> tuple[int, int]:
            """One update of this process's batch (every world-th from `position`); all processes' (tokens,
            sentences)."""
            group = [batches[(position * world + r) % len(batches)] for r in range(world)]
            tokens = sum(tgt_lens[i] + 1 for indices in group for i in indices)  # + EOS, as nmt-train counts
            trainer.train_step([train.batch(group[rank])], tokens)
            return tokens, sum(len(indices) for indices in group)

        flops = update_flops(trainer, train.batch(batches[0]))
        flops_per_token = flops / train.batch(batches[0]).target_tokens
        position, rates, sentence_rates = 1, [], []
        if repeat:  # one untimed pass over the batches every run times
            for i in range(steps):
                update(1 + i)
        for run in range(runs):
            if repeat:
                position = 1
            for _ in range(0 if repeat else warmup):
                update(position)
                position += 1
            tokens = sentences = 0
            start = time.perf_counter()
            for _ in range(steps):
                counted = update(position)
                tokens, sentences = tokens + counted[0], sentences + counted[1]
                position += 1
            if trainer.device.type == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            rates.append(tokens / elapsed)
            sentence_rates.append(sentences / elapsed)
            if trainer.dist.main:
                print(
                    f"{precision} run {run + 1}: {tokens / elapsed:,.0f} target tokens/s, "
                    f"{sentences / elapsed:,.1f} sentences/s",
                    file=sys.stderr,
                )
        peak = matmul_peak(precision, trainer.device) * world  # each process measures its own at the same time
        tokens_per_s = statistics.median(rates)
        return {
            "precision": precision,
            "tokens_per_s": tokens_per_s,
            "sentences_per_s": statistics.median(sentence_rates),
            "padding": padding(src_lens, tgt_lens, batches),
            "mfu": flops_per_token * tokens_per_s / peak,
            "peak_gflops": peak / 1e9,
            "model": f"{cfg.model.arch} d{cfg.model.dim} x{cfg.model.layers}, "
            f"{sum(p.numel() for p in trainer.model.parameters()) / 1e6:.1f}M parameters",
            "device": str(trainer.device) + (f", {world} processes (torchrun)" if world > 1 else ""),
            "main": trainer.dist.main,
        }


def by_length(timed: list[tuple[int, int, float]], width: int = 5) -> list[dict]:
    """An epoch's updates grouped by their batch's target length T (+ EOS) in bins of `width`: updates, the median
    update's target tokens and target tokens/s, and the group's share of the epoch's time."""
    total = sum(seconds for _, _, seconds in timed) or 1.0
    groups: dict[int, list[tuple[int, int, float]]] = {}
    for row in timed:
        groups.setdefault(row[0] // width, []).append(row)
    return [
        {
            "lengths": f"{min(r[0] for r in rows)}-{max(r[0] for r in rows)}",
            "updates": len(rows),
            "tokens": statistics.median(r[1] for r in rows),
            "tokens_per_s": statistics.median(r[1] / r[2] for r in rows),
            "share": sum(r[2] for r in rows) / total,
        }
        for _, rows in sorted(groups.items())
    ]


def bench_epochs(cfg, precision: str, epochs: int) -> list[dict]:
    """Train every batch of epochs 0..epochs-1 in order, as a run does; tokens/s and peak RSS per epoch."""
    cfg = replace(cfg, train=replace(cfg.train, precision=precision))
    rows = []
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(cfg, run_dir, log=lambda line: print(line, file=sys.stderr))
        train = trainer.data.splits["train"]
        src_lens, tgt_lens = train.lengths()
        world, rank = trainer.dist.world, trainer.dist.rank
        for epoch in range(epochs):
            batches = token_batches(src_lens, tgt_lens, cfg.train.batch_tokens, cfg.train.seed, epoch)
            tokens = updates = 0
            start = time.perf_counter()
            timed = []  # per update: (longest target + EOS of this process's batch, target tokens, seconds)
            for first in range(0, len(batches) - world + 1, world):  # an update holds world batches
                group = batches[first : first + world]
                counted = sum(tgt_lens[i] + 1 for indices in group for i in indices)  # + EOS, all processes'
                began = time.perf_counter()
                trainer.train_step([train.batch(group[rank])], counted)
                timed.append((max(tgt_lens[i] for i in group[rank]) + 1, counted, time.perf_counter() - began))
                tokens += counted
                updates += 1
            if trainer.device.type == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            rows.append(
                {
                    "precision": precision,
                    "epoch": epoch,
                    "updates": updates,
                    "tokens_per_s": tokens / elapsed,
                    "peak_rss_mb": rss,
                    "by_length": by_length(timed),
                }
            )
            if trainer.dist.main:
                print(
                    f"{precision} epoch {epoch}: {updates} updates, {tokens / elapsed:,.0f} target tokens/s",
                    file=sys.stderr,
                )
    return rows


def bench_ab(cfgs: tuple, precision: str, epochs: int) -> list[dict]:
    """Every batch of epochs 0..epochs-1 trained by two trainers (cfgs: the A and B configs), the two updates of a batch
    one after the other, alternating which goes first; per epoch: each one's tokens/s, the ratio B / A of the summed
    times, and the median of the per-update ratios."""
    cfgs = tuple(replace(c, train=replace(c.train, precision=precision)) for c in cfgs)
    rows = []
    with tempfile.TemporaryDirectory() as run_dir:
        trainers = [Trainer(c, f"{run_dir}/{name}", log=lambda line: None) for c, name in zip(cfgs, "AB")]
        train = trainers[0].data.splits["train"]
        src_lens, tgt_lens = train.lengths()
        for epoch in range(epochs):
            batches = token_batches(src_lens, tgt_lens, cfgs[0].train.batch_tokens, cfgs[0].train.seed, epoch)
            seconds, ratios, tokens = [0.0, 0.0], [], 0
            for position, indices in enumerate(batches):
                counted = sum(tgt_lens[i] + 1 for i in indices)
                batch, took = train.batch(indices), [0.0, 0.0]
                for which in (0, 1) if position % 2 == 0 else (1, 0):
                    began = time.perf_counter()
                    trainers[which].train_step([batch], counted)
                    took[which] = time.perf_counter() - began
                seconds = [seconds[0] + took[0], seconds[1] + took[1]]
                ratios.append(took[0] / took[1])
                tokens += counted
            rows.append(
                {
                    "precision": precision,
                    "epoch": epoch,
                    "updates": len(batches),
                    "a": tokens / seconds[0],
                    "b": tokens / seconds[1],
                    "ratio": seconds[0] / seconds[1],
                    "median_ratio": statistics.median(ratios),
                }
            )
            print(f"{precision} epoch {epoch}: B/A {seconds[0] / seconds[1]:.3f}", file=sys.stderr)
    return rows


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--precisions", default="fp32", help="comma-separated: fp32, bf16, fp16 (CUDA)")
    parser.add_argument(
        "--repeat", action="store_true", help="every run times the same --steps batches, after one untimed pass"
    )
    parser.add_argument(
        "--epochs", type=int, default=0, help="instead: train N whole epochs in order, tokens/s and peak RSS per epoch"
    )
    parser.add_argument(
        "--by-length", action="store_true", help="with --epochs: each epoch's updates by their target length too"
    )
    parser.add_argument(
        "--ab",
        metavar="KEY=A,B",
        help="with --epochs: every update trained with both values of a setting, side by side",
    )
    args, overrides = parser.parse_known_args(argv)
    if args.by_length and args.epochs <= 0:
        parser.error("--by-length groups whole epochs' updates: give --epochs N too")
    key, _, values = (args.ab or "").partition("=")
    if args.ab is not None and (args.epochs <= 0 or len(values.split(",")) != 2 or not key):
        parser.error(f"--ab {args.ab}: expected KEY=A,B (e.g. train.decoder_loop=steps,fused) and --epochs N")
    if args.ab is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        parser.error("--ab trains two models in one process: run it without torchrun")
    tune_allocator()  # as nmt-train does (nmt.cli.common.run)
    cfg = compose("config", overrides + ["train.progress=false"])
    if args.ab is not None:
        a, b = values.split(",")
        cfgs = tuple(compose("config", overrides + ["train.progress=false", f"{key}={v}"]) for v in (a, b))
        rows = [row for p in args.precisions.split(",") for row in bench_ab(cfgs, p, args.epochs)]
        print(f"\nA: {key}={a}, B: {key}={b}; batch_tokens {cfg.train.batch_tokens}, threads {torch.get_num_threads()}")
        print("| precision | epoch | updates | A target tokens/s | B target tokens/s | B / A | median per update |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(
                f"| {r['precision']} | {r['epoch']} | {r['updates']} | {r['a']:,.0f} | {r['b']:,.0f} | "
                f"{r['ratio']:.3f}x | {r['median_ratio']:.3f}x |"
            )
        return
    if args.epochs > 0:
        rows = [row for p in args.precisions.split(",") for row in bench_epochs(cfg, p, args.epochs)]
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"\nbatch_tokens {cfg.train.batch_tokens}, threads {torch.get_num_threads()}")
            print("| precision | epoch | updates | target tokens/s | peak RSS so far |\n|---|---:|---:|---:|---:|")
            for r in rows:
                print(
                    f"| {r['precision']} | {r['epoch']} | {r['updates']} | {r['tokens_per_s']:,.0f} | "
                    f"{r['peak_rss_mb']:,.0f} MB |"
                )
            for r in rows if args.by_length else []:
                print(
                    f"\n{r['precision']}, epoch {r['epoch']}, by target length (+ EOS) of the batch\n"
                    "| target length | updates | median target tokens | median target tokens/s | share of the time |\n"
                    "|---|---:|---:|---:|---:|"
                )
                for g in r["by_length"]:
                    print(
                        f"| {g['lengths']} | {g['updates']} | {g['tokens']:,.0f} | {g['tokens_per_s']:,.0f} | "
                        f"{g['share']:.1%} |"
                    )
        return
    results = [bench(cfg, p, args.steps, args.warmup, args.runs, args.repeat) for p in args.precisions.split(",")]
    if not results[0]["main"]:
        return
    print(
        f"\n{results[0]['model']}, batch_tokens {cfg.train.batch_tokens}, threads {torch.get_num_threads()}, "
        f"device {results[0]['device']}"
    )
    print(f"padding: source {results[0]['padding'][0]:.1%}, target {results[0]['padding'][1]:.1%} of padded positions")
    print("| precision | target tokens/s | sentences/s | matmul peak GFLOP/s | MFU |")
    print("|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['precision']} | {r['tokens_per_s']:,.0f} | {r['sentences_per_s']:,.1f} | {r['peak_gflops']:,.0f} | "
            f"{r['mfu']:.1%} |"
        )
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB")


if __name__ == "__main__":
    main(sys.argv[1:])
