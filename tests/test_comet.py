"""COMET (nmt.evaluation.comet): offline loading, scoring and caching on a tiny COMET model built here, the messages
for what is missing, and the bootstrap over segment scores against a hand-worked example.

The tiny model has wmt22-comet-da's architecture (a RegressionMetric over an XLM-R encoder, sparsemax layer mix) with
a 2-layer, 16-wide randomly initialised encoder and a SentencePiece unigram vocabulary trained on a few sentences; it
is saved in COMET's layout (MODEL/hparams.yaml, MODEL/checkpoints/model.ckpt) and loaded by COMET's own
load_from_checkpoint. No test touches the network: the model tests run with socket connections refused.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from nmt.cli import evaluate
from nmt.errors import NmtError
from nmt.evaluation import comet as nmt_comet
from nmt.evaluation.comet import CometScorer, encoder_fetch_command, fetch_command, find_checkpoint, segment_bootstrap
from tests.conftest import write
from tests.test_compare_report import out  # noqa: F401 (the fixture comparison)

pytestmark = pytest.mark.filterwarnings(
    "ignore:pkg_resources is deprecated", "ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated"
)

SRC = ["ein kleines Haus", "die Katze sass", "zwei Hunde laufen", "ein Mann"]
HYP = ["a small house", "the cat sat", "two dog run", "a man"]
REF = ["a small house", "the cat sat on the mat", "two dogs run", "a man rides"]


def usable() -> str | None:
    """Why the model tests cannot run here (None: they can)."""
    try:
        nmt_comet.comet_version("comet")
    except NmtError as err:
        return str(err)
    return None


# `make test-comet` (CI) sets NMT_REQUIRE_COMET=1 in COMET's own environment: there the model tests must run, never skip
needs_comet = pytest.mark.skipif(
    usable() is not None and os.environ.get("NMT_REQUIRE_COMET") != "1", reason=f"COMET cannot run here: {usable()}"
)


def cli(main, argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        from nmt.cli.common import run

        run(main, argv)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


# --- the bootstrap over segment scores --------------------------------------------------------------------------------


def test_segment_bootstrap_against_a_hand_worked_example():
    """3 sentences, 2 seeds, 4 fixed draws. Per sentence the seeds' mean system - baseline difference is
    (0.1, 0.05, 0.1), so the observed delta is 0.25/3. Draw [0,0,1] gives (0.1+0.1+0.05)/3 = 0.08333, [1,1,1] 0.05,
    [2,2,0] 0.1, [1,2,1] 0.06667; centred on 0 (minus 0.08333) none is as far from 0 as 0.08333, so p = 1/5;
    numpy's linear percentiles of the 4 sorted draws are 0.05 + 0.075/60 and 0.25/3 + 0.925/60."""
    baseline = np.array([[0.5, 0.6, 0.7], [0.4, 0.6, 0.8]])
    system = np.array([[0.6, 0.6, 0.9], [0.5, 0.7, 0.8]])
    weights = np.array([[2, 1, 0], [0, 3, 0], [1, 0, 2], [0, 2, 1]], dtype=float)
    result = segment_bootstrap(baseline, system, [1, 2], 4, 1, weights)
    assert result.delta == pytest.approx(0.25 / 3)
    assert result.p_value == pytest.approx(1 / 5)
    assert result.ci_low == pytest.approx(0.05 + 0.075 / 60)
    assert result.ci_high == pytest.approx(0.25 / 3 + 0.925 / 60)
    assert (result.samples, result.sentences, result.seeds) == (4, 3, [1, 2])


def test_segment_bootstrap_draws_all_seeds_of_a_sentence_together():
    """With drawn weights: each draw recomputed from its picked sentence indices, every seed's scores at the same
    indices, the system's mean over seeds minus the baseline's."""
    rng = np.random.default_rng(0)
    baseline, system = rng.random((3, 7)), rng.random((3, 7))
    result = segment_bootstrap(baseline, system, [1, 2, 3], 300, 5)
    picks = np.random.default_rng(5).integers(0, 7, size=(300, 7))
    draws = np.array([system[:, idx].mean(1).mean() - baseline[:, idx].mean(1).mean() for idx in picks])
    observed = system.mean(1).mean() - baseline.mean(1).mean()
    assert result.delta == pytest.approx(observed)
    assert [result.ci_low, result.ci_high] == pytest.approx(np.percentile(draws, [2.5, 97.5]).tolist())
    beyond = np.sum(np.abs(draws - observed) >= abs(observed) - 1e-9)
    assert result.p_value == pytest.approx((beyond + 1) / 301)


# --- what is missing, and the commands the messages suggest -----------------------------------------------------------


def check_python_command(command: str) -> str:
    """A suggested `python -c "..."`: it splits as a shell would into python, -c and code that compiles."""
    words = shlex.split(command)
    assert words[:2] == ["python", "-c"] and len(words) == 3
    compile(words[2], "<suggested>", "exec")
    return words[2]


def test_a_missing_package_names_the_extra_and_a_working_install(monkeypatch):
    real = metadata.version

    def version(name):
        if name == "unbabel-comet":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", version)
    with pytest.raises(NmtError) as err:
        nmt_comet.comet_version("comet.model")
    message = str(err.value)
    assert "\n" not in message and "comet extra" in message
    assert "install it with: pip install -e '.[comet]' in the clone's folder" in message
    assert "nmt-attention[" not in message and "pip install unbabel" not in message
    assert shlex.split("pip install -e '.[comet]'") == ["pip", "install", "-e", ".[comet]"]
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert 'comet = ["unbabel-comet>=2.2,<3"' in pyproject  # the extra the message names


def test_a_transformers_comet_cannot_run_with_is_named(monkeypatch):
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "2.2.7" if name == "unbabel-comet" else real(name))
    monkeypatch.setattr(metadata, "requires", lambda name: ["transformers (<0.1)", "numpy"])
    with pytest.raises(NmtError, match=r"unbabel-comet 2.2.7 needs transformers<0.1, but this environment has"):
        nmt_comet.comet_version("comet.model")
    make, install = (shlex.split(c) for c in nmt_comet.OWN_ENV.split(" && "))
    assert make[:3] == ["python", "-m", "venv"] and install == [f"{make[3]}/bin/pip", "install", "-e", ".[comet]"]


@pytest.fixture
def empty_hub(tmp_path, monkeypatch):
    """An empty Hugging Face cache: nothing is downloaded."""
    import huggingface_hub.constants

    hub = tmp_path / "hub"
    hub.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    return hub


def test_a_model_not_downloaded_says_what_to_fetch(empty_hub):
    with pytest.raises(NmtError) as err:
        find_checkpoint("Unbabel/wmt22-comet-da")
    message = str(err.value)
    assert message.startswith("comet.model=Unbabel/wmt22-comet-da: not downloaded; fetch it once with: python -c ")
    assert "about 2.3 GB" in message and "comet.model=PATH/checkpoints/model.ckpt" in message and "\n" not in message
    code = check_python_command(fetch_command("Unbabel/wmt22-comet-da"))
    assert fetch_command("Unbabel/wmt22-comet-da") in message
    assert "download_model('Unbabel/wmt22-comet-da')" in code and "load_from_checkpoint(" in code


def test_paths_that_are_not_a_comet_model(tmp_path, empty_hub):
    with pytest.raises(NmtError, match="no such file or folder"):
        find_checkpoint(str(tmp_path / "nothing" / "here.ckpt"))
    with pytest.raises(NmtError, match="no checkpoints/model.ckpt in that folder"):
        find_checkpoint(str(tmp_path))
    (tmp_path / "m" / "checkpoints").mkdir(parents=True)
    (tmp_path / "m" / "checkpoints" / "model.ckpt").write_bytes(b"x")
    with pytest.raises(NmtError, match="no hparams.yaml in"):
        find_checkpoint(str(tmp_path / "m"))
    (tmp_path / "m" / "hparams.yaml").write_text(
        "class_identifier: regression_metric\npretrained_model: xlm-roberta-large\n"
    )
    with pytest.raises(NmtError) as err:
        find_checkpoint(str(tmp_path / "m" / "checkpoints" / "model.ckpt"), key="comet_model")
    message = str(err.value)
    assert "its encoder xlm-roberta-large (hparams.yaml's pretrained_model) has no config and tokenizer" in message
    code = check_python_command(encoder_fetch_command("xlm-roberta-large"))
    assert encoder_fetch_command("xlm-roberta-large") in message and "AutoTokenizer.from_pretrained(" in code
    import transformers

    assert hasattr(transformers, "AutoConfig") and hasattr(transformers, "AutoTokenizer")


@pytest.mark.parametrize(
    "override, expected",
    [
        ("metrics=[bleu,meteor]", "metrics: unknown metric 'meteor'; expected one of bleu, chrf, chrf++, ter, bleu_lc"),
        ("metrics=[bleu,comet]", "metrics: comet needs its model: give comet.model=PATH"),
        ("metrics=[bleu,bleu]", "a metric is named twice"),
        ("comet.device=gpu", "comet.device=gpu: unknown; expected one of auto, cpu, cuda"),
        ("comet.batch_size=0", "comet.batch_size=0: expected at least 1"),
    ],
)
def test_evaluate_refuses_bad_metric_settings(override, expected, tmp_path, capsys):
    ref = write(tmp_path / "ref.txt", REF)
    code, _, err = cli(evaluate.main, [f"hyp={ref}", f"ref={ref}", override], capsys)
    assert code == 2 and err.startswith("error: ") and expected in err and len(err.strip().splitlines()) == 1


def test_evaluate_prints_chrf_plus_plus_with_its_signature(tmp_path, capsys):
    hyp, ref = write(tmp_path / "hyp.txt", HYP), write(tmp_path / "ref.txt", REF)
    code, out_text, _ = cli(evaluate.main, [f"hyp={hyp}", f"ref={ref}", "metrics=[chrf++,bleu]"], capsys)
    from sacrebleu.metrics import CHRF

    expected = CHRF(word_order=2).corpus_score(HYP, [REF]).score
    lines = out_text.strip().splitlines()
    assert code == 0 and lines[0].startswith(f"chrF2++ = {expected:.2f}") and "nw:2" in lines[0]
    assert lines[1].startswith("BLEU = ")


def test_score_api_has_chrf_plus_plus_and_checks_comet_arguments():
    import nmt

    scores = nmt.score(HYP, REF)
    assert list(scores) == ["bleu", "chrf", "chrf++", "ter"] and "nw:2" in scores["chrf++"].signature
    with pytest.raises(NmtError, match="give sources="):
        nmt.score(HYP, REF, comet_model="Unbabel/wmt22-comet-da")
    with pytest.raises(NmtError, match="comet needs comet_model="):
        nmt.score(HYP, REF, metrics=("comet",))


# --- the real loading and scoring code on a tiny model ----------------------------------------------------------------


def build_tiny_comet(folder: Path) -> Path:
    """A COMET RegressionMetric over a tiny XLM-R encoder, saved in COMET's layout; returns the model folder."""
    import io

    import pytorch_lightning
    import sentencepiece as spm
    import torch
    import yaml
    from comet.models import RegressionMetric
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import XLMRobertaConfig, XLMRobertaTokenizerFast

    encoder = folder / "encoder"
    encoder.mkdir(parents=True)
    text = SRC + HYP + REF + ["a dog runs in the park", "ein Hund läuft im Park", "the house by the river"]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text * 4), model_writer=model, vocab_size=60, model_type="unigram", minloglevel=2,
        hard_vocab_limit=False, bos_id=-1, pad_id=-1, eos_id=2, unk_id=0,
    )  # fmt: skip
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    specials = ["<s>", "<pad>", "</s>", "<unk>"]  # XLM-R's ids 0-3; <mask> last
    pieces = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    vocab = [(t, 0.0) for t in specials] + [p for p in pieces if p[0] not in specials] + [("<mask>", 0.0)]
    backend = Tokenizer(models.Unigram(vocab, unk_id=3))
    backend.pre_tokenizer, backend.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    XLMRobertaTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        unk_token="<unk>", pad_token="<pad>", mask_token="<mask>",
    ).save_pretrained(str(encoder))  # fmt: skip
    XLMRobertaConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2,
    ).save_pretrained(str(encoder))  # fmt: skip
    torch.manual_seed(0)
    metric = RegressionMetric(
        pretrained_model=str(encoder), load_pretrained_weights=False, local_files_only=True, hidden_sizes=[8],
        layer_transformation="sparsemax", layer_norm=False,
    )  # fmt: skip
    hparams = dict(metric.hparams)
    (folder / "checkpoints").mkdir()
    torch.save(
        {"state_dict": metric.state_dict(), "hyper_parameters": hparams,
         "pytorch-lightning_version": pytorch_lightning.__version__},
        folder / "checkpoints" / "model.ckpt",
    )  # fmt: skip
    (folder / "hparams.yaml").write_text(yaml.safe_dump(hparams))
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_comet(tmp_path_factory.mktemp("comet") / "tiny-comet")


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args[1:]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@needs_comet
def test_scores_load_offline_and_are_cached(tiny, tmp_path, no_network, monkeypatch):
    cache = tmp_path / "cache"
    scorer = CometScorer(str(tiny), batch_size=2, device="cpu", progress=False, cache=cache)
    result = scorer.score(SRC, HYP, REF)
    assert not result.cached and len(result.segments) == len(HYP)
    assert result.system == pytest.approx(np.mean(result.segments))
    assert result.signature.startswith("model:tiny-comet|fingerprint:") and result.signature.endswith(
        f"|comet:{metadata.version('unbabel-comet')}"
    )
    # a segment's score does not depend on its batch: alone, and in a batch of a different order
    alone = scorer.score(SRC[1:2], HYP[1:2], REF[1:2])
    assert alone.segments[0] == pytest.approx(result.segments[1], abs=1e-5)
    reordered = scorer.score(SRC[::-1], HYP[::-1], REF[::-1])
    assert reordered.segments[::-1] == pytest.approx(result.segments, abs=1e-5)
    # COMET's own system score of the same model is the mean we report
    found = scorer._load().predict(
        [{"src": s, "mt": h, "ref": r} for s, h, r in zip(SRC, HYP, REF)], batch_size=4, gpus=0, progress_bar=False
    )
    assert found.system_score == pytest.approx(result.system, abs=1e-6)
    # the second time: read from the cache, no model loaded
    fresh = CometScorer(
        str(tiny / "checkpoints" / "model.ckpt"), batch_size=2, device="cpu", progress=False, cache=cache
    )
    monkeypatch.setattr(CometScorer, "_load", lambda self: pytest.fail("a cached score loaded the model"))
    again = fresh.score(SRC, HYP, REF)
    assert again.cached and again.segments == result.segments and again.signature == result.signature
    entries = [json.loads(p.read_text()) for p in cache.glob("*.json")]
    assert len(entries) == 3 and {e["sentences"] for e in entries} == {1, 4}
    # other hypotheses are another entry: scored, not read
    with pytest.raises(pytest.fail.Exception):
        fresh.score(SRC, REF, REF)


@needs_comet
def test_a_downloaded_name_is_found_in_the_hugging_face_cache(tiny, empty_hub, tmp_path, no_network):
    import shutil

    snapshot = empty_hub / "models--Tiny--comet" / "snapshots" / "abc123"
    shutil.copytree(tiny, snapshot, ignore=shutil.ignore_patterns("encoder"))
    (empty_hub / "models--Tiny--comet" / "refs").mkdir()
    (empty_hub / "models--Tiny--comet" / "refs" / "main").write_text("abc123")
    checkpoint = find_checkpoint("Tiny/comet")
    assert checkpoint.path == snapshot / "checkpoints" / "model.ckpt" and checkpoint.name == "Tiny/comet"
    by_name = CometScorer("Tiny/comet", device="cpu", progress=False, cache=False).score(SRC, HYP, REF)
    by_path = CometScorer(str(tiny), device="cpu", progress=False, cache=False).score(SRC, HYP, REF)
    assert by_name.segments == pytest.approx(by_path.segments) and by_name.signature.startswith("model:Tiny/comet|")


@needs_comet
def test_evaluate_and_the_api_score_comet(tiny, tmp_path, capsys, no_network):
    import nmt

    hyp, ref, src = write(tmp_path / "h.txt", HYP), write(tmp_path / "r.txt", REF), write(tmp_path / "s.txt", SRC)
    cache = tmp_path / "cache"
    args = [f"hyp={hyp}", f"ref={ref}", f"comet.model={tiny}", "comet.progress=false", f"comet.cache={cache}"]
    code, _, err = cli(evaluate.main, args, capsys)
    assert code == 2 and "metrics: comet reads each hypothesis with its source: give src=FILE with hyp=FILE" in err
    code, printed, err = cli(evaluate.main, args + [f"src={src}", "metrics=[chrf++,comet]"], capsys)
    lines = printed.strip().splitlines()
    assert code == 0 and lines[0].startswith("chrF2++ = ") and lines[1].startswith("COMET = 0.") and not err
    api = nmt.score(HYP, REF, sources=SRC, comet_model=str(tiny), comet_progress=False, comet_cache=cache)
    assert lines[1] == f"COMET = {api['comet'].score:.4f}  ({api['comet'].signature})"
    assert len(list(cache.glob("*.json"))) == 1  # the API read what nmt-evaluate cached


@needs_comet
def test_the_comparison_report_scores_every_run_with_comet(out, tiny, no_network, monkeypatch):  # noqa: F811
    """A COMET table in report.md, results.json and results.csv from the runs' test.hyp; a second report reads the
    cache (OUT/comet_cache) and loads no model."""
    import csv

    from omegaconf import OmegaConf

    from nmt.compare.report import build_report
    from nmt.compare.summary import comet_summary

    plan = OmegaConf.load(out / "comparison.yaml")
    plan.comet.model, plan.comet.progress, plan.comet.device = str(tiny), False, "cpu"
    (out / "comparison.yaml").write_text(OmegaConf.to_yaml(plan))
    build_report(out)
    report = (out / "report.md").read_text()
    assert "## COMET" in report and "segment bootstrap 95% CI, p" in report and "**COMET** (unbabel-comet" in report
    results = json.loads((out / "results.json").read_text())
    comet = results["comet"]
    entries = [json.loads(p.read_text()) for p in (out / "comet_cache").glob("*.json")]
    assert len(entries) == 4  # 2 variants x 2 seeds
    by_hyp = {e["hyp_sha256"]: e for e in entries}
    from nmt.evaluation.comet import text_digest
    from tests.test_compare_report import OUTPUTS

    systems = {v: {s: by_hyp[text_digest(OUTPUTS[v][s])]["system"] for s in (1, 2)} for v in OUTPUTS}
    good = next(v for v in comet["variants"] if v["name"] == "good")
    assert good["comet"]["values"] == pytest.approx([systems["good"][1], systems["good"][2]])
    assert good["delta"] == pytest.approx(
        np.mean(list(systems["good"].values())) - np.mean(list(systems["base"].values()))
    )
    segments = {v: {s: {**by_hyp[text_digest(OUTPUTS[v][s])]} for s in (1, 2)} for v in OUTPUTS}
    again = comet_summary(segments, "base", 6, 200, 12345)
    assert good["significance"]["bootstrap"]["p_value"] == pytest.approx(
        again["variants"][1]["significance"]["bootstrap"]["p_value"]
    )
    with open(out / "results.csv", newline="") as f:
        rows = {row["variant"]: row for row in csv.DictReader(f)}
    assert float(rows["good"]["comet_mean"]) == pytest.approx(good["comet"]["mean"])
    monkeypatch.setattr(CometScorer, "_load", lambda self: pytest.fail("the second report loaded the model"))
    build_report(out)
    assert json.loads((out / "results.json").read_text())["comet"]["variants"] == comet["variants"]


def test_a_finished_comparison_is_scored_with_report_only(out, empty_hub, capsys, monkeypatch):  # noqa: F811
    """nmt-compare report_only=true comet.model=NAME reaches COMET; a model not downloaded (or no COMET installed)
    stops it with one line, and the runs are left as they were. (The fixture runs record no scoring settings, which
    report_only checks first: that check is left out here.)"""
    import nmt.compare.report
    from nmt.cli import compare

    monkeypatch.setattr(nmt.compare.report, "check_scored", lambda out, plan: None)

    before = (out / "runs" / "good" / "seed1" / "eval.json").read_text()
    code, _, err = cli(compare.main, ["report_only=true", f"out={out}", "comet.model=Unbabel/wmt22-comet-da"], capsys)
    assert code == 2 and err.startswith("error: comet.model") and len(err.strip().splitlines()) == 1
    assert ("not downloaded" in err) == (usable() is None)
    assert (out / "runs" / "good" / "seed1" / "eval.json").read_text() == before
