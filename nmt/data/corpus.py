"""Reading parallel corpora, with validation that names the file and line at fault.

Formats: a pair of text files PREFIX.SRC / PREFIX.TGT (plain or .gz), one TSV file (source<TAB>target),
one JSONL file ({"SRC": ..., "TGT": ...} or {"translation": {"SRC": ..., "TGT": ...}}), or a HuggingFace
`datasets` dataset (a local path written by `save_to_disk`, or a hub name for users with a network).
Lines are split on "\\n" only, so a line count always matches `wc -l`.

Every reader streams: one pass validates the whole corpus (raising the file:line of the first fault)
while counting and hashing the pairs, and a `ParallelText` reads them again, as a stream, whenever it
is iterated. A corpus of millions of pairs is never held in Python lists.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import struct
import sys
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import IO, Callable, Iterator

from nmt.errors import NmtError


Pairs = Callable[[], Iterator[tuple[str, str]]]


@dataclass(frozen=True)
class ParallelText:
    """Aligned sentence pairs, validated once and streamed again from their source on each iteration.

    `origin` names where they came from (for messages), `count` is the number of pairs and `digest`
    a SHA-256 of their text (what the dataset cache key hashes).
    """

    origin: str
    count: int
    digest: str
    pairs: Pairs

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return self.pairs()

    @property
    def src(self) -> list[str]:
        """All source sentences in a list (reads the corpus again: meant for small splits)."""
        return [src for src, _ in self]

    @property
    def tgt(self) -> list[str]:
        """All target sentences in a list (reads the corpus again: meant for small splits)."""
        return [tgt for _, tgt in self]


def validated(pairs: Pairs, origin: str) -> ParallelText:
    """Read the pairs once, which raises at the first fault, counting and hashing them on the way."""
    digest, count = hashlib.sha256(), 0
    for src, tgt in pairs():
        s, t = src.encode("utf-8", "surrogatepass"), tgt.encode("utf-8", "surrogatepass")
        digest.update(struct.pack("<QQ", len(s), len(t)) + s + t)  # lengths first: no two corpora hash alike
        count += 1
    return ParallelText(origin, count, digest.hexdigest(), pairs)


def _read_bytes(path: Path) -> bytes:
    if not path.exists():
        raise NmtError(f"{path}: file not found")
    if path.is_dir():
        raise NmtError(f"{path}: is a directory, expected a text file")
    try:
        data = path.read_bytes()
        return gzip.decompress(data) if path.suffix == ".gz" else data
    except PermissionError:
        raise NmtError(f"{path}: permission denied") from None
    except (OSError, EOFError) as err:
        raise NmtError(f"{path}: cannot read ({err})") from None


def decode_utf8(data: bytes, origin: str) -> str:
    """Decode UTF-8, naming the line of the first undecodable byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise NmtError(f"{origin}:{line}: invalid UTF-8 (byte 0x{data[err.start]:02x}); expected UTF-8 text") from None


def split_lines(text: str) -> list[str]:
    """Lines of a text split on "\\n" only (never on other Unicode line breaks), "\\r" endings removed."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_lines(path: str | Path) -> list[str]:
    """All lines of a plain or gzipped UTF-8 text file."""
    path = Path(path)
    return split_lines(decode_utf8(_read_bytes(path), str(path)))


def _decoded_lines(stream: IO[bytes], origin: str) -> Iterator[str]:
    """Lines of a byte stream read one at a time, split on b"\\n" only, "\\r" endings removed."""
    for number, raw in enumerate(stream, 1):
        line = raw[:-1] if raw.endswith(b"\n") else raw
        line = line[:-1] if line.endswith(b"\r") else line
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError as err:
            raise NmtError(f"{origin}:{number}: invalid UTF-8 (byte 0x{line[err.start]:02x}); expected UTF-8 text") from None


def iter_lines(path: str | Path | None) -> Iterator[str]:
    """Lines of a plain or gzipped UTF-8 text file (stdin when path is None), streamed: never all in memory.

    A missing file fails here, before the first line is asked for.
    """
    if path is None:
        return _decoded_lines(sys.stdin.buffer, "<stdin>")
    path = Path(path)
    if not path.exists():
        raise NmtError(f"{path}: file not found")
    if path.is_dir():
        raise NmtError(f"{path}: is a directory, expected a text file")
    return _file_lines(path)


def _file_lines(path: Path) -> Iterator[str]:
    try:
        with path.open("rb") as raw, (gzip.GzipFile(fileobj=raw) if path.suffix == ".gz" else raw) as stream:
            yield from _decoded_lines(stream, str(path))
    except PermissionError:
        raise NmtError(f"{path}: permission denied") from None
    except (OSError, EOFError) as err:
        raise NmtError(f"{path}: cannot read ({err})") from None


def side_path(prefix: str, lang: str) -> Path:
    """PREFIX.LANG, or PREFIX.LANG.gz when only that exists."""
    plain = Path(f"{prefix}.{lang}")
    gz = Path(f"{prefix}.{lang}.gz")
    return gz if not plain.exists() and gz.exists() else plain


def _line_pairs(src_path: Path, tgt_path: Path) -> Iterator[tuple[str, str]]:
    """Lines of the two files side by side; a different line count raises, naming both counts."""
    src_lines, tgt_lines = iter_lines(src_path), iter_lines(tgt_path)
    count = 0
    for src, tgt in zip_longest(src_lines, tgt_lines):
        if src is None or tgt is None:  # one file ended: count the rest of the other
            rest = 1 + sum(1 for _ in (tgt_lines if src is None else src_lines))
            n_src, n_tgt = (count, count + rest) if src is None else (count + rest, count)
            raise NmtError(
                f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}; "
                "parallel files must have the same number of lines"
            )
        count += 1
        yield src, tgt


def read_text_pair(prefix: str, src: str, tgt: str) -> ParallelText:
    """PREFIX.SRC and PREFIX.TGT, which must have the same number of lines."""
    src_path, tgt_path = side_path(prefix, src), side_path(prefix, tgt)
    return validated(lambda: _line_pairs(src_path, tgt_path), f"{src_path}, {tgt_path}")


def _tsv_pairs(path: Path) -> Iterator[tuple[str, str]]:
    for number, line in enumerate(iter_lines(path), 1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise NmtError(f"{path}:{number}: expected 2 tab-separated fields (source, target), found {len(fields)}")
        yield fields[0], fields[1]


def read_tsv(path: str | Path) -> ParallelText:
    """One `source<TAB>target` pair per line."""
    path = Path(path)
    return validated(lambda: _tsv_pairs(path), str(path))


def _pair_from_record(record: dict, src: str, tgt: str) -> tuple[str, str] | None:
    inner = record.get("translation") if isinstance(record.get("translation"), dict) else record
    pair = (inner.get(src), inner.get(tgt))
    return pair if all(isinstance(side, str) for side in pair) else None


def _jsonl_pairs(path: Path, src: str, tgt: str) -> Iterator[tuple[str, str]]:
    for number, line in enumerate(iter_lines(path), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise NmtError(f"{path}:{number}: invalid JSON ({err.msg})") from None
        pair = _pair_from_record(record, src, tgt) if isinstance(record, dict) else None
        if pair is None:
            raise NmtError(f'{path}:{number}: expected an object with string fields "{src}" and "{tgt}"')
        yield pair


def read_jsonl(path: str | Path, src: str, tgt: str) -> ParallelText:
    """One JSON object per line with string fields SRC and TGT (or nested under "translation")."""
    path = Path(path)
    return validated(lambda: _jsonl_pairs(path, src, tgt), str(path))


HF_SPLIT_NAMES = {"train": ("train",), "valid": ("validation", "valid", "dev"), "test": ("test",)}


def read_hf(name: str, split: str, src: str, tgt: str, optional: bool = False) -> ParallelText | None:
    """A split of a `datasets` dataset: a local `save_to_disk` folder, or a hub name (needs a network).

    A missing split is an error, or None when `optional`.
    """
    import datasets

    try:
        if Path(name).exists():
            dataset = datasets.load_from_disk(name)
        else:
            dataset = datasets.load_dataset(name)
    except Exception as err:  # datasets raises many types; all mean "cannot load this"
        raise NmtError(f"data.hf={name}: cannot load dataset ({type(err).__name__}: {err})") from None
    if isinstance(dataset, datasets.DatasetDict):
        names = [n for n in HF_SPLIT_NAMES[split] if n in dataset]
        if not names and optional:
            return None
        if not names:
            raise NmtError(f"data.hf={name}: no {split} split; found {sorted(dataset)}")
        dataset = dataset[names[0]]
    origin = f"{name}[{split}]"
    return validated(lambda: _record_pairs(dataset, origin, src, tgt), origin)


def _record_pairs(dataset, origin: str, src: str, tgt: str) -> Iterator[tuple[str, str]]:
    """The pairs of a `datasets.Dataset`, read a thousand rows at a time."""
    number = 0
    for rows in dataset.iter(batch_size=1000):
        for values in zip(*rows.values()):
            number += 1
            pair = _pair_from_record(dict(zip(rows, values)), src, tgt)
            if pair is None:
                raise NmtError(f'{origin} row {number}: expected string fields "{src}" and "{tgt}" (or "translation")')
            yield pair


def read_parallel(spec: str, src: str, tgt: str) -> ParallelText:
    """Dispatch on the path: .tsv / .jsonl are one file with both sides, anything else is a prefix."""
    lowered = spec.lower().removesuffix(".gz")
    if lowered.endswith(".tsv"):
        return read_tsv(spec)
    if lowered.endswith(".jsonl"):
        return read_jsonl(spec, src, tgt)
    return read_text_pair(spec, src, tgt)
