"""report.md's sections for budgets in updates: the table at each budget point, where the order changes, the
crossover of the extended variants, the speed probes and the time-matched view, the runs' conditions, provenance.

Every number comes from the summary (nmt.compare.budgets, provenance, speed), itself read from the runs' files.
"""

from __future__ import annotations

from nmt.compare.budgets import ORDER_GAP
from nmt.compare.markdown import NA, interval, num, signed, spread, table
from nmt.evaluation.significance import MIN_SEEDS
from nmt.training.progress import duration


def budget_section(tables: list[dict], changes: list[dict], baseline: str, figure: str | None) -> list[str]:
    """The main comparison at each budget point, and the order changes between consecutive points."""
    if not tables:
        return []
    lines = [
        "## The ranking at each budget",
        "",
        "Every variant trained the same updates on the same batches; at each budget point N the test set was "
        "translated by the model a run of N updates chooses (the best checkpoint by validation among its first N "
        "updates), so each column is a comparison in its own right. Δ is against "
        f"{baseline}; the tests and sig. are those of the main table, on that point's translations (Holm over the "
        "variants at each point).",
        "",
    ]
    names = [row["name"] for row in tables[0]["rows"]]
    header = ["variant"] + [f"{t['point']:,} updates: BLEU (rank)" for t in tables]
    rows = []
    for name in names:
        cells = [name]
        for t in tables:
            row = next((r for r in t["rows"] if r["name"] == name), None)
            cells.append(f"{spread(row['bleu'], 2)} ({row.get('rank', NA)})" if row and row["seeds"] else NA)
        rows.append(cells)
    lines += [table(header, rows), ""]
    for t in tables:
        sig_rows = []
        for row in t["rows"]:
            if row["name"] == baseline or not row["seeds"]:
                continue
            sig = row["significance"] or {}
            sig_rows.append(
                [
                    row["name"],
                    signed(row["delta"], 2) if row["delta"] is not None else NA,
                    interval(sig.get("bootstrap")),
                    interval(sig.get("seeds")) if sig.get("seeds") else f"n/a (< {MIN_SEEDS} seeds)",
                    sig.get("decision", NA),
                ]
            )
        lines += [
            f"<details><summary>At {t['point']:,} updates: each variant against {baseline}</summary>",
            "",
            table(["variant", "Δ BLEU", "sentence bootstrap 95% CI, p", "seed test 95% CI, p", "sig."], sig_rows),
            "",
            *[f"- **Note**: {note}." for note in t["notes"]],
            "</details>",
            "",
        ]
    if figure:
        lines += [f"![Test BLEU at each budget point]({figure})", ""]
    if changes:
        lines += [
            f"Where the order changes (means over seeds, pairs at least {ORDER_GAP:g} BLEU apart at both points; the "
            "tests above are against the baseline only):",
            "",
        ]
        lines += [
            f"- between {c['from']:,} and {c['to']:,} updates, **{c['passes']}** passes {c['passed']} "
            f"({num(c['before'][0], 2)} vs {num(c['before'][1], 2)} → {num(c['after'][0], 2)} vs "
            f"{num(c['after'][1], 2)})"
            for c in changes
        ]
    else:
        lines.append(
            f"The order of the variants by mean test BLEU is the same at every budget point (among pairs at least "
            f"{ORDER_GAP:g} BLEU apart at both points)."
        )
    return lines + [""]


def crossover_section(cross: dict | None, extend: dict[str, int]) -> list[str]:
    """The extended variants at every point, the first against each other."""
    if not cross or not cross["rows"]:
        return []
    lead, others = cross["lead"], cross["others"]
    lines = [
        "## Crossover: trained on",
        "",
        f"{', '.join(f'{v} (to {s:,} updates)' for v, s in extend.items())} trained on after every run reached the "
        "shared budget: the same runs, resumed, scored at further points the same way. Δ is "
        f"{lead} minus each other variant (paired cluster bootstrap over test sentences, and Welch's test over "
        "seeds, on the seeds both have; Holm over the pairs at each point).",
        "",
    ]
    header = ["updates", *(f"{n} BLEU" for n in [lead, *others]), *(f"{lead} − {o}: bootstrap, seeds" for o in others)]
    rows = []
    for row in cross["rows"]:
        cells = [f"{row['point']:,}", *(spread(row["bleu"].get(n, {"mean": None}), 2) for n in [lead, *others])]
        for other in others:
            test = row["tests"].get(other) or {}
            boot, seeds = test.get("bootstrap"), test.get("seeds")
            cells.append(
                f"{signed(-boot['delta'], 2)} {interval_flipped(boot)}; {interval_flipped(seeds)} ({test['decision']})"
                if boot
                else NA
            )
        rows.append(cells)
    lines += [table(header, rows), ""]
    for other, point in cross["leads_from"].items():
        lines.append(
            f"- {lead} leads {other} from {point:,} updates on (at every later point)"
            if point
            else f"- {lead} does not lead {other} for good within the points scored"
        )
    return lines + [""]


def interval_flipped(result: dict | None) -> str:
    """A test of B - A shown as A - B."""
    if not result:
        return NA
    return f"[{signed(-result['ci_high'], 2)}, {signed(-result['ci_low'], 2)}], p {result['p_value']:.3f}"


def speed_section(matched: dict | None, probes: list[dict], limit: float) -> list[str]:
    """The speed probes and each variant's BLEU at the same seconds of training."""
    lines = ["## Speed probes and the time-matched view", ""]
    if not probes:
        return lines + [
            "No speed probes yet. Seconds in this report come only from probes, each variant trained alone on an "
            "idle host: `nmt-compare ... probe=true` (same experiment and out=).",
            "",
        ]
    left = sum(1 for p in probes if p.get("contended"))
    if matched is None:
        return lines + [f"{len(probes)} probes, none usable ({left} contended).", ""]
    lines += [
        f"Updates per second of training, from speed probes on **{matched['cpu']}**: each variant trained alone (one "
        "probe at a time, each in a fresh process, variants taking turns), its timed updates after untimed warm-up "
        f"ones. {len(probes)} probes in all; {left} left out as contended (wall time above {limit}x CPU time per "
        "thread, or other processes busy). Validation and checkpoints are not in these seconds.",
        "",
    ]
    seconds = matched["seconds"]
    header = ["variant", "updates/s median [min, max] (probes)"] + [
        f"in {duration(t)}: updates → test BLEU" for t in seconds
    ]
    rows = []
    for row in matched["rows"]:
        speed = row["speed"]
        cells = [
            row["name"],
            f"{speed['median']:.3f} [{speed['min']:.3f}, {speed['max']:.3f}] ({len(speed['values'])})"
            if speed
            else "no probe",
        ]
        for cell in row["cells"]:
            if cell is None:
                cells.append(NA)
                continue
            below = cell.get("outside") == "below"
            outside = "before the first point scored" if below else "past the last point scored"
            bleu = num(cell["bleu"], 2) if cell["bleu"] is not None else outside
            cells.append(f"{cell['updates']:,.0f} [{cell['range'][0]:,.0f}, {cell['range'][1]:,.0f}] → {bleu}")
        rows.append(cells)
    lines += [
        f"Time budgets T: the seconds the fastest variant ({matched['fastest']}) needs to reach each budget point. "
        "A variant's BLEU at the updates it makes in T (its median speed; the range from its slowest and fastest "
        "probes) is read off its test BLEU at the scored budget points, linear in log(updates) between them (never "
        "extrapolated). These seconds are of that CPU; another CPU orders the variants' speeds differently.",
        "",
        table(header, rows),
        "",
    ]
    return lines


def conditions_section(summary: dict, limit: float) -> list[str]:
    """The runs' training conditions: contention per run, and which runs' speeds were left out."""
    flagged = [(v["name"], seed, ratio) for v in summary["variants"] for seed, ratio in v["contention"]["flagged"]]
    worst = max((r for v in summary["variants"] for r in v["contention"]["values"]), default=None)
    lines = [
        "## Training conditions",
        "",
        f"Each run records, per part, its training wall time and CPU time and the load average "
        f"(`RUN/conditions.json`). Largest ratio of training wall time to CPU time per thread: {num(worst, 2)} "
        f"(1.00: the run had its cores to itself). Runs above contention_limit={limit} trained beside other work: "
        + (
            ", ".join(f"{n} seed {s} ({r:.2f})" for n, s, r in flagged)
            + "; their speeds are left out of every speed figure (the training table), their scores stand (a budget "
            "in updates does not depend on speed)."
            if flagged
            else "none."
        ),
        "",
    ]
    return lines


def provenance_section(prov: dict) -> list[str]:
    """Every session that made the runs, from the runs' own files."""
    lines = [
        "## Provenance",
        "",
        f"{len(prov['sessions'])} nmt-compare session(s) on {len(prov['hosts'])} host(s) trained or scored these runs "
        f"(from each run's `conditions.json` and `eval.json`); {duration(prov['training_s'])} of training "
        f"(validation and checkpoints included) and {duration(prov['scoring_s'])} of scoring, summed over runs"
        + (
            f"; {prov['runs_without_session']} finished run(s) predate these records."
            if prov["runs_without_session"]
            else "."
        ),
        "",
    ]
    rows = [
        [
            s.get("started", NA),
            s.get("host") or NA,
            s.get("cpu") or NA,
            (s.get("git_commit") or "unknown")[:12],
            f"nmt {s.get('nmt', NA)}, torch {s.get('torch', NA)}",
            f"{len(s['runs'])} ({s['parts']} parts)",
            duration(s["train_wall_s"]),
            str(s["scored_points"]),
            duration(s["elapsed_s"]) if s.get("elapsed_s") is not None else NA,
        ]
        for s in prov["sessions"]
    ]
    if rows:
        lines += [
            table(
                [
                    "started",
                    "host",
                    "CPU",
                    "git",
                    "software",
                    "runs trained",
                    "their training",
                    "points scored",
                    "session wall-clock",
                ],
                rows,
                right=5,
            ),
            "",
        ]
    return lines
