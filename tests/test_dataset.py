import pytest

from nmt.config import DataConfig
from nmt.data.dataset import filter_pairs, prepare_data
from nmt.errors import NmtError
from tests.conftest import write


def config(tmp_path, **kw) -> DataConfig:
    return DataConfig(
        train=str(tmp_path / "c"), src="en", tgt="de", vocab_size=60, cache_dir=str(tmp_path / "cache"), **kw
    )


def test_filters_count_what_they_remove():
    keep, removed = filter_pairs([1, 0, 10, 2, 1], [1, 1, 1, 9, 2], max_len=8, max_ratio=3.0)
    assert keep.tolist() == [0, 4]
    assert removed == {"empty": 1, "max_len>8": 2, "ratio>3.0": 0}


def test_empty_after_filtering_names_each_filter(tmp_path):
    write(tmp_path / "c.en", ["a b c d e f g h i j k l"] * 3 + [""])
    write(tmp_path / "c.de", ["x y z u v w a b c d e f"] * 3 + ["x"])
    with pytest.raises(NmtError) as err:
        prepare_data(config(tmp_path, max_len=2), log=lambda _: None)
    message = str(err.value)
    assert "no training pairs left after filtering 4 pairs" in message
    assert "empty removed 1" in message and "max_len>2 removed 3" in message


def test_empty_corpus(tmp_path):
    write(tmp_path / "c.en", [])
    write(tmp_path / "c.de", [])
    with pytest.raises(NmtError, match="training corpus is empty"):
        prepare_data(config(tmp_path), log=lambda _: None)


def test_cache_is_reused_until_the_text_changes(tmp_path):
    write(tmp_path / "c.en", ["the cat", "a dog", "the bird"] * 4)
    write(tmp_path / "c.de", ["die katze", "ein hund", "der vogel"] * 4)
    logs: list[str] = []
    first = prepare_data(config(tmp_path), log=logs.append)
    second = prepare_data(config(tmp_path), log=logs.append)
    assert "reusing cache" in logs[-1] and second.cache_path == first.cache_path
    assert second.splits["train"].tgt_ids[:] == first.splits["train"].tgt_ids[:]
    assert second.tokenizer.state() == first.tokenizer.state()
    write(tmp_path / "c.de", ["die katze", "ein hund", "der vogel!"] * 4)
    third = prepare_data(config(tmp_path), log=logs.append)
    assert third.cache_path != first.cache_path and "reusing" not in logs[-1]


def test_a_datasets_folder_feeds_the_pipeline(tmp_path):
    import datasets

    rows = {"translation": [{"en": f"the cat {i}", "de": f"die katze {i}"} for i in range(20)]}
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(rows), "test": datasets.Dataset.from_dict(rows)}
    ).save_to_disk(str(tmp_path / "hf"))
    cfg = DataConfig(hf=str(tmp_path / "hf"), src="en", tgt="de", vocab_size=40, cache_dir=str(tmp_path / "cache"))
    prepared = prepare_data(cfg, log=lambda _: None)
    assert set(prepared.splits) == {"train", "test"}  # no validation split in this dataset
    assert prepared.tokenizer.decode_tgt(prepared.splits["train"].tgt_ids[:1]) == ["die katze 0"]


# --- the memory-mapped cache against the in-memory lists it replaced --------------------------------
def toy_data(toy_dir, cache_dir, **kw) -> DataConfig:
    return DataConfig(
        train=str(toy_dir / "train"), valid=str(toy_dir / "valid"), vocab_size=200, cache_dir=str(cache_dir), **kw
    )


def test_memory_mapped_split_gives_the_batches_of_in_memory_lists(toy_dir, tmp_path, monkeypatch):
    """Encoding, filtering and padding by lists of Python ints (the former pipeline) give the same tensors."""
    import torch

    from nmt.data import dataset
    from nmt.data.batching import make_batch, token_batches
    from nmt.data.corpus import read_lines
    from nmt.data.tokenizer import Tokenizer

    max_len, ratio = 45, 1.8  # both filters remove some of the 3,000 toy pairs; 2,662 left
    monkeypatch.setattr(dataset, "CACHE_ROWS", 1000)  # so that batches gather rows across Arrow chunks
    prepared = prepare_data(toy_data(toy_dir, tmp_path, max_len=max_len, max_ratio=ratio), log=lambda _: None)
    src_lines, tgt_lines = read_lines(toy_dir / "train.src"), read_lines(toy_dir / "train.tgt")
    tokenizer = Tokenizer.train(src_lines, tgt_lines, 200, "unigram", joint=True)
    assert tokenizer.state() == prepared.tokenizer.state()  # trained on streamed columns as on lists
    src, tgt = tokenizer.encode_src(src_lines), tokenizer.encode_tgt(tgt_lines)
    keep = [
        i
        for i, (s, t) in enumerate(zip(src, tgt))
        if s and t and len(s) <= max_len and len(t) <= max_len and max(len(s), len(t)) <= ratio * min(len(s), len(t))
    ]
    assert 2000 < len(keep) < len(src) and prepared.splits["train"].src_ids.array.num_chunks > 1
    split = prepared.splits["train"]
    assert (
        len(split) == len(keep)
        and split.src_text[:] == [src_lines[i] for i in keep]
        and split.tgt_text[-1] == tgt_lines[keep[-1]]
    )
    src, tgt = [src[i] for i in keep], [tgt[i] for i in keep]
    assert split.lengths() == ([len(s) for s in src], [len(t) for t in tgt])
    batches = token_batches(*split.lengths(), batch_tokens=300, seed=1, epoch=2)
    assert batches == token_batches([len(s) for s in src], [len(t) for t in tgt], batch_tokens=300, seed=1, epoch=2)
    for indices in batches:
        mapped, listed = split.batch(indices), make_batch([src[i] for i in indices], [tgt[i] for i in indices])
        for name in ("src", "src_mask", "tgt_in", "tgt_out"):
            assert torch.equal(getattr(mapped, name), getattr(listed, name)), name
    valid = prepared.splits["valid"]  # not filtered
    assert valid.tgt_ids[:] == tokenizer.encode_tgt(read_lines(toy_dir / "valid.tgt"))
    rows = [7, 0, 99]
    assert torch.equal(
        valid.batch(rows).src, make_batch([valid.src_ids[i] for i in rows], [valid.tgt_ids[i] for i in rows]).src
    )


def test_two_processes_prepare_the_same_cache_as_one(toy_dir, tmp_path, monkeypatch):
    import datasets

    procs: list = []
    real_map = datasets.Dataset.map
    monkeypatch.setattr(
        datasets.Dataset, "map", lambda self, *a, **kw: (procs.append(kw["num_proc"]), real_map(self, *a, **kw))[1]
    )
    one = prepare_data(toy_data(toy_dir, tmp_path / "one", num_proc=1), log=lambda _: None)
    two = prepare_data(toy_data(toy_dir, tmp_path / "two", num_proc=2), log=lambda _: None)
    assert procs == [None, None, 2, None]  # train (3,000 pairs) in two processes; valid (100) in one
    assert one.cache_path.name == two.cache_path.name  # num_proc is not part of the cache key
    assert one.tokenizer.state() == two.tokenizer.state()
    for file in ("train.arrow", "train.text.arrow", "valid.arrow", "valid.text.arrow"):
        a, b = (datasets.Dataset.from_file(str(p.cache_path / file)).data.table for p in (one, two))
        assert a.num_rows == len(one.splits[file.split(".")[0]]) and a.equals(b), file
