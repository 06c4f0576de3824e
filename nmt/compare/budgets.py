"""The ranking at each budget point, where it changes, the crossover of the extended variants, and the time-matched
view from the speed probes.

A comparison with budget=updates scores every run's test set at declared budget points (eval.json "points": the
model a run of N updates chooses by validation). Here those scores become: the main table at each point (the same
tests as the main table, on that point's translations), the points where two variants change order, the extended
variants side by side at every point (where one family passes another), and, from the speed probes of one CPU
(nmt.compare.speed), each variant's BLEU at the updates it makes in the same seconds of training.
"""

from __future__ import annotations

import math
from dataclasses import replace

from nmt.compare.collect import RunRecord
from nmt.compare.speed import probe_speeds
from nmt.compare.summary import spread

NA = "n/a"


def at_point(run: RunRecord, point: int) -> RunRecord | None:
    """The run as scored at budget point N (its translations and scores there), or None where it was not."""
    figures = run.points().get(point)
    if figures is None or not run.finished:
        return None
    return replace(run, hyps=run.point_hyps[point], evaluation={**run.evaluation, "scores": figures["scores"]})


def runs_at(runs: dict[str, list[RunRecord]], point: int) -> dict[str, list[RunRecord]]:
    """Every variant's runs as scored at `point` (a run not scored there is left out)."""
    return {name: [r for r in (at_point(run, point) for run in group) if r is not None] for name, group in runs.items()}


def scored_points(runs: dict[str, list[RunRecord]]) -> list[int]:
    """Every budget point some finished run was scored at, in order."""
    return sorted({p for group in runs.values() for r in group if r.finished for p in r.points()})


def point_table(runs: dict[str, list[RunRecord]], point: int, baseline: str, refs: list[str], samples: int, seed: int):
    """Per variant at one point: BLEU over seeds, the tests against the baseline (summary.significance), the rank."""
    from nmt.compare.summary import significance

    scored = runs_at(runs, point)
    tests = significance(scored, baseline, refs, samples, seed)
    rows = []
    for name, group in scored.items():
        stat = spread([r.score("bleu") for r in group])
        rows.append(
            {"name": name, "bleu": stat, "seeds": [r.seed for r in group], "significance": tests.tests.get(name)}
        )
    ranked = sorted((r for r in rows if r["bleu"]["mean"] is not None), key=lambda r: -r["bleu"]["mean"])
    for rank, row in enumerate(ranked, 1):
        row["rank"] = rank
    base = next((r["bleu"]["mean"] for r in rows if r["name"] == baseline), None)
    for row in rows:
        row["delta"] = row["bleu"]["mean"] - base if None not in (row["bleu"]["mean"], base) else None
    return {"point": point, "rows": rows, "notes": tests.notes}


ORDER_GAP = 1.0  # BLEU: an order change is listed when the two variants are this far apart at both points


def order_changes(tables: list[dict], gap: float = ORDER_GAP) -> list[dict]:
    """Pairs of variants whose order by mean BLEU differs between consecutive budget points, each at least `gap`
    BLEU apart at both points (two variants at 0.01 and 0.02 BLEU early in training have no order to change)."""
    changes = []
    for before, after in zip(tables, tables[1:]):
        mean = lambda table, name: next(  # noqa: E731
            (r["bleu"]["mean"] for r in table["rows"] if r["name"] == name), None
        )
        names = [r["name"] for r in before["rows"] if r["bleu"]["mean"] is not None]
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                a0, b0, a1, b1 = mean(before, a), mean(before, b), mean(after, a), mean(after, b)
                if None in (a0, b0, a1, b1) or (a0 - b0) * (a1 - b1) >= 0:
                    continue
                if min(abs(a0 - b0), abs(a1 - b1)) < gap:
                    continue
                first, second = (a, b) if a1 > b1 else (b, a)  # `first` passes `second`
                changes.append(
                    {
                        "from": before["point"],
                        "to": after["point"],
                        "passes": first,
                        "passed": second,
                        "before": (mean(before, first), mean(before, second)),
                        "after": (mean(after, first), mean(after, second)),
                    }
                )
    return changes


def crossover(runs: dict[str, list[RunRecord]], extended: list[str], refs: list[str], samples: int, seed: int):
    """The extended variants at every point they were scored at, each against the first of them (the paired cluster
    bootstrap and Welch's test, as in the main table), and the point from which the first leads each other for good."""
    from nmt.compare.summary import significance

    if len(extended) < 2:
        return None
    lead, others = extended[0], extended[1:]
    points = scored_points({name: runs[name] for name in extended if name in runs})
    rows = []
    for point in points:
        scored = {name: group for name, group in runs_at(runs, point).items() if name in extended and group}
        if lead not in scored:
            continue
        tests = significance(
            {lead: scored[lead], **{n: scored[n] for n in others if n in scored}}, lead, refs, samples, seed
        )
        rows.append(
            {
                "point": point,
                "bleu": {name: spread([r.score("bleu") for r in group]) for name, group in scored.items()},
                "tests": {name: tests.tests.get(name) for name in others if name in scored},
            }
        )
    passes = {}
    for other in others:
        ahead = [
            (row["point"], row["bleu"][lead]["mean"] > row["bleu"][other]["mean"])
            for row in rows
            if other in row["bleu"] and row["bleu"][other]["mean"] is not None
        ]
        from_point = None
        for k, (point, leads) in enumerate(ahead):
            if leads and all(lead_after for _, lead_after in ahead[k:]):
                from_point = point
                break
        passes[other] = from_point
    return {"lead": lead, "others": others, "rows": rows, "leads_from": passes}


def interpolate_bleu(points: dict[int, float], updates: float) -> float | None:
    """Mean test BLEU at a number of updates between two scored budget points, linear in log(updates); None outside
    the points scored (no extrapolation)."""
    known = sorted(points.items())
    if not known or updates < known[0][0] - 1e-9 or updates > known[-1][0] + 1e-9:
        return None
    for (x0, y0), (x1, y1) in zip(known, known[1:]):
        if x0 <= updates <= x1:
            w = (math.log(updates) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + w * (y1 - y0)
    return known[-1][1] if abs(updates - known[-1][0]) < 1e-9 else known[0][1]


def time_matched(runs: dict[str, list[RunRecord]], probes: list[dict], limit: float, main_points: list[int]):
    """Each variant's BLEU at the updates it makes in T seconds of training, for T = the seconds the fastest variant
    (by its clean probes' median updates/s on one CPU) needs to reach each budget point; its updates from its own
    median (and the range from its slowest and fastest probes)."""
    cpu, speeds = probe_speeds(probes, limit)
    speeds = {name: s for name, s in speeds.items() if s["median"] and name in runs}
    if not speeds:
        return None
    fastest = max(speeds, key=lambda name: speeds[name]["median"])
    budgets = [point / speeds[fastest]["median"] for point in main_points]
    rows = []
    for name, group in runs.items():
        speed = speeds.get(name)
        means = {}
        for point in scored_points({name: group}):
            values = [r.point_score(point) for r in group if r.finished and r.point_score(point) is not None]
            if values:
                means[point] = sum(values) / len(values)
        cells = []
        for seconds in budgets:
            if speed is None:
                cells.append(None)
                continue
            updates = seconds * speed["median"]
            low, high = seconds * speed["min"], seconds * speed["max"]
            cells.append(
                {
                    "updates": updates,
                    "range": (low, high),
                    "bleu": interpolate_bleu(means, updates),
                    "bleu_range": (interpolate_bleu(means, low), interpolate_bleu(means, high)),
                    # where no BLEU can be read: fewer updates than the first point scored, or more than the last
                    "outside": None if not means else "below" if updates < min(means) else "above",
                }
            )
        rows.append({"name": name, "speed": speed, "cells": cells})
    return {"cpu": cpu, "fastest": fastest, "seconds": budgets, "rows": rows, "limit": limit}
