"""Crashes: a run killed with SIGKILL and resumed ends bit-identical to an uninterrupted one; a kill during a save
leaves the previous checkpoint whole."""

import os
import signal
import stat
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.utils.tensorboard  # noqa: F401  (imported once here rather than in every forked run)

from nmt.cli import train
from nmt.cli.common import run
from nmt.training.checkpoint import load_checkpoint, write_payload
from nmt.training.trainer import Trainer
from tests.conftest import run_args
from tests.test_cli import cli


def fork(work) -> int:
    """Run `work()` in a forked child process (quiet, one torch thread); returns its pid.

    Forking skips a fresh interpreter's imports, which would take most of these tests' time. The child
    avoids OpenMP trouble after fork by staying on one thread, as torch's DataLoader workers do.
    """
    pid = os.fork()
    if pid:
        return pid
    try:
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        sys.stdout = sys.stderr = open(os.devnull, "w")
        torch.set_num_threads(1)
        work()
    finally:
        os._exit(1)


def wait(pid: int, timeout: float = 300) -> int:
    """The child's exit code (negative: the signal that ended it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"child {pid} did not finish in {timeout} s")


def two_ranks(work_for_rank, port: int | None = None) -> list[int]:
    """Run work_for_rank(rank) in two forked processes set up as torchrun would; their exit codes."""
    port = 29600 + os.getpid() % 1000 if port is None else port
    children = []
    for rank in (0, 1):

        def work(rank=rank):
            os.environ.update(
                RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
            )
            work_for_rank(rank)

        children.append(fork(work))
    return [wait(pid, timeout=240) for pid in children]


def killed_run(args: list[str], kill_at: int) -> int:
    """nmt-train in a child process that SIGKILLs itself just before update number `kill_at`."""

    def work():
        update = Trainer.train_step

        def train_step(self, batches, tokens=None):
            if self.step + 1 == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return update(self, batches, tokens)

        Trainer.train_step = train_step
        run(train.main, args)

    return fork(work)


def final_state(run_dir: Path) -> dict:
    payload = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    return {
        "step": payload["step"],
        "model": payload["model"],
        "optimizer": payload["train_state"]["optimizer"]["state"],
    }


def assert_identical(a: dict, b: dict) -> None:
    assert a["step"] == b["step"]
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    for index, state in a["optimizer"].items():
        for key, value in state.items():
            assert torch.equal(value, b["optimizer"][index][key]), (index, key)


needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="the kill tests fork child processes (POSIX only)")


@needs_fork
def test_killed_and_resumed_runs_end_bit_identical(small_corpus, tmp_path, capsys):
    kills = {11: 10, 19: None}  # kill before update 11 (just after the checkpoint of step 10), and mid-way before 19
    children = {at: killed_run(run_args(small_corpus) + [f"run_dir={tmp_path / f'killed{at}'}"], at) for at in kills}
    threads = torch.get_num_threads()
    try:
        code, _, err = cli(
            train.main, run_args(small_corpus) + [f"run_dir={tmp_path / 'whole'}"], capsys
        )  # meanwhile, uninterrupted
        assert code == 0, err
        reference = final_state(tmp_path / "whole")
        for kill_at, checkpoint_step in kills.items():
            assert wait(children.pop(kill_at)) == -signal.SIGKILL
            run_dir = tmp_path / f"killed{kill_at}"
            assert not (run_dir / "results.json").exists()
            resumed_from = load_checkpoint(run_dir / "checkpoints" / "last.pt")["step"]
            assert resumed_from < kill_at - 1 if checkpoint_step is None else resumed_from == checkpoint_step
            code, out, err = cli(train.main, [f"resume={run_dir}"], capsys)
            assert code == 0, err
            assert f"resumed from {run_dir}/checkpoints/last.pt at step {resumed_from}" in out
            assert_identical(reference, final_state(run_dir))
    finally:
        torch.set_num_threads(threads)
        for pid in children.values():
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


@needs_fork
def test_a_kill_during_a_save_leaves_the_previous_checkpoint_whole(tmp_path):
    path = tmp_path / "last.pt"

    def save_forever():  # a checkpoint of about 40 MB, saved over and over
        fsync = os.fsync

        def slow_fsync(fd: int) -> None:  # from the second save on, the kill comes before the rename
            if path.exists() and stat.S_ISREG(os.fstat(fd).st_mode):
                time.sleep(60)
            fsync(fd)

        os.fsync = slow_fsync
        for n in range(1, 1000):
            write_payload(
                path,
                {
                    "format": "nmt-checkpoint",
                    "model": {"w": torch.full((10_000_000,), float(n))},
                    "config": "",
                    "tokenizer": {},
                    "step": n,
                },
            )

    child = fork(save_forever)
    try:
        temporary = tmp_path / f".last.pt.tmp{child}"
        deadline = time.monotonic() + 60
        while not (
            path.exists() and temporary.exists() and temporary.stat().st_size > 0
        ):  # the second save is under way
            assert time.monotonic() < deadline
            time.sleep(0.001)
        os.kill(child, signal.SIGKILL)
    finally:
        os.kill(child, signal.SIGKILL)
        assert wait(child) == -signal.SIGKILL
    assert temporary.exists()  # killed in the middle of a save
    payload = load_checkpoint(path)
    assert payload["step"] >= 1 and torch.equal(
        payload["model"]["w"], torch.full((10_000_000,), float(payload["step"]))
    )
