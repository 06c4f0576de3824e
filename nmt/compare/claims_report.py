"""The claims section of report.md: a table of the claims' tests and verdicts, their evidence, the rules and the Holm
families (the results of nmt.compare.claims.evaluate_claims)."""

from __future__ import annotations

import math

from nmt.compare.claims import ALPHA, FAMILIES, RULES
from nmt.compare.markdown import table


def number(value: float | None, statistic: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:+.2f}" if "BLEU" in statistic or "share" in statistic else f"{value:.2f}"


def estimate_cell(test: dict) -> str:
    """label: statistic estimate [low, high] (the interval's kind unless 95%)."""
    low, high = test["ci_low"], test["ci_high"]
    span = f" [{number(low, test['statistic'])}, {number(high, test['statistic'])}]" if low is not None else ""
    span += f" ({test['interval']})" if low is not None and test["interval"] != "95%" else ""
    return f"{test['test']}: {test['statistic']} {number(test['estimate'], test['statistic'])}{span}"


def p_cell(test: dict) -> str:
    if not test["family"]:
        return f"{test['test']}: p {test['p']:.3g} (evidence, not in a family)"
    call = "called" if test["holm"] else "not called"
    return f"{test['test']}: p {test['p']:.3g}, Holm {test['p_holm']:.3g} ({call}; of {test['family_size']})"


def families(results: list[dict]) -> dict[str, int]:
    """Each Holm family's size."""
    return {f: size for f in FAMILIES if (size := sum(t["family"] == f for r in results for t in r["tests"]))}


def claims_markdown(results: list[dict]) -> str:
    """The claims section: a table, a line of evidence per claim, the rules, the families and alpha."""
    rows = []
    for r in results:
        pair = f"{r['a']} vs {r['b']}" + (f" against {r['c']} vs {r['d']}" if r["c"] else "")
        rows.append(
            [
                r["name"],
                r["text"],
                pair,
                "<br>".join(map(estimate_cell, r["tests"])) or "n/a",
                "<br>".join(map(p_cell, r["tests"])) or "n/a",
                r["verdict"],
            ]
        )
    alpha = results[0]["alpha"] if results else ALPHA
    lines = [
        table(["#", "claim", "A vs B", "estimate [95% CI] per test", "p (Holm)", "verdict"], rows, right=6),
        "",
    ]
    for r in results:
        lines.append(f"- **{r['name']}** ({r['verdict']}): {r['why']}." + "".join(f" {e}." for e in r["evidence"]))
    sizes = families(results)
    lines += [
        "",
        f"Verdicts at alpha {alpha}: *supported* when the kind's rule below holds, *not supported* when its reverse "
        "holds, *cannot tell* otherwise (a test not significant, tests that disagree, or a test that could not run, "
        "e.g. fewer than 3 seeds a side), *not run* when a variant of the claim has no finished run. A test calls a "
        "direction when Holm's correction over its family rejects its null. Δ is A minus B. Intervals are 95% "
        "(bootstrap: percentiles of the draws; seeds: Welch's t); the one-sided 95% bounds of non-inferiority are the "
        "basic bootstrap's and Student's t's, the ones that agree with the one-sided p-values.",
        "",
        *(f"- {kind}: supported when {yes}; not supported when {no}." for kind, (yes, no) in RULES.items()),
        "",
        "Holm families: "
        + ("; ".join(f"{FAMILIES[f]}: {n} test{'s' * (n != 1)}" for f, n in sizes.items()) or "none")
        + ". Cost claims use isolated measurements only (cost curves, speed probes), never the comparison's runs; "
        "budget-point differences are evidence, untested.",
    ]
    return "\n".join(lines) + "\n"
