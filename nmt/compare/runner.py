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
import os
import queue
import signal
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
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


def read_json(path: Path) -> dict | list | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def trained_to(results: dict, steps: int) -> bool:
    """Whether results.json shows training finished for a plan of `steps` updates (or stopped by a time limit or
    early stopping, which end a run before them)."""
    return results["steps"] >= steps or bool(results.get("timed_out")) or bool(results.get("early_stopped"))


def run_state(plan: PlannedRun, settings: dict | None = None, limit: float | None = None) -> str:
    """done (trained to the plan's updates and scored at all its points with these settings), rescore (scored with
    other settings), trained (to score, or points left to score), contended (trained beside other work, above `limit`:
    budget=time passes one), resume (a checkpoint to continue from) or new. `settings` None: any scoring counts."""
    run_dir = plan.run_dir
    results = read_json(run_dir / RESULTS)
    if results is None or not trained_to(results, plan.steps):
        return "resume" if (run_dir / "checkpoints" / LAST).is_file() else "new"
    if limit is not None and contention(results, read_json(run_dir / CONDITIONS) or []) > limit:
        return "contended"
    evaluation = read_json(run_dir / EVAL)
    if evaluation is None:
        return "trained"
    if settings is not None and evaluation.get("settings") != settings:
        return "rescore"
    if any(str(p) not in (evaluation.get("points") or {}) for p in plan.points):
        return "trained"
    return "done"


def clock_figures(clock: dict | None) -> dict:
    """Training wall and CPU seconds (validation and saving left out), and all wall seconds, from a checkpoint's
    clock state (nmt.training.clock.Clock.state)."""
    if not clock:
        return {"train_s": 0.0, "train_cpu_s": 0.0, "wall_s": 0.0}
    return {
        "train_s": clock["wall"] - clock.get("valid_wall", 0.0) - clock.get("save_wall", 0.0),
        "train_cpu_s": clock["cpu"] - clock.get("valid_cpu", 0.0) - clock.get("save_cpu", 0.0),
        "wall_s": clock["wall"],
    }


MIN_TIMED_S = 10.0  # shorter stretches of training are too short to tell contention from start-up


def ratio(train_s: float, train_cpu_s: float, threads: int) -> float | None:
    """Training wall time over CPU time per thread: 1.0 on cores of its own, above 1 when other work took them (None
    for less than MIN_TIMED_S of training)."""
    return train_s / (train_cpu_s / threads) if train_cpu_s > 0 and train_s >= MIN_TIMED_S else None


def part_ratios(parts: list[dict], results: dict | None) -> list[float]:
    """The contention ratio of each part of a run that can be told: from the clock at its start to the clock at its
    end (or, for a part killed before it ended, at the next part's start)."""
    found = []
    for k, part in enumerate(parts):
        start = part.get("clock_start")
        end = part.get("clock_end") or (parts[k + 1].get("clock_start") if k + 1 < len(parts) else None)
        if start is None or end is None:
            continue
        threads = part.get("torch_threads") or part.get("threads") or (results or {}).get("threads") or 1
        value = ratio(end["train_s"] - start["train_s"], end["train_cpu_s"] - start["train_cpu_s"], threads)
        if value is not None:
            found.append(value)
    return found


def contention(results: dict, parts: list[dict]) -> float:
    """A run's contention: the largest of its parts' ratios and the whole run's (results.json)."""
    threads = results.get("threads") or 1
    whole = ratio(results.get("train_s", 0.0), results.get("train_cpu_s", 0.0), threads)
    return max([r for r in [whole, *part_ratios(parts, results)] if r is not None], default=1.0)


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


def load_average() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def record_conditions(plan: PlannedRun, jobs: int, step: int, clock: dict | None) -> None:
    """Append how this part of the run trains to RUN/conditions.json: runs side by side, threads, precision as
    resolved here, batching, the host's CPU, the load average and the run's clock at its start, and the nmt-compare
    session (command, host, software) that trains it."""
    path = plan.run_dir / CONDITIONS
    parts = read_json(path) or []
    train = plan.config.train
    parts.append(
        {
            "from_step": step,
            "to_step": None,
            "jobs": jobs,
            "threads": train.threads,
            "torch_threads": train.threads or torch.get_num_threads(),
            "precision": used_precision(train.precision, train.device),
            "batch_tokens": train.batch_tokens,
            "accumulate": train.accumulate,
            "budget_clock": train.budget_clock,
            "device": train.device,
            "cpu": cpu_model(),
            "started": datetime.now().isoformat(timespec="seconds"),
            "load_average_start": load_average(),
            "clock_start": clock_figures(clock),
            "session": plan.session,
        }
    )
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, key="run_dir") as f:
        f.write(json.dumps(parts, indent=2) + "\n")


def close_conditions(plan: PlannedRun, results: dict) -> None:
    """The end of the part record_conditions began: the step reached, the load average, the run's clock."""
    path = plan.run_dir / CONDITIONS
    parts = read_json(path) or []
    if not parts:
        return
    parts[-1].update(
        {
            "to_step": results["steps"],
            "ended": datetime.now().isoformat(timespec="seconds"),
            "load_average_end": load_average(),
            "clock_end": {k: results.get(k, 0.0) for k in ("train_s", "train_cpu_s", "wall_s")},
            "results": results,  # results.json as this part left it (a run trained on overwrites it)
        }
    )
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


def set_aside(run_dir: Path) -> Path:
    """Move a run dir out of the way (RUN.contended-N), keeping its files for the record."""
    k = 1
    while (target := run_dir.with_name(f"{run_dir.name}.contended-{k}")).exists():
        k += 1
    run_dir.rename(target)
    return target


def run_one(
    number: int,
    total: int,
    plan: PlannedRun,
    test: TestSet,
    jobs: int,
    say: Callable[[str], None],
    limit: float | None = None,
) -> None:
    """Train (or resume, or skip) and score one run; `say` gets its start and end lines. `limit`: a contention ratio
    above which a finished run is trained again (budget=time)."""
    head = f"[{number}/{total}] {plan.label}"
    settings = eval_settings(test, plan.config.decode)
    state = run_state(plan, settings, limit)
    if state == "done":
        evaluation = json.loads((plan.run_dir / EVAL).read_text())
        say(f"{head}: finished earlier (test BLEU {evaluation['scores']['bleu']['score']:.2f}), skipped")
        return
    start = time.perf_counter()
    if state == "contended":
        results = read_json(plan.run_dir / RESULTS)
        moved = set_aside(plan.run_dir)
        say(
            f"{head}: trained beside other work (training wall time {contention(results, []):.2f}x its CPU time per "
            f"thread, above contention_limit={limit}): a time budget bought it fewer updates; moved to {moved.name}, "
            "training again"
        )
        state = "new"
    if state == "resume":
        payload = load_checkpoint(plan.run_dir / "checkpoints" / LAST)
        step, clock = payload["step"], (payload.get("train_state") or {}).get("clock")
        say(f"{head}: resuming from step {step} (budget {budget(plan.config)}); log {plan.run_dir / 'train.log'}")
    elif state == "new":
        step, clock = 0, None
        say(f"{head}: training (budget {budget(plan.config)}); log {plan.run_dir / 'train.log'}")
    elif state == "rescore":
        say(
            f"{head}: scored earlier with other settings ({changed_settings(plan.run_dir, settings)}); "
            "scoring again, not retraining"
        )
    else:
        say(f"{head}: trained earlier; scoring the test set")
    if state in ("new", "resume"):
        record_conditions(plan, jobs, step, clock)
        close_conditions(plan, train(plan, resume=state == "resume"))
    results = json.loads((plan.run_dir / RESULTS).read_text())
    evaluation = evaluate_run(plan.run_dir, test, plan.points, plan.budget_steps, plan.session)
    trained = train_seconds(results)
    pace = results["steps"] / trained if trained else 0.0
    at = ", ".join(f"{p}: {evaluation['points'][str(p)]['scores']['bleu']['score']:.2f}" for p in plan.points)
    say(
        f"{head}: done in {duration(time.perf_counter() - start)}: {results['steps']} steps in {duration(trained)} of "
        f"training ({pace:.2f} steps/s{', stopped by train.max_time' if results.get('timed_out') else ''}), test BLEU "
        f"{evaluation['scores']['bleu']['score']:.2f}" + (f" (by budget point: {at})" if at else "")
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


def _run_in_worker(number: int, total: int, plan: PlannedRun, test: TestSet, jobs: int, limit: float | None) -> None:
    run_one(number, total, plan, test, jobs, _LINES.put, limit)


def run_all(
    plans: list[PlannedRun],
    test: TestSet,
    progress: bool = True,
    jobs: int = 1,
    echo: Callable[[str], None] | None = None,
    limit: float | None = None,
) -> None:
    """Train and score each planned run, `jobs` at a time (spawned processes); then the extended ones train on (each
    after its own first part); `echo` gets the start and end lines (stdout above the bar by default)."""
    say = echo or (lambda line: tqdm.write(line, file=sys.stdout))
    total = len(plans) + sum(p.extend_steps is not None for p in plans)
    bar = tqdm(total=total, unit="run", file=sys.stderr, disable=None if progress else True, dynamic_ncols=True)
    try:
        if jobs == 1 or total == 1:
            queue_ = plans + [p.extended() for p in plans if p.extend_steps is not None]
            for number, plan in enumerate(queue_, 1):
                bar.set_description(plan.label)
                run_one(number, total, plan, test, jobs, say, limit)
                bar.update(1)
        else:
            _run_parallel(plans, test, jobs, say, bar, limit)
    finally:
        bar.close()


def _run_parallel(
    plans: list[PlannedRun], test: TestSet, jobs: int, say: Callable[[str], None], bar, limit: float | None
) -> None:
    """The runs in a pool of `jobs` spawned processes; their lines come back through a queue, in the order they happen.
    An extended run's second part is queued when its first part ends, behind every first part.

    Spawned, not forked: a forked child of a process that has touched CUDA cannot use it, and OpenMP's
    threads do not survive a fork. The parent never initialises CUDA (environment.py asks nvidia-smi).
    """
    context = multiprocessing.get_context("spawn")
    lines = context.Queue()
    total = len(plans) + sum(p.extend_steps is not None for p in plans)

    def drain() -> None:
        while True:
            try:
                say(lines.get_nowait())
            except queue.Empty:
                return

    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_start_worker, initargs=(lines,)) as pool:
        pending = {
            pool.submit(_run_in_worker, n, total, plan, test, jobs, limit): plan for n, plan in enumerate(plans, 1)
        }
        number = len(plans)
        try:
            while pending:
                done, _ = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                drain()
                for future in done:
                    plan = pending.pop(future)
                    future.result()  # a run's error stops the comparison
                    bar.update(1)
                    if plan.extend_steps is not None:
                        number += 1
                        nxt = plan.extended()
                        pending[pool.submit(_run_in_worker, number, total, nxt, test, jobs, limit)] = nxt
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
