"""Data-parallel training that survives: rank 0's slow data preparation does not time the others out, its failure
stops them with its own error, and a rank lost mid-run (SIGKILL) is survived by torchrun --max-restarts and
resume=auto, ending where an uninterrupted run ends."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from nmt.errors import NmtError
from nmt.training import trainer as trainer_module
from nmt.training.trainer import Trainer
from tests.conftest import tiny_config
from tests.test_cli import TINY, toy_overrides
from tests.test_resume import needs_fork, two_ranks

ROOT = Path(__file__).resolve().parents[1]


@needs_fork
def test_slow_data_preparation_on_rank_0_outlasts_the_collective_timeout(toy_dir, tmp_path):
    cache = tmp_path / "cache"
    settings = dict(max_steps=2, valid_every=100, save_every=100, threads=1, dist_timeout_min=0.05)  # 3 s

    def work(rank):
        if rank == 0:
            prepare = trainer_module.prepare_data

            def slow(*args, **kwargs):
                time.sleep(8)  # longer than the 3-second timeout a collective would wait
                return prepare(*args, **kwargs)

            trainer_module.prepare_data = slow
        Trainer(tiny_config(toy_dir, cache, **settings), tmp_path / "run", log=lambda line: None).fit()
        os._exit(0)

    assert two_ranks(work) == [0, 0]
    assert json.loads((tmp_path / "run" / "results.json").read_text())["steps"] == 2
    assert not list(cache.glob(".rank0-*"))  # the markers are removed


@needs_fork
def test_a_data_error_on_rank_0_stops_the_other_with_the_same_error(toy_dir, tmp_path):
    cache = tmp_path / "cache"
    messages = {rank: tmp_path / f"error{rank}.txt" for rank in (0, 1)}

    def work(rank):
        if rank == 0:

            def broken(*args, **kwargs):
                raise NmtError("data.train=corpus.tsv: line 7: 2 fields, expected source<TAB>target")

            trainer_module.prepare_data = broken
        try:
            Trainer(tiny_config(toy_dir, cache, max_steps=2, threads=1), tmp_path / "run", log=lambda line: None)
        except NmtError as err:
            messages[rank].write_text(str(err))
            os._exit(2)
        os._exit(0)

    started = time.monotonic()
    assert two_ranks(work) == [2, 2]
    assert time.monotonic() - started < 120  # not a collective timeout
    assert (
        messages[0].read_text()
        == messages[1].read_text()
        == ("data.train=corpus.tsv: line 7: 2 fields, expected source<TAB>target")
    )


def torchrun(args: list[str], env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.skipif(shutil.which("true") is None, reason="needs a POSIX system")
def test_a_rank_killed_mid_run_is_restarted_and_the_run_ends_as_if_uninterrupted(toy_dir, tmp_path):
    overrides = [
        *toy_overrides(toy_dir),
        *TINY,
        f"data.cache_dir={tmp_path}/cache",
        "train.max_steps=12",
        "train.save_every=4",
        "train.valid_every=100",
        "train.batch_tokens=300",
        "train.threads=1",
        "model.dropout=0.1",  # dropout: the RNG states must be restored too
        "resume=auto",
    ]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    worker = str(ROOT / "tests" / "helpers" / "elastic_worker.py")
    whole = torchrun([worker, *overrides, f"run_dir={tmp_path}/whole"], env)
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = torchrun(
        ["--max-restarts=1", worker, *overrides, f"run_dir={tmp_path}/killed"], env | {"NMT_TEST_KILL_AT": "6"}
    )
    assert killed.returncode == 0, killed.stderr[-3000:]
    log = (tmp_path / "killed" / "train.log").read_text()
    assert "resumed from" in log and "at step 4" in log  # the restart continued from the last checkpoint
    a = torch.load(tmp_path / "whole" / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "killed" / "checkpoints" / "last.pt", weights_only=True)
    assert a["step"] == b["step"] == 12
    for key, value in a["model"].items():
        assert torch.equal(b["model"][key], value), key  # bit-identical on CPU


@needs_fork
def test_validation_best_checkpoint_early_stopping_and_max_time_agree_across_ranks(toy_dir, tmp_path):
    """One 2-process run that validates every 2 updates (BLEU on rank 0 alone), keeps the best checkpoint, and stops
    by patience or by train.max_time, whichever comes first: both ranks stop at the same update and agree on it."""
    cache = tmp_path / "cache"
    settings = dict(
        max_steps=400,
        valid_every=2,
        save_every=100,
        valid_bleu_sentences=8,
        early_stop_metric="bleu",
        patience=3,
        max_time=0.1,
        budget_clock="wall",
        threads=1,
        lr=3e-3,
        warmup=2,
    )
    steps = {rank: tmp_path / f"steps{rank}.txt" for rank in (0, 1)}

    def work(rank):
        trainer = Trainer(tiny_config(toy_dir, cache, **settings), tmp_path / "run", log=lambda line: None)
        results = trainer.fit()
        steps[rank].write_text(str(trainer.step))
        os._exit(0 if results["steps"] == trainer.step else 1)

    assert two_ranks(work) == [0, 0]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert steps[0].read_text() == steps[1].read_text() == str(results["steps"])  # the same stop on both
    assert results["steps"] < 400 and (results["early_stopped"] or results["timed_out"])
    log = (tmp_path / "run" / "train.log").read_text()
    validations = log.count("| valid loss")
    assert validations >= 3 and validations == results["steps"] // 2  # every 2 updates, once each, by rank 0
    best = torch.load(tmp_path / "run" / "checkpoints" / "best.pt", weights_only=True)
    assert best["step"] == results["best"]["step"] and results["best"]["metric"] == "bleu"
