"""scripts/profile_train.py: a training update's time split into its phases and operator kinds (issue 51's profile),
and the phase labels it reads from Trainer.train_step, which change no number (tests/test_training_numerics.py)."""

from __future__ import annotations

import re

from tests.helpers.scripts import load_script
from tests.test_training_numerics import corpus, overrides  # noqa: F401  (the toy corpus fixture)


def shares(text: str, heading: str) -> dict[str, float]:
    """The rows of the markdown table under `heading`: name -> share (0-1)."""
    table = text.split(heading, 1)[1].split("\n\n", 1)[0]
    return {m[1].strip("` "): float(m[2]) / 100 for m in re.finditer(r"^\| ([^|]+) \| ([0-9.]+)% \|$", table, re.M)}


def test_the_profile_splits_an_update_into_its_phases_and_operator_kinds(corpus, capsys):  # noqa: F811
    script = load_script("profile_train")
    script.main(["--steps", "3", "--warmup", "1", *overrides(corpus, "transformer")])
    out = capsys.readouterr().out
    assert "3 updates" in out and "target tokens/s" in out
    phases = shares(out, "| phase |")
    assert set(phases) == {*script.PHASES, "other"}
    assert abs(sum(phases.values()) - 1) < 0.01  # "other" is the rest of the wall time
    assert phases["forward"] > 0.05 and phases["backward"] > 0.05 and phases["optimizer"] > 0
    kinds = shares(out, "| operator kind |")
    assert abs(sum(kinds.values()) - 1) < 0.01
    assert kinds["matrix products"] > 0.05  # a Transformer update is products first
    top = shares(out, "| top operators")
    assert top and all(name.startswith(("aten::", "mkldnn")) for name in top)


def test_operators_are_sorted_into_kinds():
    kind = load_script("profile_train").kind
    assert kind("aten::addmm") == kind("aten::bmm") == "matrix products"
    assert kind("aten::_softmax") == "attention"
    assert kind("aten::_fused_adam_") == "optimizer"
    assert kind("aten::native_layer_norm_backward") == "norms"
    assert kind("aten::copy_") == "copies and casts"
    assert kind("aten::relu") == "elementwise"
    assert kind("aten::unheard_of") == "other operators"


def test_shapes_lists_the_costliest_operator_and_input_shape_pairs(corpus, capsys):  # noqa: F811
    script = load_script("profile_train")
    script.main(["--steps", "2", "--warmup", "1", "--shapes", "6", *overrides(corpus, "transformer")])
    out = capsys.readouterr().out
    table = out.split("| operator | input shapes |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]*) \| (\d+) \| ([0-9.]+)% \|$", table, re.M)
    assert len(rows) == 6
    assert all(name.startswith(("aten::", "mkldnn")) and int(calls) >= 1 for name, _, calls, _ in rows)
    assert any(re.fullmatch(r"\(\d+(, \d+)*\)(, \(\d+(, \d+)*\))*", shapes) for _, shapes, _, _ in rows)
    assert [float(r[3]) for r in rows] == sorted((float(r[3]) for r in rows), reverse=True)  # costliest first
