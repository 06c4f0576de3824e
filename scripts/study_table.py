"""The study's main table in short, for the README: from an nmt-compare folder's results.json.

    python scripts/study_table.py runs/attention_multi30k_cpu > docs/studies/attention-multi30k/main_table.md

Columns: variant, test BLEU mean ± s.d. over seeds, Δ against the baseline with the seed test's 95% interval
and p (Welch's t-test over seeds) and the sentence bootstrap's p, both tests' decision after Holm's correction,
updates in the budget. Rows in descending mean BLEU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def row(variant: dict, baseline: str) -> str:
    bleu, name = variant["bleu"], variant["name"]
    spread = f" ± {bleu['std']:.2f}" if bleu.get("std") is not None and len(bleu["values"]) > 1 else ""
    seeds = len(bleu["values"])
    updates = variant["steps"]["values"]
    budget = f"{updates[0]:,}" if len(set(updates)) == 1 else "/".join(f"{u:,}" for u in updates)
    if name == baseline:
        return f"| **{name}** (baseline) | {bleu['mean']:.2f}{spread} | | | | | {seeds} | {budget} |"
    test = variant.get("significance") or {}
    seed, boot = test.get("seeds"), test.get("bootstrap")
    seed_cell = f"[{seed['ci_low']:+.2f}, {seed['ci_high']:+.2f}], p {seed['p_value']:.3f}" if seed else "n/a"
    boot_cell = f"p {boot['p_value']:.3f}" if boot else "n/a"
    return (
        f"| {name} | {bleu['mean']:.2f}{spread} | {variant['delta_bleu']:+.2f} | {seed_cell} | {boot_cell} | "
        f"{test.get('decision', 'n/a')} | {seeds} | {budget} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    summary = json.loads((args.folder / "results.json").read_text())
    variants = [v for v in summary["variants"] if v["bleu"]["mean"] is not None]
    variants.sort(key=lambda v: -v["bleu"]["mean"])
    print(
        "| variant | test BLEU | Δ | seed test 95% CI, p | sentence bootstrap | both significant (Holm) | seeds | "
        "updates |"
    )
    print("|---|---:|---:|---|---|---|---:|---:|")
    for variant in variants:
        print(row(variant, summary["baseline"]))


if __name__ == "__main__":
    main()
