"""The report from small fixture runs written by hand: every number in its tables comes from the runs' files."""

import csv
import json

import numpy as np
import pytest
from omegaconf import OmegaConf
from sacrebleu.metrics import BLEU

from nmt.compare.curves import read_curve
from nmt.compare.report import build_report
from nmt.config import CompareConfig, Config, DataConfig, config_to_yaml
from nmt.evaluation.metrics import corpus_score
from tests.conftest import write

SRC = ["a b c", "d e", "f g h i", "j k l m n o", "p", "q r s t"]
REF = ["x y z", "u v", "w x y z", "p q r s t u", "v", "a b c d"]
OUTPUTS = {  # variant -> seed -> test output
    "base": {
        1: ["x y q", "u v", "w x q z", "p q r s q u", "q", "a q c d"],
        2: ["x q z", "u q", "w x y q", "p q q s t u", "v", "a b q d"],
    },
    "good": {
        1: ["x y z", "u v", "w x y z", "p q r s t u", "v", "a b c q"],
        2: ["x y z", "u v", "w x y z", "p q r s t q", "v", "a b c d"],
    },
}
LOG = """model: transformer, 1,000 parameters
step 2/4 | epoch 0.50 | loss 3.000 ppl 20.1 | lr 1.00e-03 | 1,000 tok/s | 10s | ETA 10s
step 2 | valid loss 2.500 ppl 12.18 | BLEU 10.00 chrF 20.00 (beam=1)
step 4/4 | epoch 1.00 | loss 2.000 ppl 7.4 | lr 1.00e-03 | 1,000 tok/s | 30s | ETA 0s
step 4 | valid loss {loss} ppl {ppl} | BLEU 20.00 chrF 30.00 (beam=1)
"""


def fixture_run(folder, seed, hyps, bleu_offset=0.0):
    """A finished run's files as nmt-train and nmt.compare.evaluate write them (scores from sacrebleu on `hyps`)."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(config_to_yaml(Config(data=DataConfig(train="t"))))
    scores = {m: corpus_score(m, hyps, REF) for m in ("bleu", "chrf", "ter", "bleu_lc")}
    (folder / "results.json").write_text(
        json.dumps(
            {
                "steps": 4,
                "wall_s": 40.0 + 2 * seed,
                "train_cpu_s": 30.0 + 2 * seed,  # the run waited for cores or was paused: wall above CPU time
                "train_tokens_per_s": 1000.0 * seed,
                "timed_out": False,
            }
        )
    )
    evaluation = {
        "checkpoint_step": 4,
        "sentences": len(hyps),
        "test_sha256": "t",
        "decode": "beam=1",
        "sentences_per_s": 50.0,
        "parameters": 1234,
        "tokenizer_sha256": "k",
        "scores": {
            m: {"score": s.score + (bleu_offset if m == "bleu" else 0.0), "signature": s.signature}
            for m, s in scores.items()
        },
        "attention": {
            "entropy": 0.5 * seed,
            "max_weight": 0.9,
            "coverage": 1.0,
            "under_attended": 0.1,
            "over_attended": 0.0,
            "p_t_diagonal_distance": None,
        },
        "alignment": {"aer": 0.2 + 0.1 * seed, "precision": 0.8, "recall": 0.7},
    }
    (folder / "eval.json").write_text(json.dumps(evaluation))
    write(folder / "test.hyp", hyps)
    (folder / "train.log").write_text(LOG.format(loss=1.5 + seed, ppl=f"{seed + 3.5:.2f}"))


@pytest.fixture
def out(tmp_path):
    out = tmp_path / "cmp"
    for name, seeds in OUTPUTS.items():
        for seed, hyps in seeds.items():
            fixture_run(out / "runs" / name / f"seed{seed}", seed, hyps)
    write(out / "test.src", SRC)
    write(out / "test.ref", REF)
    plan = CompareConfig(
        out=str(out),
        name="Fixture",
        overrides={"base": ["model=transformer"], "good": ["model=luong"]},
        seeds=[1, 2],
        baseline="base",
        bootstrap=200,
        length_buckets=2,
        heatmap_lines=[0],
    )
    (out / "comparison.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(plan)))
    return out


def main_rows(report: str) -> dict[str, list[str]]:
    table = report.split("## Main results")[1].split("How to read")[0]
    return {
        cells[0]: cells
        for line in table.splitlines()
        if line.startswith("| ") and (cells := [c.strip() for c in line.strip("|").split("|")])
    }


def test_tables_come_from_the_runs(out):
    build_report(out)
    report = (out / "report.md").read_text()
    good = main_rows(report)["good"]
    bleu = [
        json.loads((out / "runs" / "good" / f"seed{s}" / "eval.json").read_text())["scores"]["bleu"]["score"]
        for s in (1, 2)
    ]
    mean, std = sum(bleu) / 2, abs(bleu[0] - bleu[1]) / 2**0.5
    assert good[1] == f"{mean:.1f} ± {std:.1f}"
    assert good[9] == "0.350 ± 0.071"  # AER of seeds 1 and 2: 0.3, 0.4
    # Under the (default) update budget the time column is training's CPU time (32 and 34 s), not its wall time
    # (42 and 44 s: wall_s of results.json files without train_s), which counts waiting for cores and pauses
    assert good[12] == "33s" and "| updates | train CPU time |" in report
    every_run = report.split("## Every run")[1].split("\n\n")[1].splitlines()
    cells = {tuple(line.strip("|").split("|")[k].strip() for k in (0, 1)): line for line in every_run[2:]}
    assert [c.strip() for c in cells[("good", "2")].strip("|").split("|")][9] == "34s"
    base_bleu = [
        json.loads((out / "runs" / "base" / f"seed{s}" / "eval.json").read_text())["scores"]["bleu"]["score"]
        for s in (1, 2)
    ]
    assert good[2] == f"{mean - sum(base_bleu) / 2:+.2f}"  # Δ: the difference of the means shown
    # The cluster bootstrap, recomputed here with sacrebleu on each draw: the same sentence indices for both seeds
    picks = np.random.default_rng(12345).integers(0, len(REF), size=(200, len(REF)))
    score = lambda variant, seed, idx: (
        BLEU().corpus_score([OUTPUTS[variant][seed][i] for i in idx], [[REF[i] for i in idx]]).score
    )  # noqa: E731
    draws = np.array([np.mean([score("good", s, idx) - score("base", s, idx) for s in (1, 2)]) for idx in picks])
    observed = np.mean([score("good", s, range(len(REF))) - score("base", s, range(len(REF))) for s in (1, 2)])
    low, high = np.percentile(draws, [2.5, 97.5])
    p_value = (np.sum(np.abs(draws - observed) >= abs(observed) - 1e-9) + 1) / 201
    assert good[3] == f"[{low:+.2f}, {high:+.2f}], p {p_value:.3f}"
    assert good[4] == "n/a (< 3 seeds)" and good[5].startswith("bootstrap only: ")
    with open(out / "results.csv", newline="") as f:
        rows = {row["variant"]: row for row in csv.DictReader(f)}
    assert set(rows) == {"base", "good"} and float(rows["good"]["bleu_mean"]) == pytest.approx(mean)
    assert float(rows["good"]["valid_ppl"]) == pytest.approx(5.0)  # train.log's ppl at step 4: 4.50 and 5.50
    results = json.loads((out / "results.json").read_text())
    assert results["variants"][1]["significance"]["bootstrap"]["p_value"] == pytest.approx(p_value)
    assert [b["sentences"] for b in results["length_buckets"]] == [3, 3]  # 1-3 and 4-6 words


def test_a_changed_run_file_changes_the_report(out):
    build_report(out)
    before = main_rows((out / "report.md").read_text())["good"][1]
    path = out / "runs" / "good" / "seed1" / "eval.json"
    evaluation = json.loads(path.read_text())
    evaluation["scores"]["bleu"]["score"] += 10.0
    path.write_text(json.dumps(evaluation))
    build_report(out)
    assert main_rows((out / "report.md").read_text())["good"][1] != before


def test_an_unfinished_run_is_listed_and_left_out_of_the_means(out):
    (out / "runs" / "good" / "seed2" / "eval.json").unlink()
    build_report(out)
    report = (out / "report.md").read_text()
    assert "3 of 4 runs finished" in report and "not finished" in report
    seed1 = json.loads((out / "runs" / "good" / "seed1" / "eval.json").read_text())["scores"]["bleu"]["score"]
    assert main_rows(report)["good"][1] == f"{seed1:.1f}"


def test_learning_curves_from_train_log(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(
        LOG.format(loss=1.0, ppl="2.72")
        + "resumed from x/checkpoints/last.pt at step 2\n"
        + LOG.split("\n", 3)[3].format(loss=0.5, ppl="1.65")
    )
    curve = read_curve(log, final_step=4, final_seconds=31.0)
    assert [p[0] for p in curve.valid] == [2, 4]  # step 4 repeated after the resume: the last line wins
    assert curve.valid[1][2] == 0.5 and curve.valid[0][1] == 10.0 and curve.valid[1][1] == 31.0
    assert [(s, t) for s, t, _ in curve.train] == [(2, 10.0), (4, 30.0)]


def set_max_steps(out, variant, seed, steps):
    path = out / "runs" / variant / f"seed{seed}" / "config.yaml"
    cfg = OmegaConf.load(path)
    cfg.train.max_steps = steps
    path.write_text(OmegaConf.to_yaml(cfg))


def test_an_extended_variant_kept_the_shared_budget_in_its_first_part(out):
    """extend trains a variant on after the shared budget: not a difference of budget; another budget still is."""
    plan = OmegaConf.load(out / "comparison.yaml")
    plan.extend = {"good": 6}
    (out / "comparison.yaml").write_text(OmegaConf.to_yaml(plan))
    for seed in (1, 2):
        set_max_steps(out, "base", seed, 4)
        set_max_steps(out, "good", seed, 6)
    build_report(out)
    headline = (out / "report.md").read_text().split("## Main results")[0]
    assert "differ in: training budget" not in headline and "budgets differ" not in headline
    set_max_steps(out, "good", 2, 5)
    build_report(out)
    headline = (out / "report.md").read_text().split("## Main results")[0]
    assert "differ in: training budget" in headline and "budgets differ between runs" in headline


def test_chrf_plus_plus_is_filled_in_for_runs_scored_before_it_existed(out):
    """The fixture's eval.json files have no "chrf++" (as a comparison scored by older code): the report computes it
    from each run's test.hyp with sacrebleu's CHRF(word_order=2), says so, and leaves eval.json as it was."""
    from sacrebleu.metrics import CHRF

    path = out / "runs" / "good" / "seed1" / "eval.json"
    before = path.read_text()
    build_report(out)
    assert path.read_text() == before
    report = (out / "report.md").read_text()
    per_seed = [CHRF(word_order=2).corpus_score(OUTPUTS["good"][s], [REF]).score for s in (1, 2)]
    mean, std = np.mean(per_seed), np.std(per_seed, ddof=1)
    assert main_rows(report)["good"][7] == f"{mean:.1f} ± {std:.1f}"
    assert "Filled in by the report" in report and "good seed 1" in report and "nw:2" in report
    with open(out / "results.csv", newline="") as f:
        rows = {row["variant"]: row for row in csv.DictReader(f)}
    assert float(rows["good"]["chrf++_mean"]) == pytest.approx(mean, abs=1e-3)
    results = json.loads((out / "results.json").read_text())
    assert "base seed 2" in results["filled_by_report"] and results["comet"] is None
    assert results["consistency"]["signatures"]["chrf++"][0].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:2")


def test_order_changes_are_listed_only_between_variants_that_are_apart():
    """Two variants at 0.01 and 0.02 BLEU early in training have no order to change; 10 vs 12 becoming 15 vs 11 is
    a change, listed once with the one that passes first."""
    from nmt.compare.budgets import order_changes

    def table(point, means):
        return {"point": point, "rows": [{"name": n, "bleu": {"mean": m}} for n, m in means.items()]}

    tables = [
        table(50, {"a": 0.01, "b": 0.02, "c": 10.0, "d": 12.0}),
        table(125, {"a": 0.03, "b": 0.01, "c": 15.0, "d": 11.0}),
    ]
    changes = order_changes(tables)
    assert [(c["passes"], c["passed"], c["from"], c["to"]) for c in changes] == [("c", "d", 50, 125)]
    assert changes[0]["before"] == (10.0, 12.0) and changes[0]["after"] == (15.0, 11.0)
    assert len(order_changes(tables, gap=0.0)) == 2  # every swap when asked for


def test_under_an_update_budget_only_precision_and_batching_make_runs_unlike():
    """Runs of one update budget trained on two CPUs, or with other threads, did the same updates: the headline
    says so and flags nothing; another precision is flagged. Under a time budget the CPU is flagged too."""
    from pathlib import Path

    from nmt.compare.collect import RunRecord
    from nmt.compare.markdown import headline
    from nmt.compare.summary import SCORES, consistency, differences

    def run(seed: int, cpu: str, precision: str = "fp32", threads: int = 1) -> RunRecord:
        evaluation = {
            "tokenizer_sha256": "t",
            "test_sha256": "s",
            "decode": "greedy",
            "scores": {m: {"score": 1.0, "signature": "sig"} for m in SCORES},
        }
        part = {"threads": threads, "precision": precision, "batch_tokens": 1024, "accumulate": 1, "cpu": cpu}
        return RunRecord("A", seed, Path("/nonexistent"), results={}, evaluation=evaluation, hyps=[], conditions=[part])

    two_cpus = [run(1, "AMD EPYC"), run(2, "Intel Xeon", threads=2), run(3, "Intel Xeon"), run(5, "Intel Xeon")]
    check = consistency(two_cpus, updates=True)
    assert differences(check) == [] and check["other_conditions"] == []
    assert check["speed_other_conditions"] == ["A seed 1", "A seed 2"]
    line = headline({"consistency": check})
    assert "every finished run used the same" in line and "AMD EPYC, Intel Xeon" in line and "**" not in line
    by_time = consistency(two_cpus, updates=False)
    assert differences(by_time) == ["training conditions (threads, precision, batching, runs side by side, CPU)"]
    bf16 = consistency([*two_cpus, run(4, "Intel Xeon", precision="bf16")], updates=True)
    assert differences(bf16) == ["training conditions (precision, batching)"] and bf16["other_conditions"] == [
        "A seed 4"
    ]
    assert headline({"consistency": bf16}).startswith("**The finished runs differ in: training conditions")
