"""The Python API (nmt.load, Model.translate, translate_file, nmt.score, nmt.train) on a tiny trained toy model."""

import numpy as np
import pytest
from sacrebleu.metrics import BLEU, CHRF

import nmt
from nmt.errors import NmtError
from tests.test_cli import TINY, toy_overrides


@pytest.fixture(scope="module")
def trained(toy_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("api") / "run"
    result = nmt.train(
        overrides=[
            *toy_overrides(toy_dir),
            *TINY,
            f"run_dir={run_dir}",
            "train.max_steps=12",
            f"data.cache_dir={run_dir.parent}/cache",
        ],
        log=None,
    )
    return result


def test_train_returns_the_run_dir_and_its_results(trained):
    assert (trained.run_dir / "checkpoints" / "best.pt").is_file()
    assert trained.results["steps"] == 12 and "train_s" in trained.results


def test_load_and_translate_as_the_snippet_does(trained, toy_dir):
    model = nmt.load(trained.run_dir, device="cpu")
    lines = (toy_dir / "test.src").read_text().splitlines()[:5]
    out = model.translate(lines, beam=2)
    assert isinstance(out, list) and len(out) == 5 and all(isinstance(t, str) for t in out)
    assert model.translate(lines[0], beam=2) == out[0]  # one string in, one string out
    assert model.translate(["", lines[1]], beam=2) == ["", out[1]]  # a blank line keeps its place
    rich = model.translate(lines[:2], beam=3, nbest=3, return_attention=True)
    assert [len(r.hypotheses) for r in rich] == [3, 3] and rich[0].text == rich[0].hypotheses[0]
    assert rich[0].scores == sorted(rich[0].scores, reverse=True)
    attention = rich[0].attention[0]
    assert isinstance(attention, np.ndarray) and attention.shape[1] == len(rich[0].source_tokens)
    np.testing.assert_allclose(attention.sum(1), 1.0, atol=1e-4)
    assert "nmt.Model(" in repr(model)
    if model.decode.precision == "fp32" and model.device.type == "cpu":  # which fp32 product decodes, by name
        from nmt.engine.onednn import fp32_backend

        assert f"fp32 on {fp32_backend()} products" in repr(model)
    # greedy: texts alone skip the scores (decode.scores unset), a Result has them, the text is the same
    greedy = model.translate(lines[:3], rich=True)
    assert [r.text for r in greedy] == model.translate(lines[:3]) and all(np.isfinite(r.scores[0]) for r in greedy)
    assert all(np.isnan(r.scores[0]) for r in model.translate(lines[:3], rich=True, scores=False))


def test_translate_equals_the_command_line_search(trained, toy_dir):
    from nmt.api import load_translator
    from nmt.config import DecodeConfig

    lines = (toy_dir / "test.src").read_text().splitlines()[:8]
    translator, _ = load_translator(str(trained.run_dir), DecodeConfig(beam=2), "cpu")
    assert nmt.load(trained.run_dir, device="cpu").translate(lines, beam=2) == translator.translate(lines)


def test_translate_file_keeps_the_line_count(trained, toy_dir, tmp_path):
    model = nmt.load(trained.run_dir, device="cpu", beam=2)
    source = tmp_path / "in.txt"
    source.write_text("\n".join((toy_dir / "test.src").read_text().splitlines()[:7] + ["", "ze"]) + "\n")
    assert model.translate_file(source, tmp_path / "out.txt", batch_size=3) == 9
    out = (tmp_path / "out.txt").read_text().splitlines()
    assert len(out) == 9 and out[7] == "" and out[:7] == model.translate(source.read_text().splitlines()[:7])
    with pytest.raises(NmtError, match="is the input file"):
        model.translate_file(source, source)


def test_precision_and_bad_arguments(trained):
    model = nmt.load(trained.run_dir, device="cpu", precision="int8")
    assert model.decode.precision == "int8" and model.translate("ze bosize", beam=1) is not None
    with pytest.raises(NmtError, match="precision=fp16: expected one of fp32, bf16, int8"):
        nmt.load(trained.run_dir, precision="fp16")
    with pytest.raises(NmtError, match="bem: not a decoding setting"):
        model.translate("ze", bem=2)
    with pytest.raises(NmtError, match=r"lines\[1\]: expected a string, got int"):
        model.translate(["ze", 3])
    with pytest.raises(NmtError, match="decode.beam|beam="):
        model.translate("ze", beam=0)
    with pytest.raises(NmtError, match="no such file|not found|does not exist"):
        nmt.load("/nonexistent/run")


def test_score_is_sacrebleu_with_signatures():
    hyps, refs = ["the cat sat on the mat", "a dog"], ["the cat sat on a mat", "a big dog"]
    scores = nmt.score(hyps, refs)
    assert list(scores) == ["bleu", "chrf", "chrf++", "ter"]
    assert scores["bleu"].score == pytest.approx(BLEU().corpus_score(hyps, [refs]).score)
    assert scores["chrf"].score == pytest.approx(CHRF().corpus_score(hyps, [refs]).score)
    assert scores["chrf++"].score == pytest.approx(CHRF(word_order=2).corpus_score(hyps, [refs]).score)
    assert "nw:2" in scores["chrf++"].signature
    assert "nrefs:1" in scores["bleu"].signature and float(scores["bleu"]) == scores["bleu"].score
    two = nmt.score(hyps, [refs, ["the cat sat on the mat", "a dog"]], metrics=("bleu",))
    assert "nrefs:2" in two["bleu"].signature and two["bleu"].score == pytest.approx(100.0)
    with pytest.raises(NmtError, match=r"references\[0\]: 1 lines for 2 hypotheses"):
        nmt.score(hyps, refs[:1])
    with pytest.raises(NmtError, match="unknown metric 'meteor'"):
        nmt.score(hyps, refs, metrics=("meteor",))


def test_train_needs_one_way_of_saying_what_to_train():
    with pytest.raises(NmtError, match="give overrides"):
        nmt.train()
