"""Where a training update's time goes: phases (data, forward, loss, backward, clipping, optimizer) and, inside
them, kinds of operators (matrix products, attention, recurrent cells, elementwise, ...), from torch.profiler.

    python scripts/profile_train.py experiment=bench_transformer data.root=../shared/data/multi30k
    python scripts/profile_train.py --precision bf16 --steps 30 experiment=bench_rnn data.root=../shared/data/multi30k
    python scripts/profile_train.py --precision bf16 --steps 6 --shapes 40 experiment=bench_rnn ...   # by shape too

--shapes N also lists the N costliest (operator, input shapes) pairs, with their calls over the profiled updates
(each update's batch has its own shape, so a batch-sized product appears once per update).

The updates are those scripts/bench_train.py times (consecutive ~4k-token batches of epoch 0, after --warmup
untimed ones), run through Trainer.train_step, whose phases carry torch.profiler labels. Phases are wall-clock
shares of the profiled updates ("other" is what lies outside them: the Python around the step and the
learning-rate schedule); operator kinds are shares of the operators' own CPU time in the main thread (a product
that runs on 2 threads counts its wall time once). The profiler's own cost is a few percent: compare shares, not
rates; bench_train.py gives the rates. Measure on an otherwise idle machine. In bf16 on a CPU, epoch 0's updates
meet new product shapes, whose oneDNN kernels are compiled then (counted in the products' own time: ~9% of a bf16
Transformer update); a long run's later epochs find most of them compiled (nmt/training/kernel_cache.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from nmt.cli.common import compose
from nmt.data.batching import token_batches
from nmt.memory import tune_allocator
from nmt.training.trainer import Trainer

PHASES = ("data", "forward", "loss", "backward", "clip", "optimizer")
KINDS = {  # operator name fragments -> kind, first match wins
    "matrix products": ("addmm", "aten::mm", "bmm", "matmul", "linear", "mkldnn_matmul", "_mkl", "baddbmm"),
    "attention": ("softmax", "scaled_dot_product", "masked_fill"),
    "recurrent cells": ("gru", "lstm", "rnn", "tanh", "sigmoid"),
    "embedding": ("embedding",),
    "optimizer": ("adam", "_foreach", "_fused"),
    "norms": ("layer_norm", "norm"),
    "copies and casts": ("copy_", "_to_copy", "clone", "contiguous", "cat", "stack", "index", "gather", "scatter"),
    "elementwise": (
        "add",
        "mul",
        "sub",
        "div",
        "relu",
        "threshold",
        "dropout",
        "bernoulli",
        "where",
        "fill",
        "sum",
        "mean",
        "exp",
        "log",
        "neg",
        "clamp",
        "sqrt",
        "pow",
        "lerp",
    ),
}


def kind(name: str) -> str:
    low = name.lower()
    for label, parts in KINDS.items():
        if any(part in low for part in parts):
            return label
    return "other operators"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--steps", type=int, default=20, help="profiled updates")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--top", type=int, default=15, help="operators listed")
    parser.add_argument(
        "--shapes", type=int, default=0, metavar="N", help="also list the N costliest (operator, input shapes) pairs"
    )
    args, overrides = parser.parse_known_args(argv)
    tune_allocator()  # as nmt-train does
    cfg = compose("config", overrides + ["train.progress=false"])
    cfg = replace(cfg, train=replace(cfg.train, precision=args.precision))
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(cfg, run_dir, log=lambda line: print(line, file=sys.stderr))
        train = trainer.data.splits["train"]
        src_lens, tgt_lens = train.lengths()
        batches = token_batches(src_lens, tgt_lens, cfg.train.batch_tokens, cfg.train.seed, 0)
        for i in range(args.warmup):
            trainer.train_step([train.batch(batches[i])])
        tokens = 0
        with profile(activities=[ProfilerActivity.CPU], record_shapes=args.shapes > 0) as prof:
            start = time.perf_counter()
            for i in range(args.warmup, args.warmup + args.steps):
                with torch.profiler.record_function("data"):
                    batch = train.batch(batches[i % len(batches)])
                trainer.train_step([batch])
                tokens += batch.target_tokens
            wall = time.perf_counter() - start
    phases: dict[str, float] = defaultdict(float)
    kinds: dict[str, float] = defaultdict(float)
    ops: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        if event.key in PHASES:
            phases[event.key] += event.cpu_time_total / 1e6
        elif event.key.startswith(("aten::", "mkldnn")):
            kinds[kind(event.key)] += event.self_cpu_time_total / 1e6
            ops[event.key] += event.self_cpu_time_total / 1e6
    model = f"{cfg.model.arch} d{cfg.model.dim}, {sum(p.numel() for p in trainer.model.parameters()) / 1e6:.1f}M"
    print(
        f"\n{model}, {args.precision}, {torch.get_num_threads()} threads, {args.steps} updates, "
        f"{tokens / wall:,.0f} target tokens/s under the profiler ({wall:.1f} s)"
    )
    print("\n| phase | share of the wall time |\n|---|---:|")
    phases["other"] = max(0.0, wall - sum(phases.values()))
    for name in (*PHASES, "other"):
        print(f"| {name} | {phases[name] / wall:.1%} |")
    total = sum(kinds.values())
    print("\n| operator kind | share of operator time |\n|---|---:|")
    for name, seconds in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {seconds / total:.1%} |")
    print("\n| top operators (own time) | share |\n|---|---:|")
    for name, seconds in sorted(ops.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"| `{name}` | {seconds / total:.1%} |")
    if args.shapes:
        print("\n| operator | input shapes | calls | share |\n|---|---|---:|---:|")
        events = [e for e in prof.key_averages(group_by_input_shape=True) if e.key.startswith(("aten::", "mkldnn"))]
        for event in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.shapes]:
            shapes = ", ".join(str(tuple(shape)) for shape in event.input_shapes if shape)
            print(f"| `{event.key}` | {shapes} | {event.count} | {event.self_cpu_time_total / 1e6 / total:.1%} |")


if __name__ == "__main__":
    main(sys.argv[1:])
