"""A resumed run does what it prints: new learning rates apply, new batching starts with the next epoch,
changed data and a changed ranking metric are refused, and validation's sampling continues its stream."""

import json
import shutil

import pytest
import torch

from nmt.cli import train
from nmt.training.trainer import Trainer
from tests.conftest import run_args
from tests.test_cli import cli


@pytest.fixture(scope="module")
def stopped(small_corpus, tmp_path_factory):
    """A run stopped at step 5 (mid-way through its first epoch of about 12 batches), checkpoint at step 5."""
    work = tmp_path_factory.mktemp("stopped")
    code = _run(run_args(small_corpus) + ["train.max_steps=5", "train.save_every=5", f"run_dir={work}/run"])
    assert code == 0
    return work / "run"


def _run(argv):
    from nmt.cli.common import run

    with pytest.raises(SystemExit) as exit_info:
        run(train.main, argv)
    return exit_info.value.code


def copy(run_dir, tmp_path):
    shutil.copytree(run_dir, tmp_path / "run")
    return tmp_path / "run"


def test_a_new_learning_rate_is_used_by_the_next_update(stopped, tmp_path, capsys, monkeypatch):
    used = []
    step = torch.optim.Adam.step
    monkeypatch.setattr(
        torch.optim.Adam,
        "step",
        lambda self, *a, **k: (used.append(self.param_groups[0]["lr"]), step(self, *a, **k))[1],
    )
    run_dir = copy(stopped, tmp_path)
    code, out, err = cli(
        train.main, [f"resume={run_dir}", "train.lr=0.05", "train.warmup=2", "train.max_steps=7"], capsys
    )
    assert code == 0, err
    assert "resume: setting differs from the checkpoint: train.lr: 0.0005 -> 0.05" in out
    # inverse_sqrt with warm-up 2: updates 6 and 7 use 0.05 * sqrt(2 / 6) and 0.05 * sqrt(2 / 7)
    assert used == pytest.approx([0.05 * (2 / 6) ** 0.5, 0.05 * (2 / 7) ** 0.5])


def record_batches(monkeypatch) -> dict:
    """epoch -> the training batches (example indices) its updates read, across runs."""
    seen: dict = {}
    my_batches = Trainer.my_batches

    def recording(self, group):
        seen.setdefault(self.epoch, []).extend(group)
        return my_batches(self, group)

    monkeypatch.setattr(Trainer, "my_batches", recording)
    return seen


def test_new_batching_starts_with_the_next_epoch(small_corpus, tmp_path, capsys, monkeypatch):
    seen = record_batches(monkeypatch)
    run_dir = tmp_path / "run"
    assert _run(run_args(small_corpus) + ["train.max_steps=5", "train.save_every=5", f"run_dir={run_dir}"]) == 0
    code, out, err = cli(
        train.main,
        [f"resume={run_dir}", "train.batch_tokens=128", "train.seed=3", "train.max_epochs=2", "train.max_steps=1000"],
        capsys,
    )
    assert code == 0, err
    assert "resume: train.batch_tokens/seed 256/7 -> 128/3 from epoch 1; epoch 0 finishes with its own batches" in out
    for epoch in (0, 1):  # every pair exactly once per epoch, across the two runs
        assert sorted(i for batch in seen[epoch] for i in batch) == list(range(240)), epoch
    assert len(seen[1]) > len(seen[0])  # epoch 1 is cut into the new, smaller batches


def test_subword_sampling_turned_on_starts_with_the_next_epoch(small_corpus, tmp_path, capsys, monkeypatch):
    seen = record_batches(monkeypatch)
    run_dir = tmp_path / "run"
    assert _run(run_args(small_corpus) + ["train.max_steps=5", "train.save_every=5", f"run_dir={run_dir}"]) == 0
    code, out, err = cli(
        train.main,
        [f"resume={run_dir}", "data.src_subword_alpha=0.3", "train.max_epochs=2", "train.max_steps=1000"],
        capsys,
    )
    assert code == 0, err
    assert "resume: train.batch_tokens/seed 256/7 -> 256/7, subword alphas 0.0/0.0 -> 0.3/0.0 from epoch 1" in out
    for epoch in (0, 1):  # every pair exactly once per epoch, across the two runs
        assert sorted(i for batch in seen[epoch] for i in batch) == list(range(240)), epoch
    assert len(seen[1]) > len(seen[0])  # epoch 1 is sampled: longer pairs, more batches


def test_other_training_pairs_mid_epoch_are_refused(stopped, tmp_path, capsys):
    run_dir = copy(stopped, tmp_path)
    code, _, err = cli(train.main, [f"resume={run_dir}", "data.max_len=6"], capsys)
    assert (
        code == 2
        and err.startswith("error: resume: the training data now give other pairs than in")
        and err.count("\n") == 1
    ), err
    assert "(epoch 0, batch 5) would skip or repeat pairs" in err


def test_another_ranking_metric_is_refused(stopped, tmp_path, capsys):
    run_dir = copy(stopped, tmp_path)
    code, _, err = cli(train.main, [f"resume={run_dir}", "train.early_stop_metric=loss"], capsys)
    assert code == 2 and "train.early_stop_metric cannot change on resume (bleu -> loss)" in err


def test_sampling_validation_continues_its_stream(small_corpus, tmp_path, capsys):
    sampling = ["decode=sampling", "train.valid_every=4", "train.save_every=4"]
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert _run(run_args(small_corpus) + sampling + ["train.max_steps=8", f"run_dir={whole}"]) == 0
    assert _run(run_args(small_corpus) + sampling + ["train.max_steps=4", f"run_dir={part}"]) == 0
    assert _run([f"resume={part}", "train.max_steps=8"]) == 0
    a, b = (json.loads((d / "results.json").read_text()) for d in (whole, part))
    assert (a["valid_bleu"], a["valid_chrf"]) == (b["valid_bleu"], b["valid_chrf"])
    from nmt.training.checkpoint import load_checkpoint

    states = [load_checkpoint(d / "checkpoints" / "last.pt")["train_state"]["sampling_rng"] for d in (whole, part)]
    assert torch.equal(*states)
