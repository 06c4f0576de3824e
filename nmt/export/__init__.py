"""Checkpoint converters for inference engines and other frameworks (nmt-export)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def staged(target: Path, out: str) -> Iterator[Path]:
    """A hidden folder beside `target` to write the export into; it becomes `target` only when the block succeeds,
    so a failed export leaves nothing half-written. An OSError is one line naming out=."""
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        yield tmp
        os.replace(tmp, target)
    except OSError as err:
        raise NmtError(f"out={out}: cannot write ({err.strerror or err})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
