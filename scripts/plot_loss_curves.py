"""Training loss against updates for several runs, from their train.log progress lines, in one PNG.

    python scripts/plot_loss_curves.py runs/prec_fp32 runs/prec_bf16 --out docs/precision_loss.png

Each run's label is its folder name. Prints, for every step the runs share, the largest difference
between their losses, so the figure's claim can be read as a number too.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PROGRESS = re.compile(r"^step (\d+)/\d+ \|.*\| loss ([0-9.]+) ")


def losses(run: Path) -> dict[int, float]:
    """step -> mean training loss of the window ending there, from RUN/train.log."""
    log = run / "train.log"
    if not log.is_file():
        sys.exit(f"error: {log}: no such file (give run dirs of nmt-train)")
    found = {int(m[1]): float(m[2]) for m in map(PROGRESS.match, log.read_text().splitlines()) if m}
    if not found:
        sys.exit(f"error: {log}: no progress lines (train.log_every)")
    return found


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--title", default="Training loss")
    args = parser.parse_args(argv)
    curves = {run.name: losses(run) for run in args.runs}
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, curve in curves.items():
        steps = sorted(curve)
        ax.plot(steps, [curve[s] for s in steps], label=name, linewidth=1.5)
    ax.set_xlabel("update")
    ax.set_ylabel("training loss (label-smoothed, per target token)")
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    shared = sorted(set.intersection(*(set(c) for c in curves.values())))
    for step in shared:
        values = [c[step] for c in curves.values()]
        print(
            f"step {step:>5}: " + "  ".join(f"{v:.3f}" for v in values) + f"  (spread {max(values) - min(values):.3f})"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
