"""Speed probes: how fast each variant trains on this host, measured alone (nmt-compare probe=true).

A comparison's budget is a number of updates, the same on any machine; seconds come from here. Each probe is one
variant trained from scratch in a fresh process, one probe at a time and nothing of the comparison beside it:
`probe_warmup` untimed updates, then `probe_steps` timed ones through the trainer's own update (the same batches,
precision and threads as the comparison's runs). Variants take turns (every variant's first probe, then every
variant's second, ...), so a slow spell of the machine falls on all of them. Each probe records the CPU model,
precision, threads, its training wall and CPU seconds, and what else the machine did meanwhile: the cores other
processes kept busy (from /proc/stat, less this probe's own CPU time) and its wall time over its CPU time per thread.
A probe above `contention_limit` on either count is flagged and left out of every speed figure.

OUT/probes.json holds every probe of every invocation; the report reads each variant's updates per second from the
clean probes of one CPU model.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from datetime import datetime
from multiprocessing import get_context
from pathlib import Path

from nmt.compare.environment import cpu_model
from nmt.compare.plan import PlannedRun
from nmt.config import CompareConfig, Config
from nmt.fileio import atomic_open

PROBES = "probes.json"
OTHERS_LIMIT = 0.1  # cores other processes may keep busy during a probe before it counts as contended


def cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot (/proc/stat), or None off Linux."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def others_busy(before: tuple[int, int] | None, after: tuple[int, int] | None, own_cpu_s: float, wall_s: float):
    """Cores kept busy by other processes over an interval: all CPUs' busy time less this process's own."""
    if before is None or after is None or wall_s <= 0:
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy_s = (after[0] - before[0]) / hz
    return max(0.0, (busy_s - own_cpu_s) / wall_s)


def probe_once(config: Config, warmup: int, steps: int) -> dict:
    """Train `config` from scratch for warmup + steps updates in a scratch run dir; time the last `steps`."""
    import torch

    from nmt.training.trainer import Trainer

    folder = Path(tempfile.mkdtemp(prefix="nmt-probe-"))
    try:
        trainer = Trainer(replace(config, run_dir=str(folder)), folder, log=lambda line: None)
        trainer._batches = trainer.epoch_batches()

        def update() -> int:
            group = None
            while group is None:
                group = trainer.next_group()
            tokens = sum(trainer.epoch_lens[1][i] + 1 for indices in group for i in indices)
            trainer.train_step(trainer.my_batches(group), tokens)
            return tokens

        for _ in range(warmup):
            update()
        load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
        jiffies, wall, cpu = cpu_jiffies(), time.perf_counter(), time.process_time()
        tokens = sum(update() for _ in range(steps))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        others = others_busy(jiffies, cpu_jiffies(), cpu, wall)
        threads = torch.get_num_threads()
        return {
            "steps": steps,
            "warmup": warmup,
            "seconds": round(wall, 3),
            "cpu_seconds": round(cpu, 3),
            "tokens": tokens,
            "updates_per_s": round(steps / wall, 4),
            "tokens_per_s": round(tokens / wall, 1),
            "threads": threads,
            "ratio": round(wall / (cpu / threads), 4) if cpu > 0 else None,
            "others_busy": round(others, 3) if others is not None else None,
            "load_average_start": [round(x, 2) for x in load_start] if load_start else None,
            "precision": trainer.precision.name,
            "device": str(trainer.device),
            "cpu": cpu_model(),
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def read_probes(out: Path) -> list[dict]:
    path = out / PROBES
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []


def contended(probe: dict, limit: float) -> bool:
    """Whether a probe ran beside other work: its wall time over CPU time per thread, or other processes' cores."""
    return (probe.get("ratio") or 1.0) > limit or (probe.get("others_busy") or 0.0) > OTHERS_LIMIT


def run_probes(plans: list[PlannedRun], cfg: CompareConfig, out: Path, session: dict) -> list[dict]:
    """Probe every variant `probe_repeats` times, one probe at a time, each in a fresh spawned process; append the
    records to OUT/probes.json as they come."""
    from nmt.data.dataset import prepare_data

    configs = {}
    for plan in plans:
        configs.setdefault(plan.variant, plan.config)
    prepare_data(next(iter(configs.values())).data, print)  # the tokenizer and cache, before any probe is timed
    out.mkdir(parents=True, exist_ok=True)
    found = read_probes(out)
    made = []
    print(
        f"nmt-compare: speed probes of {len(configs)} variants x {cfg.probe_repeats}, {cfg.probe_steps} timed updates "
        f"each after {cfg.probe_warmup} untimed, one at a time in fresh processes; nothing else should run now "
        f"(CPU: {cpu_model()})"
    )
    for repeat in range(1, cfg.probe_repeats + 1):
        for name, config in configs.items():
            with ProcessPoolExecutor(1, mp_context=get_context("spawn"), max_tasks_per_child=1) as pool:
                record = pool.submit(probe_once, config, cfg.probe_warmup, cfg.probe_steps).result()
            record = {
                "variant": name,
                "repeat": repeat,
                **record,
                "contended": contended(record, cfg.contention_limit),
                "started": datetime.now().isoformat(timespec="seconds"),
                "session": session,
            }
            made.append(record)
            found.append(record)
            with atomic_open(out / PROBES, key="out") as f:
                f.write(json.dumps(found, indent=2) + "\n")
            print(
                f"probe {repeat}/{cfg.probe_repeats} {name}: {record['updates_per_s']:.3f} updates/s, "
                f"{record['tokens_per_s']:,.0f} tok/s; wall/CPU per thread {record['ratio']}, other processes "
                f"{record['others_busy']} cores" + (" (contended: left out)" if record["contended"] else "")
            )
    return made


def probe_speeds(probes: list[dict], limit: float, cpu: str | None = None) -> tuple[str | None, dict[str, dict]]:
    """Each variant's updates per second from the clean probes of one CPU (the given one, else the CPU with the
    most clean probes): (cpu, {variant: {median, min, max, values, left_out}})."""
    clean = [p for p in probes if not contended(p, limit)]
    cpus = [p["cpu"] for p in clean]
    chosen = cpu or (max(set(cpus), key=cpus.count) if cpus else None)
    speeds: dict[str, dict] = {}
    for p in probes:
        if p["cpu"] != chosen:
            continue
        entry = speeds.setdefault(p["variant"], {"values": [], "left_out": 0, "precision": set(), "threads": set()})
        if contended(p, limit):
            entry["left_out"] += 1
            continue
        entry["values"].append(p["updates_per_s"])
        entry["precision"].add(p["precision"])
        entry["threads"].add(p["threads"])
    for entry in speeds.values():
        values = entry["values"]
        entry.update(
            median=statistics.median(values) if values else None,
            min=min(values) if values else None,
            max=max(values) if values else None,
            precision=sorted(entry["precision"]),
            threads=sorted(entry["threads"]),
        )
    return chosen, speeds
