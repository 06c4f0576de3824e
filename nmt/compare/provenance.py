"""Who made a comparison's runs: every nmt-compare invocation, host, software and wall-clock, from the runs' own files.

A run records the invocation that trained each of its parts (RUN/conditions.json "session") and the one that scored
each budget point (eval.json), so a study run in parts on several hosts, its finished runs archived and copied into
one folder, still names every session that made it. OUT/sessions.json adds how long each invocation in this folder
took from start to end. Seconds are summed per run part (a part's clock from its start to its end, or to the next
part's start when it was killed), so nothing is counted twice.
"""

from __future__ import annotations

from nmt.compare.collect import RunRecord
from nmt.compare.runner import train_seconds

NA = "n/a"


def _key(session: dict) -> tuple:
    return (session.get("started"), session.get("command"), session.get("host"))


def part_wall(parts: list[dict], k: int) -> float | None:
    """All wall seconds of a run's part k (training, validation, saving), from its clock records."""
    start = parts[k].get("clock_start")
    end = parts[k].get("clock_end") or (parts[k + 1].get("clock_start") if k + 1 < len(parts) else None)
    return end["wall_s"] - start["wall_s"] if start and end else None


def provenance(runs: dict[str, list[RunRecord]], sessions: list[dict]) -> dict:
    """Every session that trained or scored a finished run, with what it did; the comparison's total compute."""
    found: dict[tuple, dict] = {}

    def entry(session: dict) -> dict:
        return found.setdefault(
            _key(session),
            {**session, "parts": 0, "runs": set(), "train_wall_s": 0.0, "scored_points": 0, "scoring_s": 0.0},
        )

    unrecorded, compute_s, scoring_s = 0, 0.0, 0.0
    for group in runs.values():
        for run in group:
            if not run.finished:
                continue
            compute_s += (run.results or {}).get("wall_s", train_seconds(run.results or {}))
            scoring_s += (run.evaluation or {}).get("scoring_seconds", 0.0)
            recorded = False
            for k, part in enumerate(run.conditions):
                if part.get("session"):
                    record = entry(part["session"])
                    record["parts"] += 1
                    record["runs"].add(f"{run.variant} seed {run.seed}")
                    record["train_wall_s"] += part_wall(run.conditions, k) or 0.0
                    recorded = True
            for figures in ((run.evaluation or {}).get("points") or {}).values():
                if figures.get("session"):
                    entry(figures["session"])["scored_points"] += 1
            unrecorded += not recorded
    elapsed = {(s.get("started"), s.get("command")): s.get("seconds") for s in sessions}
    rows = []
    for record in sorted(found.values(), key=lambda r: r.get("started") or ""):
        record["runs"] = sorted(record["runs"])
        record["elapsed_s"] = elapsed.get((record.get("started"), record.get("command")))
        rows.append(record)
    return {
        "sessions": rows,
        "hosts": sorted({(r.get("host"), r.get("cpu")) for r in rows}, key=str),
        "runs_without_session": unrecorded,
        "compute_s": compute_s + scoring_s,
        "training_s": compute_s,
        "scoring_s": scoring_s,
        "elapsed_s": sum(s.get("seconds") or 0.0 for s in sessions),
    }
