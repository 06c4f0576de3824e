"""Writing files so that a crash or a full disk never leaves a half-written one behind."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

from nmt.errors import NmtError


def fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_open(path: str | Path, mode: str = "w", key: str = "output") -> Iterator[IO]:
    """Open a temporary file beside `path`; on success flush, fsync and rename it over `path`.

    On any failure the temporary file is removed and `path` is left as it was. OS errors (missing
    directory, permission, disk full) become one-line errors naming `key` and the path.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise NmtError(f"{key}={path}: directory {path.parent} does not exist")
    if path.is_dir():
        raise NmtError(f"{key}={path}: is a directory, expected a file name")
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        text = "b" not in mode
        with open(tmp, mode, **({"encoding": "utf-8", "newline": "\n"} if text else {})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as err:
        raise NmtError(f"{key}={path}: cannot write ({err.strerror or err})") from None
    finally:
        tmp.unlink(missing_ok=True)
