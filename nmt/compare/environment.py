"""Where a comparison ran: package versions, hardware, threads, the code's git commit."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

from nmt.runtime import cpu_info

PACKAGES = ("torch", "sacrebleu", "sentencepiece", "numpy", "matplotlib", "hydra-core", "omegaconf", "datasets")


def cpu_model() -> str:
    return cpu_info("model name") or platform.processor() or platform.machine()


def _git_commit() -> str | None:
    """The commit of the nmt source tree (with `+changes` when it has uncommitted edits), if it is a git checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return commit.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _gpu_names() -> list[str]:
    """The GPUs nvidia-smi lists; asked outside this process, so the comparison's parent never initialises CUDA
    (its spawned workers train on the GPU)."""
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in listed.stdout.splitlines() if line.strip()] if listed.returncode == 0 else []


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment() -> dict:
    """A JSON-able description of this process's software and hardware."""
    import nmt

    gpus = _gpu_names()
    return {
        "nmt": nmt.__version__,
        "git_commit": _git_commit(),
        "python": sys.version.split()[0],
        "packages": {name: _version(name) for name in PACKAGES},
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "gpus": gpus,
        "torch_threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }
