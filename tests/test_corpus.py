import gzip
import json

import pytest

from nmt.data.corpus import read_jsonl, read_lines, read_parallel, read_text_pair, read_tsv
from nmt.errors import NmtError
from tests.conftest import write


def test_text_pair_plain_and_gzip(tmp_path):
    write(tmp_path / "c.en", ["a b", "c"])
    (tmp_path / "c.de.gz").write_bytes(gzip.compress("x y\nz\n".encode()))
    text = read_text_pair(str(tmp_path / "c"), "en", "de")
    assert text.src == ["a b", "c"] and text.tgt == ["x y", "z"]


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    write(tmp_path / "c.en", ["a", "b", "c"])
    write(tmp_path / "c.de", ["x", "y"])
    with pytest.raises(NmtError) as err:
        read_text_pair(str(tmp_path / "c"), "en", "de")
    message = str(err.value)
    assert "c.en has 3 lines" in message and "c.de has 2" in message


def test_invalid_utf8_names_file_and_line(tmp_path):
    (tmp_path / "bad.en").write_bytes(b"fine\nalso fine\nbad \xff byte\n")
    with pytest.raises(NmtError, match=r"bad\.en:3: invalid UTF-8"):
        read_lines(tmp_path / "bad.en")


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(NmtError, match="nope.en: file not found"):
        read_lines(tmp_path / "nope.en")
    with pytest.raises(NmtError, match="is a directory"):
        read_lines(tmp_path)


def test_lines_split_on_newline_only(tmp_path):
    (tmp_path / "u.txt").write_bytes("one\u2028still one\r\ntwo\n\nfour".encode())
    assert read_lines(tmp_path / "u.txt") == ["one\u2028still one", "two", "", "four"]


def test_tsv_and_jsonl(tmp_path):
    write(tmp_path / "c.tsv", ["hello\thallo", "cat\tkatze"])
    assert read_parallel(str(tmp_path / "c.tsv"), "en", "de").tgt == ["hallo", "katze"]
    write(tmp_path / "bad.tsv", ["hello\thallo", "no tab here"])
    with pytest.raises(NmtError, match=r"bad\.tsv:2: expected 2 tab-separated fields"):
        read_tsv(tmp_path / "bad.tsv")
    rows = [{"en": "hi", "de": "hallo"}, {"translation": {"en": "cat", "de": "Katze"}}]
    write(tmp_path / "c.jsonl", [json.dumps(r) for r in rows])
    text = read_parallel(str(tmp_path / "c.jsonl"), "en", "de")
    assert text.src == ["hi", "cat"] and text.tgt == ["hallo", "Katze"]
    write(tmp_path / "bad.jsonl", [json.dumps(rows[0]), json.dumps({"en": "only"})])
    with pytest.raises(NmtError, match=r'bad\.jsonl:2: expected an object with string fields "en" and "de"'):
        read_jsonl(tmp_path / "bad.jsonl", "en", "de")


def test_hf_dataset_from_local_folder(tmp_path):
    import datasets

    from nmt.data.corpus import read_hf

    rows = {"translation": [{"en": "a", "de": "x"}, {"en": "b", "de": "y"}]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows), "validation": datasets.Dataset.from_dict(rows)}).save_to_disk(
        str(tmp_path / "hf")
    )
    assert read_hf(str(tmp_path / "hf"), "valid", "en", "de").tgt == ["x", "y"]
    with pytest.raises(NmtError, match="no test split"):
        read_hf(str(tmp_path / "hf"), "test", "en", "de")


@pytest.mark.parametrize("data", [b"a\r\n\nb \xce\xb1\n", b"a\n\nb \xce\xb1", "a\u2028x\n".encode(), b"", b"\n\n"])
def test_streamed_lines_equal_read_lines(tmp_path, data):
    from nmt.data.corpus import iter_lines

    (tmp_path / "f.txt").write_bytes(data)
    (tmp_path / "f.txt.gz").write_bytes(gzip.compress(data))
    assert list(iter_lines(tmp_path / "f.txt")) == read_lines(tmp_path / "f.txt") == list(iter_lines(tmp_path / "f.txt.gz"))


def test_streamed_lines_name_a_bad_line_and_a_missing_file(tmp_path):
    from nmt.data.corpus import iter_lines

    (tmp_path / "f.txt").write_bytes(b"ok\nok\nbad \xff\n")
    lines = iter_lines(tmp_path / "f.txt")
    assert next(lines) == "ok"
    with pytest.raises(NmtError, match=r"f.txt:3: invalid UTF-8"):
        list(lines)
    with pytest.raises(NmtError, match="file not found"):
        iter_lines(tmp_path / "missing.txt")  # at once, before the first line is asked for
