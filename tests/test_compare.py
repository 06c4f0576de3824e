"""nmt-compare end to end on the toy task: tiny variants, the report folder, report_only,
and a SIGKILL in the middle."""

import csv
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from nmt.cli import compare
from nmt.cli.common import run
from nmt.compare.probe import forced_attention, predictive_windows
from nmt.config import ModelConfig
from nmt.data.tokenizer import EOS
from nmt.models.builders import build_model
from nmt.search import greedy_search
from nmt.training.trainer import Trainer
from tests.conftest import random_batch
from tests.test_cli import cli, toy_overrides
from tests.test_errors import one_error_line
from tests.test_resume import fork, needs_fork, wait

TINY = [
    "model.dim=16",
    "model.ffn_dim=32",
    "model.window_size=3",
    "data.vocab_size=100",
    "train.batch_tokens=512",
    "train.warmup=4",
    "train.valid_every=4",
    "train.save_every=4",
    "train.log_every=2",
    "train.valid_bleu_sentences=5",
    "decode.max_len_a=1.0",
    "decode.max_len_b=2",
]


def compare_args(toy_dir, out, steps: int = 6) -> list[str]:
    """Two tiny variants of the toy experiment, one seed, on the test corpus (100 test pairs with gold alignments)."""
    return [
        "experiment=compare_attention_toy",
        "variants=transformer,luong_local_p",
        "seeds=1",
        f"out={out}",
        "progress=false",
        "bootstrap=50",
        *toy_overrides(toy_dir),
        f"data.cache_dir={toy_dir}_cache",  # beside the session's corpus: the comparisons prepare it once
        *TINY,
        f"train.max_steps={steps}",
        "budget_points=[]",  # the recipe's points (50, 125, 250) are past these tiny runs
        "claims=[]",  # the recipe's claims name variants these runs leave out
    ]


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def compared(toy_comparison, tmp_path_factory):
    """Both variants trained at once, each in its own (spawned) process (conftest's toy_comparison, trained once a
    session): this module's own copy, which its tests change."""
    out = tmp_path_factory.mktemp("compare") / "report"
    shutil.copytree(toy_comparison, out)
    return out


def test_the_report_folder_has_one_row_per_variant(compared):
    for name in (
        "report.md",
        "results.csv",
        "results.json",
        "bleu_bars.png",
        "learning_curves.png",
        "bleu_by_length.png",
        "attention_heatmaps.png",
    ):
        assert (compared / name).is_file(), name
    rows = read_csv(compared / "results.csv")
    assert [r["variant"] for r in rows] == ["transformer", "luong_local_p"]
    report = (compared / "report.md").read_text()
    results = json.loads((compared / "results.json").read_text())
    for row, variant in zip(rows, results["variants"]):
        evaluation = json.loads((compared / "runs" / row["variant"] / "seed1" / "eval.json").read_text())
        assert float(row["bleu_mean"]) == evaluation["scores"]["bleu"]["score"] == variant["bleu"]["mean"]
        assert f"| {row['variant']} " in report.split("## Training")[0]
        assert (
            evaluation["alignment"]["sentences"] + evaluation["alignment"]["skipped"] == 100
        )  # gold found beside data.test
    assert (
        results["variants"][1]["significance"]["bootstrap"]["seeds"] == [1]
        and results["variants"][0]["significance"] is None
    )
    assert len(results["consistency"]["tokenizer_sha256"]) == 1  # one tokenizer for both variants
    local_p = results["variants"][1]["attention"]["p_t_diagonal_distance"]["mean"]
    assert local_p is not None and results["variants"][0]["attention"]["p_t_diagonal_distance"]["mean"] is None


def test_report_only_rebuilds_from_the_runs_with_another_baseline(compared, capsys):
    code, out, err = cli(compare.main, ["report_only=true", f"out={compared}", "baseline=luong_local_p"], capsys)
    assert code == 0, err
    main = [line for line in out.splitlines() if line.startswith("| luong_local_p ")]
    assert main and "baseline" in main[0]
    assert json.loads((compared / "results.json").read_text())["baseline"] == "luong_local_p"


def killing_luong_at_step_6():
    """A Trainer.train_step that SIGKILLs its own process just before the luong run's update 6
    (after its checkpoint at step 4)."""
    update = Trainer.train_step

    def train_step(self, batches, tokens=None):
        if self.cfg.model.arch == "luong" and self.step + 1 == 6:
            os.kill(os.getpid(), signal.SIGKILL)
        return update(self, batches, tokens)

    return train_step


@needs_fork
def test_a_killed_comparison_skips_the_finished_run_and_resumes_the_other(toy_dir, tmp_path, capsys):
    out = tmp_path / "report"
    args = compare_args(toy_dir, out, steps=8) + ["jobs=1"]

    def work():
        Trainer.train_step = killing_luong_at_step_6()  # in the child only
        run(compare.main, args)

    assert wait(fork(work)) == -signal.SIGKILL
    finished, killed = out / "runs" / "transformer" / "seed1", out / "runs" / "luong_local_p" / "seed1"
    scored_at = (finished / "eval.json").stat().st_mtime_ns
    assert not (killed / "results.json").exists() and (killed / "checkpoints" / "last.pt").is_file()
    code, text, err = cli(compare.main, args, capsys)
    assert code == 0, err
    assert (
        "[1/2] transformer seed 1: finished earlier" in text
        and "[2/2] luong_local_p seed 1: resuming from step 4" in text
    )
    assert (finished / "eval.json").stat().st_mtime_ns == scored_at  # not trained or scored again
    assert f"resumed from {killed}/checkpoints/last.pt at step 4" in (killed / "train.log").read_text()
    assert json.loads((killed / "results.json").read_text())["steps"] == 8
    assert len(read_csv(out / "results.csv")) == 2
    sessions = json.loads((out / "sessions.json").read_text())
    assert len(sessions) == 2 and "seconds" not in sessions[0] and sessions[1]["seconds"] > 0


def process_with_open(path) -> int | None:
    """The pid of a process that has `path` open (Linux /proc), if any."""
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) == str(path) for fd in fd_dir.iterdir()):
                return int(fd_dir.parent.name)
        except OSError:
            continue
    return None


@needs_fork
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="finds the worker through /proc")
def test_a_killed_worker_stops_the_comparison_with_one_line_and_the_next_run_resumes(toy_dir, tmp_path, capsys):
    out = tmp_path / "report"
    # killed just after its checkpoint at step 4, the luong run still has 16 updates and 4 validations to go (seconds)
    args = compare_args(toy_dir, out, steps=20) + ["jobs=2", "train.threads=1"]
    errors = tmp_path / "stderr.txt"

    def work():
        sys.stderr = open(errors, "w", buffering=1)
        run(compare.main, args)

    parent = fork(work)
    luong = out / "runs" / "luong_local_p" / "seed1"
    deadline = time.monotonic() + 120
    while not (luong / "checkpoints" / "last.pt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    worker = process_with_open(luong / "train.log")
    assert worker is not None and worker != parent
    os.kill(worker, signal.SIGKILL)  # as the kernel's OOM killer would
    wait(parent)
    assert errors.read_text().splitlines()[-1].startswith("error: a worker process died (killed, or out of memory?)")
    assert not (luong / "results.json").exists()
    code, text, err = cli(compare.main, args, capsys)
    assert code == 0, err
    assert "luong_local_p seed 1: resuming from step" in text
    assert len(read_csv(out / "results.csv")) == 2


def test_mistakes_are_one_line(toy_dir, tmp_path, capsys):
    args = compare_args(toy_dir, tmp_path / "report")
    code, _, err = cli(compare.main, args + ["variants=transformer,lstm"], capsys)
    one_error_line(code, err, "error: variants: no variant named 'lstm'; expected one of transformer,")
    code, _, err = cli(
        compare.main, ["variants=lstm", f"out={tmp_path}/none"], capsys
    )  # no experiment: no variants at all
    one_error_line(
        code, err, "error: variants: no variant named 'lstm'; none are defined: give experiment=compare_NAME"
    )
    code, _, err = cli(compare.main, args + ["overrides.transformer=[model=transformer,data.max_len=50]"], capsys)
    one_error_line(
        code,
        err,
        "error: variant luong_local_p: data.max_len=80 but transformer has 50; every variant must share the data",
    )
    code, _, err = cli(
        compare.main, args + ["overrides.transformer=[model=transformer,train.loss_kernel=native]"], capsys
    )
    assert code != 0 and "train.loss_kernel" in err and err.count("\n") == 1  # the loss is computed alike for all
    code, _, err = cli(
        compare.main, args + ["overrides.transformer=[model=transformer,train.dropout_kernel=torch]"], capsys
    )
    assert code != 0 and "train.dropout_kernel" in err and err.count("\n") == 1  # and dropout draws alike
    code, _, err = cli(
        compare.main, args + ["overrides.transformer=[model=transformer,train.norm_kernel=native]"], capsys
    )
    assert code != 0 and "train.norm_kernel" in err and err.count("\n") == 1  # and LayerNorm rounds alike
    code, _, err = cli(compare.main, ["report_only=true", f"out={tmp_path}/nothing"], capsys)
    one_error_line(code, err, f"error: out={tmp_path}/nothing: no comparison.yaml there")
    code, _, err = cli(compare.main, ["report_only=true", f"out={tmp_path}", "train.max_steps=5"], capsys)
    one_error_line(code, err, "error: report_only=true trains nothing")
    code, _, err = cli(compare.main, ["seeds=1,1"], capsys)
    one_error_line(code, err, "error: seeds=[1, 1]: expected distinct seeds")


def test_a_run_dir_with_other_settings_is_not_taken_for_finished(compared, toy_dir, capsys):
    args = compare_args(toy_dir, compared, steps=7) + ["train.threads=1"]  # the runs there made 6 updates
    code, _, err = cli(compare.main, args, capsys)
    one_error_line(
        code, err, "holds a run with other settings (train.max_steps: 6 -> 7; train.snapshot_at: [6] -> [7])"
    )


def test_the_budget_is_updates_with_declared_points_and_its_conditions_are_enforced(
    toy_dir, tmp_path, capsys, monkeypatch
):
    """budget=updates: no time limit, no early stopping, one explicit precision the host runs natively, budget points
    that are validation steps; each refused with one line before anything trains."""
    args = compare_args(toy_dir, tmp_path / "report") + ["train.threads=1"]
    refused = {
        "train.max_time=30": "error: variant transformer: train.max_time=30.0: budget=updates trains every variant "
        "train.max_steps=6 updates and a time limit stops variants at different updates",
        "train.patience=2": "train.patience=2: budget=updates trains every variant train.max_steps=6 updates and "
        "early stopping ends",
        "train.precision=auto": "error: train.precision=auto: a comparison trains every run in one explicit precision",
        "budget_points=[3]": "error: budget_points: 3 is not a validation step of the runs (train.valid_every=4, "
        "train.max_steps=6)",
        "budget_points=[4,2]": "error: budget_points=[4, 2]: expected increasing numbers of updates",
        "budget=time": "error: budget=time: give train.max_time=MINUTES",
        "extend.transformer=5": "error: extend.transformer=5: expected more updates than train.max_steps=6",
    }
    for argument, message in refused.items():
        code, _, err = cli(compare.main, args + argument.split(), capsys)
        one_error_line(code, err, message)
    code, _, err = cli(compare.main, args + ["budget=time", "budget_points=[4]", "train.max_time=1"], capsys)
    one_error_line(code, err, "error: budget=time: budget_points and extend are numbers of updates")
    monkeypatch.setattr("nmt.training.precision.native_bf16", lambda device: False)
    code, _, err = cli(compare.main, args + ["train.precision=bf16"], capsys)
    one_error_line(code, err, "error: train.precision=bf16: this CPU (")
    assert "has no bf16 matrix instructions" in err
    assert not (tmp_path / "report" / "runs").exists()


def test_an_extended_variant_trains_on_the_same_run_and_is_scored_at_every_point(compared, toy_dir, tmp_path, capsys):
    """extend: after the shared budget, the variant's runs resume to their longer budget (the same runs: equal to one
    trained there in one go) and are scored at the further points; the shared budget's scores stay."""
    out = tmp_path / "report"
    shutil.copytree(compared, out)
    args = compare_args(toy_dir, out) + ["train.threads=1", "extend.luong_local_p=8"]
    code, said, err = cli(compare.main, args, capsys)
    assert code == 0, err
    assert said.count("finished earlier") == 2
    assert "luong_local_p seed 1: resuming from step 6 (budget 8 updates)" in said
    run_dir = out / "runs" / "luong_local_p" / "seed1"
    evaluation = json.loads((run_dir / "eval.json").read_text())
    before = json.loads((compared / "runs" / "luong_local_p" / "seed1" / "eval.json").read_text())
    assert sorted(evaluation["points"], key=int) == ["6", "8"] and evaluation["scores"] == before["scores"]
    assert json.loads((run_dir / "results.json").read_text())["steps"] == 8
    assert [p["from_step"] for p in json.loads((run_dir / "conditions.json").read_text())] == [0, 6]
    in_one_go = tmp_path / "one_go"
    code, _, err = cli(
        compare.main,
        [a for a in compare_args(toy_dir, in_one_go, steps=8) if a != "variants=transformer,luong_local_p"]
        + ["variants=luong_local_p", "train.threads=1"],
        capsys,
    )
    assert code == 0, err
    extended = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]
    direct = torch.load(in_one_go / "runs" / "luong_local_p" / "seed1" / "checkpoints" / "last.pt")["model"]
    assert all(torch.equal(extended[k], direct[k]) for k in direct)


def test_forced_attention_is_the_attention_of_greedy_search():
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(arch="luong", dim=16, layers=1, window="local_p", window_size=2, dropout=0.0), 30, 30, joint=True
    ).eval()
    batch = random_batch(30, src_lens=(6, 3), tgt_lens=(1, 1))
    hyps = greedy_search(model, batch.src, batch.src_mask, torch.tensor([5, 4]), 0, 0.0)
    src = [row[mask][:-1].tolist() for row, mask in zip(batch.src, batch.src_mask)]
    tgt = [h.tokens for h in hyps]
    forced = forced_attention(model, src, tgt, torch.device("cpu"))
    for hyp, probe, s in zip(hyps, forced, src):
        steps = len(hyp.tokens) + (1 if hyp.tokens and len(hyp.attention) > len(hyp.tokens) else 0)
        torch.testing.assert_close(
            torch.tensor(probe.attention[:steps]), hyp.attention[:steps].float(), atol=1e-5, rtol=0
        )
        assert (
            probe.positions.shape == (len(hyp.tokens) + 1,)
            and ((probe.positions >= 0) & (probe.positions <= len(s) + 1)).all()
        )
    assert all("positions" not in vars(w) for w in predictive_windows(model))  # the recorder is gone
    assert EOS not in tgt[0]
