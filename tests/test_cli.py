"""The commands end to end, run in-process (as the console scripts do) in a temporary folder."""

import json

import pytest

from nmt.cli import evaluate, prepare, train, translate
from nmt.cli.common import run
from tests.conftest import MULTI30K, write

TINY = ["model.dim=32", "model.layers=1", "model.heads=2", "model.ffn_dim=64", "train.progress=false"]


def toy_overrides(toy_dir):
    return [
        "data=toy",
        "data.synthetic=null",
        f"data.train={toy_dir}/train",
        f"data.valid={toy_dir}/valid",
        f"data.test={toy_dir}/test",
    ]


def cli(main, argv, capsys):
    """Run an entry point; returns (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        run(main, argv)
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


@pytest.fixture(scope="module")
def trained(tmp_path_factory, toy_dir):
    """A run dir trained for a few steps on the toy corpus."""
    work = tmp_path_factory.mktemp("cli")
    argv = (
        toy_overrides(toy_dir)
        + TINY
        + [
            f"data.cache_dir={work}/cache",
            "train.max_steps=8",
            "train.valid_every=4",
            "train.valid_bleu_sentences=10",
            f"run_dir={work}/run",
        ]
    )
    with pytest.raises(SystemExit) as exit_info:
        run(train.main, argv)
    assert exit_info.value.code == 0
    return work / "run"


def test_train_writes_run_dir(trained):
    results = json.loads((trained / "results.json").read_text())
    for key in ("steps", "wall_s", "train_tokens_per_s", "valid_loss", "valid_ppl", "valid_bleu", "bleu_signature"):
        assert key in results
    assert results["steps"] == 8 and results["train_tokens_per_s"] > 0
    assert results["bleu_signature"].startswith("nrefs:1|")
    assert (trained / "checkpoints" / "best.pt").is_file() and (trained / "checkpoints" / "last.pt").is_file()
    assert "max_steps: 8" in (trained / "config.yaml").read_text()
    assert list((trained / "tb").glob("events.out.tfevents.*"))


def test_translate_keeps_every_line_in_order(trained, toy_dir, tmp_path, capsys):
    lines = (toy_dir / "test.src").read_text().splitlines()[:5]
    source = write(tmp_path / "in.txt", [lines[0], "", lines[1], "   ", lines[2], "", "", lines[3]])
    code, _, err = cli(
        translate.main, [f"checkpoint={trained}", f"input={source}", f"output={tmp_path / 'out.txt'}"], capsys
    )
    assert code == 0, err
    out = (tmp_path / "out.txt").read_text().split("\n")
    assert out[-1] == "" and len(out) - 1 == 8
    assert all(out[i] == "" for i in (1, 3, 5, 6))
    # the same lines through stdin/stdout give the same translations
    import io
    import sys

    sys_stdin = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(source.read_bytes()))
    try:
        code, stdout, _ = cli(translate.main, [f"checkpoint={trained / 'checkpoints' / 'best.pt'}"], capsys)
    finally:
        sys.stdin = sys_stdin
    assert code == 0 and stdout.split("\n") == out


def test_evaluate_prints_scores_with_signatures(trained, tmp_path, capsys):
    code, out, err = cli(
        evaluate.main, [f"checkpoint={trained}", "split=test", f"hyp_out={tmp_path / 'hyp.txt'}"], capsys
    )
    assert code == 0, err
    assert "BLEU = " in out and "nrefs:1|case:mixed" in out and "chrF2 = " in out and "TER = " in out
    assert "BLEU (lowercased) = " in out and "case:lc" in out  # for comparison with papers' tokenized lowercased BLEU
    assert len((tmp_path / "hyp.txt").read_text().splitlines()) == 100


def test_evaluate_with_worker_processes_scores_the_same_translation(trained, tmp_path, capsys):
    args = [f"checkpoint={trained}", "split=test", "decode=beam", "decode.beam=3"]
    code, one, err = cli(evaluate.main, args + [f"hyp_out={tmp_path / 'one.txt'}"], capsys)
    assert code == 0, err
    code, two, err = cli(evaluate.main, args + ["workers=2", f"hyp_out={tmp_path / 'two.txt'}"], capsys)
    assert code == 0, err
    assert (tmp_path / "two.txt").read_text() == (tmp_path / "one.txt").read_text()
    assert two == one  # the same scores, line for line


def test_evaluate_scores_a_hypothesis_file(tmp_path, capsys):
    ref = write(tmp_path / "ref.txt", ["the cat sat on the mat", "a dog"])
    code, out, _ = cli(evaluate.main, [f"hyp={ref}", f"ref={ref}"], capsys)
    assert code == 0 and "BLEU = 100.00" in out


def test_prepare_builds_the_cache(toy_dir, tmp_path, capsys):
    code, out, _ = cli(prepare.main, toy_overrides(toy_dir) + [f"data.cache_dir={tmp_path}/cache"], capsys)
    assert code == 0 and "valid: 100 pairs" in out and "test: 100 pairs" in out
    assert list((tmp_path / "cache").iterdir())


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train.no_such_key=1"], "no_such_key"),
        (["model=no_such_model"], "model=no_such_model: no such recipe in recipes/model/"),
        (["train.max_steps=many"], "max_steps"),
        (["data=parallel"], "data.train"),
    ],
)
def test_config_mistakes_exit_2_with_one_line(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(train.main, argv, capsys)
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_bad_checkpoint_and_output_path(trained, tmp_path, capsys):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint at all")
    code, _, err = cli(translate.main, [f"checkpoint={junk}"], capsys)
    assert code == 2 and "junk.pt" in err and "not a readable checkpoint" in err
    source = write(tmp_path / "in.txt", ["ze"])
    code, _, err = cli(
        translate.main, [f"checkpoint={trained}", f"input={source}", f"output={tmp_path}/missing/out.txt"], capsys
    )
    assert code == 2 and "does not exist" in err


@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"Multi30k not found at {MULTI30K} (set NMT_MULTI30K)")
def test_multi30k_trains_a_few_steps(tmp_path, capsys):
    argv = (
        ["data=multi30k_en_de", f"data.root={MULTI30K}", "data.vocab_size=2000", f"data.cache_dir={tmp_path}/cache"]
        + TINY
        + [
            "train.max_steps=3",
            "train.valid_every=3",
            "train.valid_bleu_sentences=8",
            "decode.max_len_b=3",
            "decode.max_len_a=0",
            f"run_dir={tmp_path}/run",
        ]
    )
    code, out, err = cli(train.main, argv, capsys)
    assert code == 0, err
    assert "BLEU" in out
    assert json.loads((tmp_path / "run" / "results.json").read_text())["steps"] == 3
