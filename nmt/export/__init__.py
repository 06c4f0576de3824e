"""Checkpoint converters for inference engines and other frameworks (nmt-export)."""

from __future__ import annotations

from pathlib import Path

from nmt.errors import NmtError


def export_target(out: str) -> Path:
    """The model directory an export writes: new, or an empty directory, inside an existing one."""
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise NmtError(f"out={out}: already exists and is not an empty directory; choose a new directory")
    if not target.parent.is_dir():
        raise NmtError(f"out={out}: directory {target.parent} does not exist")
    return target
