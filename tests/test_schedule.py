"""Learning-rate schedules against their formulas: the warm-up ramp, the peak, the decay, and the rate
the trainer's n-th update really uses (LambdaLR counts updates from 0)."""

import math

import pytest
import torch

from nmt.errors import NmtError
from nmt.training.schedule import constant, cosine, inverse_sqrt, lr_multiplier
from nmt.training.trainer import Trainer
from tests.conftest import tiny_config


def vaswani(n: int, warmup: int, d: int = 512) -> float:
    """Vaswani et al. 2017, eq. 3 for the n-th update (n from 1), divided by its peak value at n = warmup."""
    rate = lambda step: d**-0.5 * min(step**-0.5, step * warmup**-1.5)  # noqa: E731
    return rate(n) / rate(warmup)


def test_inverse_sqrt_worked_by_hand():
    """Warm-up 4: the n-th update (LambdaLR step n - 1) gets min(n / 4, sqrt(4 / n)).

    Fails if the ramp started at 0 (step instead of step + 1), peaked at another step, or decayed otherwise.
    """
    f = inverse_sqrt(4)
    # n = 1, 2, 3: the ramp n / 4 = 0.25, 0.5, 0.75; n = 4: the peak, 4 / 4 = sqrt(4 / 4) = 1
    # n = 5: sqrt(4 / 5) = 0.894427; n = 16: sqrt(4 / 16) = 0.5; n = 100: sqrt(4 / 100) = 0.2
    expected = {1: 0.25, 2: 0.5, 3: 0.75, 4: 1.0, 5: 0.894427, 16: 0.5, 100: 0.2}
    assert {n: f(n - 1) for n in expected} == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("warmup", [1, 4, 250, 4000])
def test_inverse_sqrt_is_eq_3_divided_by_its_peak(warmup):
    f = inverse_sqrt(warmup)
    steps = [1, 2, warmup // 2 + 1, warmup - 1, warmup, warmup + 1, 2 * warmup, 10 * warmup + 3]
    assert [f(n - 1) for n in steps if n >= 1] == pytest.approx([vaswani(n, warmup) for n in steps if n >= 1], rel=1e-9)
    assert max(f(n - 1) for n in range(1, 3 * warmup)) == pytest.approx(1.0)


def test_inverse_sqrt_without_warm_up_decays_from_the_first_update():
    f = inverse_sqrt(0)  # warm-up 0 counts as 1
    assert [f(n - 1) for n in (1, 2, 4, 9)] == pytest.approx([1.0, 1 / math.sqrt(2), 0.5, 1 / 3])


def test_constant_ramps_then_holds():
    """Warm-up 4: n / 4 for n = 1..4, then 1; no warm-up: 1 from the first update. Fails on an off-by-one ramp."""
    assert [constant(4)(n - 1) for n in range(1, 9)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert [constant(0)(n - 1) for n in range(1, 5)] == [1.0] * 4


def test_cosine_worked_by_hand():
    """Warm-up 2 in a run of 10 updates: n / 2 for n = 1, 2; then 0.5 (1 + cos(pi (n - 2) / 8)) for n = 3..10,
    so the last update (n = 10) runs at rate 0 and the middle one (n = 6) at half the peak.

    Fails if the decay ignored the warm-up, ended before or after train.max_steps, or went below 0 past it."""
    f = cosine(2, 10)
    expected = {n: n / 2 if n <= 2 else 0.5 * (1 + math.cos(math.pi * (n - 2) / 8)) for n in range(1, 11)}
    assert {n: f(n - 1) for n in expected} == pytest.approx(expected, abs=1e-12)
    assert (
        f(5) == pytest.approx(0.5) and f(9) == pytest.approx(0.0, abs=1e-12) and f(50) == pytest.approx(0.0, abs=1e-12)
    )
    assert cosine(0, 4)(0) == pytest.approx(
        0.5 * (1 + math.cos(math.pi / 4))
    )  # no warm-up: decays from the first update
    assert lr_multiplier("cosine", 2, 10)(5) == f(5)


def test_unknown_schedule_lists_the_valid_ones():
    with pytest.raises(
        NmtError, match="train.schedule=linear: unknown; expected one of inverse_sqrt, constant, cosine"
    ):
        lr_multiplier("linear", 10, 100)


def test_the_trainers_nth_update_uses_the_scheduled_rate(toy_dir, toy_cache, tmp_path):
    """The rate each optimizer step of `train_step` reads is lr * vaswani(n, warmup), n = 1, 2, ...

    Fails if the trainer stepped the scheduler before the optimizer (every rate one update early)."""
    lr, warmup = 2e-3, 3
    trainer = Trainer(
        tiny_config(toy_dir, toy_cache, lr=lr, warmup=warmup, schedule="inverse_sqrt"),
        tmp_path / "run",
        log=lambda line: None,
    )
    used = []
    step = trainer.precision.step
    trainer.precision.step = lambda optimizer: (used.append(optimizer.param_groups[0]["lr"]), step(optimizer))
    split = trainer.data.splits["train"]
    for n in range(6):
        assert trainer.train_step([split.batch([n])]) is not None
    assert used == pytest.approx([lr * vaswani(n, warmup) for n in range(1, 7)], rel=1e-9)
    assert isinstance(trainer.scheduler, torch.optim.lr_scheduler.LambdaLR)
