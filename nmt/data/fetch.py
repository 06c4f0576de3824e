"""Downloading public corpora into `data.root` for users (never at training time, never in tests).

Multi30k task 1 (Elliott et al. 2016) comes from its official release files, one gzipped file per split
and language, e.g. https://github.com/multi30k/dataset/raw/master/data/task1/raw/train.en.gz. Each file is
written under a temporary name and renamed when complete, so an interrupted download leaves no half file.
`NMT_MULTI30K_URL` replaces the base URL (a mirror, or a `file://` folder: what the tests use).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

from nmt.errors import NmtError
from nmt.fileio import atomic_open

MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw"
MULTI30K_SPLITS = ("train", "val", "test_2016_flickr")
MULTI30K_LANGS = ("en", "de", "fr", "cs")
SOURCES = ("multi30k",)


def multi30k_files(langs: tuple[str, ...]) -> list[str]:
    """The release's file names for these languages, e.g. train.en.gz."""
    return [f"{split}.{lang}.gz" for split in MULTI30K_SPLITS for lang in langs]


def missing_files(root: str | Path, names: list[str]) -> list[str]:
    """Which of `names` are absent from root (a plain-text copy, without .gz, counts too)."""
    root = Path(root)
    return [n for n in names if not (root / n).exists() and not (root / n.removesuffix(".gz")).exists()]


def _download(url: str, path: Path, bar_position: int) -> None:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            size = int(response.headers.get("Content-Length") or 0) or None
            with atomic_open(path, "wb", key="data.root") as out, tqdm(
                total=size, unit="B", unit_scale=True, desc=path.name, position=bar_position, leave=False, disable=None
            ) as bar:
                while chunk := response.read(1 << 16):
                    out.write(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or err
        raise NmtError(f"{url}: cannot download ({reason})") from None


def fetch_multi30k(root: str | Path, langs: tuple[str, ...], log=print) -> list[Path]:
    """Download the Multi30k files of `langs` missing from root; returns the files written."""
    for lang in langs:
        if lang not in MULTI30K_LANGS:
            raise NmtError(f"Multi30k has no language '{lang}'; expected some of {', '.join(MULTI30K_LANGS)}")
    root = Path(root)
    todo = missing_files(root, multi30k_files(langs))
    if not todo:
        return []
    base = os.environ.get("NMT_MULTI30K_URL", MULTI30K_URL).rstrip("/")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise NmtError(f"data.root={root}: cannot create the folder ({err.strerror or err})") from None
    log(f"data: downloading {len(todo)} Multi30k files from {base} into {root}")
    written = []
    try:
        for name in todo:
            _download(f"{base}/{name}", root / name, 0)
            written.append(root / name)
    except NmtError as err:
        raise NmtError(
            f"{err}; to use Multi30k offline, download {', '.join(todo)} from {MULTI30K_URL} "
            f"and put them in {root} (or point data.root at a folder that has them)"
        ) from None
    return written
