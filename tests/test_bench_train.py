"""scripts/bench_train.py: its --repeat mode times the same batches in every run, after one untimed pass over them
(the steady state of shapes already met, for A/B comparisons); its usual mode a warm-up update and then the timed
ones in each run."""

from __future__ import annotations

import pytest

from nmt.training.trainer import Trainer
from tests.helpers.scripts import load_script
from tests.test_training_numerics import corpus, overrides  # noqa: F401  (the toy corpus fixture)


@pytest.mark.parametrize("repeat", [True, False])
def test_repeat_times_the_same_batches_after_an_untimed_pass(repeat, corpus, monkeypatch, capsys):  # noqa: F811
    seen: list[tuple[int, ...]] = []
    step = Trainer.train_step

    def recorded(self, batches, *args, **kwargs):
        seen.append(tuple(batches[0].src.shape) + tuple(batches[0].tgt_out.shape))
        return step(self, batches, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train_step", recorded)
    argv = ["--precisions", "fp32", "--steps", "3", "--runs", "2", "--warmup", "1", *overrides(corpus, "transformer")]
    load_script("bench_train").main((["--repeat"] if repeat else []) + argv)
    out = capsys.readouterr()
    assert "| fp32 |" in out.out and out.err.count("fp32 run ") == 2
    timed = seen[1:]  # the first update counts the FLOPs
    if repeat:  # one untimed pass, then each run: the same 3 batches in the same order
        assert len(timed) == 3 + 2 * 3
        assert timed[0:3] == timed[3:6] == timed[6:9]
    else:  # each run: 1 warm-up update, then 3 timed ones (consecutive batches of the epoch)
        assert len(timed) == 2 * (1 + 3)


def test_by_length_splits_every_epoch_into_target_length_groups(corpus, capsys):  # noqa: F811
    argv = ["--precisions", "fp32", "--epochs", "2", "--by-length", *overrides(corpus, "transformer")]
    load_script("bench_train").main(argv)
    out = capsys.readouterr().out
    summary = out.split("| precision | epoch |", 1)[1].split("\n\n", 1)[0]
    updates = [int(line.split("|")[3]) for line in summary.splitlines() if line.startswith("| fp32 |")]
    assert len(updates) == 2 and all(n > 0 for n in updates)
    for epoch, expected in enumerate(updates):
        table = out.split(f"fp32, epoch {epoch}, by target length", 1)[1].split("\n\n", 1)[0]
        rows = [line.split("|")[1:-1] for line in table.splitlines() if line.startswith("| ") and "---" not in line]
        rows = rows[1:]  # the header
        assert sum(int(r[1]) for r in rows) == expected  # every update in one group
        assert abs(sum(float(r[4].strip().rstrip("%")) for r in rows) - 100) < 0.5  # shares of the epoch's time
        firsts = [int(r[0].split("-")[0]) for r in rows]
        assert firsts == sorted(firsts)  # shortest targets first


def test_by_length_without_epochs_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        load_script("bench_train").main(["--by-length", "experiment=bench_transformer"])
    assert exit_.value.code == 2
    assert "--by-length groups whole epochs' updates: give --epochs N too" in capsys.readouterr().err


def test_ab_trains_every_batch_with_both_settings_one_after_the_other(corpus, monkeypatch, capsys):  # noqa: F811
    """--ab: two trainers (one per value), each update's batch trained by both back to back, the order alternating;
    the table has each epoch's two rates and their ratio."""
    seen: list[tuple[str, tuple[int, ...]]] = []
    step = Trainer.train_step

    def recorded(self, batches, *args, **kwargs):
        seen.append((self.cfg.train.dropout_kernel, tuple(batches[0].tgt_out.shape)))
        return step(self, batches, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train_step", recorded)
    argv = ["--epochs", "1", "--ab", "train.dropout_kernel=torch,auto", *overrides(corpus, "transformer")]
    load_script("bench_train").main(argv)
    out = capsys.readouterr().out
    assert "A: train.dropout_kernel=torch, B: train.dropout_kernel=auto" in out
    row = next(line for line in out.splitlines() if line.startswith("| fp32 | 0 |"))
    updates = int(row.split("|")[3])
    assert updates > 0 and len(seen) == 2 * updates
    pairs = [seen[i : i + 2] for i in range(0, len(seen), 2)]
    assert all(a[1] == b[1] for a, b in pairs)  # the same batch twice
    assert [a[0] for a, _ in pairs[:2]] == ["torch", "auto"]  # A first, then B first
    assert float(row.split("|")[6].strip().rstrip("x")) > 0


@pytest.mark.parametrize("ab", ["train.decoder_loop=steps", "=a,b", "train.x=a,b,c"])
def test_ab_needs_a_key_two_values_and_epochs(ab, capsys):
    with pytest.raises(SystemExit) as exit_:
        load_script("bench_train").main(["--epochs", "1", "--ab", ab, "experiment=bench_rnn"])
    assert exit_.value.code == 2
    assert f"--ab {ab}: expected KEY=A,B" in capsys.readouterr().err
