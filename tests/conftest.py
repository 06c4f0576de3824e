"""Shared fixtures: tiny corpora in temporary folders, tiny model configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from nmt.config import Config, DataConfig, ModelConfig, TrainConfig
from nmt.data.synthetic import generate_toy_corpus

# The native kernels (nmt/engine/csrc/) build with warnings as errors in the tests: a warning a change brings in fails
# the suite here, where users' builds (no -Werror) would only print it. A caller's own flags are kept.
os.environ.setdefault("NMT_NATIVE_FLAGS", "-Werror")

MULTI30K = Path(os.environ.get("NMT_MULTI30K", Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"))

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs the suite in one worker per core (pytest -n): each worker, and every process a test starts,
    # takes one thread, as two torch processes with a thread per core each would slow each other many times over
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
else:
    torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def toy_dir(tmp_path_factory) -> Path:
    """A small toy corpus: train 3000, valid 100, test 100 pairs."""
    out = tmp_path_factory.mktemp("toy")
    return generate_toy_corpus(out, seed=3, sizes={"train": 3000, "valid": 100, "test": 100})


@pytest.fixture(scope="session")
def toy_cache(tmp_path_factory) -> Path:
    """A dataset cache folder for the whole session: tests that share it prepare the toy corpus once."""
    return tmp_path_factory.mktemp("toy_cache")


@pytest.fixture(scope="session")
def toy_comparison(toy_dir, tmp_path_factory) -> Path:
    """Two tiny variants of the toy comparison (tests/test_compare.py's compare_args) trained at once by two spawned
    workers, the parent forbidden to initialise CUDA: trained once a session, read through a copy of the folder by
    tests/test_compare.py (`compared`) and tests/test_compare_trust.py (`spawned`)."""
    from nmt.cli import compare
    from nmt.cli.common import run
    from tests.test_compare import compare_args

    out = tmp_path_factory.mktemp("toy_comparison") / "report"

    def no_cuda(*args, **kwargs):
        raise AssertionError("the comparison's parent process initialised CUDA")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "_lazy_init", no_cuda)
        patch.setattr(torch.cuda, "get_device_name", no_cuda)
        with pytest.raises(SystemExit) as exit_info:
            run(compare.main, compare_args(toy_dir, out) + ["jobs=2", "train.threads=1"])
    assert exit_info.value.code == 0
    assert not torch.cuda.is_initialized()
    return out


def tiny_config(toy_dir: Path, cache_dir: Path, **train) -> Config:
    """A 1-layer d32 Transformer on the toy corpus, a few steps."""
    data = DataConfig(
        name="toy",
        train=str(toy_dir / "train"),
        valid=str(toy_dir / "valid"),
        test=str(toy_dir / "test"),
        vocab_size=200,
        cache_dir=str(cache_dir),
    )
    model = ModelConfig(dim=32, layers=1, heads=2, ffn_dim=64, dropout=0.0)
    settings = dict(
        max_steps=5, batch_tokens=512, warmup=10, valid_every=5, save_every=5, progress=False, valid_bleu_sentences=20
    )
    return Config(data=data, model=model, train=TrainConfig(**(settings | train)))


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def random_batch(vocab: int, src_lens=(7, 3, 5), tgt_lens=(6, 2, 4), seed: int = 0):
    """A padded batch of random token ids (ids >= 4, clear of the special ids) of the given lengths."""
    from nmt.data.batching import make_batch

    g = torch.Generator().manual_seed(seed)
    src = [torch.randint(4, vocab, (n,), generator=g).tolist() for n in src_lens]
    tgt = [torch.randint(4, vocab, (n,), generator=g).tolist() for n in tgt_lens]
    return make_batch(src, tgt)


@pytest.fixture(scope="module")
def small_corpus(toy_dir, tmp_path_factory):
    """240 training pairs (about 12 batches an epoch, so 24 updates cross an epoch boundary) and 20 validation pairs."""
    out = tmp_path_factory.mktemp("small")
    for split, n in (("train", 240), ("valid", 20)):
        for side in ("src", "tgt"):
            write(out / f"{split}.{side}", (toy_dir / f"{split}.{side}").read_text().splitlines()[:n])
    from nmt.cli.common import compose
    from nmt.data.dataset import prepare_data

    prepare_data(compose("config", run_args(out)).data, log=lambda line: None)  # the runs share this cache
    return out


def run_args(corpus: Path) -> list[str]:
    """A tiny model with dropout (so the torch RNG matters), checkpoints every 10 updates, validation every 8."""
    return [
        "data=toy",
        "data.synthetic=null",
        f"data.train={corpus}/train",
        f"data.valid={corpus}/valid",
        "data.test=null",
        "data.vocab_size=100",
        f"data.cache_dir={corpus}/cache",
        "model.dim=16",
        "model.layers=1",
        "model.heads=2",
        "model.ffn_dim=32",
        "model.dropout=0.2",
        "train.max_steps=24",
        "train.batch_tokens=256",
        "train.warmup=5",
        "train.save_every=10",
        "train.valid_every=8",
        "train.keep_last=2",
        "train.threads=1",
        "train.progress=false",
        "train.seed=7",
        "train.valid_bleu_sentences=8",
        "decode.max_len_a=1.0",
        "decode.max_len_b=2",
    ]


# The longest test files first (measured: `pytest --durations`): `make test` hands tests to its workers in
# collection order, so a long test collected last would leave the other worker idle at the end.
LONGEST_FIRST = (
    "test_native_boundaries.py",  # the kernel tests again under the sanitizers and as the portable build
    "test_toy_learning.py",  # every family trained as the toy comparison trains it
    "test_compare.py",
    "test_distributed.py",
    "test_compare_trust.py",
    "test_export.py",
    "test_export_hf_beam.py",
)


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        name = Path(str(item.fspath)).name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within a file, and of the other files, is kept


STEP = 0.03  # seconds the `steps` fixture adds to each of the server's decoding steps


@pytest.fixture
def steps(monkeypatch):
    """Slow every decoding step of nmt-serve's lanes by STEP seconds (a tiny model's line then takes long enough to
    be interrupted); the list gets the time of each step (tests/test_serve_hostile.py, tests/test_serve_stream.py)."""
    import time

    from nmt.serve import lanes

    seen: list[float] = []
    real = lanes.Stoppable.step

    def slow(self, *args, **kwargs):
        seen.append(time.monotonic())
        time.sleep(STEP)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(lanes.Stoppable, "step", slow)
    return seen
