"""Checkpoints: weights, resolved config, tokenizer and step in one file; safe loading; atomic writes.

A checkpoint is a dict saved with torch.save and read back with `torch.load(weights_only=True)`, which
accepts tensors and plain containers only, so a file crafted to run code on load is rejected.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from nmt.config import Config, config_from_yaml, config_to_yaml
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.fileio import atomic_open
from nmt.models.seq2seq import Seq2Seq, build_model

FORMAT = "nmt-checkpoint"
VERSION = 1
BEST, LAST = "best.pt", "last.pt"


def save_checkpoint(path: Path, model: Seq2Seq, cfg: Config, tokenizer: Tokenizer, step: int, train_state: dict | None = None) -> None:
    """Write a self-contained checkpoint atomically; `train_state` holds what exact resume needs."""
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "model": model.state_dict(),
        "config": config_to_yaml(cfg),
        "tokenizer": tokenizer.state(),
        "step": step,
        "train_state": train_state,
    }
    with atomic_open(path, "wb", key="checkpoint") as f:
        torch.save(payload, f)


def resolve_checkpoint(path: str) -> Path:
    """A checkpoint file, or a run dir (its best checkpoint, else its last)."""
    p = Path(path)
    if p.is_dir():
        for name in (BEST, LAST):
            if (p / "checkpoints" / name).is_file():
                return p / "checkpoints" / name
        raise NmtError(f"{p}: no checkpoints/{BEST} or checkpoints/{LAST} in this run dir")
    if not p.exists():
        raise NmtError(f"{p}: checkpoint not found")
    return p


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint safely; a truncated, corrupt or foreign file is a one-line error."""
    p = resolve_checkpoint(str(path))
    if not zipfile.is_zipfile(p):
        raise NmtError(f"{p}: not a readable checkpoint (not a torch zip archive; truncated or corrupt?)")
    try:
        payload = torch.load(p, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        reason = next((line.strip() for line in str(err).splitlines() if "Unsupported global" in line), "unsafe content")
        raise NmtError(f"{p}: refused to load: the file holds more than plain tensors and values ({reason})") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as err:
        raise NmtError(f"{p}: not a readable checkpoint (truncated or corrupt: {str(err).splitlines()[0]})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise NmtError(f"{p}: not an nmt checkpoint")
    return payload


def model_from_checkpoint(payload: dict[str, Any], device: torch.device) -> tuple[Seq2Seq, Tokenizer, Config]:
    """Rebuild the model and tokenizer a checkpoint describes, in eval mode."""
    cfg = config_from_yaml(payload["config"])
    tokenizer = Tokenizer.from_state(payload["tokenizer"])
    model = build_model(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.joint)
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as err:
        raise NmtError(f"checkpoint weights do not match its model config: {str(err).splitlines()[0]}") from None
    return model.to(device).eval(), tokenizer, cfg
