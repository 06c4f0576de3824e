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
