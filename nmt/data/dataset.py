"""From a data config to encoded train/valid/test splits, cached on disk with `datasets`.

The cache key hashes the text of every split (a digest taken while the corpus is validated) with the
tokenizer and filter settings, so a second run (or `nmt-prepare` ahead of training) reuses the
tokenizer and the Arrow files when nothing changed.

Corpora larger than memory: the validated text is streamed into an Arrow file, SentencePiece keeps a
sample of it, `datasets.map` encodes it in `data.num_proc` processes, and the cache is memory-mapped
when it is read back: a `Split` reads only the rows a batch asks for, so no split ever sits in
Python lists.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from nmt.config import DataConfig
from nmt.data.batching import Batch, rows_batch
from nmt.data.corpus import ParallelText, read_hf, read_parallel, side_path
from nmt.data.synthetic import generate_toy_corpus
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError

CACHE_VERSION = "2"  # 2: the text digest of nmt.data.corpus.validated; ids stored in the smallest integer type
SPLITS = ("train", "valid", "test")
ROWS_PER_CHUNK = 1000  # pairs per Arrow record batch and per datasets.map call; a worker per chunk at most
TEXT_SCHEMA = pa.schema([("src_text", pa.string()), ("tgt_text", pa.string())])


class Column(Sequence):
    """A read-only view of one column of a memory-mapped split: rows become Python objects only when read."""

    def __init__(self, array: pa.ChunkedArray):
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return self.array.slice(start, max(stop - start, 0)).to_pylist()
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError(f"row {index} of {len(self)}")
        return self.array[position].as_py()

    def __iter__(self):
        for start in range(0, len(self), ROWS_PER_CHUNK):
            yield from self.array.slice(start, ROWS_PER_CHUNK).to_pylist()


class Rows:
    """Random access to the rows of a list<int> column through zero-copy views of its Arrow chunks.

    (`ChunkedArray.take` would concatenate the whole column first: a corpus-sized copy per batch.)
    """

    def __init__(self, array: pa.ChunkedArray):
        chunks = [chunk for chunk in array.chunks if len(chunk)]
        self.ends = np.cumsum([len(chunk) for chunk in chunks], dtype=np.int64)  # row index after each chunk
        self.starts = self.ends - [len(chunk) for chunk in chunks]
        self.offsets = [chunk.offsets.to_numpy() for chunk in chunks]  # into the chunk's (unsliced) values
        self.values = [chunk.values.to_numpy() for chunk in chunks]

    def lengths(self) -> np.ndarray:
        """(rows,) the length of every row."""
        return np.concatenate([np.diff(offsets) for offsets in self.offsets]) if self.offsets else np.zeros(0, np.int64)

    def gather(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """These rows laid end to end, and their lengths."""
        rows = np.asarray(indices, dtype=np.int64)
        chunk = np.searchsorted(self.ends, rows, side="right")
        pieces = []
        for c, i in zip(chunk.tolist(), (rows - self.starts[chunk]).tolist()):
            offsets = self.offsets[c]
            pieces.append(self.values[c][offsets[i] : offsets[i + 1]])
        lengths = np.array([len(piece) for piece in pieces], dtype=np.int64)
        return (np.concatenate(pieces) if pieces else np.zeros(0, np.int64)), lengths


class Split:
    """One encoded split, memory-mapped from the Arrow cache; the raw text is kept for BLEU references and messages."""

    def __init__(self, dataset: Any):  # a datasets.Dataset with the columns src_ids, tgt_ids, src_text, tgt_text
        self.dataset = dataset
        self.src_ids, self.tgt_ids, self.src_text, self.tgt_text = (
            Column(dataset.data.column(name)) for name in ("src_ids", "tgt_ids", "src_text", "tgt_text")
        )
        self._src_rows, self._tgt_rows = Rows(self.src_ids.array), Rows(self.tgt_ids.array)

    def __len__(self) -> int:
        return len(self.src_ids)

    def lengths(self) -> tuple[list[int], list[int]]:
        """Source and target lengths in subword tokens (without EOS/BOS), what batching needs."""
        return self._src_rows.lengths().tolist(), self._tgt_rows.lengths().tolist()

    def batch(self, indices: Sequence[int]) -> Batch:
        """The padded batch of these pairs."""
        return rows_batch(self._src_rows.gather(indices), self._tgt_rows.gather(indices))


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
    skewed = ~empty & ~too_long
    if max_ratio is None:
        skewed[:] = False
    else:
        skewed &= np.maximum(src, tgt) > max_ratio * np.minimum(src, tgt)
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


def _write_text(text: ParallelText, path: Path) -> Any:
    """Stream the pairs into an Arrow file, and memory-map it as a datasets.Dataset."""
    import datasets

    pairs = iter(text)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, TEXT_SCHEMA) as writer:
        while chunk := list(islice(pairs, ROWS_PER_CHUNK)):
            src, tgt = zip(*chunk)
            writer.write_batch(pa.record_batch([pa.array(src, pa.string()), pa.array(tgt, pa.string())], schema=TEXT_SCHEMA))
    return datasets.Dataset.from_file(str(path))


_TOKENIZERS: dict[tuple[bytes, bytes | None], Tokenizer] = {}  # one per process: datasets.map workers build theirs once


def _encode_rows(rows: dict[str, list[str]], models: tuple[bytes, bytes | None]) -> dict[str, list[list[int]]]:
    """The datasets.map function: the subword ids of a chunk of pairs."""
    tokenizer = _TOKENIZERS.get(models) or _TOKENIZERS.setdefault(models, Tokenizer(*models))
    return {"src_ids": tokenizer.encode_src(rows["src_text"]), "tgt_ids": tokenizer.encode_tgt(rows["tgt_text"])}


def _encode(tokenizer: Tokenizer, text: Any, work: Path, name: str, num_proc: int) -> Any:
    """The text dataset with its ids, encoded by up to `num_proc` processes (one per chunk at most)."""
    import datasets

    vocab = max(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
    ids = datasets.List(datasets.Value("uint16" if vocab <= 1 << 16 else "int32"))
    features = datasets.Features({"src_text": datasets.Value("string"), "tgt_text": datasets.Value("string"), "src_ids": ids, "tgt_ids": ids})
    procs = min(num_proc, math.ceil(len(text) / ROWS_PER_CHUNK))
    return text.map(
        _encode_rows, batched=True, batch_size=ROWS_PER_CHUNK, fn_kwargs={"models": (tokenizer.src_model, tokenizer.tgt_model)},
        features=features, num_proc=procs if procs > 1 else None, cache_file_name=str(work / f"{name}.ids.arrow"),
        load_from_cache_file=False, new_fingerprint=f"{name}-ids",
    )


def _build(
    path: Path, data: DataConfig, texts: dict[str, ParallelText], tokenizer: Tokenizer | None, log: Callable[[str], None]
) -> None:
    """Tokenize, encode, filter and write the cache at `path`, through a temporary folder renamed at the end."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")  # per process: two runs may fill one cache at once
    work = tmp / "work"  # intermediate Arrow files, removed before the rename
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        work.mkdir(parents=True)
        text = {name: _write_text(pairs, work / f"{name}.text.arrow") for name, pairs in texts.items()}
        if tokenizer is None:
            src, tgt = (Column(text["train"].data.column(c)) for c in ("src_text", "tgt_text"))
            tokenizer = Tokenizer.train(src, tgt, data.vocab_size, data.spm_model, data.joint_vocab, data.spm_sample)
            log(f"data: trained {data.spm_model} tokenizer, vocab {tokenizer.src_vocab_size}/{tokenizer.tgt_vocab_size}")
        else:
            log(f"data: using the checkpoint's tokenizer, vocab {tokenizer.src_vocab_size}/{tokenizer.tgt_vocab_size}")
        for side, model in tokenizer.state().items():
            (tmp / f"{side}.model").write_bytes(model)
        for name in texts:
            encoded = _encode(tokenizer, text[name], work, name, data.num_proc)
            if name == "train":
                encoded = _filter_train(encoded, data, texts["train"].origin, work, log)
            encoded.save_to_disk(str(tmp / name))
        shutil.rmtree(work)
        tmp.rename(path)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not path.is_dir():  # unless another process finished the same cache first
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _filter_train(encoded: Any, data: DataConfig, origin: str, work: Path, log: Callable[[str], None]) -> Any:
    """The training pairs the filters keep (logged with what each filter removed)."""
    keep, removed = filter_pairs(
        Rows(encoded.data.column("src_ids")).lengths(), Rows(encoded.data.column("tgt_ids")).lengths(), data.max_len, data.max_ratio
    )
    summary = ", ".join(f"{name} removed {n}" for name, n in removed.items())
    if not len(keep):
        raise NmtError(f"{origin}: no training pairs left after filtering {len(encoded)} pairs ({summary})")
    log(f"data: train {len(encoded)} pairs, kept {len(keep)} ({summary})")
    if len(keep) == len(encoded):
        return encoded
    return encoded.select(keep, indices_cache_file_name=str(work / "train.keep.arrow"), new_fingerprint="train-kept")


def _load(path: Path) -> tuple[Tokenizer, dict[str, Split]]:
    import datasets

    tgt = path / "tgt.model"
    tokenizer = Tokenizer((path / "src.model").read_bytes(), tgt.read_bytes() if tgt.exists() else None)
    splits = {name: Split(datasets.load_from_disk(str(path / name))) for name in SPLITS if (path / name).exists()}
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
