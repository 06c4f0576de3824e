"""Figures written with matplotlib's object API (no pyplot, no global state, no display needed)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from nmt.fileio import atomic_open

MAX_LABELS = 120  # longer axes are drawn without token labels
MAX_INCHES = 40.0


def plot_attention(matrix: np.ndarray, src: list[str], tgt: list[str], path: str | Path, title: str = "") -> None:
    """A heat-map PNG of an attention matrix (output steps, source tokens), tokens on the axes."""
    from matplotlib.figure import Figure

    rows, cols = matrix.shape
    size = (min(MAX_INCHES, 2.0 + 0.3 * cols), min(MAX_INCHES, 1.5 + 0.3 * rows))
    fig = Figure(figsize=size, layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(matrix, cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.xaxis.tick_top()
    if cols <= MAX_LABELS:
        ax.set_xticks(range(cols), src[:cols], rotation=90)
    if rows <= MAX_LABELS:
        ax.set_yticks(range(rows), tgt[:rows])
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    if title:
        ax.set_title(title, loc="left", fontsize="small")
    fig.colorbar(image, ax=ax, shrink=0.8)
    save_figure(fig, path, "plot_dir")


def save_figure(fig, path: str | Path, key: str, dpi: int = 100) -> None:
    """Write a matplotlib Figure as PNG atomically (`key` names the setting in an error)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Glyph .* missing")  # scripts the default font lacks
        with atomic_open(path, "wb", key=key) as f:
            fig.savefig(f, format="png", dpi=dpi)
