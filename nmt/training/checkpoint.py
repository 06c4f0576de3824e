"""Checkpoints: weights, resolved config, tokenizer and training state in one file; safe loading; atomic writes.

A checkpoint is a dict saved with torch.save and read back with `torch.load(weights_only=True)`, which
accepts tensors and plain containers only, so a file crafted to run code on load is rejected.

A run keeps its checkpoints as `checkpoints/step_N.pt`. `last.pt` and `best.pt` are hard links to the
newest and the best of them (a copy where the file system has no hard links), replaced atomically, so
each name always holds a whole checkpoint and a kill at any moment leaves the previous one in place.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any

import torch

from nmt.config import Config, config_from_yaml, config_to_yaml
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.fileio import atomic_open, fsync_dir
from nmt.models.builders import build_model
from nmt.models.seq2seq import Seq2Seq

FORMAT = "nmt-checkpoint"
# 2: model.embed_scale exists (RNN embeddings read out times sqrt(E)); a version-1 config reads as embed_scale=false
VERSION = 2
BEST, LAST = "best.pt", "last.pt"
STEP_NAME = re.compile(r"step_(\d+)\.pt")
REQUIRED = {"model": dict, "config": str, "tokenizer": dict, "step": int}


def step_name(step: int) -> str:
    return f"step_{step}.pt"


def save_checkpoint(
    path: Path, model: Seq2Seq, cfg: Config, tokenizer: Tokenizer, step: int, train_state: dict | None = None
) -> None:
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
    write_payload(path, payload)


def write_payload(path: Path, payload: dict[str, Any], key: str = "checkpoint") -> None:
    """torch.save through a temporary file, fsync and rename."""
    with atomic_open(path, "wb", key=key) as f:
        torch.save(payload, f)


def link_checkpoint(target: Path, name: Path) -> None:
    """Point `name` (last.pt, best.pt) at the checkpoint `target` atomically: a hard link, else a copy."""
    tmp = name.with_name(f".{name.name}.tmp{os.getpid()}")
    try:
        tmp.unlink(missing_ok=True)
        try:
            os.link(target, tmp)
        except OSError:
            shutil.copyfile(target, tmp)
        os.replace(tmp, name)
        fsync_dir(name.parent)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise NmtError(f"checkpoint={name}: cannot write ({err.strerror or err})") from None


def step_checkpoints(folder: Path) -> dict[int, Path]:
    """The run's step_N.pt files by step."""
    found = {}
    for path in folder.glob("step_*.pt"):
        if match := STEP_NAME.fullmatch(path.name):
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def prune_checkpoints(folder: Path, keep: set[int]) -> None:
    """Remove the step checkpoints whose step is not in `keep` (last.pt / best.pt are separate links)."""
    for step, path in step_checkpoints(folder).items():
        if step not in keep:
            path.unlink(missing_ok=True)


def remove_stale_temporaries(folder: Path) -> None:
    """Temporary files a killed save left behind (`.NAME.tmpPID`)."""
    for path in folder.glob(".*.tmp*"):
        path.unlink(missing_ok=True)


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
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(err))
        reason = f"it would call {found.group(1)}" if found else "unsafe content"
        raise NmtError(f"{p}: refused to load: the file holds more than plain tensors and values ({reason})") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as err:
        raise NmtError(f"{p}: not a readable checkpoint (truncated or corrupt: {str(err).splitlines()[0]})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise NmtError(f"{p}: not an nmt checkpoint")
    for key, kind in REQUIRED.items():
        if not isinstance(payload.get(key), kind):
            raise NmtError(f"{p}: not a usable nmt checkpoint (its '{key}' entry is missing or not a {kind.__name__})")
    payload["path"] = str(p)
    return payload


def checkpoint_config(payload: dict[str, Any]) -> Config:
    """The config a checkpoint was trained with."""
    try:
        cfg = config_from_yaml(payload["config"])
    except Exception as err:  # omegaconf raises many types; all mean "not a valid saved config"
        raise NmtError(
            f"{payload['path']}: the checkpoint's config is not valid ({str(err).splitlines()[0]})"
        ) from None
    if payload.get("version", 1) < 2:  # trained before model.embed_scale existed: its RNN embeddings read out as stored
        cfg.model.embed_scale = False
    return cfg


def checkpoint_tokenizer(payload: dict[str, Any]) -> Tokenizer:
    """The tokenizer a checkpoint carries."""
    try:
        return Tokenizer.from_state(payload["tokenizer"])
    except Exception as err:  # sentencepiece raises RuntimeError/OSError/TypeError on a bad model
        raise NmtError(
            f"{payload['path']}: the checkpoint's tokenizer cannot be read ({str(err).splitlines()[0]})"
        ) from None


def load_weights(model: Seq2Seq, payload: dict[str, Any]) -> None:
    """Copy a checkpoint's weights into `model`; a shape or name mismatch is a one-line error."""
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as err:
        raise NmtError(
            f"{payload['path']}: the weights do not match the model config: {' '.join(str(err).split())[:300]}"
        ) from None


def model_from_checkpoint(payload: dict[str, Any], device: torch.device) -> tuple[Seq2Seq, Tokenizer, Config]:
    """Rebuild the model and tokenizer a checkpoint describes, in eval mode."""
    cfg = checkpoint_config(payload)
    tokenizer = checkpoint_tokenizer(payload)
    model = build_model(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.joint)
    load_weights(model, payload)
    return model.to(device).eval(), tokenizer, cfg


def average_weights(payloads: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the checkpoints' floating-point weights; other tensors from the last one."""
    first = payloads[0]["model"]
    for payload in payloads[1:]:
        if payload["model"].keys() != first.keys() or any(
            payload["model"][k].shape != v.shape for k, v in first.items()
        ):
            raise NmtError(f"{payload['path']}: its weights do not have the names and shapes of {payloads[0]['path']}")
    averaged = {}
    for key, value in payloads[-1]["model"].items():
        if value.is_floating_point():
            averaged[key] = sum(p["model"][key].double() for p in payloads).div(len(payloads)).to(value.dtype)
        else:
            averaged[key] = value.clone()
    return averaged
