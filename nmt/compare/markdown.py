"""report.md: tables padded to line up in a terminal, pipe tables that render on a git host.

Every number comes from the summary (nmt.compare.summary), itself read from the runs' files; the text
says how each was computed. A value that is missing (a run not finished, no gold alignments) shows as n/a.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict
from datetime import datetime

from nmt.compare.collect import RunRecord, TestData
from nmt.compare.runner import budget
from nmt.compare.summary import ALPHA
from nmt.config import RUN_KEYS, CompareConfig, Config, config_to_yaml, flatten
from nmt.training.progress import duration

NA = "n/a"
NOT_SETTINGS = (*RUN_KEYS, "train.seed", "train.progress")  # left out of the config differences


def num(value: float | None, digits: int = 1) -> str:
    return NA if value is None else f"{value:.{digits}f}"


def spread(stat: dict, digits: int = 1) -> str:
    """mean ± standard deviation over seeds (the mean alone with one seed)."""
    if stat["mean"] is None:
        return NA
    return num(stat["mean"], digits) + (f" ± {stat['std']:.{digits}f}" if stat["std"] is not None else "")


def signed(value: float, digits: int = 1) -> str:
    return f"{value:+.{digits}f}"


def count(n: int | None) -> str:
    """1234567 -> 1.23M, 45200 -> 45.2k."""
    if n is None:
        return NA
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else str(n)


def seconds(value: float | None) -> str:
    return NA if value is None else duration(value)


def table(header: list[str], rows: list[list[str]], right: int = 1) -> str:
    """A pipe table, each column padded to its widest cell; columns from `right` on are right-aligned."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).rjust(w) if i >= right else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"  # noqa: E731
    rule = "|" + "|".join("-" * (w + 1) + ":" if i >= right else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def delta_cells(sig: dict | None, baseline: bool) -> list[str]:
    """Δ BLEU [95% CI], p, significant? for one variant."""
    if baseline:
        return ["baseline", "", ""]
    if not sig:
        return [NA, NA, NA]
    return [f"{signed(sig['delta'], 2)} [{signed(sig['ci_low'], 2)}, {signed(sig['ci_high'], 2)}]", f"{sig['p_value']:.3f}", "yes" if sig["significant"] else "no"]


def main_table(summary: dict) -> str:
    """Test BLEU (mean ± s.d. over seeds), the paired test against the baseline, chrF, TER, AER, size and time."""
    rows = []
    for v in summary["variants"]:
        aer = spread(v["alignment"]["aer"], 3) if v["alignment"] else NA
        rows.append([v["name"], spread(v["bleu"]), *delta_cells(v["significance"], v["name"] == summary["baseline"]),
                     spread(v["chrf"]), spread(v["ter"]), aer, count(v["parameters"]), seconds(v["train_seconds"]["mean"])])
    return table(["variant", "test BLEU", "Δ BLEU vs baseline [95% CI]", "p", "sig.", "chrF", "TER", "AER", "params", "train time"], rows)


def training_table(summary: dict) -> str:
    rows = []
    for v in summary["variants"]:
        rows.append([v["name"], num(v["steps"]["mean"], 0), seconds(v["train_seconds"]["mean"]), num(v["steps_per_s"]["mean"], 2),
                     num(v["train_tokens_per_s"]["mean"], 0), num(v["best_step"]["mean"], 0), spread(v["valid_ppl"], 2),
                     num(v["decode_sentences_per_s"]["mean"], 1), f"{v['timed_out']}/{len(v['seeds'])}", spread(v["bleu_lc"])])
    return table(["variant", "updates", "train time", "updates/s", "target tok/s", "best step", "valid ppl", "decode sent/s", "stopped by time", "lc tok BLEU"], rows)


def length_table(summary: dict) -> str:
    header = ["variant"] + [f"{b['words']} words (n={b['sentences']})" for b in summary["length_buckets"]]
    rows = [[v["name"], *(num(b["mean"]) for b in v["length_bleu"])] for v in summary["variants"]]
    return table(header, rows)


def attention_table(summary: dict) -> str:
    rows = []
    for v in summary["variants"]:
        a, g = v["attention"], v["alignment"]
        rows.append([v["name"], num(a["entropy"]["mean"], 2), num(a["max_weight"]["mean"], 2), num(a["coverage"]["mean"], 2),
                     num(a["under_attended"]["mean"], 3), num(a["over_attended"]["mean"], 3),
                     *(spread(g[k], 3) if g else NA for k in ("aer", "precision", "recall")), num(a["p_t_diagonal_distance"]["mean"], 2)])
    return table(["variant", "entropy (nats)", "max weight", "coverage", "under-attended", "over-attended", "AER", "precision", "recall", "local-p |p_t - diagonal|"], rows)


def relative(run: RunRecord) -> str:
    """OUT/runs/VARIANT/seedN as runs/VARIANT/seedN."""
    return "/".join(run.run_dir.parts[-3:])


def runs_table(summary: dict, runs: dict[str, list[RunRecord]]) -> str:
    by_seed = {v["name"]: v["significance_by_seed"] for v in summary["variants"]}
    rows = []
    for name, group in runs.items():
        for r in group:
            if not r.finished:
                rows.append([name, str(r.seed), "not finished", "", "", "", "", "", "", "", relative(r)])
                continue
            sig = by_seed[name].get(r.seed)
            test = f"{signed(sig['delta'])} (p {sig['p_value']:.3f})" if sig else ("baseline" if name == summary["baseline"] else NA)
            rows.append([name, str(r.seed), num(r.score("bleu")), num(r.score("chrf")), num(r.score("ter")), num(r.score("bleu_lc")),
                         test, str(r.results["steps"]), duration(r.results["wall_s"]), str(r.evaluation["checkpoint_step"]), relative(r)])
    return table(["variant", "seed", "BLEU", "chrF", "TER", "lc tok BLEU", "Δ BLEU vs baseline, same seed", "updates", "train time", "best step", "run dir"], rows, right=1)


def signature_lines(summary: dict) -> list[str]:
    """The sacrebleu signature of each metric; more than one means the runs were not scored alike."""
    lines = []
    names = {"bleu": "BLEU", "chrf": "chrF", "ter": "TER", "bleu_lc": "lc tok BLEU"}
    for metric, found in summary["consistency"]["signatures"].items():
        text = ", ".join(f"`{s}`" for s in found) or NA
        lines.append(f"  - {names[metric]}: {text}" + (" **(differs between runs)**" if len(found) > 1 else ""))
    return lines


def config_section(configs: dict[str, Config | None], baseline: str) -> list[str]:
    """The baseline's resolved config in full and, for every other variant, the settings that differ from it."""
    base = configs.get(baseline)
    if base is None:
        return ["No resolved config yet (the baseline has not started)."]
    flat_base = {k: v for k, v in flatten(asdict(base)).items() if k not in NOT_SETTINGS}
    rows = []
    for name, cfg in configs.items():
        if cfg is None or name == baseline:
            continue
        flat = {k: v for k, v in flatten(asdict(cfg)).items() if k not in NOT_SETTINGS}
        diff = [f"{k}={flat.get(k)}" for k in sorted(set(flat) | set(flat_base)) if flat.get(k) != flat_base.get(k)]
        rows.append([name, " ".join(diff) or "(none)"])
    lines = ["Each run's resolved config is `RUN/config.yaml`. Settings that differ from the baseline's (seed and run dir aside):", "",
             table(["variant", "settings that differ from " + baseline], rows, right=9), "",
             f"<details><summary>The baseline's resolved config ({baseline})</summary>", "", "```yaml", config_to_yaml(base).rstrip(), "```", "", "</details>"]
    return lines


def environment_lines(sessions: list[dict]) -> list[str]:
    lines = []
    for k, session in enumerate(sessions, 1):
        env = session.get("environment", {})
        took = f", {duration(session['seconds'])}" if session.get("seconds") is not None else ", killed before it ended"
        took += " (interrupted)" if session.get("interrupted") else ""
        lines += [f"{k}. started {session.get('started', NA)}{took}:", "", "   ```", f"   {session.get('command', NA)}", "   ```", ""]
        packages = ", ".join(f"{name} {version}" for name, version in env.get("packages", {}).items())
        lines += [f"   - nmt {env.get('nmt', NA)} (git {env.get('git_commit') or 'unknown'}), Python {env.get('python', NA)}; {packages}",
                  f"   - {env.get('platform', NA)}; CPU: {env.get('cpu', NA)}, {env.get('cpu_cores', NA)} cores; GPUs: {', '.join(env.get('gpus') or []) or 'none'}",
                  f"   - torch threads {env.get('torch_threads', NA)}, OMP_NUM_THREADS={env.get('OMP_NUM_THREADS')}, load average at the start {env.get('load_average', NA)}", ""]
    return lines


def bonferroni(tests: int) -> str:
    if tests < 2:
        return ""
    return (f" No correction is made for testing {tests} variants against one baseline; with a Bonferroni correction a difference "
            f"would need p < {ALPHA / tests:.4f}.")


def how_computed(plan: CompareConfig, summary: dict, test: TestData, metric: str) -> list[str]:
    boot = summary["bootstrap"]
    consistency = summary["consistency"]
    tokenizers = consistency["tokenizer_sha256"]
    lines = [
        "## How each number was computed", "",
        f"- **Test set**: the {len(test.src)} pairs in `test.src` / `test.ref` (copied from the data config's test split; "
        f"sha256 of the text {', '.join(s[:16] for s in consistency['test_sha256']) or NA}). Each run translates it with its best checkpoint "
        f"(`checkpoints/best.pt`, the best by validation {metric}) and the shared decoding settings: {', '.join(consistency['decode']) or NA}.",
        "- **BLEU, chrF, TER** are sacrebleu corpus scores of `RUN/test.hyp` against `test.ref`, read from `RUN/eval.json`; "
        "**lc tok BLEU** is BLEU on lowercased text after sacrebleu's 13a tokenization, for comparison with papers that report tokenized lowercased BLEU. Signatures:",
        *signature_lines(summary),
        f"- **mean ± s.d.** are over the seeds {', '.join(map(str, plan.seeds))} (sample standard deviation; the mean alone with one seed).",
        f"- **Δ BLEU, 95% CI, p**: sacrebleu's paired bootstrap resampling test (`sacrebleu.significance.PairedTest`, `test_type=bs`; Koehn 2004), "
        f"{boot['samples']} resamples, seed {boot['seed']} (signature `{boot['signature'] or NA}`), of each variant against **{summary['baseline']}** "
        "on the same test sentences. With several seeds the outputs of all seeds are laid end to end (each beside the baseline's output of the same seed), "
        "so a resample draws (sentence, seed) pairs; Δ is the BLEU of that pooled output minus the baseline's. The interval is the 2.5th to 97.5th "
        "percentile of the resampled differences (the same draws as sacrebleu's test); p is sacrebleu's p-value. "
        f"**sig.** is yes when p < {ALPHA} and the interval excludes 0 (sacrebleu's test gives identical outputs p = 1/(resamples + 1), "
        "although their difference is 0 on every draw)." + bonferroni(len(summary["variants"]) - 1) + " The per-run table gives the test seed by seed.",
        "- **params**: parameters of the model (`eval.json`); **updates, train time, target tok/s**: `RUN/results.json` of nmt-train (time includes "
        "validation and is cumulative over resumes); **valid ppl**: validation perplexity at the best checkpoint's step, from `RUN/train.log`; "
        "**decode sent/s**: test sentences translated per second (`eval.json`).",
        "- **Attention** (`eval.json`): each test reference is forced through the model (teacher forcing), so every variant attends over the same "
        "output words. For RNN models the weights are the decoder's attention; for the Transformer the last layer's cross-attention averaged over heads. "
        "entropy = mean over output steps of -Σ a log a (nats; rows renormalised); max weight = mean of each step's largest weight; "
        f"coverage = attention mass a source subword receives summed over the output (</s> excluded), with the shares below {plan.under_attended} "
        f"(under-attended) and above {plan.over_attended} (over-attended); local-p |p_t - diagonal| = mean distance in source tokens between the "
        "predicted position p_t (Luong et al. 2015, eq. 9) and the line from the first source token to </s>. Hard attention is one-hot at inference, "
        "so its entropy is 0.",
        "- **AER, precision, recall** (Och & Ney 2003): each reference word is linked to the source word its attention weighs most "
        "(subwords merged: a word's row is the mean of its pieces' rows, a source word's column the sum of its pieces'; the </s> column left out), "
        + ("against the gold alignments in `test.align` (Pharaoh `i-j`), counts summed over the test set." if test.gold is not None
           else "but this comparison has no gold alignments (give `align=FILE`), so they are n/a."),
        "- **BLEU by source length**: the test set split into buckets of about equal size by source words; sacrebleu BLEU of each bucket's "
        "sentences, per run, then averaged over seeds.",
        "- **Learning curves** are the validation lines of each `RUN/train.log` (validation BLEU and loss); the seconds of a validation step are "
        "interpolated between the progress lines around it.",
        "- **Tokenizer**: " + (f"all runs used the same SentencePiece model(s) (sha256 {tokenizers[0][:16]}), so the same vocabulary and segmentation."
                                if len(tokenizers) == 1 else f"**the runs used {len(tokenizers)} different tokenizers**: {', '.join(t[:16] for t in tokenizers)}."),
    ]
    return lines + [""]


def markdown_report(plan: CompareConfig, summary: dict, test: TestData, sessions: list[dict], figures: dict[str, str],
                    configs: dict[str, Config | None], runs: dict[str, list[RunRecord]]) -> str:
    """The whole report.md."""
    variants = summary["variants"]
    finished = sum(len(v["seeds"]) for v in variants)
    planned = len(variants) * len(plan.seeds)
    base_cfg = configs.get(summary["baseline"])
    total = sum(s["seconds"] for s in sessions if s.get("seconds") is not None)
    budgets = summary["consistency"]["budget"]
    lines = [
        f"# {plan.name or 'Attention variants compared'}", "",
        f"{len(variants)} variants, seeds {', '.join(map(str, plan.seeds))}: {finished} of {planned} runs finished"
        + (f" (**{planned - finished} not finished**: the tables cover the finished ones)" if finished < planned else "") + ". "
        f"Every variant trains on the same data with the same tokenizer, budget and decoding settings; "
        f"budget per run: {budget(base_cfg) if base_cfg else NA}" + (" **(budgets differ between runs)**" if len(budgets) > 1 else "") + ". "
        f"Test set: {len(test.src)} sentences. Baseline: **{summary['baseline']}**. Runs trained {plan.jobs} at a time"
        + (" (so speeds are measured beside another run)" if plan.jobs > 1 else "") + ". "
        f"Training and scoring took {duration(total)} (wall-clock, {len(sessions)} session(s)). Report written {datetime.now().isoformat(timespec='seconds')}.", "",
        "## Main results", "",
        main_table(summary), "",
        "How to read it: *test BLEU* is the mean ± standard deviation over seeds. *Δ BLEU* is the variant's BLEU minus the baseline's on the "
        "same sentences (seeds pooled), with the 95% interval of sacrebleu's paired bootstrap; *p* is the chance of a difference at least this "
        f"large if the two systems were equally good, and *sig.* says whether p < {ALPHA} with an interval that excludes 0. An interval that contains 0 means the test cannot "
        "tell the two apart; a difference smaller than the s.d. over seeds may come from the seed rather than the attention. AER is "
        "lower-is-better (n/a without gold alignments).", "",
    ]
    if "bars" in figures:
        lines += [f"![Test BLEU by variant]({figures['bars']})", ""]
    lines += ["## Training and decoding", "", training_table(summary), ""]
    if "curves" in figures:
        lines += [f"![Learning curves]({figures['curves']})", ""]
    lines += ["## BLEU by source length", "", length_table(summary), ""]
    if "lengths" in figures:
        lines += [f"![BLEU by source length]({figures['lengths']})", ""]
    lines += ["## Attention", "", attention_table(summary), ""]
    if "heatmaps" in figures:
        lines += ["The same test sentences for every variant (reference forced through the model; rows: reference words, columns: "
                  "source words and </s>; red circles: gold alignment links, when there are any):", "",
                  f"![Attention heat maps]({figures['heatmaps']})", ""]
    lines += ["## Every run", "", runs_table(summary, runs), ""]
    lines += how_computed(plan, summary, test, base_cfg.train.early_stop_metric if base_cfg else NA)
    lines += ["## Reproducibility", "", "Commands (each nmt-compare session in this folder), with the software and hardware it ran on:", "",
              *environment_lines(sessions), "Variants and their overrides (`shared`, then the variant's, then the command line's, then the seed):", "",
              table(["variant", "overrides"], [[v["name"], " ".join(v["overrides"])] for v in variants], right=9), "",
              "Shared overrides: `" + " ".join(plan.shared) + "`" + (f"; from the command line: `{shlex.join(plan.extra)}`" if plan.extra else ""), "",
              *config_section(configs, summary["baseline"]), ""]
    return "\n".join(lines)
