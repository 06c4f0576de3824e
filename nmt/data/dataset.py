"""From a data config to encoded train/valid/test splits, cached on disk with `datasets`.

The cache key hashes the raw text of every split with the tokenizer and filter settings, so a second
run (or `nmt-prepare` ahead of training) reuses the tokenizer and the Arrow files when nothing changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from nmt.config import DataConfig
from nmt.data.batching import Batch, make_batch
from nmt.data.corpus import ParallelText, read_hf, read_parallel, side_path
from nmt.data.synthetic import generate_toy_corpus
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError

CACHE_VERSION = "1"
SPLITS = ("train", "valid", "test")


@dataclass
class Split:
    """One encoded split; the raw text is kept for BLEU references and messages."""

    src_ids: list[list[int]]
    tgt_ids: list[list[int]]
    src_text: list[str]
    tgt_text: list[str]

    def __len__(self) -> int:
        return len(self.src_ids)

    def lengths(self) -> tuple[list[int], list[int]]:
        """Source and target lengths in subword tokens (without EOS/BOS), what batching needs."""
        return [len(s) for s in self.src_ids], [len(t) for t in self.tgt_ids]

    def batch(self, indices: list[int]) -> Batch:
        """The padded batch of these pairs."""
        return make_batch([self.src_ids[i] for i in indices], [self.tgt_ids[i] for i in indices])


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
    """The raw text of one split, or None when the config names none."""
    if data.hf is not None:
        return read_hf(data.hf, split, data.src, data.tgt, optional=split != "train")
    spec = {"train": data.train, "valid": data.valid, "test": data.test}[split]
    return None if spec is None else read_parallel(spec, data.src, data.tgt)


def filter_pairs(
    src: list[list[int]], tgt: list[list[int]], max_len: int, max_ratio: float | None
) -> tuple[list[int], dict[str, int]]:
    """Indices of the pairs kept, and how many pairs each filter removed (applied in order)."""
    removed = {"empty": 0, f"max_len>{max_len}": 0, f"ratio>{max_ratio}": 0}
    keep = []
    for i, (s, t) in enumerate(zip(src, tgt)):
        if not s or not t:
            removed["empty"] += 1
        elif len(s) > max_len or len(t) > max_len:
            removed[f"max_len>{max_len}"] += 1
        elif max_ratio is not None and max(len(s), len(t)) > max_ratio * min(len(s), len(t)):
            removed[f"ratio>{max_ratio}"] += 1
        else:
            keep.append(i)
    return keep, removed


def _cache_key(data: DataConfig, texts: dict[str, ParallelText], tokenizer: Tokenizer | None = None) -> str:
    settings = {k: v for k, v in asdict(data).items() if k in ("max_len", "max_ratio", "vocab_size", "spm_model", "joint_vocab")}
    digest = hashlib.sha256(json.dumps([CACHE_VERSION, settings], sort_keys=True).encode())
    for model in (tokenizer.state().values() if tokenizer is not None else ()):
        digest.update(model)
    for split in SPLITS:
        if split in texts:
            digest.update(split.encode())
            for side in (texts[split].src, texts[split].tgt):
                digest.update("\n".join(side).encode("utf-8", "surrogatepass"))
                digest.update(b"\0")
    return digest.hexdigest()[:16]


def _encode(tokenizer: Tokenizer, text: ParallelText) -> Split:
    return Split(tokenizer.encode_src(text.src), tokenizer.encode_tgt(text.tgt), text.src, text.tgt)


def _save(path: Path, tokenizer: Tokenizer, splits: dict[str, Split]) -> None:
    import datasets

    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")  # per process: two runs may fill one cache at once
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        for side, model in tokenizer.state().items():
            (tmp / f"{side}.model").write_bytes(model)
        for name, split in splits.items():
            columns = {"src_ids": split.src_ids, "tgt_ids": split.tgt_ids, "src_text": split.src_text, "tgt_text": split.tgt_text}
            datasets.Dataset.from_dict(columns).save_to_disk(str(tmp / name))
        tmp.rename(path)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not path.is_dir():  # unless another process finished the same cache first
            raise


def _load(path: Path) -> tuple[Tokenizer, dict[str, Split]]:
    import datasets

    tgt = path / "tgt.model"
    tokenizer = Tokenizer((path / "src.model").read_bytes(), tgt.read_bytes() if tgt.exists() else None)
    splits = {}
    for name in SPLITS:
        if (path / name).exists():
            table = datasets.load_from_disk(str(path / name))
            splits[name] = Split(table["src_ids"], table["tgt_ids"], table["src_text"], table["tgt_text"])
    return tokenizer, splits


def _holds_tokenizer(path: Path, tokenizer: Tokenizer) -> bool:
    """Whether the cache at `path` was encoded with exactly this tokenizer."""
    return all((path / f"{side}.model").is_file() and (path / f"{side}.model").read_bytes() == model for side, model in tokenizer.state().items())


def prepare_data(data: DataConfig, log: Callable[[str], None] = print, tokenizer: Tokenizer | None = None) -> PreparedData:
    """Read, validate, tokenize, filter and cache the splits a data config names.

    A given `tokenizer` (a checkpoint's, on resume or init_from) is used instead of training one.
    """
    import datasets

    datasets.disable_progress_bars()
    ensure_synthetic(data)
    texts = {s: t for s in SPLITS if (t := read_split(data, s)) is not None}
    if not texts["train"].src:
        raise NmtError(f"{texts['train'].origin}: the training corpus is empty")
    path = Path(data.cache_dir) / _cache_key(data, texts)
    if tokenizer is not None and not (path.exists() and _holds_tokenizer(path, tokenizer)):
        path = Path(data.cache_dir) / _cache_key(data, texts, tokenizer)
    if path.exists():
        tokenizer, splits = _load(path)
        log(f"data: reusing cache {path} ({', '.join(f'{k} {len(v)}' for k, v in splits.items())} pairs)")
        return PreparedData(tokenizer, splits, path)

    train = texts["train"]
    if tokenizer is None:
        tokenizer = Tokenizer.train(train.src, train.tgt, data.vocab_size, data.spm_model, data.joint_vocab)
        log(f"data: trained {data.spm_model} tokenizer, vocab {tokenizer.src_vocab_size}/{tokenizer.tgt_vocab_size}")
    else:
        log(f"data: using the checkpoint's tokenizer, vocab {tokenizer.src_vocab_size}/{tokenizer.tgt_vocab_size}")
    splits = {name: _encode(tokenizer, text) for name, text in texts.items()}
    encoded = splits["train"]
    keep, removed = filter_pairs(encoded.src_ids, encoded.tgt_ids, data.max_len, data.max_ratio)
    summary = ", ".join(f"{name} removed {n}" for name, n in removed.items())
    if not keep:
        raise NmtError(f"{train.origin}: no training pairs left after filtering {len(encoded)} pairs ({summary})")
    log(f"data: train {len(encoded)} pairs, kept {len(keep)} ({summary})")
    splits["train"] = Split(*([column[i] for i in keep] for column in (encoded.src_ids, encoded.tgt_ids, train.src, train.tgt)))
    try:
        _save(path, tokenizer, splits)
    except OSError as err:
        raise NmtError(f"data.cache_dir={data.cache_dir}: cannot write the dataset cache ({err.strerror or err})") from None
    return PreparedData(tokenizer, splits, path)
