"""The GPU paths as far as a CPU machine can check them: scripts/gpu_check.sh refuses to run without a GPU (clearly,
with exit code 3), int8 products are padded as CUDA's kernel needs, bf16 on a GPU without bf16 arithmetic is
refused before training, and device=mps is a known device (refused clearly where there is none)."""

import os
import subprocess
from pathlib import Path

import pytest
import torch

from nmt.engine.quantize import padded_int_mm
from nmt.errors import NmtError
from nmt.runtime import resolve_device
from nmt.training import precision
from tests.test_cli import cli
from tests.test_errors import one_error_line

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("fake_smi", [False, True])
def test_gpu_check_exits_3_with_a_clear_message_without_a_gpu(tmp_path, fake_smi):
    env = os.environ.copy()
    if fake_smi:  # nvidia-smi answers, but torch has no CUDA (a CPU build, or a broken driver)
        (tmp_path / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")
        (tmp_path / "nvidia-smi").chmod(0o755)
        env["PATH"] = f"{tmp_path}:{env['PATH']}"
    else:
        env["PATH"] = ":".join(p for p in env["PATH"].split(":") if not (Path(p) / "nvidia-smi").exists())
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip() == (
        "gpu_check: no CUDA GPU here (nvidia-smi lists none, or torch cannot use it): nothing to check"
    )
    assert done.stdout == ""


@pytest.mark.parametrize("rows, inner, out", [(1, 5, 3), (16, 256, 8000), (17, 13, 9), (40, 64, 64)])
def test_int8_products_padded_for_cuda_equal_the_exact_product(rows, inner, out):
    g = torch.Generator().manual_seed(rows)
    a = torch.randint(-127, 128, (rows, inner), dtype=torch.int8, generator=g)
    b = torch.randint(-127, 128, (inner, out), dtype=torch.int8, generator=g)
    assert torch.equal(padded_int_mm(a, b), a.int() @ b.int())


def test_bf16_on_a_gpu_without_bf16_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    with pytest.raises(NmtError, match="train.precision=bf16: this GPU has no bf16 arithmetic"):
        precision.Precision("bf16", torch.device("cuda"))
    with pytest.raises(NmtError, match="decode.precision=bf16: this GPU has no bf16 arithmetic"):
        precision.check_bf16("bf16", torch.device("cuda"), "decode.precision")
    precision.check_bf16("bf16", torch.device("cpu"), "decode.precision")  # a CPU emulates nothing: allowed
    precision.check_bf16("fp16", torch.device("cuda"), "train.precision")


def test_mps_is_a_device_name_refused_clearly_where_there_is_none(capsys):
    from nmt.cli import translate

    if torch.backends.mps.is_available():
        assert resolve_device("mps").type == "mps"
        return
    with pytest.raises(NmtError, match=r"train.device=mps: MPS \(an Apple GPU\) is not available on this machine"):
        resolve_device("mps")
    code, _, err = cli(translate.main, ["checkpoint=/nonexistent.pt", "device=mps"], capsys)
    assert "unknown" not in err
    one_error_line(code, err, "error:")
