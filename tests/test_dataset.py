import pytest

from nmt.config import DataConfig
from nmt.data.dataset import filter_pairs, prepare_data
from nmt.errors import NmtError
from tests.conftest import write


def config(tmp_path, **kw) -> DataConfig:
    return DataConfig(train=str(tmp_path / "c"), src="en", tgt="de", vocab_size=60, cache_dir=str(tmp_path / "cache"), **kw)


def test_filters_count_what_they_remove():
    src = [[5], [], [5] * 10, [5, 6], [5]]
    tgt = [[7], [7], [7], [7] * 9, [7, 8]]
    keep, removed = filter_pairs(src, tgt, max_len=8, max_ratio=3.0)
    assert keep == [0, 4]
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
    assert second.splits["train"].tgt_ids == first.splits["train"].tgt_ids
    assert second.tokenizer.state() == first.tokenizer.state()
    write(tmp_path / "c.de", ["die katze", "ein hund", "der vogel!"] * 4)
    third = prepare_data(config(tmp_path), log=logs.append)
    assert third.cache_path != first.cache_path and "reusing" not in logs[-1]


def test_a_datasets_folder_feeds_the_pipeline(tmp_path):
    import datasets

    rows = {"translation": [{"en": f"the cat {i}", "de": f"die katze {i}"} for i in range(20)]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows), "test": datasets.Dataset.from_dict(rows)}).save_to_disk(
        str(tmp_path / "hf")
    )
    cfg = DataConfig(hf=str(tmp_path / "hf"), src="en", tgt="de", vocab_size=40, cache_dir=str(tmp_path / "cache"))
    prepared = prepare_data(cfg, log=lambda _: None)
    assert set(prepared.splits) == {"train", "test"}  # no validation split in this dataset
    assert prepared.tokenizer.decode_tgt(prepared.splits["train"].tgt_ids[:1]) == ["die katze 0"]
