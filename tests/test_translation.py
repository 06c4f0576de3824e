"""Translating files: every line in gets its line out, in order, whatever the lines hold;
outputs appear whole or not at all."""

import json

import numpy as np
import pytest
import torch

from nmt.cli import translate
from nmt.config import Config, DataConfig, DecodeConfig, ModelConfig
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.models.builders import build_model
from nmt.training.checkpoint import save_checkpoint
from nmt.translation import Translator
from tests.conftest import write
from tests.test_cli import cli

WORDS = "the a cat dog sat on mat house red blue big small runs sees".split()
NON_LATIN = ["Ο σκύλος τρέχει στο πάρκο", "狗在公园里跑", "الكلب يجري في الحديقة", "Собака бежит по парку"]
FAST = ["decode.max_len_a=0", "decode.max_len_b=6"]  # an untrained model: short outputs keep the tests fast


@pytest.fixture(scope="module")
def tokenizer():
    g = np.random.default_rng(0)
    corpus = [" ".join(g.choice(WORDS, size=6)) for _ in range(200)] + NON_LATIN * 5
    return Tokenizer.train(corpus, corpus, 120, "unigram", joint=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer):
    """An untrained tiny Transformer: translation must keep lines whatever the model says."""
    torch.manual_seed(0)
    cfg = Config(data=DataConfig(train="unused"), model=ModelConfig(dim=16, layers=1, heads=2, ffn_dim=32, dropout=0.0))
    model = build_model(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.joint)
    path = tmp_path_factory.mktemp("ckpt") / "model.pt"
    save_checkpoint(path, model, cfg, tokenizer, step=0)
    return path


def mixed_lines() -> list[str]:
    long_line = " ".join(WORDS * 40)  # ~560 words, cut by decode.max_src_len
    return [
        "the cat sat",
        "",
        NON_LATIN[0],
        "   ",
        long_line,
        NON_LATIN[1],
        "",
        "a dog",
        NON_LATIN[2],
        long_line + " red",
        NON_LATIN[3],
        "",
    ]


def run_translate(capsys, checkpoint, source, tmp_path, *args, output="out.txt"):
    argv = [
        f"checkpoint={checkpoint}",
        f"input={source}",
        f"output={tmp_path / output}",
        "decode.max_src_len=40",
        *FAST,
        *args,
    ]
    code, out, err = cli(translate.main, argv, capsys)
    return code, err, (tmp_path / output)


def test_translator_keeps_lines_blank_lines_and_order(checkpoint, tokenizer):
    from nmt.training.checkpoint import load_checkpoint, model_from_checkpoint

    model, tok, _ = model_from_checkpoint(load_checkpoint(checkpoint), torch.device("cpu"))
    warnings = []
    translator = Translator(
        model,
        tok,
        DecodeConfig(beam=3, max_len_a=0, max_len_b=4, max_src_len=40, batch_size=2),
        torch.device("cpu"),
        warnings.append,
    )
    lines = mixed_lines()
    results = translator.translate_lines(lines, first_line=101)
    assert len(results) == len(lines)
    for line, result in zip(lines, results):
        assert bool(result.hyps) == bool(line.strip())
        if line.strip():
            assert result.src_ids == tokenizer.encode_src([line])[0][:40]  # each result sits at its own line
    assert [w.split(":")[0] for w in warnings] == ["warning", "warning"]
    assert "line 105" in warnings[0] and "line 110" in warnings[1] and "decode.max_src_len=40" in warnings[0]


@pytest.mark.parametrize("decode", [["decode=greedy"], ["decode=beam"], ["decode=sampling"]])
def test_file_with_blank_long_and_non_latin_lines_keeps_count_and_order(decode, checkpoint, tmp_path, capsys):
    lines = mixed_lines()
    source = write(tmp_path / "in.txt", lines)
    code, err, out = run_translate(capsys, checkpoint, source, tmp_path, *decode, "chunk_size=5")
    assert code == 0, err
    assert "line 5: " in err and "line 10: " in err  # the cut lines are named
    text = out.read_text(encoding="utf-8")
    assert text.endswith("\n") and text.count("\n") == len(lines)
    got = text.split("\n")[:-1]
    assert all(got[i] == "" for i, line in enumerate(lines) if not line.strip())
    # the same lines one at a time (chunks of one, batches of one) give the same outputs in the same places
    code, err, alone = run_translate(
        capsys, checkpoint, source, tmp_path, *decode, "chunk_size=1", "decode.batch_size=1", output="alone.txt"
    )
    assert code == 0, err
    if decode != ["decode=sampling"]:  # samples depend on the batch they are drawn in
        assert alone.read_text(encoding="utf-8").split("\n")[:-1] == got


def test_nbest_output_format(checkpoint, tmp_path, capsys):
    lines = ["the cat sat", "", "a big dog runs", NON_LATIN[1]]
    source = write(tmp_path / "in.txt", lines)
    code, err, out = run_translate(
        capsys, checkpoint, source, tmp_path, "decode=beam", "decode.beam=4", "decode.nbest=3"
    )
    assert code == 0, err
    rows = [line.split("\t") for line in out.read_text(encoding="utf-8").split("\n")[:-1]]
    assert len(rows) == 3 * len(lines) and all(len(r) == 3 for r in rows)
    assert [int(r[0]) for r in rows] == [i for i in range(len(lines)) for _ in range(3)]
    for i in range(len(lines)):
        scores = [float(r[1]) for r in rows[3 * i : 3 * i + 3]]
        assert scores == sorted(scores, reverse=True)
    assert all(r[2] == "" for r in rows[3:6])  # the blank line


def test_nbest_larger_than_beam_is_a_one_line_error(checkpoint, tmp_path, capsys):
    source = write(tmp_path / "in.txt", ["the cat"])
    code, err, out = run_translate(capsys, checkpoint, source, tmp_path, "decode.beam=2", "decode.nbest=3")
    assert code == 2 and "decode.nbest=3" in err and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize("suffix", [".jsonl", ".npz"])
def test_attention_output_and_plots(suffix, checkpoint, tokenizer, tmp_path, capsys):
    lines = ["the cat sat", "", NON_LATIN[1], "a dog"]
    source = write(tmp_path / "in.txt", lines)
    attn_path, plots = tmp_path / f"attn{suffix}", tmp_path / "plots"
    code, err, _ = run_translate(
        capsys,
        checkpoint,
        source,
        tmp_path,
        "decode=beam",
        f"attention_out={attn_path}",
        f"plot_dir={plots}",
        "plot_n=2",
        "chunk_size=3",
    )
    assert code == 0, err
    if suffix == ".jsonl":
        records = [json.loads(line) for line in attn_path.read_text(encoding="utf-8").splitlines()]
    else:
        with np.load(attn_path) as npz:  # allow_pickle stays False: only numbers and strings inside
            records = [
                {
                    "index": i,
                    "src": npz[f"src_{i}"].tolist(),
                    "tgt": npz[f"tgt_{i}"].tolist(),
                    "attention": npz[f"attn_{i}"],
                }
                for i in range(len(lines))
            ]
    assert [r["index"] for r in records] == list(range(len(lines)))
    for line, record in zip(lines, records):
        matrix = np.asarray(record["attention"], dtype=float).reshape(len(record["tgt"]), len(record["src"]))
        if not line.strip():
            assert matrix.size == 0
            continue
        assert record["src"][-1] == "</s>" and len(record["src"]) == len(tokenizer.encode_src([line])[0]) + 1
        np.testing.assert_allclose(matrix.sum(1), 1.0, atol=1e-3)
    assert sorted(p.name for p in plots.iterdir()) == ["000000.png", "000002.png"]  # the first 2 non-blank lines
    assert (plots / "000000.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_output_file_is_left_behind_on_failure(checkpoint, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_bytes(b"the cat\n" * 4 + b"bad \xff byte\n" + b"a dog\n")
    write(tmp_path / "out.txt", ["an earlier translation"])
    code, err, out = run_translate(
        capsys, checkpoint, source, tmp_path, "chunk_size=2", f"attention_out={tmp_path / 'attn.jsonl'}"
    )
    assert code == 2 and "in.txt:5: invalid UTF-8" in err
    assert out.read_text() == "an earlier translation\n"  # untouched
    assert not (tmp_path / "attn.jsonl").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]  # no temporary files either
    code, err, _ = run_translate(capsys, checkpoint, tmp_path / "missing.txt", tmp_path, output="new.txt")
    assert code == 2 and "missing.txt: file not found" in err and not (tmp_path / "new.txt").exists()


def test_input_is_read_in_chunks(checkpoint, tmp_path, capsys, monkeypatch):
    seen = []
    original = Translator.translate_lines

    def spy(self, lines, first_line=1, progress=None, **options):
        seen.append((first_line, len(lines)))
        return original(self, lines, first_line, progress, **options)

    monkeypatch.setattr(Translator, "translate_lines", spy)
    source = write(tmp_path / "in.txt", ["the cat", "a dog", "", "red mat", "big house", "sees", "runs"])
    code, err, out = run_translate(capsys, checkpoint, source, tmp_path, "chunk_size=3")
    assert code == 0, err
    assert seen == [(1, 3), (4, 3), (7, 1)]
    assert out.read_text().count("\n") == 7


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_reduced_precision_keeps_every_line_and_reports_speed(precision, checkpoint, tmp_path, capsys):
    lines = mixed_lines()
    source = write(tmp_path / "in.txt", lines)
    code, err, out = run_translate(
        capsys, checkpoint, source, tmp_path, "decode=beam", f"decode.precision={precision}", "threads=1"
    )
    assert code == 0, err
    assert out.read_text(encoding="utf-8").count("\n") == len(lines)
    speed = err.strip().splitlines()[
        -1
    ]  # translated 9 sentences in 0.4s: 22.1 sentences/s, 150 tokens/s (beam=5 ... precision=int8, 1 threads)
    assert (
        speed.startswith(f"translated {sum(1 for line in lines if line.strip())} sentences in ")
        and "sentences/s" in speed
        and "tokens/s" in speed
    )
    assert f"precision={precision}" in speed


def test_progress_bar_counts_the_input_lines(tmp_path):
    import gzip

    (tmp_path / "a.txt").write_bytes(b"one\ntwo\n\nfour")  # no newline at the end
    (tmp_path / "b.txt.gz").write_bytes(gzip.compress(b"one\ntwo\n"))
    (tmp_path / "c.txt").write_bytes(b"")
    assert [translate.count_lines(str(tmp_path / n)) for n in ("a.txt", "b.txt.gz", "c.txt", "missing.txt")] == [
        4,
        2,
        0,
        None,
    ]


def test_checkpoint_lists_reach_hydra_as_one_value():
    assert translate.checkpoint_list(["checkpoint=a.pt,b.pt", "decode.beam=5", "checkpoint='x,y'"]) == [
        "checkpoint=a.pt\\,b.pt",
        "decode.beam=5",
        "checkpoint='x,y'",
    ]


@pytest.mark.parametrize("bad", ["decode.top_p=0", "decode.temperature=0", "decode.beam=0", "chunk_size=0"])
def test_bad_decode_settings_exit_2(bad, checkpoint, tmp_path, capsys):
    source = write(tmp_path / "in.txt", ["the cat"])
    code, err, _ = run_translate(capsys, checkpoint, source, tmp_path, bad)
    assert code == 2 and bad.split("=")[0] in err


def test_decode_settings_are_checked_and_beam_fits_the_vocabulary():
    with pytest.raises(NmtError, match="decode.nbest=3: at most decode.beam=2"):
        DecodeConfig(beam=2, nbest=3)
    DecodeConfig(sampling=True, nbest=3)  # any number of samples

    class Vocab:
        tgt_vocab_size = 10

    with pytest.raises(NmtError, match="decode.beam=9: wider than the 8 tokens the target vocabulary can emit"):
        Translator(None, Vocab(), DecodeConfig(beam=9), torch.device("cpu"))
    Translator(None, Vocab(), DecodeConfig(beam=8), torch.device("cpu"))


@pytest.mark.parametrize("decode", [["decode=greedy"], ["decode=beam", "decode.nbest=2"]])
def test_worker_processes_give_the_output_of_one_process(decode, checkpoint, tmp_path, capsys):
    """workers=2: batches searched in two processes come back in order; the file equals the one-process one,
    line for line."""
    lines = mixed_lines() * 3
    source = write(tmp_path / "in.txt", lines)
    args = [*decode, "decode.batch_size=2", "chunk_size=7"]  # many batches, several chunks
    code, err, one = run_translate(capsys, checkpoint, source, tmp_path, *args, output="one.txt")
    assert code == 0, err
    code, err, two = run_translate(capsys, checkpoint, source, tmp_path, *args, "workers=2", output="two.txt")
    assert code == 0, err
    assert two.read_text(encoding="utf-8") == one.read_text(encoding="utf-8")
    assert "2 workers x 1 thread(s)" in err.strip().splitlines()[-1]


def test_workers_with_sampling_or_a_broken_checkpoint_are_one_line_errors(checkpoint, tmp_path, capsys):
    source = write(tmp_path / "in.txt", ["the cat"])
    code, err, out = run_translate(capsys, checkpoint, source, tmp_path, "decode=sampling", "workers=2")
    assert code == 2 and "workers=2 with decode.sampling=true" in err and err.count("\n") == 1
    assert not out.exists()
    code, err, _ = run_translate(capsys, checkpoint, source, tmp_path, "workers=0")
    assert code == 2 and "workers" in err


def test_a_worker_that_cannot_load_the_model_fails_the_run_instead_of_hanging(checkpoint, tmp_path):
    """The pool's initializer keeps its error for the first search
    (a raising initializer would be restarted forever)."""
    from nmt.workers import SearchPool

    with SearchPool(str(tmp_path / "missing.pt"), DecodeConfig(), "cpu", workers=1, threads=1) as pool:
        with pytest.raises(NmtError, match="missing.pt"):
            list(pool.search([[[5, 6, 7]]]))
