"""Writing files so that a crash or a full disk never leaves a half-written one behind."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

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
        what = "is a file, not a directory" if path.parent.exists() else "does not exist"
        raise NmtError(f"{key}={path}: directory {path.parent} {what}")
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


def _same(a: Path, b: Path) -> bool:
    """The same file or folder, through symlinks and relative paths (and hard links, where both exist)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_outputs(
    inputs: dict[str, str | Path | None], outputs: dict[str, str | Path | None], folders: tuple[str, ...] = ()
) -> None:
    """Refuse, before anything is written, an output that is one of the inputs (or holds one, for an output folder),
    two outputs at one path, or an output path that exists as the wrong kind (a folder for a file or the reverse).

    Keys name the settings (`output`, `input`, ...); an input may list several paths separated by commas.
    """
    ins = [(key, Path(p)) for key, value in inputs.items() if value for p in str(value).split(",") if p]
    outs = [(key, Path(value)) for key, value in outputs.items() if value]
    for key, path in outs:
        folder = key in folders
        if path.exists() and path.is_dir() != folder:
            raise NmtError(
                f"{key}={path}: is a {'file' if folder else 'folder'}, expected "
                f"{'a folder' if folder else 'a file name'}"
            )
        for other_key, other in ins:
            inside = folder and other.resolve().is_relative_to(path.resolve())
            if _same(path, other) or inside:
                what = "holds" if inside and not _same(path, other) else "is"
                raise NmtError(
                    f"{key}={path}: {what} the input {other_key}={other}; choose another {key} "
                    "(it would be overwritten)"
                )
    for i, (key, path) in enumerate(outs):
        for other_key, other in outs[i + 1 :]:
            if _same(path, other):
                raise NmtError(f"{key}={path} and {other_key}={other} are the same path; give each output its own")
