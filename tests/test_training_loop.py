"""The loop's limits and reports: train.max_time, progress lines in train.log, gradient accumulation,
precision, and data-parallel training over two processes."""

import json
import os

import pytest
import torch

from nmt.data.batching import make_batch
from nmt.errors import NmtError
from nmt.training.trainer import Trainer
from tests.conftest import tiny_config
from tests.test_resume import needs_fork, two_ranks


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def test_max_time_stops_after_the_first_update_past_it(toy_dir, cache, tmp_path):
    cfg = tiny_config(toy_dir, cache, max_steps=1000, max_time=1e-6, valid_every=500, save_every=500)
    results = Trainer(cfg, tmp_path / "run", log=lambda line: None).fit()
    assert results["steps"] == 1 and results["timed_out"]
    written = json.loads((tmp_path / "run" / "results.json").read_text())
    assert (
        written["steps"] == 1 and "valid_bleu" in written and written["best"]["step"] == 1
    )  # validated and saved as at max_steps
    assert (tmp_path / "run" / "checkpoints" / "last.pt").is_file()


def test_progress_lines_go_to_train_log(toy_dir, cache, tmp_path):
    cfg = tiny_config(toy_dir, cache, max_steps=4, log_every=2, valid_every=100)
    Trainer(cfg, tmp_path / "run", log=lambda line: None).fit()
    lines = [
        line
        for line in (tmp_path / "run" / "train.log").read_text().splitlines()
        if line.startswith("step ") and "tok/s" in line
    ]
    assert [line.split(" |")[0] for line in lines] == ["step 2/4", "step 4/4"]
    assert all(
        " | epoch 0." in line and " loss " in line and " (label-smoothed) " in line and " lr " in line and "ETA" in line
        for line in lines
    ), lines  # the smoothed loss's exponent is no perplexity, so none is shown
    from nmt.compare.curves import read_curve

    assert [step for step, *_ in read_curve(tmp_path / "run" / "train.log", 4, 1.0).train] == [2, 4]
    plain = tiny_config(toy_dir, cache, max_steps=2, log_every=2, valid_every=100, label_smoothing=0.0)
    Trainer(plain, tmp_path / "plain", log=lambda line: None).fit()
    line = next(x for x in (tmp_path / "plain" / "train.log").read_text().splitlines() if "tok/s" in x)
    loss, ppl = float(line.split(" loss ")[1].split()[0]), float(line.split(" ppl ")[1].split()[0])
    assert abs(ppl - 2.718281828**loss) < 0.1 * ppl  # without smoothing, a perplexity


def test_accumulated_batches_give_the_update_of_one_batch_holding_them(toy_dir, cache, tmp_path):
    pairs = [([5, 6, 7, 8], [9, 10]), ([11, 12], [13, 14, 15, 16, 17]), ([18, 19, 20], [21]), ([22], [23, 24, 25])]
    parts = [
        make_batch([s for s, _ in pairs[:2]], [t for _, t in pairs[:2]]),
        make_batch([s for s, _ in pairs[2:]], [t for _, t in pairs[2:]]),
    ]
    whole = make_batch([s for s, _ in pairs], [t for _, t in pairs])
    grads = []
    for name, batches in (("a", parts), ("b", [whole])):
        trainer = Trainer(
            tiny_config(toy_dir, cache, lr=1e-2, warmup=0, schedule="constant"), tmp_path / name, log=lambda line: None
        )
        step = trainer.precision.step
        trainer.precision.step = lambda optimizer, trainer=trainer, step=step: (
            grads.append([p.grad.clone() for p in trainer.model.parameters()]),
            step(optimizer),
        )
        assert trainer.train_step(batches) is not None
    assert len(grads) == 2
    for a, b in zip(*grads):  # the gradient of the update (Adam's first step then turns it into about lr * sign(g))
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_fp16_needs_cuda_and_bf16_trains_on_a_cpu(toy_dir, cache, tmp_path):
    with pytest.raises(NmtError, match="train.precision=fp16: needs a CUDA device"):
        Trainer(tiny_config(toy_dir, cache, precision="fp16", device="cpu"), tmp_path / "a", log=lambda line: None)
    assert not (tmp_path / "a").exists()
    common = dict(max_steps=30, valid_every=30, lr=3e-3, warmup=5)
    results = Trainer(
        tiny_config(toy_dir, cache, precision="bf16", **common), tmp_path / "b", log=lambda line: None
    ).fit()
    exact = Trainer(
        tiny_config(toy_dir, cache, precision="fp32", **common), tmp_path / "c", log=lambda line: None
    ).fit()
    assert results["steps"] == 30 and results["precision"] == "bf16"
    # it learns: validation loss far below an untrained model's (ln of the vocabulary, 5.3 for 200 words) and
    # within 10% of the same run in fp32
    assert (
        results["valid_loss"] < 0.8 * exact["valid_loss"] + 0.2 * 5.3
        and abs(results["valid_loss"] - exact["valid_loss"]) < 0.1 * exact["valid_loss"]
    )
    assert exact["valid_loss"] < 4.0
    weights = torch.load(tmp_path / "b" / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert all(v.dtype == torch.float32 for v in weights.values() if v.is_floating_point())  # fp32 master weights


CPUINFO_X86 = (
    "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme sse2 avx2 avx512f {extra} xsave\n\nprocessor\t: 1\n"
)


def test_the_cpu_flags_tell_bf16_hardware():
    from nmt.training.precision import cpu_has_bf16

    assert cpu_has_bf16(CPUINFO_X86.format(extra="avx512_bf16 avx512_vnni"))
    assert cpu_has_bf16(CPUINFO_X86.format(extra="amx_bf16 amx_tile"))
    assert not cpu_has_bf16(CPUINFO_X86.format(extra="avx512_vnni avx512_fp16"))  # fp16 and VNNI are not bf16
    assert not cpu_has_bf16(CPUINFO_X86.format(extra="xavx512_bf16x"))  # whole flags only
    assert cpu_has_bf16("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\nCPU implementer\t: 0x41\n")
    assert not cpu_has_bf16("processor\t: 0\nFeatures\t: fp asimd\n")
    assert not cpu_has_bf16("")


def test_the_cpu_flags_tell_int8_dot_products():
    from nmt.training.precision import cpu_has_int8

    assert cpu_has_int8(CPUINFO_X86.format(extra="avx512_vnni"))
    assert cpu_has_int8(CPUINFO_X86.format(extra="avx_vnni"))
    assert cpu_has_int8(CPUINFO_X86.format(extra="amx_int8 amx_tile"))
    assert not cpu_has_int8(CPUINFO_X86.format(extra="avx512_bf16"))  # an AVX2/AVX-512 CPU without VNNI
    assert cpu_has_int8("processor\t: 0\nFeatures\t: fp asimd asimddp\n")
    assert not cpu_has_int8("processor\t: 0\nFeatures\t: fp asimd\n")
    assert not cpu_has_int8("")


def test_auto_precision_is_bf16_only_where_the_hardware_multiplies_bf16(monkeypatch):
    from nmt.training import precision

    assert isinstance(precision.native_bf16(torch.device("cpu")), bool)
    for native, expected in ((False, "fp32"), (True, "bf16")):
        monkeypatch.setattr(precision, "native_bf16", lambda device, native=native: native)
        assert precision.Precision("auto", torch.device("cpu")).name == expected
    assert precision.Precision("fp32", torch.device("cpu")).name == "fp32"  # an explicit choice is kept as given


@needs_fork
def test_two_processes_reach_the_parameters_of_one_with_the_same_global_batch(toy_dir, cache, tmp_path):
    """torchrun's view, made by hand: RANK/WORLD_SIZE in the environment, gloo on CPU, 2 processes of 1 thread."""
    common = dict(max_steps=4, valid_every=100, save_every=100, lr=3e-3, warmup=2, batch_tokens=300, threads=1)
    Trainer(
        tiny_config(toy_dir, cache, accumulate=2, **common), tmp_path / "one", log=lambda line: None
    ).fit()  # builds the cache first

    def work(rank):
        Trainer(tiny_config(toy_dir, cache, **common), tmp_path / "two", log=lambda line: None).fit()
        os._exit(0)

    assert two_ranks(work, port=29500 + os.getpid() % 1000) == [0, 0]
    one = torch.load(tmp_path / "one" / "checkpoints" / "last.pt", weights_only=True)
    two = torch.load(tmp_path / "two" / "checkpoints" / "last.pt", weights_only=True)
    assert one["step"] == two["step"] == 4
    for key, value in one["model"].items():
        torch.testing.assert_close(two["model"][key], value, rtol=1e-4, atol=1e-5)
    results = json.loads((tmp_path / "two" / "results.json").read_text())
    assert (
        results["world_size"] == 2 and len((tmp_path / "two" / "train.log").read_text().split("model: ")) == 2
    )  # rank 0 writes alone


def test_the_oversubscription_warning_counts_the_runs_own_processes_out_of_the_load():
    """The 1-minute load average includes this run's own processes: two single-threaded torchrun ranks on 2 cores,
    or one process of 2 threads whose data preparation kept one core busy, are not others' work."""
    from nmt.training.trainer import oversubscribed

    assert not oversubscribed(cores=2, threads=1, processes=2, load=2.0)  # torchrun, train.threads=1
    assert not oversubscribed(cores=2, threads=2, processes=1, load=1.0)  # its own data preparation
    assert oversubscribed(cores=2, threads=2, processes=1, load=2.0)  # another job on the other core
    assert oversubscribed(cores=2, threads=2, processes=2, load=0.0)  # 4 threads on 2 cores
    assert not oversubscribed(cores=2, threads=1, processes=1, load=3.0)  # one thread never spin-waits
