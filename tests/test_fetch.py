"""Getting Multi30k: nmt-prepare downloads the missing release files into data.root (from a local
`file://` mirror here: tests never use the network); offline, the message says what to put where."""

import gzip

import pytest

from nmt.cli import prepare, train
from tests.test_cli import cli
from tests.test_errors import one_error_line


@pytest.fixture
def mirror(tmp_path, toy_dir, monkeypatch):
    """A folder laid out like the release (train/val/test_2016_flickr.{en,de}.gz) served as NMT_MULTI30K_URL."""
    folder = tmp_path / "mirror"
    folder.mkdir()
    for split, toy, n in (("train", "train", 300), ("val", "valid", 20), ("test_2016_flickr", "test", 20)):
        for lang, side in (("en", "src"), ("de", "tgt")):
            lines = (toy_dir / f"{toy}.{side}").read_text().splitlines()[:n]
            (folder / f"{split}.{lang}.gz").write_bytes(gzip.compress("".join(line + "\n" for line in lines).encode()))
    monkeypatch.setenv("NMT_MULTI30K_URL", folder.as_uri())
    return folder


def test_prepare_downloads_then_prepares(mirror, tmp_path, capsys):
    root = tmp_path / "m30k"
    argv = ["data=multi30k_en_de", f"data.root={root}", f"data.cache_dir={tmp_path}/cache", "data.vocab_size=100"]
    code, out, err = cli(prepare.main, argv, capsys)
    assert code == 0, err
    assert sorted(p.name for p in root.iterdir()) == sorted(p.name for p in mirror.iterdir())
    assert (root / "train.de.gz").read_bytes() == (mirror / "train.de.gz").read_bytes()
    assert "train: 300 pairs" in out and "valid: 20 pairs" in out and "test: 20 pairs" in out
    code, out, err = cli(prepare.main, argv, capsys)  # a second time: nothing to download
    assert code == 0 and "downloading" not in out + err


def test_offline_says_what_to_download_and_where(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NMT_MULTI30K_URL", (tmp_path / "nowhere").as_uri())
    code, _, err = cli(prepare.main, ["data=multi30k_en_de", f"data.root={tmp_path}/m30k"], capsys)
    one_error_line(
        code,
        err,
        "train.en.gz: cannot download",
        "to use Multi30k offline, download train.en.gz, train.de.gz, val.en.gz",
        f"and put them in {tmp_path}/m30k",
    )
    assert not list((tmp_path / "m30k").iterdir())  # no half-written file


def test_train_without_the_corpus_points_at_nmt_prepare(tmp_path, capsys):
    code, _, err = cli(
        train.main, ["data=multi30k_en_de", f"data.root={tmp_path}/none", f"run_dir={tmp_path}/run"], capsys
    )
    one_error_line(
        code,
        err,
        f"data.root={tmp_path}/none: Multi30k is not there; run `nmt-prepare data=multi30k_en_de` once to download it",
    )
    assert not (tmp_path / "run").exists()
