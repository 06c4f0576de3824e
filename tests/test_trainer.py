"""The trainer's guards: checkpoints kept, non-finite updates skipped, early stopping, fine-tuning, averaging."""

import math
import shutil

import pytest
import torch

from nmt.cli import average, train, translate
from nmt.errors import NmtError
from nmt.training.checkpoint import load_checkpoint
from nmt.training.stopping import TrainingStopped
from nmt.training.trainer import Trainer
from tests.conftest import tiny_config
from tests.test_cli import TINY, cli, toy_overrides


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def trainer(toy_dir, cache, run_dir, **train) -> Trainer:
    return Trainer(tiny_config(toy_dir, cache, **train), run_dir, log=lambda line: None)


def scripted(monkeypatch, metric: str, scores: list[float]) -> None:
    """Validation returns these scores of `metric` in turn (and nothing costly)."""
    it = iter(scores)

    def validate(self):
        value = next(it)
        return {"valid_loss": 1.0, "valid_ppl": math.e, "valid_bleu": 0.0, "valid_chrf": 0.0} | {
            f"valid_{metric}": value
        }

    monkeypatch.setattr(Trainer, "validate", validate)


def steps_on_disk(run_dir) -> list[int]:
    return sorted(int(p.stem.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*.pt"))


def test_keeps_the_last_n_and_the_best_m(toy_dir, cache, tmp_path, monkeypatch):
    scripted(monkeypatch, "bleu", [5.0, 9.0, 7.0, 8.0, 1.0, 2.0])  # at steps 2, 4, ..., 12
    t = trainer(toy_dir, cache, tmp_path / "run", max_steps=12, valid_every=2, save_every=3, keep_last=2, keep_best=2)
    results = t.fit()
    folder = tmp_path / "run" / "checkpoints"
    # best two: step 4 (9.0) and step 8 (8.0); newest two: steps 10 (2.0 ranks no higher) .. 12
    assert steps_on_disk(tmp_path / "run") == [4, 8, 9, 12]
    assert (folder / "last.pt").samefile(folder / "step_12.pt") and (folder / "best.pt").samefile(folder / "step_4.pt")
    assert load_checkpoint(folder / "best.pt")["step"] == 4
    assert results["best"] == {"metric": "bleu", "score": 9.0, "step": 4} and not results["early_stopped"]


def test_snapshots_keep_the_best_checkpoint_so_far_at_each_budget_point(toy_dir, cache, tmp_path, monkeypatch):
    """best_at_N.pt is the model a run of N updates would choose by validation, even after later steps are pruned."""
    scripted(monkeypatch, "bleu", [5.0, 9.0, 7.0, 8.0, 10.0, 2.0])  # at steps 2, 4, ..., 12
    t = trainer(
        toy_dir, cache, tmp_path / "run", max_steps=12, valid_every=2, save_every=4, keep_last=1, snapshot_at=[6, 8, 12]
    )
    t.fit()
    folder = tmp_path / "run" / "checkpoints"
    assert {n: load_checkpoint(folder / f"best_at_{n}.pt")["step"] for n in (6, 8, 12)} == {6: 4, 8: 4, 12: 10}
    assert not (folder / "best_at_4.pt").exists()


@pytest.mark.parametrize(
    "metric, scores, stop_step", [("bleu", [3.0, 5.0, 5.0, 4.0, 9.0], 8), ("loss", [4.0, 3.0, 3.5, 2.9, 3.0, 3.0], 12)]
)
def test_early_stopping_with_patience(toy_dir, cache, tmp_path, monkeypatch, metric, scores, stop_step):
    scripted(monkeypatch, metric, scores)
    t = trainer(
        toy_dir,
        cache,
        tmp_path / "run",
        max_steps=20,
        valid_every=2,
        save_every=100,
        early_stop_metric=metric,
        patience=2,
    )
    results = t.fit()
    assert results["steps"] == stop_step and results["early_stopped"]
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["step"] == stop_step


def test_early_stopping_settings_are_checked():
    from nmt.config import TrainConfig

    with pytest.raises(NmtError, match="train.early_stop_metric=ter: unknown; expected one of bleu, chrf, loss"):
        TrainConfig(early_stop_metric="ter")
    with pytest.raises(NmtError, match="train.patience=0"):
        TrainConfig(patience=0)


def test_non_finite_loss_is_skipped_and_counted(toy_dir, cache, tmp_path, monkeypatch):
    t = trainer(toy_dir, cache, tmp_path / "run", max_steps=4, valid_every=100, save_every=100)
    loss, calls = Trainer.loss, []

    def poisoned(self, batch, smoothing, net=None):
        value = loss(self, batch, smoothing, net)
        if not self.model.training:  # validation
            return value
        calls.append(self.step)
        return value * float("nan") if len(calls) in (2, 3) else value  # the 2nd and 3rd batches

    monkeypatch.setattr(Trainer, "loss", poisoned)
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    results = t.fit()
    assert calls == [0, 1, 1, 1, 2, 3] and results["skipped_updates"] == 2 and results["steps"] == 4
    assert t.batch_in_epoch == 6 and t.guard.in_a_row == 0
    assert not any(
        torch.equal(before[k], v) for k, v in t.model.state_dict().items() if v.is_floating_point() and "norm" not in k
    )


def test_non_finite_gradients_too_many_in_a_row_stop_the_run(toy_dir, cache, tmp_path, monkeypatch, capsys):
    t = trainer(toy_dir, cache, tmp_path / "run", max_steps=10, valid_every=100, save_every=2, max_bad_steps=3)
    step = Trainer.train_step

    def explode_after_3(self, batches, tokens=None):
        if self.step >= 3:
            next(self.model.parameters()).register_hook(lambda grad: grad * float("inf"))
        return step(self, batches, tokens)

    monkeypatch.setattr(Trainer, "train_step", explode_after_3)
    with pytest.raises(TrainingStopped) as err:
        t.fit()
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    assert str(err.value) == (
        "step 4: 3 updates in a row had a non-finite loss or gradient (train.max_bad_steps=3), training stopped at "
        f"epoch 0 batch 6; last good checkpoint: {last} (step 2); lower train.lr or check the data"
    )
    assert err.value.exit_code == 3 and load_checkpoint(last)["step"] == 2


def test_diverging_run_exits_3_with_one_line(toy_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        Trainer, "loss", lambda self, batch, smoothing, net=None: torch.tensor(float("nan"), requires_grad=True)
    )
    argv = (
        toy_overrides(toy_dir)
        + TINY
        + [f"data.cache_dir={tmp_path}/cache", "train.max_bad_steps=2", f"run_dir={tmp_path}/run"]
    )
    code, _, err = cli(train.main, argv, capsys)
    assert code == 3 and err.count("\n") == 1 and "Traceback" not in err
    assert (
        err.startswith("error: step 1: 2 updates in a row had a non-finite loss or gradient")
        and "last good checkpoint: none saved yet" in err
    )


@pytest.fixture(scope="module")
def finished(toy_dir, tmp_path_factory):
    """A finished tiny run (6 updates, a checkpoint every 2, all kept) made through the command line."""
    work = tmp_path_factory.mktemp("finished")
    argv = (
        toy_overrides(toy_dir)
        + TINY
        + [
            f"data.cache_dir={work}/cache",
            "train.max_steps=6",
            "train.save_every=2",
            "train.valid_every=6",
            "train.keep_last=3",
            "train.valid_bleu_sentences=5",
            "decode.max_len_b=3",
            f"run_dir={work}/run",
        ]
    )
    from nmt.cli.common import run

    with pytest.raises(SystemExit) as exit_info:
        run(train.main, argv)
    assert exit_info.value.code == 0
    return work


def test_init_from_starts_fresh_from_the_weights(finished, toy_dir, tmp_path, capsys):
    source = finished / "run" / "checkpoints" / "last.pt"
    argv = toy_overrides(toy_dir) + [
        f"init_from={source}",
        f"data.cache_dir={finished}/cache",
        "train.max_steps=1",
        "train.lr=1e-4",
        "train.progress=false",
        "train.valid_bleu_sentences=5",
        "decode.max_len_b=3",
        f"run_dir={tmp_path}/tuned",
    ]
    code, out, err = cli(train.main, argv, capsys)
    assert code == 0, err
    assert "init_from: setting differs from the checkpoint: train.lr: 0.0005 -> 0.0001" in out
    assert "model.dim" not in out  # the recipe's model size yields to the checkpoint's
    tuned, original = load_checkpoint(tmp_path / "tuned" / "checkpoints" / "last.pt"), load_checkpoint(source)
    assert (
        tuned["step"] == 1 and tuned["train_state"]["optimizer"]["state"][0]["step"] == 1
    )  # a fresh optimizer: one update of its own
    assert tuned["train_state"]["scheduler"]["last_epoch"] == 1
    for key, value in original["model"].items():  # started from these weights (one tiny warm-up update away)
        torch.testing.assert_close(tuned["model"][key], value, rtol=0, atol=1e-5)
    assert tuned["tokenizer"] == original["tokenizer"]


def test_resume_prints_changed_settings_and_refuses_a_new_shape(finished, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(finished / "run", run_dir)
    code, out, err = cli(train.main, [f"resume={run_dir}", "train.max_steps=7", "train.valid_every=100"], capsys)
    assert code == 0, err
    assert "resume: setting differs from the checkpoint: train.max_steps: 6 -> 7" in out and "resumed from" in out
    code, _, err = cli(train.main, [f"resume={run_dir}", "model.dim=64"], capsys)
    assert (
        code == 2
        and err
        == f"error: resume={run_dir}: cannot change what the weights depend on: model.dim is 32 in the checkpoint, "
        "64 asked\n"
    )


def test_average_of_the_last_checkpoints(finished, tmp_path, capsys):
    run_dir = finished / "run"
    code, out, err = cli(average.main, [f"run={run_dir}", "last=3", f"output={tmp_path}/avg.pt"], capsys)
    assert code == 0, err
    assert "averaged step_2.pt, step_4.pt, step_6.pt into" in out
    averaged = load_checkpoint(tmp_path / "avg.pt")
    parts = [load_checkpoint(run_dir / "checkpoints" / f"step_{s}.pt")["model"] for s in (2, 4, 6)]
    for key, value in averaged["model"].items():
        if value.is_floating_point():
            torch.testing.assert_close(value, sum(p[key] for p in parts) / 3, rtol=0, atol=1e-6)
    source = tmp_path / "in.txt"
    source.write_text("ze bo\n\n")
    code, _, err = cli(
        translate.main,
        [f"checkpoint={tmp_path}/avg.pt", f"input={source}", f"output={tmp_path}/out.txt", "decode.max_len_b=3"],
        capsys,
    )
    assert code == 0, err
    assert len((tmp_path / "out.txt").read_text().split("\n")) == 3
    code, _, err = cli(average.main, [f"run={run_dir}", "last=9"], capsys)
    assert code == 2 and f"last=9: {run_dir} has only 3 step checkpoints" in err
