"""report.md: tables padded to line up in a terminal, pipe tables that render on a git host.

Every number comes from the summary (nmt.compare.summary), itself read from the runs' files; the text
says how each was computed. A value that is missing (a run not finished, no gold alignments) shows as n/a.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict
from datetime import datetime

from nmt.compare.collect import RunRecord, TestData
from nmt.compare.runner import budget, train_seconds
from nmt.compare.summary import ALPHA, differences
from nmt.config import RUN_KEYS, CompareConfig, Config, config_to_yaml, flatten
from nmt.evaluation.significance import MIN_SEEDS
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
    line = lambda cells: (
        "| "
        + " | ".join(str(c).rjust(w) if i >= right else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        + " |"
    )  # noqa: E731
    rule = "|" + "|".join("-" * (w + 1) + ":" if i >= right else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def interval(result: dict | None, digits: int = 2) -> str:
    """[low, high], p for one test's result."""
    if not result:
        return NA
    return f"[{signed(result['ci_low'], digits)}, {signed(result['ci_high'], digits)}], p {result['p_value']:.3f}"


def delta_cells(v: dict, baseline: bool) -> list[str]:
    """Δ BLEU (difference of the means shown), the sentence bootstrap, the seed test, sig. for one variant."""
    if baseline:
        return ["baseline", "", "", ""]
    sig = v["significance"] or {}
    delta = signed(v["delta_bleu"], 2) if v["delta_bleu"] is not None else NA
    return [
        delta,
        interval(sig.get("bootstrap")),
        interval(sig.get("seeds")) if sig.get("seeds") else f"n/a (< {MIN_SEEDS} seeds)",
        sig.get("decision", NA),
    ]


def cpu_timed(summary: dict) -> bool:
    """Under an update budget the main and per-run tables time training by its CPU time: the same updates on the
    same batches cost the same CPU seconds however long the run waited for cores or was stopped, while its wall time
    counts both."""
    return bool(summary["consistency"].get("updates"))


def train_time_header(summary: dict) -> str:
    return "train CPU time" if cpu_timed(summary) else "train time"


def main_table(summary: dict) -> str:
    """Test BLEU (mean ± s.d. over seeds), the two tests against the baseline, chrF, chrF++, TER, AER, size and budget
    used."""
    rows = []
    time_key = "train_cpu_seconds" if cpu_timed(summary) else "train_seconds"
    for v in summary["variants"]:
        aer = spread(v["alignment"]["aer"], 3) if v["alignment"] else NA
        rows.append(
            [
                v["name"],
                spread(v["bleu"]),
                *delta_cells(v, v["name"] == summary["baseline"]),
                spread(v["chrf"]),
                spread(v["chrf++"]),
                spread(v["ter"]),
                aer,
                count(v["parameters"]),
                num(v["steps"]["mean"], 0),
                seconds(v[time_key]["mean"]),
            ]
        )
    return table(
        [
            "variant",
            "test BLEU",
            "Δ BLEU",
            "sentence bootstrap 95% CI, p",
            "seed test (Welch) 95% CI, p",
            "sig.",
            "chrF",
            "chrF++",
            "TER",
            "AER",
            "params",
            "updates",
            train_time_header(summary),
        ],
        rows,
    )


def significance_table(summary: dict) -> str:
    """Each test's raw decision (p < alpha, interval without 0) and its Holm-corrected one."""
    yes_no = lambda r, key: NA if not r else ("yes" if r[key] else "no")  # noqa: E731
    rows = []
    for v in summary["variants"]:
        if v["name"] == summary["baseline"] or not v["significance"]:
            continue
        boot, seeds = v["significance"]["bootstrap"], v["significance"]["seeds"]
        rows.append(
            [
                v["name"],
                " ".join(map(str, boot["seeds"])) if boot else NA,
                signed(boot["delta"], 2) if boot else NA,
                interval(boot),
                yes_no(boot, "significant_raw"),
                yes_no(boot, "holm"),
                interval(seeds),
                yes_no(seeds, "significant_raw"),
                yes_no(seeds, "holm"),
                v["significance"]["decision"],
            ]
        )
    return table(
        [
            "variant",
            "bootstrap seeds",
            "bootstrap Δ",
            "bootstrap 95% CI, p",
            "raw",
            "Holm",
            "seed test 95% CI, p",
            "raw",
            "Holm",
            "sig.",
        ],
        rows,
    )


def training_table(summary: dict) -> str:
    rows = []
    for v in summary["variants"]:
        rows.append(
            [
                v["name"],
                num(v["steps"]["mean"], 0),
                seconds(v["train_seconds"]["mean"]),
                seconds(v["train_cpu_seconds"]["mean"]),
                seconds(v["valid_seconds"]["mean"]),
                num(v["steps_per_s"]["mean"], 2),
                num(v["train_tokens_per_s"]["mean"], 0),
                num(v["train_tokens_per_cpu_s"]["mean"], 0),
                num(v["best_step"]["mean"], 0),
                spread(v["valid_ppl"], 2),
                num(v["decode_sentences_per_s"]["mean"], 1),
                num(v["decode_sentences_per_cpu_s"]["mean"], 1),
                f"{v['timed_out']}/{len(v['seeds'])}",
                spread(v["bleu_lc"]),
            ]
        )
    header = [
        "variant",
        "updates",
        "train time",
        "train CPU",
        "validation time",
        "updates/s",
        "target tok/s",
        "target tok/CPU-s",
        "best step",
        "valid ppl",
        "decode sent/s",
        "decode sent/CPU-s",
        "stopped by time",
        "lc tok BLEU",
    ]
    return table(header, rows)


def length_table(summary: dict) -> str:
    header = ["variant"] + [f"{b['words']} words (n={b['sentences']})" for b in summary["length_buckets"]]
    rows = [[v["name"], *(num(b["mean"]) for b in v["length_bleu"])] for v in summary["variants"]]
    return table(header, rows)


def attention_table(summary: dict) -> str:
    rows = []
    for v in summary["variants"]:
        a, g = v["attention"], v["alignment"]
        scored = (
            f"{sum(g['scored'])}/{sum(g['scored']) + sum(g['skipped'])}"
            if g and None not in g["scored"] + g["skipped"]
            else NA
        )
        rows.append(
            [
                v["name"],
                num(a["entropy"]["mean"], 2),
                num(a["max_weight"]["mean"], 2),
                num(a["coverage"]["mean"], 2),
                num(a["under_attended"]["mean"], 3),
                num(a["over_attended"]["mean"], 3),
                *(spread(g[k], 3) if g else NA for k in ("aer", "precision", "recall")),
                scored,
                "; ".join(g["layer"]) if g else NA,
                num(a["p_t_diagonal_distance"]["mean"], 2),
            ]
        )
    return table(
        [
            "variant",
            "entropy (nats)",
            "max weight",
            "coverage",
            "under-attended",
            "over-attended",
            "AER",
            "precision",
            "recall",
            "sentences scored (all seeds)",
            "attention scored",
            "local-p |p_t - diagonal|",
        ],
        rows,
    )


def layer_table(summary: dict) -> str | None:
    """Transformers: test AER of each decoder layer (heads averaged), mean over seeds,
    and the layer chosen on validation."""
    rows = []
    for v in summary["variants"]:
        layers = v.get("alignment_by_layer")
        if layers:
            cells = [spread(stat, 3) for stat in layers["test_aer"]]
            rows.append(
                [
                    v["name"],
                    *cells,
                    ", ".join(map(str, layers["best_layers"])) + f" (on {', '.join(layers['chosen_on'])})",
                ]
            )
    if not rows:
        return None
    width = max(len(r) - 2 for r in rows)
    rows = [r[:-1] + [""] * (width + 2 - len(r)) + r[-1:] for r in rows]
    return table(["variant", *(f"layer {i + 1} AER" for i in range(width)), "layer reported, per seed"], rows)


def relative(run: RunRecord) -> str:
    """OUT/runs/VARIANT/seedN as runs/VARIANT/seedN."""
    return "/".join(run.run_dir.parts[-3:])


def runs_table(summary: dict, runs: dict[str, list[RunRecord]]) -> str:
    by_seed = {v["name"]: v["significance_by_seed"] for v in summary["variants"]}
    timed = (lambda res: res.get("train_cpu_s")) if cpu_timed(summary) else train_seconds
    rows = []
    for name, group in runs.items():
        for r in group:
            if not r.finished:
                rows.append([name, str(r.seed), "not finished", "", "", "", "", "", "", "", "", relative(r)])
                continue
            sig = by_seed[name].get(r.seed)
            test = (
                f"{signed(sig['delta'], 2)} [{signed(sig['ci_low'], 2)}, {signed(sig['ci_high'], 2)}] "
                f"(p {sig['p_value']:.3f})"
                if sig
                else ("baseline" if name == summary["baseline"] else NA)
            )
            rows.append(
                [
                    name,
                    str(r.seed),
                    num(r.score("bleu")),
                    num(r.score("chrf")),
                    num(r.score("chrf++")),
                    num(r.score("ter")),
                    num(r.score("bleu_lc")),
                    test,
                    str(r.results["steps"]),
                    duration(timed(r.results)) if timed(r.results) is not None else NA,
                    str(r.evaluation["checkpoint_step"]),
                    relative(r),
                ]
            )
    return table(
        [
            "variant",
            "seed",
            "BLEU",
            "chrF",
            "chrF++",
            "TER",
            "lc tok BLEU",
            "Δ BLEU vs baseline, same seed",
            "updates",
            train_time_header(summary),
            "best step",
            "run dir",
        ],
        rows,
        right=1,
    )


def signature_lines(summary: dict) -> list[str]:
    """The sacrebleu signature of each metric; more than one means the runs were not scored alike."""
    lines = []
    names = {"bleu": "BLEU", "chrf": "chrF", "chrf++": "chrF++", "ter": "TER", "bleu_lc": "lc tok BLEU"}
    for metric, found in summary["consistency"]["signatures"].items():
        text = ", ".join(f"`{s}`" for s in found) or NA
        lines.append(f"  - {names[metric]}: {text}" + (" **(differs between runs)**" if len(found) > 1 else ""))
    return lines


def filled_lines(summary: dict) -> list[str]:
    """Which runs had a score computed by the report (scored before the metric was added)."""
    filled = summary.get("filled_by_report") or []
    if not filled:
        return []
    return [
        "- **Filled in by the report**: chrF++ of the runs scored before it was added to `eval.json` "
        f"({', '.join(filled)}) is computed when the report is written, from their `test.hyp` (and `test.atN.hyp`) "
        "with the same sacrebleu call (`eval.json` is left as it is)."
    ]


def comet_lines(summary: dict, boot: dict) -> list[str]:
    """How COMET was computed (nothing without comet.model)."""
    comet = summary.get("comet")
    if not comet:
        return []
    return [
        f"- **COMET** (unbabel-comet, model `{comet['model']}`; signature "
        f"{', '.join(f'`{s}`' for s in comet['signatures']) or NA}"
        + (" **(differs between runs)**" if len(comet["signatures"]) > 1 else "")
        + "): each run's `test.hyp` scored with its source (`test.src`) and reference, segment by segment, when the "
        "report is written (cached in `comet_cache/`); a run's COMET is the mean of its segment scores. Its bootstrap "
        f"uses the BLEU bootstrap's {boot['samples']} draws of test sentences (all seeds of a drawn sentence "
        "together): a draw's score of a seed is the mean of its drawn segments' scores (a sentence drawn twice counts "
        "twice), a system's the mean over its seeds; the seed test is Welch's on the per-seed COMET; Holm and *sig.* "
        "as for BLEU."
    ]


def comet_table(comet: dict) -> str:
    """COMET (mean ± s.d. over seeds), Δ against the baseline, the segment bootstrap, the seed test, sig."""
    rows = []
    for v in comet["variants"]:
        if v["name"] == comet["baseline"]:
            cells = ["baseline", "", "", ""]
        else:
            sig = v["significance"] or {}
            cells = [
                signed(v["delta"], 4) if v["delta"] is not None else NA,
                interval(sig.get("bootstrap"), 4),
                interval(sig.get("seeds"), 4) if sig.get("seeds") else f"n/a (< {MIN_SEEDS} seeds)",
                sig.get("decision", NA),
            ]
        rows.append([v["name"], spread(v["comet"], 4), *cells, " ".join(map(str, v["seeds"]))])
    header = [
        "variant",
        "COMET",
        "Δ COMET",
        "segment bootstrap 95% CI, p",
        "seed test (Welch) 95% CI, p",
        "sig.",
        "seeds",
    ]
    return table(header, rows)


def comet_section(summary: dict) -> list[str]:
    """## COMET: the table at the shared budget and its notes (nothing without comet.model)."""
    comet = summary.get("comet")
    if not comet:
        return []
    return [
        "## COMET",
        "",
        f"COMET ({comet['model']}) of each run's test translation at the shared budget, mean ± s.d. over seeds; Δ "
        f"against {comet['baseline']}; the tests as for BLEU (sentence bootstrap over the segment scores, all seeds of "
        "a sentence drawn together; Welch's test over the per-seed COMET; Holm over the variants).",
        "",
        comet_table(comet),
        "",
        *[f"- **Note**: {note}." for note in comet["notes"]],
        "",
    ]


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
    lines = [
        "Each run's resolved config is `RUN/config.yaml`. Settings that differ from the baseline's "
        "(seed and run dir aside):",
        "",
        table(["variant", "settings that differ from " + baseline], rows, right=9),
        "",
        f"<details><summary>The baseline's resolved config ({baseline})</summary>",
        "",
        "```yaml",
        config_to_yaml(base).rstrip(),
        "```",
        "",
        "</details>",
    ]
    return lines


def environment_lines(sessions: list[dict]) -> list[str]:
    lines = []
    for k, session in enumerate(sessions, 1):
        env = session.get("environment", {})
        took = f", {duration(session['seconds'])}" if session.get("seconds") is not None else ", killed before it ended"
        took += " (interrupted)" if session.get("interrupted") else ""
        lines += [
            f"{k}. started {session.get('started', NA)}{took}:",
            "",
            "   ```",
            f"   {session.get('command', NA)}",
            "   ```",
            "",
        ]
        packages = ", ".join(f"{name} {version}" for name, version in env.get("packages", {}).items())
        lines += [
            f"   - nmt {env.get('nmt', NA)} (git {env.get('git_commit') or 'unknown'}), Python "
            f"{env.get('python', NA)}; {packages}",
            f"   - {env.get('platform', NA)}; CPU: {env.get('cpu', NA)}, {env.get('cpu_cores', NA)} cores; GPUs: "
            f"{', '.join(env.get('gpus') or []) or 'none'}",
            f"   - torch threads {env.get('torch_threads', NA)}, OMP_NUM_THREADS={env.get('OMP_NUM_THREADS')}, load "
            f"average at the start {env.get('load_average', NA)}",
            "",
        ]
    return lines


def how_computed(plan: CompareConfig, summary: dict, test: TestData, metric: str) -> list[str]:
    boot = summary["bootstrap"]
    consistency = summary["consistency"]
    tokenizers = consistency["tokenizer_sha256"]
    lines = [
        "## How each number was computed",
        "",
        f"- **Test set**: the {len(test.src)} pairs in `test.src` / `test.ref` (copied from the data config's test "
        f"split; sha256 of the text {', '.join(s[:16] for s in consistency['test_sha256']) or NA}). Each run "
        f"translates it with its best checkpoint (`checkpoints/best.pt`, the best by validation {metric}) and the "
        f"shared decoding settings: {', '.join(consistency['decode']) or NA}.",
        "- **BLEU, chrF, chrF++, TER** are sacrebleu corpus scores of `RUN/test.hyp` against `test.ref`, read from "
        "`RUN/eval.json` (chrF++ is chrF with word unigrams and bigrams, sacrebleu's `nw:2`); **lc tok BLEU** is BLEU "
        "on lowercased text after sacrebleu's 13a tokenization, for comparison with papers that report tokenized "
        "lowercased BLEU. Signatures:",
        *signature_lines(summary),
        *filled_lines(summary),
        *comet_lines(summary, boot),
        f"- **mean ± s.d.** are over the seeds {', '.join(map(str, plan.seeds))} "
        "(sample standard deviation; the mean alone with one seed).",
        "- **Δ BLEU** is the difference of the mean test BLEU over seeds shown in the table (the variant's minus "
        f"{summary['baseline']}'s).",
        "- **Sentence bootstrap** (paired cluster bootstrap; Koehn 2004, with the test sentence as the unit): "
        f"{boot['samples']} draws of {len(test.src)} test sentences with replacement (numpy seed {boot['seed']}), the "
        "same draws for every variant; a draw takes every seed's output of each drawn sentence for both systems, and "
        "scores each system as the mean over its seeds of corpus BLEU (sacrebleu's sufficient statistics summed over "
        "the draw). The interval is the 2.5th-97.5th percentile of the draws' differences; p is the two-sided "
        "bootstrap p-value: the share of draws, shifted to centre on 0, that lie at least as far from 0 as the "
        "observed difference ((k + 1) / (draws + 1)). It estimates how often test sets like this one would show a "
        "difference this large if these trained models were equally good on such sentences; it is not the probability "
        "that the systems are equal, and it holds the trained models fixed (it says nothing about other seeds). It "
        "uses the seeds both variants finished (column *bootstrap seeds*).",
        "- **Seed test**: Welch's t-test (unequal variances; `scipy.stats.ttest_ind`) on the per-seed test BLEU of "
        "the variant against the baseline's, with its 95% interval for the difference of means; it needs "
        f"{boot['min_seeds']} or more seeds per variant. It asks whether the difference exceeds training-seed noise.",
        f"- **sig.** is *yes* only when both tests call the difference at alpha {boot['alpha']} after Holm-Bonferroni "
        f"correction over the {max(len(summary['variants']) - 1, 0)} variants tested against the baseline (each "
        "test's p-values corrected on their own), with intervals that exclude 0 and in the same direction; *bootstrap "
        "only* when the seed test cannot run (fewer seeds); the Significance section shows each test's raw and "
        "corrected decision. At alpha 0.05, a true no-difference is called significant by a test in about one "
        "comparison in twenty; the correction keeps the chance of any such call among all variants at 0.05.",
        "- **params**: parameters of the model (`eval.json`); **updates, train time, target tok/s**: "
        "`RUN/results.json` of nmt-train; *train time* is training only by the budget's clock (validation and "
        "checkpoint saving are timed apart and not counted in `train.max_time`), summed over resumed parts; **valid "
        "ppl**: validation perplexity at the best checkpoint's step, from `RUN/train.log`; **decode sent/s**: test "
        "sentences translated per second (`eval.json`); **tok/CPU-s, sent/CPU-s**: the same per second of the "
        "process's CPU time (all its threads), which other processes on the machine do not slow down: with "
        "`train.threads=1` the speed per core.",
        "- **Attention** (`eval.json`): each test reference is forced through the model (teacher forcing), so every "
        "variant attends over the same output words. For RNN models the weights are the decoder's attention; for the "
        "Transformer the last layer's cross-attention averaged over heads. Every figure uses rows renormalised to sum "
        "to 1, for every variant (local-p's Gaussian leaves its raw rows summing to less than 1). entropy = mean over "
        "output steps of -Σ a log a (nats); max weight = mean of each step's largest weight; coverage = attention "
        "mass a source subword receives summed over the output (</s> excluded), with the shares below "
        f"{plan.under_attended} (under-attended) and above {plan.over_attended} (over-attended); local-p |p_t - "
        "diagonal| = mean distance in source tokens between the predicted position p_t (Luong et al. 2015, eq. 9) and "
        "the line from the first source token to </s>. Hard attention is one-hot at inference, so its entropy is 0.",
        "- **AER, precision, recall** (Och & Ney 2003): each reference word is linked to the source word its "
        "attention weighs most (subwords merged: a word's row is the mean of its pieces' rows, a source word's column "
        "the sum of its pieces'; the </s> column left out), "
        + (
            "against the gold alignments in `test.align` (Pharaoh `i-j`: source word i, target word j, 0-based), "
            "counts summed over the sentences scored (the AER table gives how many were scored and skipped: a "
            "sentence is skipped when its subwords do not merge into its whitespace words). For a Transformer every "
            "decoder layer is scored (heads averaged) and the layer with the lowest AER on the validation alignments "
            "is reported (the table names it)."
            if test.gold is not None
            else "but this comparison has no gold alignments (give `align=FILE`), so they are n/a."
        ),
        "- **BLEU by source length**: the test set split into buckets of about equal size by source words; sacrebleu "
        "BLEU of each bucket's sentences, per run, then averaged over seeds.",
        "- **Learning curves** are the validation lines of each `RUN/train.log` (validation BLEU and loss); the "
        "seconds of a validation step are interpolated between the progress lines around it.",
        "- **Tokenizer**: "
        + (
            f"all runs used the same SentencePiece model(s) (sha256 {tokenizers[0][:16]}), "
            "so the same vocabulary and segmentation."
            if len(tokenizers) == 1
            else f"**the runs used {len(tokenizers)} different tokenizers**: {', '.join(t[:16] for t in tokenizers)}."
        ),
    ]
    return lines + [""]


def headline(summary: dict) -> str:
    """The fairness sentence, only as far as the runs' files show it."""
    check = summary["consistency"]
    differ = differences(check)
    speed = ""
    if check.get("updates") and len(check.get("speed_conditions") or []) > 1:
        cpus = sorted({str(c.get("cpu")) for c in check["speed_conditions"]})
        speed = (
            f" They trained under {len(check['speed_conditions'])} sets of speed conditions (threads, runs side by "
            f"side, device, CPU: {', '.join(cpus)}), which under an update budget change the train time columns, "
            "not what was trained (the same updates on the same batches; only float rounding differs between CPUs)."
        )
    if not differ:
        trained = "training conditions (precision, batching)" if check.get("updates") else "training conditions"
        return (
            "Checked from the runs' files: every finished run used the same tokenizer, test set, training budget, "
            f"{trained} and decoding settings." + speed
        )
    return f"**The finished runs differ in: {', '.join(differ)}** (see How each number was computed)." + speed


def how_to_read(summary: dict) -> str:
    return (
        "How to read it: *test BLEU* is the mean ± standard deviation over seeds; *Δ BLEU* the difference of those "
        "means against the baseline. *Sentence bootstrap* resamples test sentences (all seeds of a sentence together) "
        "and asks whether these trained models differ on sentences like these; *seed test* compares the per-seed BLEU "
        "and asks whether the difference exceeds training-seed noise. *sig.* is yes only when both say so at alpha "
        f"{ALPHA} after Holm's correction over the variants. An interval that contains 0 means that test cannot tell "
        "the two apart. AER is lower-is-better (n/a without gold alignments). "
        + (
            "*train CPU time* counts training only, in CPU seconds of all the run's threads: under the update budget "
            "every variant did the same updates, and CPU time, unlike wall time, does not count the time a run waited "
            "for a core or was paused (speed is compared in the probes)."
            if cpu_timed(summary)
            else "*train time* counts training only."
        )
    )


def markdown_report(
    plan: CompareConfig,
    summary: dict,
    test: TestData,
    sessions: list[dict],
    figures: dict[str, str],
    configs: dict[str, Config | None],
    runs: dict[str, list[RunRecord]],
    early: list[str] | None = None,
    late: list[str] | None = None,
    prov: dict | None = None,
) -> str:
    """The whole report.md; `early` sections follow the significance tables, `late` ones precede reproducibility."""
    variants = summary["variants"]
    finished = sum(len(v["seeds"]) for v in variants)
    planned = sum(len(plan.seeds_of(v["name"])) for v in variants)
    base_cfg = configs.get(summary["baseline"])
    total = sum(s["seconds"] for s in sessions if s.get("seconds") is not None)
    budgets = summary["consistency"]["budget"]
    lines = [
        f"# {plan.name or 'Attention variants compared'}",
        "",
        f"{len(variants)} variants, seeds {', '.join(map(str, plan.all_seeds()))}: {finished} of {planned} runs "
        "finished"
        + (
            f" (**{planned - finished} not finished**: the tables cover the finished ones)"
            if finished < planned
            else ""
        )
        + ". "
        + headline(summary)
        + (
            f" Budget per run: {base_cfg.train.max_steps if base_cfg else NA} updates for every variant, on the same "
            "batches (the same data seen, on any machine)"
            if plan.budget == "updates"
            else f" Budget per run: {budget(base_cfg) if base_cfg else NA}"
        )
        + (" **(budgets differ between runs)**" if len(budgets) > 1 else "")
        + ". "
        f"Test set: {len(test.src)} sentences. Baseline: **{summary['baseline']}**. Runs trained {plan.jobs} at a time"
        + (" (so speeds are measured beside another run)" if plan.jobs > 1 else "")
        + ". "
        + (
            f"Training took {duration(prov['training_s'])} and scoring {duration(prov['scoring_s'])}, summed over the "
            f"runs, made by {len(prov['sessions'])} session(s) on {len(prov['hosts'])} host(s) (Provenance)"
            if prov and prov["sessions"]
            else f"Training and scoring took {duration(total)} (wall-clock, {len(sessions)} session(s) in this folder)"
        )
        + f". Report written {datetime.now().isoformat(timespec='seconds')}.",
        "",
        "## Main results",
        "",
        main_table(summary),
        "",
        how_to_read(summary),
        "",
        "## Significance",
        "",
        significance_table(summary),
        "",
        *[f"- **Note**: {note}." for note in summary["bootstrap"]["notes"]],
        *(
            [
                (
                    "- **Note**: these runs trained with another precision or batching than the rest "
                    "(`RUN/conditions.json`): "
                    if summary["consistency"].get("updates")
                    else "- **Note**: these runs trained under other conditions than the rest (threads, precision, "
                    "batching, runs side by side or the host's CPU; `RUN/conditions.json`): "
                )
                + f"{', '.join(summary['consistency']['other_conditions'])}; "
                + (
                    "their updates are not the others'."
                    if summary["consistency"].get("updates")
                    else "their speed and budget are not comparable."
                )
            ]
            if summary["consistency"]["other_conditions"]
            else []
        ),
        *(
            [
                "- **Note**: these runs trained with other threads, beside other runs or on another CPU than the "
                f"rest (`RUN/conditions.json`): {', '.join(summary['consistency']['speed_other_conditions'])}; "
                "under the update budget their scores are comparable, their train times are not."
            ]
            if summary["consistency"].get("speed_other_conditions")
            else []
        ),
        "",
    ]
    if "bars" in figures:
        lines += [f"![Test BLEU by variant]({figures['bars']})", ""]
    lines += early or []
    lines += ["## Training and decoding", "", training_table(summary), ""]
    if "curves" in figures:
        lines += [f"![Learning curves]({figures['curves']})", ""]
    lines += ["## BLEU by source length", "", length_table(summary), ""]
    if "lengths" in figures:
        lines += [f"![BLEU by source length]({figures['lengths']})", ""]
    lines += ["## Attention", "", attention_table(summary), ""]
    if (layers := layer_table(summary)) is not None:
        lines += [
            "Transformer cross-attention, layer by layer (test AER, heads averaged; the main figure reports the layer "
            "with the lowest AER on the validation alignments):",
            "",
            layers,
            "",
        ]
    if "heatmaps" in figures:
        lines += [
            "The same test sentences for every variant (reference forced through the model; rows: reference words, "
            "columns: source words and </s>; red circles: gold alignment links, when there are any):",
            "",
            f"![Attention heat maps]({figures['heatmaps']})",
            "",
        ]
    lines += ["## Every run", "", runs_table(summary, runs), ""]
    lines += late or []
    lines += how_computed(plan, summary, test, base_cfg.train.early_stop_metric if base_cfg else NA)
    lines += [
        "## Reproducibility",
        "",
        "Commands (each nmt-compare session in this folder), with the software and hardware it ran on:",
        "",
        *environment_lines(sessions),
        "Variants and their overrides (`shared`, then the variant's, then the command line's, then the seed):",
        "",
        table(["variant", "overrides"], [[v["name"], " ".join(v["overrides"])] for v in variants], right=9),
        "",
        "Shared overrides: `"
        + " ".join(plan.shared)
        + "`"
        + (f"; from the command line: `{shlex.join(plan.extra)}`" if plan.extra else ""),
        "",
        *config_section(configs, summary["baseline"]),
        "",
    ]
    return "\n".join(lines)
