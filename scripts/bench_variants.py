"""Train every attention variant for the same number of steps through nmt-train; print BLEU and speed.

    python scripts/bench_variants.py --steps 300                       # toy BLEU and tokens/s, tiny models
    python scripts/bench_variants.py --steps 300 --seeds 1,2,3         # mean +- std of BLEU over seeds
    python scripts/bench_variants.py --toy-steps 0 --multi30k ../shared/data/multi30k --m30k-steps 20

Toy task: each variant trains from `--steps` steps at the sizes given by the flags (the same for every
variant), then the validation split is translated greedily and scored with sacrebleu. Multi30k: each
variant trains `--m30k-steps` steps at its recipe's own sizes without validation, to measure training
speed (target tokens per second, as in results.json). Every run goes through nmt.cli.train.main, the
code behind the nmt-train command. Speeds are medians over the seeds; ratios are against the first
variant listed (the Transformer by default). Set OMP_NUM_THREADS to the cores you can use.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nmt.cli import train  # noqa: E402

# name -> overrides selecting it (on top of the recipes' defaults)
VARIANTS: dict[str, list[str]] = {
    "transformer": ["model=transformer"],
    "transformer_single_head": ["model=transformer_single_head"],
    "transformer_unscaled": ["model=transformer_unscaled"],
    "bahdanau": ["model=bahdanau"],
    "luong_dot": ["model=luong", "model.score=dot"],
    "luong_general": ["model=luong", "model.score=general"],
    "luong_general_no_feeding": ["model=luong", "model.input_feeding=false"],
    "luong_concat": ["model=luong", "model.score=concat"],
    "luong_location": ["model=luong", "model.score=location"],
    "luong_local_m_general": ["model=luong_local_m", "model.score=general"],
    "luong_local_m_dot": ["model=luong_local_m", "model.score=dot"],
    "luong_local_p_general": ["model=luong_local_p", "model.score=general"],
    "luong_local_p_dot": ["model=luong_local_p", "model.score=dot"],
    "hard": ["model=hard"],
}
M30K_VARIANTS = "transformer,bahdanau,luong_general,luong_general_no_feeding,luong_local_p_general"


def run(argv: list[str], run_dir: Path) -> dict:
    """One nmt-train run (its log goes to run_dir/train.log); its results.json."""
    with contextlib.redirect_stdout(io.StringIO()):
        train.main(argv + [f"run_dir={run_dir}", "train.progress=false"])
    return json.loads((run_dir / "results.json").read_text())


def toy_argv(args: argparse.Namespace, seed: int) -> list[str]:
    """The same tiny sizes and schedule for every variant."""
    return [
        "data=toy", f"model.dim={args.dim}", f"model.layers={args.layers}", f"model.ffn_dim={4 * args.dim}", "model.embed_dim=null",
        f"model.dropout={args.dropout}", f"train.max_steps={args.steps}", f"train.batch_tokens={args.batch_tokens}",
        f"train.lr={args.lr}", f"train.warmup={args.warmup}", f"train.valid_every={args.steps}", f"train.save_every={args.steps}",
        f"train.valid_bleu_sentences={args.valid_sentences}", f"train.seed={seed}",
    ]


def m30k_argv(args: argparse.Namespace) -> list[str]:
    """Recipe sizes, no validation: a speed measurement."""
    return [
        "data=multi30k_en_de", f"data.root={args.multi30k}", "data.valid=null", "data.test=null",
        f"train.max_steps={args.m30k_steps}", f"train.batch_tokens={args.m30k_batch_tokens}", f"train.save_every={args.m30k_steps}",
    ]


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows])


def bench_toy(args: argparse.Namespace, names: list[str], seeds: list[int]) -> str:
    rows, base = [], None
    for name in names:
        bleus, speeds, start = [], [], time.perf_counter()
        for seed in seeds:
            res = run(VARIANTS[name] + toy_argv(args, seed), args.work / "toy" / f"{name}_s{seed}")
            bleus.append(res["valid_bleu"])
            speeds.append(res["train_tokens_per_s"])
        speed = statistics.median(speeds)
        base = base or speed
        spread = f" +- {statistics.stdev(bleus):.1f}" if len(bleus) > 1 else ""
        rows.append([name, " ".join(VARIANTS[name]), f"{statistics.mean(bleus):.1f}{spread}", f"{speed:.0f}", f"{speed / base:.2f}"])
        print(f"  {name}: BLEU {rows[-1][2]}, {speed:.0f} tok/s ({time.perf_counter() - start:.0f}s)", file=sys.stderr, flush=True)
    title = f"Toy task, {args.steps} steps, dim {args.dim}, {args.layers} layer(s), {args.batch_tokens} tokens/batch, seeds {seeds}"
    return title + "\n" + table(rows, ["variant", "overrides", "toy BLEU", "train tok/s", "vs first"])


def bench_m30k(args: argparse.Namespace, names: list[str]) -> str:
    rows, base = [], None
    for name in names:
        speeds = [
            run(VARIANTS[name] + m30k_argv(args) + [f"train.seed={seed}"], args.work / "m30k" / f"{name}_s{seed}")["train_tokens_per_s"]
            for seed in range(1, args.m30k_repeats + 1)
        ]
        speed = statistics.median(speeds)
        base = base or speed
        rows.append([name, " ".join(VARIANTS[name]), f"{speed:.0f}", f"{speed / base:.2f}"])
        print(f"  {name}: {speed:.0f} tok/s", file=sys.stderr, flush=True)
    title = f"Multi30k en-de, training speed at recipe sizes, {args.m30k_steps} steps of {args.m30k_batch_tokens} tokens, median of {args.m30k_repeats}"
    return title + "\n" + table(rows, ["variant", "overrides", "train tok/s", "vs first"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names (default: all): " + ", ".join(VARIANTS))
    parser.add_argument("--steps", type=int, default=300, help="toy training steps per variant (0: skip the toy task)")
    parser.add_argument("--seeds", default="1", help="comma-separated train.seed values; BLEU is reported as mean +- std")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--valid-sentences", type=int, default=200, help="validation sentences translated for BLEU")
    parser.add_argument("--multi30k", type=Path, help="a Multi30k folder: also measure training tokens/s there")
    parser.add_argument("--m30k-variants", default=M30K_VARIANTS)
    parser.add_argument("--m30k-steps", type=int, default=20)
    parser.add_argument("--m30k-batch-tokens", type=int, default=4096)
    parser.add_argument("--m30k-repeats", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path("runs/bench"), help="where the run dirs go")
    args = parser.parse_args(argv)
    unknown = [n for n in (args.variants + "," + args.m30k_variants).split(",") if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {', '.join(unknown)}; expected some of {', '.join(VARIANTS)}")
    if args.steps > 0:
        print(bench_toy(args, args.variants.split(","), [int(s) for s in args.seeds.split(",")]), flush=True)
    if args.multi30k:
        print(bench_m30k(args, args.m30k_variants.split(",")), flush=True)


if __name__ == "__main__":
    main()
