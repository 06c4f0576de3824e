"""nmt-compare: train attention variants side by side on the same data and budget, then write a report."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import asdict, fields, replace
from datetime import datetime
from pathlib import Path

from omegaconf import OmegaConf

from nmt.cli.common import compose, print_help, run
from nmt.compare.plan import (
    PlannedRun,
    check_budget,
    check_existing,
    check_shared,
    merge_overrides,
    override_key,
    run_dir_for,
)
from nmt.config import CompareConfig
from nmt.errors import NmtError
from nmt.training.progress import duration

USAGE = """
usage: nmt-compare experiment=NAME [out=DIR] [variants=a,b] [seeds=1,2,3] [baseline=NAME] [jobs=N] [KEY=VALUE ...]
       nmt-compare experiment=NAME launcher=slurm [slurm.partition=P slurm.gpus_per_node=1 slurm.timeout_min=M ...]
       nmt-compare report_only=true out=DIR [baseline=NAME] [variants=a,b]

Train each variant of an experiment (a named list of nmt-train overrides) on the same data, tokenizer,
budget and decoding settings, once per seed; translate the test set with each; write OUT/report.md,
results.csv, results.json and figures. KEY=VALUE that is not an nmt-compare setting goes to every
variant's nmt-train (e.g. train.max_steps=100, train.max_time=5, data.cache_dir=...). An interrupted
comparison continues where it stopped when run again with the same out=. Examples:
  nmt-compare experiment=compare_attention_toy out=runs/compare_toy
  nmt-compare experiment=compare_attention_toy variants=transformer,bahdanau seeds=1,2,3 out=runs/two
  nmt-compare experiment=compare_attention_multi30k_cpu data.root=data/multi30k      # the Multi30k study, 2 CPU cores
  nmt-compare experiment=compare_attention_multi30k data.root=/data/multi30k launcher=slurm slurm.partition=gpu
  nmt-compare report_only=true out=runs/compare_toy baseline=bahdanau
Each variant is tested against the baseline twice: a paired bootstrap over test sentences (all seeds of a
sentence drawn together) and, with 3+ seeds, Welch's t-test over seeds; sig. is yes when both say so after
Holm's correction. train.max_time counts training only (train.budget_clock=wall|cpu). matched_steps.NAME=N
gives each variant its own updates (a time budget frozen in updates, the same on any host).
"""

COMPARE_KEYS = {f.name for f in fields(CompareConfig)} | {"experiment"}
LIST_KEYS = ("variants", "seeds", "heatmap_lines", "budget_points", "extend_points", "extend_seeds")
OVERRIDE_LISTS = (
    "overrides.",
    "shared",
)  # lists of KEY=VALUE: `overrides.x=[model=luong,model.score=dot]` is quoted for Hydra


def split_arguments(argv: list[str]) -> tuple[list[str], list[str]]:
    """(nmt-compare settings, nmt-train overrides for every variant); `seeds=1,2` becomes `seeds=[1,2]`, and the
    items of `overrides.NAME=[model=luong,model.score=dot]` are quoted (Hydra's grammar wants `=` quoted in a list)."""
    mine, theirs = [], []
    for argument in argv:
        if "=" not in argument:
            raise NmtError(f"{argument}: expected KEY=VALUE")
        key, value = override_key(argument), argument.split("=", 1)[1]
        if key.split(".")[0] in COMPARE_KEYS:
            if key in LIST_KEYS and not value.startswith("["):
                argument = f"{key}=[{value}]"
            elif (
                key.startswith(OVERRIDE_LISTS)
                and value.startswith("[")
                and value.endswith("]")
                and not set("'\"") & set(value)
            ):
                argument = (
                    argument.split("=", 1)[0]
                    + "=["
                    + ",".join(f"'{item.strip()}'" for item in value[1:-1].split(",") if item.strip())
                    + "]"
                )
            if key.startswith("seeds_for.") and not value.startswith("["):
                argument = f"{argument.split('=', 1)[0]}=[{value}]"
            if key.startswith(("overrides.", "extend.", "seeds_for.")):
                # defines a new variant (or its extension, seeds) or replaces one
                argument = "++" + argument.lstrip("+")
            mine.append(argument)
        else:
            theirs.append(argument)
    return mine, theirs


def plan_runs(cfg: CompareConfig, out: Path, session: dict | None = None) -> list[PlannedRun]:
    """Each variant's training config composed once, then one run per seed; checks that they share data, budget,
    precision and decoding, and that the budget and its points are ones every variant can keep."""
    bases = {}
    for name in cfg.selected():
        try:
            bases[name] = compose(
                "config", merge_overrides(cfg.shared, cfg.overrides[name], cfg.extra, ["train.progress=false"])
            )
        except NmtError as err:
            raise NmtError(f"variant {name}: {err}") from None
    points, further = check_budget(cfg, bases)
    plans = []
    for seed in cfg.all_seeds():  # seed by seed: a comparison stopped part-way has every variant at its first seeds
        for name, base in bases.items():
            if seed not in cfg.seeds_of(name):
                continue
            extend = cfg.extend.get(name) if not cfg.extend_seeds or seed in cfg.extend_seeds else None
            own = [p for p in further if extend is not None and p <= extend]
            train = replace(base.train, seed=seed, snapshot_at=points + own)
            config = replace(base, run_dir=str(run_dir_for(out, name, seed)), train=train)
            plans.append(
                PlannedRun(name, seed, config, points, extend, own, session, base.train.max_steps if points else None)
            )
    check_shared(plans)
    for plan in plans:
        check_existing(plan)
    return plans


def saved_plan(out: Path, overrides: list[str]) -> CompareConfig:
    """report_only: the plan nmt-compare saved in OUT, with report settings from the command line."""
    from nmt.compare.collect import read_plan

    keep = [o for o in overrides if override_key(o) not in ("out", "report_only", "experiment")]
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(read_plan(out)), OmegaConf.from_dotlist(keep)))
    except NmtError:
        raise
    except Exception as err:  # omegaconf validation errors carry the key
        raise NmtError(f"{getattr(err, 'full_key', None) or 'report_only'}: {str(err).splitlines()[0]}") from None


def write_session(out: Path, sessions: list[dict]) -> None:
    from nmt.compare.collect import SESSIONS
    from nmt.fileio import atomic_open

    with atomic_open(out / SESSIONS, key="out") as f:
        f.write(json.dumps(sessions, indent=2) + "\n")


def main(argv: list[str]) -> None:
    if "-h" in argv or "--help" in argv:
        return print_help(USAGE)
    mine, extra = split_arguments(argv)
    where = compose(
        "compare", [a for a in mine if override_key(a) in ("out", "report_only")]
    )  # the rest may need the saved plan
    if where.report_only:
        from nmt.compare.report import build_report, check_scored

        if extra:
            raise NmtError(f"report_only=true trains nothing, so nmt-train settings have no effect: {' '.join(extra)}")
        out = Path(where.out)
        if out.exists() and not out.is_dir():
            raise NmtError(f"out={out}: is a file, expected a comparison's folder")
        plan = saved_plan(out, mine)
        check_scored(out, plan)
        print(build_report(out, plan))
        print(f"report: {out / 'report.md'}")
        return
    cfg: CompareConfig = compose("compare", mine)
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise NmtError(f"out={out}: is a file, expected a folder (new, or a comparison's to continue)")
    if not cfg.overrides:
        raise NmtError(
            "no variants to compare: give experiment=NAME (recipes/experiment/compare_*.yaml) or "
            "overrides.NAME=[KEY=VALUE,...]"
        )
    cfg.extra = extra
    run_comparison(cfg, out, "nmt-compare " + shlex.join(argv))


def session_record(command: str) -> dict:
    """Who trains or scores a run: this invocation's command, host, CPU, software (RUN/conditions.json, eval.json)."""
    import platform

    from nmt.compare.environment import environment

    env = environment()
    return {
        "started": datetime.now().isoformat(timespec="seconds"),
        "command": command,
        "host": platform.node(),
        "cpu": env["cpu"],
        "git_commit": env["git_commit"],
        "nmt": env["nmt"],
        "torch": env["packages"]["torch"],
        "python": env["python"],
        "platform": env["platform"],
    }


def run_comparison(cfg: CompareConfig, out: Path, command: str) -> None:
    """Plan, train and score every run not done yet, then write the report."""
    from nmt.compare.collect import PLAN, read_sessions
    from nmt.compare.environment import environment
    from nmt.compare.evaluate import eval_settings
    from nmt.compare.plan import check_host, prepare_test
    from nmt.compare.report import build_report
    from nmt.compare.runner import budget, comparison_lock, run_all, run_state
    from nmt.data.dataset import prepare_data
    from nmt.fileio import atomic_open

    session = session_record(command)
    plans = plan_runs(cfg, out, session)
    if cfg.launcher == "local":
        check_host(plans[0].config)
    if cfg.baseline and cfg.baseline != cfg.baseline_name():
        print(
            f"nmt-compare: baseline={cfg.baseline} is not among the variants run; testing against {cfg.baseline_name()}"
        )
    if cfg.probe:
        from nmt.compare.speed import run_probes

        with comparison_lock(out):
            run_probes(plans, cfg, out, session)
        return
    limit = cfg.contention_limit if cfg.budget == "time" else None
    with comparison_lock(out):
        test, align = prepare_test(cfg, plans[0].config.data, out)
        if any(run_state(p) == "new" for p in plans):  # one tokenizer, trained here before any run starts
            prepare_data(plans[0].config.data, print)
        cfg.align, cfg.heatmap_lines, cfg.baseline = align, test.heatmap_lines, cfg.baseline_name()
        with atomic_open(out / PLAN, key="out") as f:
            f.write(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        sessions = read_sessions(out) + [
            {"command": command, "started": session["started"], "environment": environment()}
        ]
        write_session(out, sessions)
        points = plans[0].points
        extended = sorted({p.variant for p in plans if p.extend_steps is not None})
        print(
            f"nmt-compare: {len(cfg.selected())} variants, {len(plans)} runs, {cfg.jobs} at a time; budget "
            f"{budget(plans[0].config)} each"
            + (f", test scored at {', '.join(map(str, points))} updates" if points else "")
            + (
                f"; then {', '.join(extended)} train on ({', '.join(f'{v}: {cfg.extend[v]}' for v in extended)})"
                if extended
                else ""
            )
            + f"; baseline {cfg.baseline}; test set {len(test.src)} sentences"
            f"{' with gold alignments' if test.gold else ''}; out {out}"
        )
        start = time.perf_counter()
        try:
            if cfg.launcher == "local":
                run_all(plans, test, cfg.progress, cfg.jobs, limit=limit)
            else:
                from nmt.compare.launch import SlurmSettings, dispatch

                for phase in (plans, [p.extended() for p in plans if p.extend_steps is not None]):
                    todo = [p for p in phase if run_state(p, eval_settings(test, p.config.decode), limit) != "done"]
                    if todo:
                        dispatch(todo, test, cfg.launcher, out, SlurmSettings(**asdict(cfg.slurm)), limit=limit)
        except BaseException:
            sessions[-1]["interrupted"] = True
            raise
        finally:
            sessions[-1]["seconds"] = round(time.perf_counter() - start, 1)  # training and scoring; the report follows
            write_session(out, sessions)
        print(build_report(out, cfg))
    print(f"report: {out / 'report.md'} (this session: {duration(sessions[-1]['seconds'])})")


def entry() -> None:
    run(main)


if __name__ == "__main__":
    entry()
