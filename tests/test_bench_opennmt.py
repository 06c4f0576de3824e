"""scripts/bench_opennmt.py: OpenNMT-py gets the benchmark's own pairs cut by its SentencePiece model, the configs
of docs/benchmarks.md, and its figure is the median of its own report lines from --from on; mistakes are one line.
OpenNMT-py itself is not installed for the tests: a stand-in records what it was given and prints report lines."""

from __future__ import annotations

import json
import stat

import pytest
import sentencepiece as spm

from nmt.cli.common import compose
from nmt.data.dataset import prepare_data
from tests.helpers.scripts import load_script
from tests.test_training_numerics import corpus, overrides  # noqa: F401  (the toy corpus fixture)

LOG = """[2026-12-07 19:05:01 INFO] Step 10/   40; acc: 3.1; ppl: 7001.2; xent: 8.9; lr: 0.00001; sents:    3000; bsz: 1400/1500/75; 2000/2100 tok/s;      7 sec;
[2026-12-07 19:05:08 INFO] Step 20/   40; acc: 9.0; ppl: 900.1; xent: 6.8; lr: 0.00002; sents:    3000; bsz: 1400/1500/75; 2050/2140 tok/s;     14 sec;
[2026-12-07 19:05:15 INFO] Step 30/   40; acc: 12.0; ppl: 500.3; xent: 6.2; lr: 0.00003; sents:    3000; bsz: 1400/1500/75; 2010/2120 tok/s;     21 sec;
[2026-12-07 19:05:22 INFO] Step 40/   40; acc: 14.0; ppl: 300.3; xent: 5.7; lr: 0.00004; sents:    3000; bsz: 1400/1500/75; 2300/2400 tok/s;     28 sec;
"""  # noqa: E501


def data_overrides(corpus):  # noqa: F811
    keep = ("data.train", "data.valid", "data.test", "data.vocab_size", "data.cache_dir")
    return [o for o in overrides(corpus, "transformer") if o.startswith(keep)] + ["data.src=src", "data.tgt=tgt"]


def fake_opennmt(tmp_path):
    """onmt_build_vocab and onmt_train stand-ins: they record their arguments and print LOG."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("onmt_build_vocab", "onmt_train"):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/calls\ncat <<'END'\n{LOG}END\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return tmp_path / "venv"


def test_it_feeds_opennmt_our_pieces_and_reads_the_median_of_its_reports(corpus, tmp_path, capsys):  # noqa: F811
    work, results = tmp_path / "work", tmp_path / "results.json"
    argv = ["--venv", str(fake_opennmt(tmp_path)), "--work", str(work), "--steps", "40", "--from", "20"]
    assert load_script("bench_opennmt").main([*argv, "--json", str(results), *data_overrides(corpus)]) == 0
    figures = json.loads(results.read_text())
    assert figures["transformer"] == {"target_tokens_per_s": 2140.0, "reports": [2140.0, 2120.0, 2400.0]}
    assert set(figures) == {"transformer", "rnn"}
    assert "OpenNMT-py rnn: 2,140 target tokens/s" in capsys.readouterr().out
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == ["-config vocab.yaml -n_sample -1", "-config transformer.yaml", "-config rnn.yaml"]
    configs = [json.loads((work / f"{name}.yaml").read_text()) for name in ("vocab", "transformer", "rnn")]
    assert [c.get("encoder_type") for c in configs] == [None, "transformer", "brnn"]
    assert all(c["batch_size"] == 4096 and c["src_vocab_size"] == 8000 for c in configs)
    assert configs[1]["train_steps"] == 40
    # the pairs, as the benchmark's own SentencePiece model cuts them
    prepared = prepare_data(compose("config", ["experiment=bench_transformer", *data_overrides(corpus)]).data)
    pieces = spm.SentencePieceProcessor(model_proto=(prepared.cache_path / "src.model").read_bytes())
    first = (corpus / "train.tgt").read_text().splitlines()[0]
    assert (work / "train.tgt").read_text().splitlines()[0] == " ".join(pieces.encode(first, out_type=str))
    assert len((work / "train.src").read_text().splitlines()) == 400


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--models", "lstm"], "error: --models: lstm unknown; expected transformer and/or rnn"),
        (["--steps", "20", "--from", "30"], "error: --from 30: expected an update between 1 and --steps (20)"),
        (["--venv", "/nonexistent"], "error: --venv /nonexistent: no OpenNMT-py there; run this script with --install"),
    ],
)
def test_mistakes_are_one_line(argv, message):
    with pytest.raises(SystemExit) as stop:
        load_script("bench_opennmt").main(argv)
    assert str(stop.value).startswith(message) and "\n" not in str(stop.value)
