"""Attention cost against length: forward+backward time and peak memory of each variant, plotted log-log.

    python scripts/bench_attention.py                 # lengths 16..4096, prints a table, writes docs/attention_cost.png
    python scripts/bench_attention.py --max-len 512 --runs 3 --plot /tmp/cost.png --json /tmp/cost.json
    python scripts/bench_attention.py --quadratic-max-len 2048   # additive and concat up to n = 2048 only
    python scripts/bench_attention.py --device cuda   # peak memory from the CUDA allocator

Every variant attends T = n queries over S = n source positions (n = 16, 32, ..., --max-len), a batch of
--batch sentences, model width --dim (queries, keys and values), attention hidden size --dim, local
windows of D = --window. One measurement is a forward pass and the gradients of every input and
parameter. Time: the median of --runs after one warm-up (--json keeps every run's time too, for intervals).
Memory: the peak of the bytes allocated during one forward+backward (on CPU replayed from the profiler's
allocation events; on CUDA torch.cuda.max_memory_allocated), inputs excluded.

Variants: the global scores of nmt/models/attention.py (additive, dot, general, concat; additive and concat in
bounded blocks, `additive_scores`), local-p (general score) twice, as it was (every position scored, then
masked: `dense_log_weights`, O(n^2)) and as training runs it (the 2D + 1 positions of each window only, the
context without the (B, T, S) weights: `LocalWindow.forward(..., need_weights=False)`, O(n D)), and the
Transformer's multi-head scaled dot product (nmt/models/transformer.py, 4 heads,
F.scaled_dot_product_attention with the padding mask). The slowest variants, additive and concat (n^2 * A tanh
evaluations each way: about a minute a run at n = 4096, d 256 on one core), stop at --quadratic-max-len if given.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from nmt.models.attention import make_attention
from nmt.models.transformer import MultiHeadAttention

Fn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (query, keys, mask) -> context
QUADRATIC = ("additive", "concat")  # n^2 * A tanh evaluations: the variants --quadratic-max-len cuts off
Row = tuple[list[float], float]  # every run's seconds, peak MB


def variants(dim: int, window: int, heads: int) -> dict[str, tuple[Fn, list[torch.nn.Parameter]]]:
    """name -> (context of queries over keys, the parameters whose gradients backward computes)."""
    out: dict[str, tuple[Fn, list[torch.nn.Parameter]]] = {}
    for score in ("additive", "dot", "general", "concat"):
        attention = make_attention(score, dim, dim, dim)
        out[score] = (lambda q, k, m, a=attention: a(q, a.prepare(k), k, m)[0], list(attention.parameters()))
    local = make_attention("general", dim, dim, dim, window="local_p", window_size=window)

    def dense(q: torch.Tensor, k: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return local.dense_log_weights(q, local.prepare(k), m).exp() @ k

    out["local-p, masked (was)"] = (dense, list(local.parameters()))
    out["local-p, window-only"] = (
        lambda q, k, m: local(q, local.prepare(k), k, m, need_weights=False)[0],  # the context alone, as in training
        list(local.parameters()),
    )
    mha = MultiHeadAttention(dim, heads, dropout=0.0)
    out["multi-head SDPA"] = (
        lambda q, k, m: mha.attend(q, *mha.keys_values(k), mask=m[:, None, None, :])[0],
        list(mha.parameters()),
    )
    return out


def step(fn: Fn, params: list[torch.nn.Parameter], query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> None:
    """One forward pass and the gradients of the inputs and parameters."""
    context = fn(query, keys, mask)
    torch.autograd.grad(context.square().sum(), [query, keys, *params])


def peak_bytes(run: Callable[[], None], device: torch.device) -> int:
    """Peak bytes allocated while `run` runs, beyond what was allocated before."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def seconds(run: Callable[[], None], device: torch.device, runs: int) -> list[float]:
    """Wall time of each of `runs` calls after one warm-up."""
    run()
    times = []
    for _ in range(runs):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def measure(args: argparse.Namespace) -> tuple[list[int], dict[str, list[Row]]]:
    """lengths, and name -> [(every run's seconds, MB)] per length (fewer where --quadratic-max-len cut it off)."""
    device = torch.device(args.device)
    torch.manual_seed(0)
    lengths = [2**k for k in range(4, args.max_len.bit_length()) if 2**k <= args.max_len]
    results: dict[str, list[Row]] = {}
    for name, (fn, params) in variants(args.dim, args.window, args.heads).items():
        if args.variants and name not in args.variants:
            continue
        for p in params:
            p.data = p.data.to(device)
        results[name] = []
        for n in lengths:
            if name in QUADRATIC and args.quadratic_max_len and n > args.quadratic_max_len:
                break
            query = torch.randn(args.batch, n, args.dim, device=device, requires_grad=True)
            keys = torch.randn(args.batch, n, args.dim, device=device, requires_grad=True)
            mask = torch.ones(args.batch, n, dtype=torch.bool, device=device)
            run = lambda fn=fn, params=params, query=query, keys=keys, mask=mask: step(fn, params, query, keys, mask)  # noqa: E731
            results[name].append((seconds(run, device, args.runs), peak_bytes(run, device) / 2**20))
            print(
                f"{name:>22} n={n:5d}: {statistics.median(results[name][-1][0]) * 1e3:9.2f} ms "
                f"{results[name][-1][1]:9.1f} MB",
                file=sys.stderr,
                flush=True,
            )
    return lengths, results


def figures(rows: list[Row]) -> tuple[list[float], list[float]]:
    """Median ms and peak MB per measured length."""
    return [statistics.median(times) * 1e3 for times, _ in rows], [mb for _, mb in rows]


def table(lengths: list[int], results: dict[str, list[Row]]) -> str:
    """Median time (ms) and peak memory (MB) per variant and length ("-": not measured),
    and the growth factor from n/2 to n at the longest length measured."""
    head = f"{'variant':>22} | " + " ".join(f"{n:>8d}" for n in lengths) + " | x per doubling (last)"
    lines = [head, "-" * len(head)]
    for name, rows in results.items():
        for unit, values in zip(("ms", "MB"), figures(rows)):
            growth = values[-1] / values[-2] if len(values) > 1 and values[-2] > 0 else float("nan")
            cells = [f"{v:8.2f}" for v in values] + [f"{'-':>8}"] * (len(lengths) - len(values))
            lines.append(f"{name if unit == 'ms' else '':>22} | " + " ".join(cells) + f" | {growth:.1f}x {unit}")
    return "\n".join(lines)


def plot(lengths: list[int], results: dict[str, list[Row]], path: Path, title: str) -> None:
    """Time and memory against length, log-log, one line per variant, with n and n^2 guides."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, column, label in ((axes[0], 0, "forward+backward time (ms)"), (axes[1], 1, "peak memory (MB)")):
        for name, rows in results.items():
            values = figures(rows)[column]
            ax.plot(
                lengths[: len(values)], values, "--" if "was" in name else "-", marker="o", markersize=3, label=name
            )
        top = max(max(figures(rows)[column]) for rows in results.values())
        for power, guide in ((1, "n"), (2, "n²")):
            ax.plot(lengths, [top * (n / lengths[-1]) ** power for n in lengths], ":", color="gray", linewidth=0.8)
            ax.annotate(guide, (lengths[0], top * (lengths[0] / lengths[-1]) ** power), color="gray", fontsize=8)
        ax.set(xscale="log", yscale="log", xlabel="source = target length n", ylabel=label)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())  # no 2 x 10^2-style labels between them
        ax.grid(True, which="major", linewidth=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument(
        "--quadratic-max-len", type=int, help=f"measure {', '.join(QUADRATIC)} up to this length only (default: all)"
    )
    parser.add_argument("--variant", dest="variants", action="append", help="only this one (repeatable)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--window", type=int, default=10, help="D: local windows cover [p_t - D, p_t + D]")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--keep-denormals",
        action="store_true",
        help="do not flush denormal floats to zero (by default they are: see `measure`)",
    )
    parser.add_argument("--plot", type=Path, default=Path("docs/attention_cost.png"))
    parser.add_argument("--json", type=Path, help="also write the measurements here (scripts/study_claims.py --cost)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    # Random unscaled inputs give dot scores of s.d. sqrt(dim) (16 at d256): the softmax then underflows into
    # denormal floats, whose arithmetic the CPU runs many times slower (dot measured 7.3 s at 4,096 against
    # general's 1.0 s, 2026-12-06, Intel Xeon). That is the CPU's penalty on these inputs, not the mechanism's
    # cost, so denormals are flushed to zero unless --keep-denormals.
    denormals_flushed = torch.set_flush_denormal(not args.keep_denormals) and not args.keep_denormals
    lengths, results = measure(args)
    print(table(lengths, results))
    title = (
        f"batch {args.batch}, dim {args.dim}, D={args.window}, {args.device}, {args.threads} thread(s), "
        f"median of {args.runs}{', denormals flushed' if denormals_flushed else ''}"
    )
    plot(lengths, results, args.plot, title)
    print(f"plot: {args.plot} ({title})")
    if args.json:
        keys = ("batch", "dim", "heads", "window", "runs", "threads", "device", "quadratic_max_len")
        from nmt.runtime import cpu_info

        settings = {k: getattr(args, k) for k in keys} | {
            "denormals_flushed": denormals_flushed,
            "cpu": cpu_info("model name") or platform.processor(),
            "date": time.strftime("%Y-%m-%d"),
        }
        found = {
            name: [
                {"n": n, "ms": statistics.median(times) * 1e3, "runs_ms": [t * 1e3 for t in times], "mb": mb}
                for n, (times, mb) in zip(lengths, rows)
            ]
            for name, rows in results.items()
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"settings": settings, "title": title, "results": found}, indent=1) + "\n")
        print(f"json: {args.json}")


if __name__ == "__main__":
    main(sys.argv[1:])
