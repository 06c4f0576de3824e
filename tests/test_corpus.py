import gzip
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nmt.data.corpus import read_jsonl, read_lines, read_parallel, read_text_pair, read_tsv
from nmt.errors import NmtError
from tests.conftest import write


def test_text_pair_plain_and_gzip(tmp_path):
    write(tmp_path / "c.en", ["a b", "c"])
    (tmp_path / "c.de.gz").write_bytes(gzip.compress(b"x y\nz\n"))
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
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(rows), "validation": datasets.Dataset.from_dict(rows)}
    ).save_to_disk(str(tmp_path / "hf"))
    assert read_hf(str(tmp_path / "hf"), "valid", "en", "de").tgt == ["x", "y"]
    with pytest.raises(NmtError, match="no test split"):
        read_hf(str(tmp_path / "hf"), "test", "en", "de")


# --- properties: whatever Unicode text is written, one line per "\n" reads back unchanged ------------
# Any character but "\n" (and lone surrogates, which UTF-8 cannot encode), with the other line breaks
# str.splitlines() would split on (\r, \u2028, \u2029, \x85, \x0b, \x0c, \x1c) and a BOM drawn often.
CHARS = st.one_of(
    st.characters(exclude_categories=("Cs",), exclude_characters="\n"),
    st.sampled_from("\r\t\u2028\u2029\x85\x0b\x0c\x1c\ufeff "),
)
LINE = st.text(CHARS, max_size=30).filter(
    lambda line: not line.endswith("\r")
)  # a final "\r" is read as part of "\r\n"
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(lines=st.lists(LINE, max_size=12), crlf=st.booleans(), gz=st.booleans(), final_newline=st.booleans())
def test_any_unicode_lines_read_back_line_for_line(tmp_path, lines, crlf, gz, final_newline):
    end = "\r\n" if crlf else "\n"
    text = "".join(line + end for line in lines)
    if not final_newline and lines and lines[-1]:
        text = text[: -len(end)]  # no newline after the last line
    data = text.encode("utf-8")
    path = tmp_path / ("c.txt.gz" if gz else "c.txt")
    path.write_bytes(gzip.compress(data) if gz else data)
    assert read_lines(path) == lines


FIELD = st.text(CHARS.filter(lambda c: c != "\t"), max_size=20)


@SETTINGS
@given(pairs=st.lists(st.tuples(FIELD, FIELD.filter(lambda t: not t.endswith("\r"))), max_size=10))
def test_any_unicode_tsv_pairs_read_back(tmp_path, pairs):
    (tmp_path / "c.tsv").write_bytes("".join(f"{s}\t{t}\n" for s, t in pairs).encode("utf-8"))
    text = read_tsv(tmp_path / "c.tsv")
    assert list(zip(text.src, text.tgt)) == pairs


@pytest.mark.parametrize("data", [b"a\r\n\nb \xce\xb1\n", b"a\n\nb \xce\xb1", "a\u2028x\n".encode(), b"", b"\n\n"])
def test_streamed_lines_equal_read_lines(tmp_path, data):
    from nmt.data.corpus import iter_lines

    (tmp_path / "f.txt").write_bytes(data)
    (tmp_path / "f.txt.gz").write_bytes(gzip.compress(data))
    assert (
        list(iter_lines(tmp_path / "f.txt"))
        == read_lines(tmp_path / "f.txt")
        == list(iter_lines(tmp_path / "f.txt.gz"))
    )


def test_streamed_lines_name_a_bad_line_and_a_missing_file(tmp_path):
    from nmt.data.corpus import iter_lines

    (tmp_path / "f.txt").write_bytes(b"ok\nok\nbad \xff\n")
    lines = iter_lines(tmp_path / "f.txt")
    assert next(lines) == "ok"
    with pytest.raises(NmtError, match=r"f.txt:3: invalid UTF-8"):
        list(lines)
    with pytest.raises(NmtError, match="file not found"):
        iter_lines(tmp_path / "missing.txt")  # at once, before the first line is asked for
