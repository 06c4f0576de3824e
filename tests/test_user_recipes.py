"""Recipes ship inside the package; NMT_RECIPES adds a user's own recipe folders."""

from pathlib import Path

import nmt
from nmt.cli import train
from nmt.cli.common import compose, group_options, recipes_dir
from tests.test_cli import cli
from tests.test_errors import one_error_line


def test_the_recipes_are_package_data():
    assert recipes_dir() == Path(nmt.__file__).parent / "recipes"
    assert (recipes_dir() / "config.yaml").is_file() and "quickstart" in group_options()["experiment"]


def test_a_user_recipe_folder_adds_recipes(tmp_path, monkeypatch):
    mine = tmp_path / "my_recipes"
    (mine / "experiment").mkdir(parents=True)
    (mine / "experiment" / "tiny_toy.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /data: toy\n  - override /model: luong\n"
        "model:\n  dim: 48\ntrain:\n  max_steps: 7\n"
    )
    (mine / "model").mkdir()
    (mine / "model" / "wide_luong.yaml").write_text("defaults:\n  - luong\n  - _self_\ndim: 512\n")
    monkeypatch.setenv("NMT_RECIPES", str(mine))
    cfg = compose("config", ["experiment=tiny_toy"])
    assert (cfg.model.arch, cfg.model.dim, cfg.train.max_steps, cfg.data.name) == ("luong", 48, 7, "toy")
    assert compose("config", ["model=wide_luong"]).model.dim == 512
    assert (
        "tiny_toy" in group_options()["experiment"] and "quickstart" in group_options()["experiment"]
    )  # added, not replaced


def test_a_missing_user_recipe_folder_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NMT_RECIPES", str(tmp_path / "nowhere"))
    code, _, err = cli(train.main, ["experiment=quickstart"], capsys)
    one_error_line(code, err, f"error: NMT_RECIPES={tmp_path / 'nowhere'}: {tmp_path / 'nowhere'} is not a folder")
