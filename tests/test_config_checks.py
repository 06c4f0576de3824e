"""Every setting is checked when the config is composed: one `error:` line naming the key and what is
allowed, exit code 2, before any data is read or any run dir is written."""

from dataclasses import fields

import pytest

from nmt.cli import average, compare, evaluate, export, train, translate
from nmt.config import (
    AverageConfig,
    CompareConfig,
    Config,
    DataConfig,
    DecodeConfig,
    EvaluateConfig,
    ExportConfig,
    ModelConfig,
    TrainConfig,
    TranslateConfig,
)
from tests.test_cli import cli
from tests.test_errors import one_error_line

# A training command that would fail on its data if a bad setting slipped through composition.
NO_DATA = ["data=parallel", "data.train=/nonexistent/corpus"]
SECTIONS = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig, "decode": DecodeConfig}


def ruled_keys(schema) -> list[tuple[str, object]]:
    """(name, a value its rule rejects) for every field of a schema that declares a rule."""
    return [(f.name, f.metadata["rule"].bad) for f in fields(schema) if "rule" in f.metadata]


def test_every_numeric_key_declares_its_range():
    """A new int/float key without a rule would accept any value: each one must say what it allows."""
    for schema in (*SECTIONS.values(), TranslateConfig, EvaluateConfig, AverageConfig, CompareConfig, ExportConfig):
        for f in fields(schema):
            if f.type in ("int", "float", "Optional[int]", "Optional[float]"):
                assert "rule" in f.metadata, f"{schema.__name__}.{f.name} has no rule"


@pytest.mark.parametrize(
    "section, name, bad", [(s, n, b) for s, schema in SECTIONS.items() for n, b in ruled_keys(schema)]
)
def test_every_training_key_with_a_bad_value(section, name, bad, tmp_path, capsys):
    code, _, err = cli(train.main, NO_DATA + [f"{section}.{name}={bad}", f"run_dir={tmp_path}/run"], capsys)
    one_error_line(code, err, f"error: {section}.{name}=")
    assert "/nonexistent" not in err and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "main, schema, base",
    [
        (translate.main, TranslateConfig, ["checkpoint=/nonexistent.pt"]),
        (evaluate.main, EvaluateConfig, ["checkpoint=/nonexistent.pt"]),
        (average.main, AverageConfig, ["run=/nonexistent"]),
        (compare.main, CompareConfig, ["experiment=compare_attention_toy", "out=/nonexistent"]),
        (export.main, ExportConfig, ["checkpoint=/nonexistent.pt", "out=/nonexistent/out"]),
    ],
)
def test_every_command_key_with_a_bad_value(main, schema, base, capsys):
    cases = [(name, bad) for name, bad in ruled_keys(schema)] + [
        (f"decode.{n}", b) for n, b in ruled_keys(DecodeConfig) if hasattr(schema, "decode")
    ]
    assert cases
    for name, bad in cases:
        code, _, err = cli(main, base + [f"{name}={bad}"], capsys)
        one_error_line(code, err, f"error: {name}=")


@pytest.mark.parametrize(
    "override, message",
    [
        # ranges
        ("train.valid_every=0", "train.valid_every=0: expected at least 1"),
        ("train.label_smoothing=1.0", "train.label_smoothing=1.0: expected a number in [0, 1)"),
        ("model.dropout=-0.1", "model.dropout=-0.1: expected a number in [0, 1)"),
        ("train.lr=-0.001", "train.lr=-0.001: expected a positive number"),
        ("train.batch_tokens=0", "train.batch_tokens=0: expected at least 1"),
        ("train.threads=-1", "train.threads=-1: expected at least 1"),
        ("decode.top_p=0", "decode.top_p=0.0: expected a number in (0, 1]"),
        # names
        ("model.norm=typo", "model.norm=typo: unknown; expected one of pre, post"),
        ("train.device=gpu", "train.device=gpu: unknown; expected auto, cpu, cuda, cuda:N or mps"),
        ("train.precision=fp8", "train.precision=fp8: unknown; expected one of fp32, bf16, fp16"),
        (
            "model.cell=rnn",
            "model.cell=rnn: unknown; expected one of gru, lstm",
        ),  # checked even for the Transformer, which ignores it
        ("experiment=no_such_name", "experiment=no_such_name: no such recipe in recipes/experiment/; expected one of"),
        ("decode=wide", "decode=wide: no such recipe in recipes/decode/; expected one of beam, greedy, sampling"),
        # combinations
        ("model.heads=3", "model.dim=256 with model.heads=3: the model dim must be a multiple of the number of heads"),
        ("decode.nbest=2", "decode.nbest=2: at most decode.beam=1 hypotheses"),
        # Hydra's sweep form where one value or a list was meant
        (
            "data.vocab_size=4000,8000",
            "data.vocab_size=4000,8000: one value, or a list written data.vocab_size=[4000,8000] (with brackets",
        ),
        ("+train.seed=1,2", "train.seed=1,2: one value, or a list written train.seed=[1,2]"),
    ],
)
def test_mistakes_by_class(override, message, tmp_path, capsys):
    code, _, err = cli(train.main, NO_DATA + [override, f"run_dir={tmp_path}/run"], capsys)
    one_error_line(code, err, f"error: {message}")
    assert not (tmp_path / "run").exists()


def test_lists_the_hydra_way_get_one_line_everywhere(capsys):
    from nmt.cli import serve
    from nmt.cli.common import top_level_commas

    code, _, err = cli(serve.main, ["checkpoint=/nonexistent.pt", "serve.allowed_hosts=a.example,b.example"], capsys)
    one_error_line(code, err, "error: serve.allowed_hosts=a.example,b.example: one value, or a list written")
    assert not top_level_commas("[a,b]") and not top_level_commas("'a,b'") and not top_level_commas("a\\,b")
    assert top_level_commas("a,b") and top_level_commas("[a],b")


def test_rnn_combinations(capsys):
    code, _, err = cli(train.main, NO_DATA + ["model=luong", "model.dim=255"], capsys)
    one_error_line(code, err, "model.dim=255: a bidirectional encoder needs an even dim")
    code, _, err = cli(train.main, NO_DATA + ["model=luong", "model.score=location", "model.window=local_p"], capsys)
    one_error_line(code, err, "model.score=location with model.window=local_p: location attention is global only")


def test_cuda_where_there_is_none(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, err = cli(translate.main, ["checkpoint=/nonexistent.pt", "device=cuda"], capsys)
    one_error_line(code, err, "error: device=cuda: CUDA is not available on this machine; use cpu or auto")


def test_defaults_pass_their_own_checks():
    for schema in (Config, TranslateConfig, EvaluateConfig, AverageConfig, CompareConfig, ExportConfig):
        assert schema.__dataclass_fields__  # constructing the defaults runs every check
    Config(data=DataConfig(train="x"))


def test_the_composition_checks_know_the_builders_names():
    """nmt.models.checks (torch-free, run by the config) lists exactly the names the builders look up."""
    from nmt.models import attention, builders, checks, rnn

    assert set(checks.ARCHS) == set(builders.BUILDERS)
    assert set(checks.SCORES) == set(attention.SCORES)
    assert set(checks.CELLS) == set(rnn.CELLS)


def test_the_config_does_not_import_the_model_zoo():
    import subprocess
    import sys

    code = "import sys, nmt.config; print(sorted(m for m in sys.modules if m.startswith(('torch', 'nmt.models.'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['nmt.models.checks']"
