"""No command writes over one of its inputs or another of its outputs: refused, before anything is written."""

import os

import pytest

from nmt.cli import average, evaluate, translate
from nmt.errors import NmtError
from nmt.fileio import check_outputs
from tests.test_cli import TINY, cli, toy_overrides
from tests.test_errors import one_error_line


def test_check_outputs_resolves_symlinks_relative_paths_and_kinds(tmp_path, monkeypatch):
    source = tmp_path / "in.txt"
    source.write_text("a\n")
    (tmp_path / "link.txt").symlink_to(source)
    (tmp_path / "folder").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NmtError, match="output=link.txt: is the input input="):
        check_outputs({"input": str(source)}, {"output": "link.txt"})
    with pytest.raises(NmtError, match="output=in.txt: is the input input=in.txt"):  # ./in.txt: the same file
        check_outputs({"input": "in.txt"}, {"output": "./in.txt"})
    with pytest.raises(NmtError, match="output=out.txt and attention_out=out.txt are the same path"):
        check_outputs({"input": "in.txt"}, {"output": "out.txt", "attention_out": "./out.txt"})
    with pytest.raises(NmtError, match="output=folder: is a folder, expected a file name"):
        check_outputs({}, {"output": "folder"})
    with pytest.raises(NmtError, match="plot_dir=in.txt: is a file, expected a folder"):
        check_outputs({}, {"plot_dir": "in.txt"}, folders=("plot_dir",))
    with pytest.raises(NmtError, match="out=.: holds the input checkpoint="):
        check_outputs({"checkpoint": "in.txt"}, {"out": "."}, folders=("out",))
    os.link(source, tmp_path / "hard.txt")
    with pytest.raises(NmtError, match="is the input"):
        check_outputs({"input": "in.txt"}, {"output": "hard.txt"})
    check_outputs({"input": "in.txt"}, {"output": "new.txt", "plot_dir": "plots"}, folders=("plot_dir",))  # fine


@pytest.fixture(scope="module")
def run_dir(toy_dir, tmp_path_factory):
    from nmt.cli import train

    run = tmp_path_factory.mktemp("outputs") / "run"
    with pytest.raises(SystemExit):
        from nmt.cli.common import run as run_main

        run_main(
            train.main,
            [
                *toy_overrides(toy_dir),
                *TINY,
                f"run_dir={run}",
                "train.max_steps=2",
                "train.save_every=1",
                "train.valid_every=2",
                f"data.cache_dir={run.parent}/cache",
            ],
        )
    return run


def test_commands_refuse_to_overwrite_their_inputs(run_dir, toy_dir, tmp_path, capsys):
    source = tmp_path / "src.txt"
    source.write_text((toy_dir / "test.src").read_text())
    before = source.read_text()
    code, _, err = cli(translate.main, [f"checkpoint={run_dir}", f"input={source}", f"output={source}"], capsys)
    one_error_line(code, err, f"error: output={source}: is the input input={source}")
    assert source.read_text() == before
    code, _, err = cli(
        translate.main,
        [f"checkpoint={run_dir}", f"input={source}", f"output={tmp_path}/o.txt", f"attention_out={tmp_path}/o.txt"],
        capsys,
    )
    one_error_line(code, err, "are the same path")
    best = run_dir / "checkpoints" / "best.pt"
    code, _, err = cli(translate.main, [f"checkpoint={run_dir}", f"input={source}", f"output={best.resolve()}"], capsys)
    one_error_line(code, err, "is the input checkpoint=")
    code, _, err = cli(evaluate.main, [f"hyp={source}", f"ref={toy_dir}/test.tgt", f"hyp_out={source}"], capsys)
    one_error_line(code, err, f"error: hyp_out={source}: is the input hyp={source}")
    newest = sorted((run_dir / "checkpoints").glob("step_*.pt"))[-1]
    code, _, err = cli(average.main, [f"run={run_dir}", "last=2", f"output={newest}"], capsys)
    one_error_line(code, err, f"error: output={newest}: is the input run=")


def test_a_folder_setting_given_a_file_is_one_line(tmp_path, capsys):
    """run_dir= and out= name folders; a file there is refused before any work, naming the key."""
    from nmt.cli import compare, train
    from tests.test_cli import cli
    from tests.test_errors import one_error_line

    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    code, _, err = cli(compare.main, ["experiment=compare_attention_toy", f"out={afile}"], capsys)
    one_error_line(code, err, f"error: out={afile}: is a file, expected a folder")
    code, _, err = cli(train.main, ["experiment=quickstart", f"run_dir={afile}", "data.root=/nonexistent"], capsys)
    one_error_line(code, err, f"error: run_dir={afile}: is a file, expected a folder")
    from nmt.errors import NmtError
    from nmt.fileio import atomic_open

    try:
        with atomic_open(afile / "x", key="output"):
            pass
    except NmtError as err:
        assert str(err) == f"output={afile}/x: directory {afile} is a file, not a directory"
    assert afile.read_text() == "mine\n"
