"""Bad input: one line on stderr naming the file, line or key and what was expected, exit code 2, no
traceback, and no partial output (no run dir, no output file, no temporary file)."""

import errno
import os
from pathlib import Path

import pytest
import torch

from nmt.cli import average, evaluate, train, translate
from nmt.config import Config, DataConfig, ModelConfig
from nmt.data.tokenizer import Tokenizer
from nmt.models.builders import build_model
from nmt.training.checkpoint import save_checkpoint
from tests.conftest import write
from tests.test_checkpoint import WritesAFile
from tests.test_cli import TINY, cli


def one_error_line(code: int, err: str, *parts: str) -> None:
    """Exit code 2 and exactly one `error:` line on stderr that contains every part."""
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for part in parts:
        assert part in err, (part, err)


def nothing_left(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".") or p.name in ("out.txt", "run")], list(
        folder.iterdir()
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, toy_dir):
    """A small valid corpus (prefix `ok`) to combine with one broken piece per test."""
    folder = tmp_path_factory.mktemp("corpus")
    for side in ("src", "tgt"):
        write(folder / f"ok.{side}", (toy_dir / f"train.{side}").read_text().splitlines()[:200])
    return folder


def train_args(tmp_path: Path, train_prefix: str, *extra: str) -> list[str]:
    return [
        "data=parallel",
        f"data.train={train_prefix}",
        "data.src=src",
        "data.tgt=tgt",
        f"data.cache_dir={tmp_path}/cache",
        f"run_dir={tmp_path}/run",
        *TINY,
        "train.max_steps=1",
        *extra,
    ]


def train_fails(tmp_path, capsys, prefix, *parts, extra=()):
    code, _, err = cli(train.main, train_args(tmp_path, prefix, *extra), capsys)
    one_error_line(code, err, *parts)
    assert not (tmp_path / "run").exists()  # a bad input leaves no run dir behind
    return err


# --- corpus files ----------------------------------------------------------------------------------
def test_different_line_counts(tmp_path, capsys):
    write(tmp_path / "c.src", ["a", "b", "c"])
    write(tmp_path / "c.tgt", ["x", "y"])
    train_fails(
        tmp_path,
        capsys,
        tmp_path / "c",
        f"{tmp_path}/c.src has 3 lines but {tmp_path}/c.tgt has 2; parallel files must have the same number of lines",
    )


def test_missing_file(tmp_path, capsys):
    train_fails(tmp_path, capsys, tmp_path / "nope", f"error: {tmp_path}/nope.src: file not found")


def test_unreadable_file(tmp_path, capsys, corpus, monkeypatch):
    """Tests run as root, where chmod cannot deny a read: the OS error is simulated
    (the corpus is streamed through Path.open)."""
    open_path = Path.open

    def denied(self, *args, **kwargs):
        if self.name == "ok.tgt":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return open_path(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", denied)
    train_fails(tmp_path, capsys, corpus / "ok", f"error: {corpus}/ok.tgt: permission denied")


def test_directory_where_a_file_is_expected(tmp_path, capsys):
    (tmp_path / "d.src").mkdir()
    write(tmp_path / "d.tgt", ["x"])
    train_fails(tmp_path, capsys, tmp_path / "d", f"error: {tmp_path}/d.src: is a directory, expected a text file")


def test_invalid_utf8(tmp_path, capsys):
    (tmp_path / "u.src").write_bytes(b"fine\nalso fine\nbad \xff byte\n")
    write(tmp_path / "u.tgt", ["x", "y", "z"])
    train_fails(
        tmp_path, capsys, tmp_path / "u", f"error: {tmp_path}/u.src:3: invalid UTF-8 (byte 0xff); expected UTF-8 text"
    )


def test_empty_corpus(tmp_path, capsys):
    write(tmp_path / "e.src", [])
    write(tmp_path / "e.tgt", [])
    train_fails(
        tmp_path, capsys, tmp_path / "e", f"error: {tmp_path}/e.src, {tmp_path}/e.tgt: the training corpus is empty"
    )


def test_empty_after_filtering(tmp_path, capsys, corpus):
    train_fails(
        tmp_path,
        capsys,
        corpus / "ok",
        f"error: {corpus}/ok.src, {corpus}/ok.tgt: no training pairs left after filtering 200 pairs",
        "max_len>1 removed",
        extra=["data.max_len=1"],
    )


def test_bad_tsv_and_jsonl_lines(tmp_path, capsys):
    write(tmp_path / "c.tsv", ["a\tx", "no tab"])
    train_fails(
        tmp_path,
        capsys,
        tmp_path / "c.tsv",
        f"error: {tmp_path}/c.tsv:2: expected 2 tab-separated fields (source, target), found 1",
    )
    write(tmp_path / "c.jsonl", ['{"src": "a", "tgt": "x"}', "{not json"])
    train_fails(tmp_path, capsys, tmp_path / "c.jsonl", f"error: {tmp_path}/c.jsonl:2: invalid JSON")


# --- configuration ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "override, message",
    [
        (
            "train.no_such_key=1",
            "error: train.no_such_key: unknown key 'no_such_key'; valid keys in train: max_steps, max_epochs,",
        ),
        (
            "+train.no_such_key=1",
            "error: train.no_such_key: unknown key 'no_such_key'; valid keys in train: max_steps, max_epochs,",
        ),
        (
            "nosuch=1",
            "error: nosuch: unknown key 'nosuch'; valid keys at the top level: data, model, train, decode, "
            "run_dir, resume, init_from",
        ),
        (
            "model=no_such_model",
            "error: model=no_such_model: no such recipe in recipes/model/; expected one of bahdanau, hard, luong,",
        ),
        ("train.max_steps=many", "error: train.max_steps=many: expected a whole number"),
        ("train.lr=fast", "error: train.lr=fast: expected a number"),
        ("train.progress=maybe", "error: train.progress=maybe: expected true or false"),
        (
            "train.early_stop_metric=ter",
            "error: train.early_stop_metric=ter: unknown; expected one of bleu, chrf, loss",
        ),
        ("train.keep_last=0", "error: train.keep_last=0: expected at least 1"),
    ],
)
def test_config_mistakes(override, message, tmp_path, capsys, corpus):
    train_fails(tmp_path, capsys, corpus / "ok", message, extra=[override])


def test_translate_config_mistake(tmp_path, capsys):
    code, _, err = cli(translate.main, [f"checkpoint={tmp_path}/x.pt", "decode.bem=2"], capsys)
    one_error_line(code, err, "decode.bem: unknown key 'bem'; valid keys in decode: beam,")


# --- checkpoints -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, corpus) -> Path:
    """An untrained tiny model's checkpoint: enough to translate (badly)."""
    lines = (corpus / "ok.src").read_text().splitlines() + (corpus / "ok.tgt").read_text().splitlines()
    tokenizer = Tokenizer.train(lines, lines, 100, "unigram", joint=True)
    cfg = Config(
        data=DataConfig(train=str(corpus / "ok"), vocab_size=100),
        model=ModelConfig(dim=32, layers=1, heads=2, ffn_dim=64),
    )
    model = build_model(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, True)
    path = tmp_path_factory.mktemp("ckpt") / "model.pt"
    save_checkpoint(path, model, cfg, tokenizer, step=3)
    return path


@pytest.fixture
def source(tmp_path, corpus) -> Path:
    return write(tmp_path / "in.txt", (corpus / "ok.src").read_text().splitlines()[:3])


def bad_checkpoints(folder: Path, good: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, what the message says)."""
    data = good.read_bytes()
    (folder / "cut.pt").write_bytes(data[: len(data) // 2])
    (folder / "junk.pt").write_bytes(os.urandom(5000))
    torch.save({"weights": torch.zeros(2)}, folder / "other.pt")
    torch.save({"format": "nmt-checkpoint", "model": WritesAFile(str(folder / "pwned"))}, folder / "evil.pt")
    payload = torch.load(good, weights_only=True)
    payload["model"] = {k: v[..., :1] if v.dim() else v for k, v in payload["model"].items()}
    torch.save(payload, folder / "shapes.pt")
    return {
        "truncated": (folder / "cut.pt", "not a readable checkpoint (not a torch zip archive; truncated or corrupt?)"),
        "corrupt": (folder / "junk.pt", "not a readable checkpoint"),
        "foreign": (folder / "other.pt", "not an nmt checkpoint"),
        "runs code": (folder / "evil.pt", "refused to load: the file holds more than plain tensors and values"),
        "weights": (
            folder / "shapes.pt",
            "the weights do not match the model config: Error(s) in loading state_dict for Seq2Seq",
        ),
        "missing": (folder / "none.pt", "checkpoint not found"),
    }


@pytest.mark.parametrize("case", ["truncated", "corrupt", "foreign", "runs code", "weights", "missing"])
def test_bad_checkpoint_to_translate(case, checkpoint, source, tmp_path, capsys):
    path, message = bad_checkpoints(tmp_path, checkpoint)[case]
    code, _, err = cli(translate.main, [f"checkpoint={path}", f"input={source}", f"output={tmp_path}/out.txt"], capsys)
    one_error_line(code, err, f"error: {path}: {message}")
    assert not (tmp_path / "out.txt").exists() and not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("case", ["truncated", "runs code", "weights"])
def test_bad_checkpoint_to_init_from(case, checkpoint, tmp_path, capsys, corpus):
    path, message = bad_checkpoints(tmp_path, checkpoint)[case]
    train_fails(tmp_path, capsys, corpus / "ok", f"error: {path}: {message}", extra=[f"init_from={path}"])


def test_init_from_with_another_model_size_or_vocabulary(checkpoint, tmp_path, capsys, corpus):
    train_fails(
        tmp_path,
        capsys,
        corpus / "ok",
        f"error: init_from={checkpoint}: the checkpoint does not match the model asked for: model.dim is 32 in the "
        "checkpoint, 64 asked; model.ffn_dim is 64 in the checkpoint, 128 asked (fine-tuning keeps the checkpoint's "
        "architecture and vocabulary; drop these overrides)",
        extra=[f"init_from={checkpoint}", "model.dim=64", "model.ffn_dim=128"],
    )
    train_fails(
        tmp_path,
        capsys,
        corpus / "ok",
        "data.vocab_size is 100 in the checkpoint, 500 asked",
        extra=[f"init_from={checkpoint}", "data.vocab_size=500"],
    )


def test_resume_mistakes(tmp_path, capsys, checkpoint):
    code, _, err = cli(train.main, [f"resume={tmp_path}/nowhere"], capsys)
    one_error_line(
        code,
        err,
        f"error: resume={tmp_path}/nowhere: no checkpoints/last.pt there; expected a run dir written by nmt-train",
    )
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "last.pt").write_bytes(
        checkpoint.read_bytes()
    )  # a checkpoint without training state
    code, _, err = cli(train.main, [f"resume={tmp_path}/run", "model=transformer"], capsys)
    one_error_line(
        code,
        err,
        "error: resume: cannot change a recipe group on resume (model=transformer); only KEY.SUB=VALUE overrides",
    )
    code, _, err = cli(train.main, [f"resume={tmp_path}/run", "train.nokey=1"], capsys)
    one_error_line(code, err, "error: resume: train.nokey: Key 'nokey' not in 'TrainConfig'")
    code, _, err = cli(train.main, [f"resume={tmp_path}/run", f"init_from={checkpoint}"], capsys)
    one_error_line(code, err, "error: resume= and init_from= do not go together")
    code, _, err = cli(train.main, [f"resume={tmp_path}/run", f"data.cache_dir={tmp_path}/cache"], capsys)
    one_error_line(
        code,
        err,
        f"error: {tmp_path}/run/checkpoints/last.pt: holds no training state (an averaged or exported checkpoint?); "
        "start from it with init_from= instead",
    )


def test_a_new_run_does_not_overwrite_a_run_dir_with_checkpoints(tmp_path, capsys, corpus, checkpoint):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "last.pt").write_bytes(checkpoint.read_bytes())
    code, _, err = cli(train.main, train_args(tmp_path, corpus / "ok"), capsys)
    one_error_line(
        code,
        err,
        f"error: run_dir={tmp_path}/run: already holds a run's checkpoints; "
        f"continue it with resume={tmp_path}/run, or choose another run_dir",
    )
    assert (tmp_path / "run" / "checkpoints" / "last.pt").read_bytes() == checkpoint.read_bytes()


# --- writing ---------------------------------------------------------------------------------------
def test_output_in_a_missing_directory(checkpoint, source, tmp_path, capsys):
    code, _, err = cli(
        translate.main, [f"checkpoint={checkpoint}", f"input={source}", f"output={tmp_path}/missing/out.txt"], capsys
    )
    one_error_line(code, err, f"error: output={tmp_path}/missing/out.txt: directory {tmp_path}/missing does not exist")
    code, _, err = cli(
        evaluate.main,
        [f"checkpoint={checkpoint}", f"src={source}", f"ref={source}", f"hyp_out={tmp_path}/missing/h.txt"],
        capsys,
    )
    one_error_line(code, err, f"error: hyp_out={tmp_path}/missing/h.txt: directory {tmp_path}/missing does not exist")


@pytest.mark.parametrize("failure", [errno.ENOSPC, errno.EACCES])
def test_disk_full_or_permission_denied_leaves_no_output(failure, checkpoint, source, tmp_path, capsys, monkeypatch):
    """Tests run as root, where a read-only folder is still writable: the OS error is simulated at the rename."""

    def fail(*args):
        raise OSError(failure, os.strerror(failure))

    monkeypatch.setattr(os, "replace", fail)
    code, _, err = cli(
        translate.main, [f"checkpoint={checkpoint}", f"input={source}", f"output={tmp_path}/out.txt"], capsys
    )
    one_error_line(code, err, f"error: output={tmp_path}/out.txt: cannot write ({os.strerror(failure)})")
    nothing_left(tmp_path)


def test_disk_full_while_saving_a_checkpoint(tmp_path, capsys, corpus, monkeypatch):
    import nmt.fileio

    fsync = os.fsync

    def full(fd):
        if "step_" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return fsync(fd)

    monkeypatch.setattr(nmt.fileio.os, "fsync", full)
    code, _, err = cli(train.main, train_args(tmp_path, corpus / "ok", "train.valid_every=100"), capsys)
    one_error_line(
        code, err, f"error: checkpoint={tmp_path}/run/checkpoints/step_1.pt: cannot write (No space left on device)"
    )
    assert not list((tmp_path / "run" / "checkpoints").iterdir())


def test_average_output_in_a_missing_directory(tmp_path, capsys, checkpoint):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "step_3.pt").write_bytes(checkpoint.read_bytes())
    code, _, err = cli(average.main, [f"run={tmp_path}/run", "last=1", f"output={tmp_path}/missing/avg.pt"], capsys)
    one_error_line(code, err, f"error: output={tmp_path}/missing/avg.pt: directory {tmp_path}/missing does not exist")


# --- translating -----------------------------------------------------------------------------------
def test_translate_input_errors(checkpoint, tmp_path, capsys):
    code, _, err = cli(
        translate.main, [f"checkpoint={checkpoint}", f"input={tmp_path}/none.txt", f"output={tmp_path}/out.txt"], capsys
    )
    one_error_line(code, err, f"error: {tmp_path}/none.txt: file not found")
    (tmp_path / "bad.txt").write_bytes(b"ok\n\xc3\x28\n")
    code, _, err = cli(
        translate.main, [f"checkpoint={checkpoint}", f"input={tmp_path}/bad.txt", f"output={tmp_path}/out.txt"], capsys
    )
    one_error_line(code, err, f"error: {tmp_path}/bad.txt:2: invalid UTF-8 (byte 0xc3); expected UTF-8 text")
    nothing_left(tmp_path)


def test_a_very_long_line_still_gets_its_output_line(checkpoint, tmp_path, capsys, corpus):
    """The Transformer has no length limit (sinusoidal positions): a 3000-token line is translated, not dropped."""
    words = " ".join((corpus / "ok.src").read_text().split())
    source = write(tmp_path / "in.txt", ["ze", " ".join([words] * 3)[: 3000 * 4], "bo"])
    argv = [
        f"checkpoint={checkpoint}",
        f"input={source}",
        f"output={tmp_path}/out.txt",
        "decode.max_len_a=0",
        "decode.max_len_b=3",
    ]
    code, _, err = cli(translate.main, argv, capsys)
    assert code == 0, err
    assert len((tmp_path / "out.txt").read_text().split("\n")) == 4


def test_evaluate_line_count_mismatch(tmp_path, capsys):
    write(tmp_path / "h.txt", ["a", "b"])
    write(tmp_path / "r.txt", ["a"])
    code, _, err = cli(evaluate.main, [f"hyp={tmp_path}/h.txt", f"ref={tmp_path}/r.txt"], capsys)
    one_error_line(code, err, f"error: {tmp_path}/h.txt has 2 lines but {tmp_path}/r.txt has 1; they must match")


def test_evaluate_empty_files(tmp_path, capsys):
    (tmp_path / "h.txt").write_text("")
    (tmp_path / "r.txt").write_text("")
    code, _, err = cli(evaluate.main, [f"hyp={tmp_path}/h.txt", f"ref={tmp_path}/r.txt"], capsys)
    one_error_line(code, err, f"error: {tmp_path}/r.txt: no lines; expected one reference per line to score against")


def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    from nmt.cli.common import run
    from nmt.errors import NmtError

    monkeypatch.setenv("NMT_DEBUG", "1")
    with pytest.raises(NmtError, match="file not found"):
        run(train.main, train_args(tmp_path, tmp_path / "nope"))


def test_disk_full_while_writing_the_data_cache(tmp_path, capsys, corpus, monkeypatch):
    import pyarrow

    def full(sink, schema):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pyarrow.ipc, "new_stream", full)  # what writes the cache's Arrow files
    code, _, err = cli(train.main, train_args(tmp_path, corpus / "ok"), capsys)
    one_error_line(
        code, err, f"error: data.cache_dir={tmp_path}/cache: cannot write the dataset cache (No space left on device)"
    )
    assert not list((tmp_path / "cache").iterdir()) and not (tmp_path / "run").exists()
