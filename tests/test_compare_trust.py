"""What makes a comparison's numbers true of what it ran: re-scoring instead of relabelling, matched training budgets,
shared training conditions, a CUDA-free parent, submitit dispatch, and diagnostics that measure the model."""

import json
import shutil
import time

import numpy as np
import pytest
import torch

from nmt.cli import compare
from nmt.compare.environment import cpu_model
from nmt.compare.plan import TEST_ALIGN, prepare_test
from nmt.config import CompareConfig, Config, DataConfig, ModelConfig, TrainConfig
from nmt.evaluation.diagnostics import AttentionStats
from nmt.models.attention import LocalWindow, make_attention
from nmt.training.trainer import Trainer
from tests.test_cli import cli
from tests.test_compare import compare_args
from tests.test_errors import one_error_line


@pytest.fixture(scope="module")
def spawned(toy_comparison, tmp_path_factory):
    """Two tiny variants trained by two spawned workers, the parent forbidden to initialise CUDA (conftest's
    toy_comparison, trained once a session): this module's own copy, which its tests change."""
    out = tmp_path_factory.mktemp("trust") / "report"
    shutil.copytree(toy_comparison, out)
    return out


def eval_of(out, variant="transformer"):
    return json.loads((out / "runs" / variant / "seed1" / "eval.json").read_text())


def test_each_run_records_how_it_trained(spawned):
    conditions = json.loads((spawned / "runs" / "transformer" / "seed1" / "conditions.json").read_text())
    assert len(conditions) == 1
    part = conditions[0]
    assert {k: part[k] for k in ("from_step", "to_step", "jobs", "threads", "precision", "batch_tokens")} == {
        "from_step": 0,
        "to_step": 6,
        "jobs": 2,
        "threads": 1,
        "precision": "fp32",
        "batch_tokens": 512,
    }
    assert part["cpu"] == cpu_model()  # the host's, so parts run elsewhere are told apart
    assert part["clock_start"] == {"train_s": 0.0, "train_cpu_s": 0.0, "wall_s": 0.0}
    results = json.loads((spawned / "runs" / "transformer" / "seed1" / "results.json").read_text())
    assert part["clock_end"] == {k: results[k] for k in ("train_s", "train_cpu_s", "wall_s")}
    assert len(part["load_average_start"]) == 3 and len(part["load_average_end"]) == 3
    session = part["session"]  # the invocation that trained it: provenance survives archiving the run elsewhere
    assert session["command"].startswith("nmt-compare experiment=compare_attention_toy")
    assert session["cpu"] == cpu_model()
    assert {"host", "git_commit", "nmt", "torch", "started"} <= set(session)
    assert eval_of(spawned)["points"]["6"]["session"] == session
    report = (spawned / "report.md").read_text()
    assert (
        "Checked from the runs' files: every finished run used the same tokenizer, test set, training budget" in report
    )
    results = json.loads((spawned / "runs" / "transformer" / "seed1" / "results.json").read_text())
    assert results["train_s"] <= results["wall_s"] and {"valid_s", "save_s", "train_cpu_s"} <= set(results)


def test_a_comparison_resumed_with_other_thresholds_is_scored_again_not_retrained(spawned, toy_dir, capsys):
    trained_at = (spawned / "runs" / "transformer" / "seed1" / "results.json").stat().st_mtime_ns
    assert eval_of(spawned)["settings"]["under_attended"] == 0.5
    code, out, err = cli(
        compare.main, compare_args(toy_dir, spawned) + ["train.threads=1", "under_attended=0.25"], capsys
    )
    assert code == 0, err
    assert (
        "transformer seed 1: scored earlier with other settings (under_attended: 0.5 -> 0.25); scoring again, "
        "not retraining" in out
    )
    assert eval_of(spawned)["settings"]["under_attended"] == 0.25
    assert (spawned / "runs" / "transformer" / "seed1" / "results.json").stat().st_mtime_ns == trained_at
    # report_only with yet another threshold would relabel the numbers: refused, naming the key
    code, _, err = cli(compare.main, ["report_only=true", f"out={spawned}", "under_attended=0.4"], capsys)
    one_error_line(
        code,
        err,
        "error: report_only=true: transformer seed 1 was scored with under_attended=0.25, "
        "but the report would state under_attended=0.4",
    )
    code, _, err = cli(compare.main, ["report_only=true", f"out={spawned}", "heatmap_lines=[1]"], capsys)
    one_error_line(code, err, "was scored with heatmap_lines=")
    code, _, err = cli(compare.main, ["report_only=true", f"out={spawned}"], capsys)
    assert code == 0, err


def test_every_variant_must_share_the_throughput_settings(toy_dir, tmp_path, capsys):
    args = compare_args(toy_dir, tmp_path / "report")
    code, _, err = cli(compare.main, args + ["overrides.transformer=[model=transformer,train.accumulate=2]"], capsys)
    one_error_line(code, err, "error: variant luong_local_p: train.accumulate=1 but transformer has 2")
    code, _, err = cli(compare.main, args + ["overrides.transformer=[model=transformer,train.threads=2]"], capsys)
    one_error_line(code, err, "train.threads=1 but transformer has 2")
    code, _, err = cli(compare.main, args + ["bootstrap_seed=0"], capsys)  # checked before anything trains
    one_error_line(code, err, "error: bootstrap_seed=0: expected")
    assert not (tmp_path / "report" / "runs").exists()


def test_a_stale_gold_alignment_file_is_removed(toy_dir, tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    (out / TEST_ALIGN).write_text("0-0\n")
    (tmp_path / "plain.src").write_text("a b\n")
    (tmp_path / "plain.tgt").write_text("c d\n")
    test, align = prepare_test(
        CompareConfig(), DataConfig(train=f"{toy_dir}/train", test=f"{tmp_path}/plain", src="src", tgt="tgt"), out
    )
    assert align is None and test.gold is None and test.align_sha256 is None and not (out / TEST_ALIGN).exists()


def slow_validation(seconds: float, calls: list | None = None):
    validate = Trainer.validate

    def slowed(self):
        if calls is not None:
            calls.append(self.step)
        time.sleep(seconds)
        return validate(self)

    return slowed


def test_a_slow_validation_takes_no_training_time(toy_dir, tmp_path, monkeypatch):
    """Two runs with the same 0.04-minute budget, one validating 0.5 s slower each time: both train 2.4 s."""

    def fit(name: str) -> dict:
        cfg = Config(
            data=DataConfig(
                name="toy",
                train=f"{toy_dir}/train",
                valid=f"{toy_dir}/valid",
                src="src",
                tgt="tgt",
                vocab_size=100,
                cache_dir=str(tmp_path / "cache"),
            ),
            model=ModelConfig(arch="transformer", dim=16, ffn_dim=32, layers=1, heads=2),
            train=TrainConfig(
                max_steps=100000,
                max_time=0.04,
                batch_tokens=256,
                valid_every=40,
                save_every=1000,
                threads=1,
                valid_bleu_sentences=5,
                progress=False,
            ),
        )
        return Trainer(cfg, tmp_path / name).fit()

    fast = fit("fast")
    calls: list = []
    monkeypatch.setattr(Trainer, "validate", slow_validation(0.5, calls))
    slow = fit("slow")
    for results in (fast, slow):
        assert 2.4 <= results["train_s"] < 2.9 and results["timed_out"]
    validations = len(calls)  # counted, not inferred from the step count (2 when a loaded machine makes < 120 updates)
    assert (
        validations >= 2 and slow["valid_s"] > fast["valid_s"] + 0.5 * validations - 0.2
    )  # none of it counted as training
    assert slow["wall_s"] > slow["train_s"] + 0.5 * validations
    assert 0.6 < slow["steps"] / fast["steps"] < 1.6  # the same budget buys about the same number of updates


def test_submitit_local_dispatch(toy_dir, tmp_path, capsys):
    pytest.importorskip("submitit")
    out = tmp_path / "report"
    code, text, err = cli(
        compare.main,
        compare_args(toy_dir, out, steps=4) + ["launcher=submitit_local", "train.threads=1", "slurm.timeout_min=10"],
        capsys,
    )
    assert code == 0, err
    assert "2 jobs submitted (submitit_local)" in text and "transformer seed 1: job" in text
    assert (out / "report.md").is_file() and (out / "submitit").is_dir()
    for variant in ("transformer", "luong_local_p"):
        assert (out / "runs" / variant / "seed1" / "eval.json").is_file()
    code, text, err = cli(
        compare.main, compare_args(toy_dir, out, steps=4) + ["launcher=submitit_local", "train.threads=1"], capsys
    )
    assert code == 0 and "jobs submitted" not in text  # nothing left to run: the report alone


def test_local_p_diagnostics_use_renormalised_rows():
    """A hand-made local-p sentence whose rows sum to 0.5: the figures are those of the same rows summing to 1."""
    rows = np.array([[0.4, 0.1, 0.0], [0.1, 0.3, 0.1]])  # sums 0.5 (raw), columns 0, 1 and </s>
    raw, full = AttentionStats(0.5, 2.0), AttentionStats(0.5, 2.0)
    raw.add(rows)
    full.add(rows * 2)
    assert raw.as_dict() == full.as_dict()
    figures = raw.as_dict()
    assert figures["max_weight"] == pytest.approx((0.8 + 0.6) / 2)
    assert figures["coverage"] == pytest.approx((1.0 + 0.8) / 2)  # (0.8 + 0.2, 0.2 + 0.6), </s> left out
    assert figures["under_attended"] == 0.0  # raw masses 0.5 and 0.4 would have counted one


def test_local_p_positions_stay_exact_under_bf16_autocast():
    torch.manual_seed(0)
    window = make_attention("general", 16, 16, 16, window="local_p", window_size=5)
    assert isinstance(window, LocalWindow)
    query, mask = torch.randn(1, 4, 16), torch.ones(1, 300, dtype=torch.bool)
    exact = window.positions(query, mask, None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        positions = window.positions(query, mask, None)
    assert positions.dtype == torch.float32
    torch.testing.assert_close(
        positions, exact, atol=0.5, rtol=0.02
    )  # bf16 would round 200.4 to 200 and collide above 256
    assert len(set(positions.flatten().tolist())) == 4
    keys = torch.randn(1, 300, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, weights = window(query, window.prepare(keys), keys, mask)
    assert torch.isfinite(weights).all() and (weights.float().sum(-1) <= 1 + 1e-2).all()


def test_decode_precision_is_honoured_in_scoring(toy_dir, tmp_path, capsys):
    out = tmp_path / "report"
    code, _, err = cli(
        compare.main,
        compare_args(toy_dir, out, steps=4) + ["variants=transformer", "decode.precision=int8", "train.threads=1"],
        capsys,
    )
    assert code == 0, err
    evaluation = eval_of(out)
    assert "precision=int8" in evaluation["decode"] and "precision=int8" in evaluation["settings"]["decode"]
    log = (out / "runs" / "transformer" / "seed1" / "train.log").read_text()
    assert "precision=int8" in log  # validation searched in int8 too
