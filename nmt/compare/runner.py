"""Train and score every (variant, seed) of a comparison in turn, picking up where an interrupted one stopped.

A run is done when its RUN/eval.json exists (written last, after test.hyp): it is skipped. A run with
results.json but no eval.json is only scored; one with checkpoints/last.pt is resumed exactly from it
(nmt-train resume=RUN); anything else starts afresh. Each run writes its own train.log, so the console
gets one line as a run starts and one as it ends, and a bar over the whole comparison. With jobs > 1
the runs go to that many forked worker processes (each with the run's train.threads), which die with
the comparison if it is killed.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import multiprocessing
import queue
import signal
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator

import torch
from tqdm import tqdm

from nmt.compare.evaluate import EVAL, TestSet, evaluate_run
from nmt.compare.plan import PlannedRun
from nmt.config import Config
from nmt.errors import NmtError
from nmt.training.checkpoint import LAST, load_checkpoint
from nmt.training.progress import duration

RESULTS = "results.json"


def run_state(run_dir: Path) -> str:
    """done (scored), trained (to score), resume (a checkpoint to continue from) or new."""
    if (run_dir / RESULTS).is_file():
        return "done" if (run_dir / EVAL).is_file() else "trained"
    return "resume" if (run_dir / "checkpoints" / LAST).is_file() else "new"


def budget(cfg: Config) -> str:
    """The training budget of a config in words."""
    limits = [f"{cfg.train.max_steps} updates"]
    if cfg.train.max_time is not None:
        limits.append(f"{cfg.train.max_time:g} minutes")
    if cfg.train.max_epochs is not None:
        limits.append(f"{cfg.train.max_epochs} epochs")
    return " or ".join(limits) + (", whichever comes first" if len(limits) > 1 else "")


@contextmanager
def comparison_lock(out: Path) -> Iterator[None]:
    """One nmt-compare at a time per report folder (the lock goes with the process, even on SIGKILL)."""
    out.mkdir(parents=True, exist_ok=True)
    handle = open(out / ".lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise NmtError(f"out={out}: another nmt-compare is working in this folder; wait for it to end or choose another out=") from None
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def train(plan: PlannedRun, resume: bool) -> dict:
    """nmt-train for one run (its lines go to RUN/train.log only); results.json's figures."""
    from nmt.training.trainer import Trainer

    quiet = lambda line: None  # noqa: E731
    if resume:
        payload = load_checkpoint(plan.run_dir / "checkpoints" / LAST)
        trainer = Trainer(replace(plan.config, resume=str(plan.run_dir)), plan.run_dir, log=quiet, checkpoint=payload)
    else:
        trainer = Trainer(plan.config, plan.run_dir, log=quiet)
    try:
        return trainer.fit()
    finally:
        trainer.dist.close()


def run_one(number: int, total: int, plan: PlannedRun, test: TestSet, under: float, over: float, say: Callable[[str], None]) -> None:
    """Train (or resume, or skip) and score one run; `say` gets its start and end lines."""
    head = f"[{number}/{total}] {plan.label}"
    state = run_state(plan.run_dir)
    if state == "done":
        evaluation = json.loads((plan.run_dir / EVAL).read_text())
        say(f"{head}: finished earlier (test BLEU {evaluation['scores']['bleu']['score']:.2f}), skipped")
        return
    start = time.perf_counter()
    if state == "resume":
        step = load_checkpoint(plan.run_dir / "checkpoints" / LAST)["step"]
        say(f"{head}: resuming from step {step} (budget {budget(plan.config)}); log {plan.run_dir / 'train.log'}")
    elif state == "new":
        say(f"{head}: training (budget {budget(plan.config)}); log {plan.run_dir / 'train.log'}")
    else:
        say(f"{head}: trained earlier; scoring the test set")
    if state in ("new", "resume"):
        train(plan, resume=state == "resume")
    results = json.loads((plan.run_dir / RESULTS).read_text())
    evaluation = evaluate_run(plan.run_dir, test, under, over)
    pace = results["steps"] / results["wall_s"] if results["wall_s"] else 0.0
    say(
        f"{head}: done in {duration(time.perf_counter() - start)}: {results['steps']} steps in {duration(results['wall_s'])} "
        f"({pace:.2f} steps/s{', stopped by train.max_time' if results.get('timed_out') else ''}), "
        f"test BLEU {evaluation['scores']['bleu']['score']:.2f}, {evaluation['sentences_per_s']} sent/s"
    )


_LINES = None  # a worker process's queue of lines for the parent (set by _start_worker)


def _start_worker(lines) -> None:
    """A worker dies with its parent (Linux prctl PR_SET_PDEATHSIG), so a killed comparison leaves no run training."""
    global _LINES
    _LINES = lines
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    torch.set_num_threads(1)  # until the run's train.threads; several OpenMP threads are unsafe after fork


def _run_in_worker(number: int, total: int, plan: PlannedRun, test: TestSet, under: float, over: float) -> None:
    run_one(number, total, plan, test, under, over, _LINES.put)


def run_all(plans: list[PlannedRun], test: TestSet, under: float, over: float, progress: bool = True, jobs: int = 1,
            echo: Callable[[str], None] | None = None) -> None:
    """Train and score each planned run, `jobs` at a time (forked processes); `echo` gets the start and end lines
    (stdout above the bar by default)."""
    say = echo or (lambda line: tqdm.write(line, file=sys.stdout))
    bar = tqdm(total=len(plans), unit="run", file=sys.stderr, disable=None if progress else True, dynamic_ncols=True)
    try:
        if jobs == 1 or len(plans) == 1:
            for number, plan in enumerate(plans, 1):
                bar.set_description(plan.label)
                run_one(number, len(plans), plan, test, under, over, say)
                bar.update(1)
        else:
            _run_parallel(plans, test, under, over, jobs, say, bar)
    finally:
        bar.close()


def _run_parallel(plans: list[PlannedRun], test: TestSet, under: float, over: float, jobs: int, say: Callable[[str], None], bar) -> None:
    """The runs in a pool of `jobs` forked processes; their lines come back through a queue, in the order they happen."""
    context = multiprocessing.get_context("fork")
    lines = context.Queue()

    def drain() -> None:
        while True:
            try:
                say(lines.get_nowait())
            except queue.Empty:
                return

    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_start_worker, initargs=(lines,)) as pool:
        pending = {pool.submit(_run_in_worker, n, len(plans), plan, test, under, over) for n, plan in enumerate(plans, 1)}
        try:
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                drain()
                for future in done:
                    future.result()  # a run's error stops the comparison
                    bar.update(1)
        except BrokenProcessPool:
            raise NmtError(
                "a worker process died (killed, or out of memory?) and the runs in progress stopped with it; "
                "run the same command again to continue them from their last checkpoints"
            ) from None
        except BaseException:
            for future in pending:
                future.cancel()
            raise
        finally:
            time.sleep(0.1)
            drain()
