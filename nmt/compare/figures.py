"""The report's figures (PNG, matplotlib's object API): BLEU bars, learning curves, BLEU by length, heat maps.

Every value drawn comes from the runs' files, through the report's summary; nothing is recomputed here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nmt.compare.curves import Curve
from nmt.evaluation.alignment import GoldAlignment
from nmt.evaluation.plots import save_figure

KIND_COLORS = {"baseline": "#7f7f7f", "better": "#2ca02c", "worse": "#d62728", "same": "#1f77b4"}
KIND_LABELS = {
    "baseline": "baseline",
    "better": "better (both tests, Holm)",
    "worse": "worse (both tests, Holm)",
    "same": "not shown to differ",
}


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab20" if n > 10 else "tab10"]
    return [cmap(i % cmap.N) for i in range(n)]


def bleu_bars(
    names: list[str],
    means: list[float],
    stds: list[float | None],
    per_seed: list[list[float]],
    kinds: list[str],
    title: str,
    path: Path,
) -> None:
    """Horizontal bars of mean test BLEU, error bars one standard deviation over seeds, a dot per seed."""
    fig = _figure(7.0, 1.2 + 0.32 * len(names))
    ax = fig.subplots()
    y = np.arange(len(names))[::-1]
    ax.barh(
        y,
        means,
        xerr=[s or 0.0 for s in stds],
        color=[KIND_COLORS[k] for k in kinds],
        alpha=0.85,
        capsize=3,
        height=0.7,
    )
    for row, values in zip(y, per_seed):
        ax.plot(values, [row] * len(values), "k.", markersize=4)
    ax.set_yticks(y, names, fontsize="small")
    ax.set_xlabel("test BLEU (bar: mean over seeds; line: ±1 s.d.; dots: seeds)")
    ax.set_title(title, loc="left", fontsize="small")
    from matplotlib.patches import Patch

    shown = [k for k in KIND_COLORS if k in kinds]
    ax.legend(
        handles=[Patch(color=KIND_COLORS[k], label=KIND_LABELS[k]) for k in shown],
        fontsize="x-small",
        loc="lower right",
    )
    ax.grid(axis="x", alpha=0.3)
    save_figure(fig, path, "out")


def learning_curves(curves: dict[str, list[Curve]], path: Path, clock: str = "wall") -> None:
    """Validation BLEU and loss against updates and against training seconds by the runs' budget clock
    (`clock`: "wall", "cpu", or "mixed"); one colour per variant, a line per seed."""
    fig = _figure(12.0, 8.0)
    axes = fig.subplots(2, 2)
    seconds = {
        "wall": "training seconds (wall-clock)",
        "cpu": "training seconds (CPU time of the process)",
    }.get(clock, "training seconds (each run's budget clock: wall or CPU)")
    panels = [
        (0, 0, 0, 4, "updates", "valid BLEU"),
        (0, 1, 1, 4, seconds, "valid BLEU"),
        (1, 0, 0, 2, "updates", "valid loss"),
        (1, 1, 1, 2, seconds, "valid loss"),
    ]
    for (name, runs), color in zip(curves.items(), _colors(len(curves))):
        for k, curve in enumerate(runs):
            if not curve.valid:
                continue
            points = np.array(curve.valid)
            for row, col, x, y, _, _ in panels:
                axes[row, col].plot(
                    points[:, x],
                    points[:, y],
                    color=color,
                    marker=".",
                    markersize=3,
                    linewidth=1,
                    linestyle="-" if k == 0 else "--",
                    label=name if k == 0 else None,
                )
    for row, col, _, _, xlabel, ylabel in panels:
        axes[row, col].set_xlabel(xlabel)
        axes[row, col].set_ylabel(ylabel)
        axes[row, col].grid(alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    save_figure(fig, path, "out")


def bleu_by_budget(curves: dict[str, list[tuple[int, float, float | None]]], path: Path) -> None:
    """Test BLEU (mean over seeds, a bar of one standard deviation) at each budget point, a line per variant,
    updates on a log axis: the ranking at each budget, and where lines cross."""
    fig = _figure(9.0, 5.0)
    ax = fig.subplots()
    for (name, points), color in zip(curves.items(), _colors(len(curves))):
        if not points:
            continue
        x, y, err = zip(*points)
        ax.errorbar(x, y, yerr=[e or 0.0 for e in err], marker="o", markersize=3, capsize=2, color=color, label=name)
    ax.set_xscale("log")
    ticks = sorted({p for points in curves.values() for p, _, _ in points})
    ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
    ax.set_xlabel("updates (the same for every variant at each point)")
    ax.set_ylabel("test BLEU (mean over seeds)")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize="small")
    save_figure(fig, path, "out")


def bleu_by_length(buckets: list[str], bleu: dict[str, list[float | None]], path: Path) -> None:
    """Test BLEU in each source-length bucket, a line per variant (as Bahdanau et al. 2014, fig. 2)."""
    fig = _figure(9.0, 5.0)
    ax = fig.subplots()
    x = np.arange(len(buckets))
    for (name, values), color in zip(bleu.items(), _colors(len(bleu))):
        ax.plot(x, [np.nan if v is None else v for v in values], marker="o", markersize=3, color=color, label=name)
    ax.set_xticks(x, buckets)
    ax.set_xlabel("source sentence length (words)")
    ax.set_ylabel("test BLEU (mean over seeds)")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize="small")
    save_figure(fig, path, "out")


def attention_grid(records: dict[str, list[dict]], gold: dict[int, GoldAlignment], path: Path) -> None:
    """The same test sentences (columns) for every variant (rows): forced-reference attention, gold links circled."""
    names = list(records)
    lines = [r["line"] for r in next(iter(records.values()), [])]
    if not names or not lines:
        return
    sizes = [max(len(r["src"]), len(r["tgt"])) for r in records[names[0]]]
    panel = [1.2 + 0.16 * s for s in sizes]
    fig = _figure(sum(panel) + 1.0, sum([max(panel)] * len(names)) * 0.95 + 0.6)
    axes = np.atleast_2d(fig.subplots(len(names), len(lines), squeeze=False))
    image = None
    for row, name in enumerate(names):
        for col, record in enumerate(records[name]):
            ax = axes[row, col]
            matrix = np.array(record["attention"])
            image = ax.imshow(matrix, cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
            alignment = gold.get(record["line"])
            if alignment is not None and record["unit"] == "word":
                for i, j in alignment.sure:
                    ax.plot(
                        i,
                        j,
                        marker="o",
                        markersize=5,
                        markerfacecolor="none",
                        markeredgecolor="#d62728",
                        markeredgewidth=0.8,
                    )
            ax.set_yticks(range(len(record["tgt"])), record["tgt"], fontsize=5)
            ax.set_xticks(
                range(len(record["src"])),
                record["src"] if row == 0 else [""] * len(record["src"]),
                rotation=90,
                fontsize=5,
            )
            ax.xaxis.tick_top()
            if col == 0:
                ax.set_ylabel(name, fontsize="small")
            if row == len(names) - 1:
                ax.set_xlabel(f"test line {record['line']}", fontsize="small")
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.3, label="attention weight")
    save_figure(fig, path, "out")
