"""Word alignments out, per-line settings (input_format=jsonl), and prefixes and alignments through the CLI, the
Python API and the server."""

import json

import numpy as np
import pytest
import torch

import nmt
from nmt.alignments import Aligner, links, pharaoh
from nmt.cli import translate as translate_cli
from nmt.errors import NmtError
from nmt.search import Hypothesis
from nmt.translation import Translation
from tests.test_cli import cli
from tests.test_errors import one_error_line
from tests.test_serve import trained_pair

RUN_DECODE = ["decode.max_len_a=0", "decode.max_len_b=4"]  # the decode settings trained_pair's runs were made with


@pytest.fixture(scope="module")
def runs(tmp_path_factory, toy_dir):
    return trained_pair(tmp_path_factory, toy_dir)


@pytest.fixture(scope="module")
def sources(toy_dir):
    return (toy_dir / "test.src").read_text().splitlines()[:6]


def test_links_by_argmax_and_threshold_worked_by_hand():
    # target words x source words
    words = np.array([[0.7, 0.2, 0.1], [0.1, 0.45, 0.45], [0.0, 0.3, 0.7]])
    assert links(words) == [(0, 0), (1, 1), (2, 2)]  # argmax (ties: the first)
    assert links(words, "threshold", 0.4) == [(0, 0), (1, 1), (2, 1), (2, 2)]
    assert pharaoh(links(words, "threshold", 0.4)) == "0-0 1-1 2-1 2-2"


class FakeTokenizer:
    class Side:
        def __init__(self, pieces):
            self.pieces = pieces

        def id_to_piece(self, i):
            return self.pieces[i]

    def __init__(self):
        self.src = self.Side({10: "▁a", 11: "bc", 12: "▁d"})
        self.tgt = self.Side({20: "▁x", 21: "▁y", 22: "z"})


def test_subwords_merge_to_words_and_eos_takes_no_part():
    # source pieces: ▁a bc ▁d </s> -> words a(bc)=0, d=1; target pieces ▁x ▁y z EOS -> words x=0, y(z)=1
    attention = torch.tensor(
        [
            [0.1, 0.1, 0.6, 0.2],  # ▁x -> d
            [0.5, 0.3, 0.1, 0.1],  # ▁y -> a+bc
            [0.1, 0.1, 0.1, 0.7],  # z  -> </s> most, but </s> is dropped: a+bc (0.2) vs d (0.1)
            [0.0, 0.0, 0.0, 1.0],  # EOS: no word
        ]
    )
    result = Translation([10, 11, 12], [Hypothesis([20, 21, 22], -1.0, -1.0, attention)])
    aligner = Aligner(None, FakeTokenizer(), torch.device("cpu"))
    assert aligner.pharaoh(result) == "1-0 0-1"  # sorted by target word
    assert aligner.pharaoh(Translation([], [])) == ""


def test_cli_alignments_out_one_line_per_input_and_layer_choice(runs, sources, tmp_path, capsys):
    src = tmp_path / "in.src"
    src.write_text("\n".join([sources[0], "", sources[1], sources[2]]) + "\n")
    for extra in ([], ["align.layer=0", "align.head=1"], ["align.method=threshold", "align.threshold=0.2"]):
        out, align = tmp_path / "out.hyp", tmp_path / "out.align"
        code, _, err = cli(
            translate_cli.main,
            [f"checkpoint={runs['a']}", f"input={src}", f"output={out}", f"alignments_out={align}", *extra],
            capsys,
        )
        assert code == 0, err
        hyps, found = out.read_text().splitlines(), align.read_text().splitlines()
        assert len(found) == len(hyps) == 4 and found[1] == ""
        for hyp, line, source in zip(hyps, found, src.read_text().splitlines()):
            for link in line.split():
                i, j = map(int, link.split("-"))
                assert 0 <= i < len(source.split()) and 0 <= j < len(hyp.split())
            if extra == [] and hyp:
                assert sorted({int(link.split("-")[1]) for link in line.split()}) == list(range(len(hyp.split())))
    code, _, err = cli(
        translate_cli.main,
        [f"checkpoint={runs['a']}", f"input={src}", f"alignments_out={tmp_path}/x", "align.layer=5"],
        capsys,
    )
    one_error_line(code, err, "error: align.layer=5: the model has 1 decoder layers")
    code, _, err = cli(
        translate_cli.main,
        [f"checkpoint={runs['b']}", f"input={src}", f"alignments_out={tmp_path}/x", "align.head=0"],
        capsys,
    )
    one_error_line(code, err, "error: align.layer/align.head: only a Transformer has decoder layers and heads")
    code, _, err = cli(translate_cli.main, [f"checkpoint={runs['a']}", f"input={src}", f"alignments_out={src}"], capsys)
    one_error_line(code, err, "alignments_out=")  # would overwrite the input


def test_jsonl_input_with_prefixes(runs, sources, tmp_path, capsys):
    model = nmt.load(runs["a"])
    prefix = model.translate(sources[1])[:5]
    src = tmp_path / "in.jsonl"
    rows = [{"text": sources[0]}, {}, {"text": sources[1], "prefix": prefix}, {"text": sources[2], "prefix": None}]
    src.write_text("\n".join("" if not r else json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out.hyp"
    code, _, err = cli(
        translate_cli.main,
        [f"checkpoint={runs['a']}", f"input={src}", f"output={out}", "input_format=jsonl", *RUN_DECODE],
        capsys,
    )
    assert code == 0, err
    hyps = out.read_text().splitlines()
    assert len(hyps) == 4 and hyps[1] == "" and hyps[2].startswith(prefix)
    assert hyps[0] == model.translate(sources[0]) and hyps[3] == model.translate(sources[2])
    for bad, message in [
        ('{"text": 3}', '"text" is not a string'),
        ('{"prefix": "x"}', '"text" missing'),
        ("[1, 2]", "a JSON list; expected an object"),
        ("{oops", "not a JSON object"),
        ('{"text": "x", "constraints": "y"}', '"constraints" is not a list of strings'),
        ('{"text": "x", "terms": ["y"]}', "unknown field 'terms'; expected text, prefix, constraints, avoid"),
        ('{"text": "x", "prefix": 5}', '"prefix" is not a string'),
    ]:
        src.write_text(f'{{"text": "{sources[0]}"}}\n{bad}\n')
        code, _, err = cli(
            translate_cli.main,
            [f"checkpoint={runs['a']}", f"input={src}", f"output={tmp_path}/bad.hyp", "input_format=jsonl"],
            capsys,
        )
        one_error_line(code, err, f"error: {src}:2: {message}")
        assert not (tmp_path / "bad.hyp").exists()  # nothing half-written


def test_api_prefix_alignments_and_repetition(runs, sources):
    model = nmt.load(runs["a"])
    plain = model.translate(sources[:3])
    starts = [text[:4] for text in plain]
    forced = model.translate(sources[:3], prefix=starts[::-1])
    for text, start in zip(forced, starts[::-1]):
        assert text.startswith(start)
    one = model.translate(sources[0], prefix=plain[0])
    assert one.startswith(plain[0])
    rich = model.translate(sources[:2], beam=3, nbest=2, return_alignments=True, align_layer=0)
    for result in rich:
        assert len(result.alignments) == len(result.hypotheses) == 2
        for hyp, found in zip(result.hypotheses, result.alignments):
            assert all(0 <= j < len(hyp.split()) for _, j in found)
    assert model.translate(sources[0], no_repeat_ngram_size=1)
    with pytest.raises(NmtError, match="prefix: 1 prefixes for 2"):
        model.translate(sources[:2], prefix=["x"])


def test_server_prefix_and_alignments(runs, sources):
    from starlette.testclient import TestClient

    from nmt.config import DecodeConfig, ServeSettings
    from nmt.serve.app import create_app
    from nmt.serve.models import load_model

    decode = DecodeConfig(max_len_a=1.0, max_len_b=4)
    models = [load_model(name, path, decode, torch.device("cpu")) for name, path in runs.items()]
    with TestClient(create_app(models, ServeSettings(access_log=False), decode), base_url="http://localhost") as c:
        plain = c.post("/v1/translate", json={"text": sources[:2]}).json()["translations"]
        word = plain[1]["text"][:4]
        reply = c.post(
            "/v1/translate", json={"text": sources[:2], "prefix": [None, word], "alignments": True, "model": "b"}
        )
        assert reply.status_code == 200, reply.text
        got = reply.json()["translations"]
        assert got[1]["text"].startswith(word) and all("alignment" in r for r in got)
        bad = c.post("/v1/translate", json={"text": sources[:2], "prefix": ["x"]})
        assert bad.status_code == 422 and bad.json()["field"] == "prefix"
