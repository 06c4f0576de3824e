"""resume=auto: the same command, run again after a restart (torchrun --max-restarts), continues the run."""

import json

from nmt.cli import train
from tests.test_cli import TINY, cli, toy_overrides
from tests.test_errors import one_error_line


def test_resume_auto_starts_then_continues_the_same_run(toy_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = [*toy_overrides(toy_dir), *TINY, f"run_dir={run_dir}", f"data.cache_dir={tmp_path}/cache", "resume=auto"]
    code, _, err = cli(train.main, argv + ["train.max_steps=4"], capsys)
    assert code == 0, err
    assert json.loads((run_dir / "results.json").read_text())["steps"] == 4
    code, _, err = cli(train.main, argv + ["train.max_steps=8"], capsys)  # the same command line, a larger budget
    assert code == 0, err
    assert json.loads((run_dir / "results.json").read_text())["steps"] == 8
    assert f"resumed from {run_dir}/checkpoints/last.pt at step 4" in (run_dir / "train.log").read_text()


def test_resume_auto_needs_a_run_dir(capsys):
    code, _, err = cli(train.main, ["resume=auto"], capsys)
    one_error_line(code, err, "error: resume=auto needs run_dir=DIR")
