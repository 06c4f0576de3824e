"""From a data config to encoded train/valid/test splits, cached on disk as Arrow files read with `datasets`.

The cache key hashes the text of every split (a digest taken while the corpus is validated) with the
tokenizer and filter settings, so a second run (or `nmt-prepare` ahead of training) reuses the
tokenizer and the Arrow files when nothing changed. A cache is a folder: `src.model` (and `tgt.model`
for separate vocabularies), `{train,valid,test}.arrow` with the columns src_ids and tgt_ids, and
`{train,valid,test}.text.arrow` with src_text and tgt_text.

Corpora larger than memory: the validated text is streamed into an Arrow file, the tokenizer trains on
a seeded sample of it, `datasets.map` encodes it in `data.num_proc` processes, the kept rows are
streamed into the cache, and the cache is memory-mapped when it is read back (`Dataset.from_file`):
a `Split` reads only the rows a batch asks for, so no split ever sits in Python lists.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from nmt.config import DataConfig
from nmt.data.corpus import ParallelText, read_hf, read_parallel, side_path
from nmt.data.split import Rows, Split
from nmt.data.synthetic import generate_toy_corpus
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError

CACHE_VERSION = "2"  # 2: the text digest of nmt.data.corpus.validated; ids stored in the smallest integer type
SPLITS = ("train", "valid", "test")
ROWS_PER_CHUNK = 1000  # pairs per Arrow record batch and per datasets.map call; a worker per chunk at most
CACHE_ROWS = 65_536  # rows per record batch in the cache files
TEXT_SCHEMA = pa.schema([("src_text", pa.string()), ("tgt_text", pa.string())])


@dataclass
class PreparedData:
    tokenizer: Tokenizer
    splits: dict[str, Split]
    cache_path: Path


def ensure_synthetic(data: DataConfig) -> None:
    """Generate the toy corpus into the folder of data.train when the recipe asks for it and it is missing."""
    if data.synthetic is None:
        return
    if data.synthetic != "toy":
        raise NmtError(f"data.synthetic={data.synthetic}: unknown; expected toy or null")
    if not side_path(data.train, data.src).exists():
        generate_toy_corpus(Path(data.train).parent, seed=data.synthetic_seed)


def read_split(data: DataConfig, split: str) -> ParallelText | None:
    """The validated text of one split (streamed again when iterated), or None when the config names none."""
    if data.hf is not None:
        return read_hf(data.hf, split, data.src, data.tgt, optional=split != "train")
    spec = {"train": data.train, "valid": data.valid, "test": data.test}[split]
    return None if spec is None else read_parallel(spec, data.src, data.tgt)


def filter_pairs(
    src_lens: Sequence[int], tgt_lens: Sequence[int], max_len: int, max_ratio: float | None
) -> tuple[np.ndarray, dict[str, int]]:
    """Indices of the pairs kept, and how many pairs each filter removed (applied in order)."""
    src, tgt = np.asarray(src_lens, dtype=np.int64), np.asarray(tgt_lens, dtype=np.int64)
    empty = (src == 0) | (tgt == 0)
    too_long = ~empty & ((src > max_len) | (tgt > max_len))
    skewed = np.zeros_like(empty) if max_ratio is None else ~empty & ~too_long & (np.maximum(src, tgt) > max_ratio * np.minimum(src, tgt))
    removed = {"empty": int(empty.sum()), f"max_len>{max_len}": int(too_long.sum()), f"ratio>{max_ratio}": int(skewed.sum())}
    return np.flatnonzero(~(empty | too_long | skewed)), removed


def _cache_key(data: DataConfig, texts: dict[str, ParallelText], tokenizer: Tokenizer | None = None) -> str:
    settings = {k: v for k, v in asdict(data).items() if k in ("max_len", "max_ratio", "vocab_size", "spm_model", "spm_sample", "joint_vocab")}
    digest = hashlib.sha256(json.dumps([CACHE_VERSION, settings], sort_keys=True).encode())
    for model in (tokenizer.state().values() if tokenizer is not None else ()):
        digest.update(model)
    for split in SPLITS:
        if split in texts:
            digest.update(f"{split}:{texts[split].digest}".encode())
    return digest.hexdigest()[:16]


def _write_text(text: ParallelText, path: Path) -> None:
    """Stream the pairs into an Arrow file, a chunk at a time."""
    pairs = iter(text)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, TEXT_SCHEMA) as writer:
        while chunk := list(islice(pairs, ROWS_PER_CHUNK)):
            src, tgt = zip(*chunk)
            writer.write_batch(pa.record_batch([pa.array(src, pa.string()), pa.array(tgt, pa.string())], schema=TEXT_SCHEMA))


def _batches(paths: list[str]) -> Iterator[pa.RecordBatch]:
    """The record batches of Arrow stream files, read (not memory-mapped) one at a time: a pass leaves no pages resident."""
    for path in paths:
        with pa.OSFile(path) as source:
            yield from pa.ipc.open_stream(source)


class ArrowColumn:
    """One column of an Arrow stream file, streamed as often as asked: the tokenizer's corpus."""

    def __init__(self, path: Path, name: str, rows: int):
        self.path, self.name, self.rows = path, name, rows

    def __len__(self) -> int:
        return self.rows

    def __iter__(self) -> Iterator[str]:
        for batch in _batches([str(self.path)]):
            yield from batch.column(self.name).to_pylist()


def _write_cache(encoded: Any, schema: pa.Schema, folder: Path, name: str, kept: np.ndarray | None = None) -> None:
    """Stream the rows `kept` (a bool per row; all when None) of datasets.map's output into NAME.arrow and NAME.text.arrow.

    The ids and the text go to separate files, so reading the ids never pages in text (the kernel reads
    ahead around each page a memory map touches), in record batches of CACHE_ROWS rows, so opening a
    file reads few batch headers.
    """
    parts = {f"{name}.arrow": ["src_ids", "tgt_ids"], f"{name}.text.arrow": ["src_text", "tgt_text"]}
    with ExitStack() as stack:
        writers = {
            file: stack.enter_context(pa.ipc.new_stream(stack.enter_context(pa.OSFile(str(folder / file), "wb")), pa.schema([schema.field(c) for c in columns])))
            for file, columns in parts.items()
        }

        def write(batches: list[pa.RecordBatch]) -> None:
            table = pa.Table.from_batches(batches).cast(schema).combine_chunks()
            for file, columns in parts.items():
                writers[file].write_table(table.select(columns))

        pending, rows, row = [], 0, 0
        for batch in _batches([f["filename"] for f in encoded.cache_files]):
            if kept is not None:
                batch, row = batch.filter(pa.array(kept[row : row + len(batch)])), row + len(batch)
            pending.append(batch)
            rows += len(batch)
            if rows >= CACHE_ROWS:
                write(pending)
                pending, rows = [], 0
        if pending:
            write(pending)


_TOKENIZERS: dict[tuple[bytes, bytes | None], Tokenizer] = {}  # one per process: datasets.map workers build theirs once


def _encode_rows(rows: dict[str, list[str]], models: tuple[bytes, bytes | None]) -> dict[str, list[list[int]]]:
    """The datasets.map function: the subword ids of a chunk of pairs."""
    tokenizer = _TOKENIZERS.get(models) or _TOKENIZERS.setdefault(models, Tokenizer(*models))
    return {"src_ids": tokenizer.encode_src(rows["src_text"]), "tgt_ids": tokenizer.encode_tgt(rows["tgt_text"])}


def _features(tokenizer: Tokenizer) -> Any:
    """The cache's columns (datasets.Features): the text, and the ids in the smallest integer type that holds them."""
    import datasets

    vocab = max(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
    ids = datasets.List(datasets.Value("uint16" if vocab <= 1 << 16 else "int32"))
    return datasets.Features({"src_text": datasets.Value("string"), "tgt_text": datasets.Value("string"), "src_ids": ids, "tgt_ids": ids})


def _encode(tokenizer: Tokenizer, features: Any, text: Path, work: Path, name: str, num_proc: int) -> Any:
    """The text file's pairs with their ids (a memory-mapped datasets.Dataset), encoded by up to `num_proc` processes."""
    import datasets

    text_ds = datasets.Dataset.from_file(str(text))
    procs = min(num_proc, math.ceil(len(text_ds) / ROWS_PER_CHUNK))  # one process for a small split
    return text_ds.map(
        _encode_rows, batched=True, batch_size=ROWS_PER_CHUNK, fn_kwargs={"models": (tokenizer.src_model, tokenizer.tgt_model)},
        features=features, num_proc=procs if procs > 1 else None, cache_file_name=str(work / f"{name}.ids.arrow"),
        load_from_cache_file=False, new_fingerprint=f"{name}-ids",
    )


def _build(
    path: Path, data: DataConfig, texts: dict[str, ParallelText], tokenizer: Tokenizer | None, log: Callable[[str], None]
) -> None:
    """Tokenize, encode, filter and write the cache at `path`, through a temporary folder renamed at the end.

    Every pass over the corpus streams it (the text in, the tokenizer's sample, the kept rows out);
    only datasets.map's workers memory-map it, each its own share.
    """
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")  # per process: two runs may fill one cache at once
    work = tmp / "work"  # intermediate Arrow files, removed before the rename
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        work.mkdir(parents=True)
        for name, pairs in texts.items():
            _write_text(pairs, work / f"{name}.text.arrow")
        if tokenizer is None:
            src, tgt = (ArrowColumn(work / "train.text.arrow", column, len(texts["train"])) for column in ("src_text", "tgt_text"))
            tokenizer = Tokenizer.train(src, tgt, data.vocab_size, data.spm_model, data.joint_vocab, data.spm_sample)
            log(f"data: trained {data.spm_model} tokenizer, vocab {tokenizer.src_vocab_size}/{tokenizer.tgt_vocab_size}")
        else:
            log(f"data: using the checkpoint's tokenizer, vocab {tokenizer.src_vocab_size}/{tokenizer.tgt_vocab_size}")
        for side, model in tokenizer.state().items():
            (tmp / f"{side}.model").write_bytes(model)
        features = _features(tokenizer)
        for name in texts:
            encoded = _encode(tokenizer, features, work / f"{name}.text.arrow", work, name, data.num_proc)
            kept = _filter_train(encoded, data, texts["train"].origin, log) if name == "train" else None
            _write_cache(encoded, features.arrow_schema.remove_metadata(), tmp, name, kept)
        shutil.rmtree(work)
        tmp.rename(path)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not path.is_dir():  # unless another process finished the same cache first
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _filter_train(encoded: Any, data: DataConfig, origin: str, log: Callable[[str], None]) -> np.ndarray:
    """Which training pairs the filters keep (a bool per pair), logged with what each filter removed."""
    keep, removed = filter_pairs(
        Rows(encoded.data.column("src_ids")).lengths(), Rows(encoded.data.column("tgt_ids")).lengths(), data.max_len, data.max_ratio
    )
    summary = ", ".join(f"{name} removed {n}" for name, n in removed.items())
    if not len(keep):
        raise NmtError(f"{origin}: no training pairs left after filtering {len(encoded)} pairs ({summary})")
    log(f"data: train {len(encoded)} pairs, kept {len(keep)} ({summary})")
    kept = np.zeros(len(encoded), dtype=bool)
    kept[keep] = True
    return kept


def _load(path: Path) -> tuple[Tokenizer, dict[str, Split]]:
    import datasets

    tgt = path / "tgt.model"
    tokenizer = Tokenizer((path / "src.model").read_bytes(), tgt.read_bytes() if tgt.exists() else None)
    read = lambda file: datasets.Dataset.from_file(str(path / file))  # noqa: E731  (memory-mapped)
    splits = {name: Split(read(f"{name}.arrow"), read(f"{name}.text.arrow")) for name in SPLITS if (path / f"{name}.arrow").exists()}
    return tokenizer, splits


def _holds_tokenizer(path: Path, tokenizer: Tokenizer) -> bool:
    """Whether the cache at `path` was encoded with exactly this tokenizer."""
    return all((path / f"{side}.model").is_file() and (path / f"{side}.model").read_bytes() == model for side, model in tokenizer.state().items())


def prepare_data(data: DataConfig, log: Callable[[str], None] = print, tokenizer: Tokenizer | None = None) -> PreparedData:
    """Read, validate, tokenize, filter and cache the splits a data config names; the splits are memory-mapped.

    A given `tokenizer` (a checkpoint's, on resume or init_from) is used instead of training one.
    """
    import datasets

    datasets.disable_progress_bars()
    ensure_synthetic(data)
    texts = {s: t for s in SPLITS if (t := read_split(data, s)) is not None}
    if not len(texts["train"]):
        raise NmtError(f"{texts['train'].origin}: the training corpus is empty")
    path = Path(data.cache_dir) / _cache_key(data, texts)
    if tokenizer is not None and not (path.exists() and _holds_tokenizer(path, tokenizer)):
        path = Path(data.cache_dir) / _cache_key(data, texts, tokenizer)
    if path.exists():
        tokenizer, splits = _load(path)
        log(f"data: reusing cache {path} ({', '.join(f'{k} {len(v)}' for k, v in splits.items())} pairs)")
        return PreparedData(tokenizer, splits, path)
    try:
        _build(path, data, texts, tokenizer, log)
    except OSError as err:
        raise NmtError(f"data.cache_dir={data.cache_dir}: cannot write the dataset cache ({err.strerror or err})") from None
    tokenizer, splits = _load(path)
    return PreparedData(tokenizer, splits, path)
