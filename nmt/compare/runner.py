"""Train and score every (variant, seed) of a comparison in turn, picking up where an interrupted one stopped.

A run is done when its RUN/eval.json exists (written last, after test.hyp): it is skipped. A run with
results.json but no eval.json is only scored; one with checkpoints/last.pt is resumed exactly from it
(nmt-train resume=RUN); anything else starts afresh. Each run writes its own train.log, so the console
gets one line as a run starts and one as it ends, and a bar over the whole comparison. With jobs > 1
the runs go to that many spawned worker processes (each with the run's train.threads), which die with
the comparison if it is killed. A run scored with other scoring settings (eval.json's `settings`: test set,
gold alignments, attention thresholds, heat-map lines, decoding) is scored again, never retrained.
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
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from nmt.compare.environment import cpu_model
from nmt.compare.evaluate import EVAL, TestSet, eval_settings, evaluate_run
from nmt.compare.plan import PlannedRun
from nmt.config import Config
from nmt.errors import NmtError
from nmt.fileio import atomic_open
from nmt.runtime import resolve_device
from nmt.training.checkpoint import LAST, load_checkpoint
from nmt.training.precision import resolve_precision
from nmt.training.progress import duration

RESULTS, CONDITIONS = "results.json", "conditions.json"


def run_state(run_dir: Path, settings: dict | None = None) -> str:
    """done (scored with these settings), rescore (scored with others), trained (to score), resume (a checkpoint to
    continue from) or new. `settings` (evaluate.eval_settings) None: any scoring counts as done."""
    if (run_dir / RESULTS).is_file():
        if not (run_dir / EVAL).is_file():
            return "trained"
        scored = json.loads((run_dir / EVAL).read_text()).get("settings")
        return "done" if settings is None or scored == settings else "rescore"
    return "resume" if (run_dir / "checkpoints" / LAST).is_file() else "new"


def changed_settings(run_dir: Path, settings: dict) -> str:
    """The scoring settings that differ between RUN/eval.json and now, as `key: old -> new`."""
    scored = json.loads((run_dir / EVAL).read_text()).get("settings") or {}
    return "; ".join(f"{k}: {scored.get(k, 'not recorded')} -> {v}" for k, v in settings.items() if scored.get(k) != v)


def used_precision(name: str, device: str) -> str:
    """The precision a run trains in (`auto` resolved on this host: bf16 where the CPU or GPU has it, else fp32)."""
    try:
        return resolve_precision(name, resolve_device(device))
    except NmtError:  # the trainer reports a bad device itself
        return name


def record_conditions(plan: PlannedRun, jobs: int, step: int) -> None:
    """Append how this part of the run trains to RUN/conditions.json
    (runs side by side, threads, precision as resolved here, batching, the host's CPU)."""
    path = plan.run_dir / CONDITIONS
    parts = json.loads(path.read_text()) if path.is_file() else []
    train = plan.config.train
    parts.append(
        {
            "from_step": step,
            "jobs": jobs,
            "threads": train.threads,
            "precision": used_precision(train.precision, train.device),
            "batch_tokens": train.batch_tokens,
            "accumulate": train.accumulate,
            "budget_clock": train.budget_clock,
            "device": train.device,
            "cpu": cpu_model(),
        }
    )
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, key="run_dir") as f:
        f.write(json.dumps(parts, indent=2) + "\n")


def train_seconds(results: dict) -> float:
    """A run's training seconds by its budget clock (validation and saving not counted); wall_s in results.json
    files from before validation was timed apart."""
    if results.get("budget_clock") == "cpu":
        return results["train_cpu_s"]
    return results.get("train_s", results["wall_s"])


def budget(cfg: Config) -> str:
    """The training budget of a config in words."""
    limits = [f"{cfg.train.max_steps} updates"]
    if cfg.train.max_time is not None:
        clock = "wall-clock" if cfg.train.budget_clock == "wall" else "CPU"
        limits.append(
            f"{cfg.train.max_time:g} minutes of training ({clock} time; validation and checkpoints not counted)"
        )
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
        raise NmtError(
            f"out={out}: another nmt-compare is working in this folder; wait for it to end or choose another out="
        ) from None
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


def run_one(number: int, total: int, plan: PlannedRun, test: TestSet, jobs: int, say: Callable[[str], None]) -> None:
    """Train (or resume, or skip) and score one run; `say` gets its start and end lines."""
    head = f"[{number}/{total}] {plan.label}"
    settings = eval_settings(test, plan.config.decode)
    state = run_state(plan.run_dir, settings)
    if state == "done":
        evaluation = json.loads((plan.run_dir / EVAL).read_text())
        say(f"{head}: finished earlier (test BLEU {evaluation['scores']['bleu']['score']:.2f}), skipped")
        return
    start = time.perf_counter()
    if state == "resume":
        step = load_checkpoint(plan.run_dir / "checkpoints" / LAST)["step"]
        say(f"{head}: resuming from step {step} (budget {budget(plan.config)}); log {plan.run_dir / 'train.log'}")
    elif state == "new":
        step = 0
        say(f"{head}: training (budget {budget(plan.config)}); log {plan.run_dir / 'train.log'}")
    elif state == "rescore":
        say(
            f"{head}: scored earlier with other settings ({changed_settings(plan.run_dir, settings)}); "
            "scoring again, not retraining"
        )
    else:
        say(f"{head}: trained earlier; scoring the test set")
    if state in ("new", "resume"):
        record_conditions(plan, jobs, step)
        train(plan, resume=state == "resume")
    results = json.loads((plan.run_dir / RESULTS).read_text())
    evaluation = evaluate_run(plan.run_dir, test)
    trained = train_seconds(results)
    pace = results["steps"] / trained if trained else 0.0
    say(
        f"{head}: done in {duration(time.perf_counter() - start)}: {results['steps']} steps in {duration(trained)} of "
        f"training ({pace:.2f} steps/s{', stopped by train.max_time' if results.get('timed_out') else ''}), test BLEU "
        f"{evaluation['scores']['bleu']['score']:.2f}, {evaluation['sentences_per_s']} sent/s"
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
    torch.set_num_threads(1)  # until the run's train.threads


def _run_in_worker(number: int, total: int, plan: PlannedRun, test: TestSet, jobs: int) -> None:
    run_one(number, total, plan, test, jobs, _LINES.put)


def run_all(
    plans: list[PlannedRun],
    test: TestSet,
    progress: bool = True,
    jobs: int = 1,
    echo: Callable[[str], None] | None = None,
) -> None:
    """Train and score each planned run, `jobs` at a time (spawned processes); `echo` gets the start and end lines
    (stdout above the bar by default)."""
    say = echo or (lambda line: tqdm.write(line, file=sys.stdout))
    bar = tqdm(total=len(plans), unit="run", file=sys.stderr, disable=None if progress else True, dynamic_ncols=True)
    try:
        if jobs == 1 or len(plans) == 1:
            for number, plan in enumerate(plans, 1):
                bar.set_description(plan.label)
                run_one(number, len(plans), plan, test, jobs, say)
                bar.update(1)
        else:
            _run_parallel(plans, test, jobs, say, bar)
    finally:
        bar.close()


def _run_parallel(plans: list[PlannedRun], test: TestSet, jobs: int, say: Callable[[str], None], bar) -> None:
    """The runs in a pool of `jobs` spawned processes; their lines come back through a queue, in the order they happen.

    Spawned, not forked: a forked child of a process that has touched CUDA cannot use it, and OpenMP's
    threads do not survive a fork. The parent never initialises CUDA (environment.py asks nvidia-smi).
    """
    context = multiprocessing.get_context("spawn")
    lines = context.Queue()

    def drain() -> None:
        while True:
            try:
                say(lines.get_nowait())
            except queue.Empty:
                return

    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_start_worker, initargs=(lines,)) as pool:
        pending = {pool.submit(_run_in_worker, n, len(plans), plan, test, jobs) for n, plan in enumerate(plans, 1)}
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
