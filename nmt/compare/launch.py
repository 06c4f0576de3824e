"""Runs of a comparison dispatched as jobs through submitit (the library behind Hydra's SLURM launcher).

`launcher=slurm` submits one job per (variant, seed) not finished yet, as a SLURM job array of at most
`slurm.array_parallelism` jobs at a time; `launcher=submitit_local` sends the same jobs to submitit's local
executor (every job at once, each in its own process: a way to try the dispatch on one machine, not to
share its cores). Each job trains and scores its run into OUT/runs/VARIANT/seedN exactly as the local pool
does (`runner.run_one`), so a comparison can be started on a cluster and continued, or reported, anywhere
the folder is: the report is written once every job has ended, or later with `nmt-compare report_only=true`.
Job logs go to OUT/submitit/.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nmt.compare.evaluate import TestSet
from nmt.compare.plan import PlannedRun
from nmt.errors import NmtError

LAUNCHERS = ("local", "submitit_local", "slurm")


@dataclass
class SlurmSettings:
    """What a SLURM job of one run asks for (nmt.config.SlurmConfig, as plain values)."""

    partition: str | None
    gpus_per_node: int
    cpus_per_task: int
    mem_gb: float | None
    timeout_min: int
    array_parallelism: int
    account: str | None
    constraint: str | None


def run_job(number: int, total: int, plan: PlannedRun, test: TestSet, limit: float | None = None) -> str:
    """One job: train and score one run (its lines go to the job's log); returns the run dir."""
    from nmt.compare.plan import check_host
    from nmt.compare.runner import run_one

    check_host(plan.config)  # the job's node, which may not be the one that planned it
    run_one(number, total, plan, test, 1, lambda line: print(line, flush=True), limit)
    return str(plan.run_dir)


def executor(launcher: str, folder: Path, slurm: SlurmSettings):
    """A submitit executor for the launcher, its parameters set."""
    try:
        import submitit
    except ImportError:
        raise NmtError(f"launcher={launcher} needs submitit: pip install -e '.[cluster]' in the nmt clone") from None
    if launcher == "submitit_local":
        found = submitit.LocalExecutor(folder=str(folder))
        found.update_parameters(timeout_min=slurm.timeout_min)
        return found
    found = submitit.AutoExecutor(folder=str(folder), cluster="slurm")
    extra = {"account": slurm.account} if slurm.account else {}
    if slurm.constraint:
        extra["constraint"] = slurm.constraint
    found.update_parameters(
        name="nmt-compare",
        timeout_min=slurm.timeout_min,
        gpus_per_node=slurm.gpus_per_node,
        cpus_per_task=slurm.cpus_per_task,
        tasks_per_node=1,
        nodes=1,
        slurm_array_parallelism=slurm.array_parallelism,
        **({"slurm_partition": slurm.partition} if slurm.partition else {}),
        **({"mem_gb": slurm.mem_gb} if slurm.mem_gb else {}),
        **({"slurm_additional_parameters": extra} if extra else {}),
    )
    return found


def dispatch(
    plans: list[PlannedRun],
    test: TestSet,
    launcher: str,
    out: Path,
    slurm: SlurmSettings,
    say: Callable[[str], None] = print,
    limit: float | None = None,
) -> None:
    """Submit a job per run and wait for them all; a failed job is an error naming its run and its log."""
    pool = executor(launcher, out / "submitit", slurm)
    with pool.batch():
        jobs = [pool.submit(run_job, n, len(plans), plan, test, limit) for n, plan in enumerate(plans, 1)]
    say(
        f"nmt-compare: {len(jobs)} jobs submitted ({launcher}), logs in {out / 'submitit'}; waiting for them to end "
        f"(or stop waiting and run `nmt-compare report_only=true out={out}` once they have)"
    )
    failed = []
    for plan, job in zip(plans, jobs):
        try:
            job.result()
            say(f"{plan.label}: job {job.job_id} done")
        except Exception as err:  # submitit wraps the job's error; its log has the whole story
            first = (str(err).strip().splitlines() or [type(err).__name__])[-1]
            failed.append(
                f"{plan.label} (job {job.job_id}: {first[:200]}; log {out / 'submitit'}/{job.job_id}_0_log.err)"
            )
    if failed:
        raise NmtError(
            f"{len(failed)} of {len(jobs)} jobs failed: "
            + "; ".join(failed[:3])
            + "; run the same command again to continue them"
        )
