"""nmt.engine.onednn: decoding's fp32 linear layers on oneDNN give what nn.Linear gives, a row alone what it gets
in any batch, and the backend a decoding copy uses is the one `fp32_backend` names."""

import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nmt.engine import native, onednn
from nmt.engine.onednn import NativeLinear, OnednnLinear, onednn_fp32
from nmt.errors import NmtError

KINDS = [
    pytest.param(OnednnLinear, marks=pytest.mark.skipif(not onednn_fp32(), reason="no oneDNN fp32 linear")),
    pytest.param(NativeLinear, marks=pytest.mark.skipif(not native.fp32(), reason="no AVX-512 kernels here")),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("inner, out", [(32, 48), (256, 768), (1024, 256), (256, 1001)])
def test_fp32_product_equals_linear_and_rows_are_independent(kind, inner, out, bias):
    torch.manual_seed(0)
    linear = nn.Linear(inner, out, bias=bias)
    layer = kind(linear)
    with torch.inference_mode():
        x = torch.randn(300, 1, inner)
        full = layer(x)
        assert full.shape == (300, 1, out) and layer._packed is not None  # the arranged weight served
        torch.testing.assert_close(full, F.linear(x, linear.weight, linear.bias), rtol=1e-4, atol=1e-4)
        for rows in (1, 2, 7, 16, 17, 64, 65, 81):  # a row's numbers do not depend on the rows beside it (nor on
            # the padding up to a bucket)
            assert torch.equal(layer(x[:rows]), full[:rows])
        assert torch.equal(torch.cat([layer(x[i : i + 1]) for i in range(40)]), full[:40])
        y = torch.randn(5, 20, inner).transpose(0, 1)  # not contiguous
        torch.testing.assert_close(layer(y), F.linear(y, linear.weight, linear.bias), rtol=1e-4, atol=1e-4)
        index = torch.tensor([0, 3, out - 1])
        cut = layer.rows(index)
        assert torch.equal(cut(x[:9]), full[:9, :, index])


@pytest.mark.parametrize("kind", KINDS)
def test_fp32_weight_follows_changes_and_copies_and_gradients(kind):
    torch.manual_seed(0)
    linear = nn.Linear(16, 24)
    layer = kind(linear)
    x = torch.randn(8, 16)
    with torch.no_grad():
        layer(x)
        linear.weight.mul_(2)  # the shared parameter changes in place: re-arranged
        torch.testing.assert_close(layer(x), F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)
    made = pickle.loads(pickle.dumps(layer))  # a worker process's copy arranges its own
    assert made._packed is None
    torch.testing.assert_close(made(x), F.linear(x, made.weight, made.bias), rtol=1e-5, atol=1e-5)
    y = layer(x.requires_grad_())  # gradients wanted: torch's own product
    y.sum().backward()
    assert x.grad is not None and linear.weight.grad is not None


def test_backend_is_named_by_the_environment(monkeypatch):
    from nmt.config import ModelConfig
    from nmt.engine import decoding_copy
    from nmt.engine.packed import PackedLinear
    from nmt.models.builders import build_model

    def backend(value):
        monkeypatch.setenv("NMT_FP32_GEMM", value)
        onednn.fp32_backend.cache_clear()
        return onednn.fp32_backend()

    try:
        assert backend("torch") == "torch"
        assert backend("onednn") == ("onednn" if onednn_fp32() else "torch")
        assert backend("native") == ("native" if native.fp32() else "torch")
        with pytest.raises(NmtError, match="NMT_FP32_GEMM=fast: expected one of auto, mkl, native, onednn, torch"):
            backend("fast")
        for name, kind in (
            ("onednn", OnednnLinear),
            ("native", NativeLinear),
            ("mkl", PackedLinear),
            ("torch", nn.Linear),
        ):
            found = backend(name)
            model = build_model(ModelConfig(arch="transformer", dim=32, layers=1, heads=4, ffn_dim=64), 40, 40, True)
            model = decoding_copy(model, "fp32")
            decoder = {type(m) for m in model.decoder.modules() if isinstance(m, nn.Linear)}
            encoder = {type(m) for m in model.encoder.modules() if isinstance(m, nn.Linear)}
            if found == name:
                assert decoder == {kind} and encoder == ({kind} if name in ("onednn", "native") else {nn.Linear})
            assert model.decoder.output.weight is model.decoder.embed.tokens.weight  # still tied
    finally:
        monkeypatch.delenv("NMT_FP32_GEMM")
        onednn.fp32_backend.cache_clear()


@pytest.mark.skipif(not native.fp32(), reason="no AVX-512 kernels here")
def test_native_product_is_the_same_at_any_number_of_threads():
    torch.manual_seed(0)
    layer = NativeLinear(nn.Linear(256, 1024))
    x = torch.randn(200, 256)
    threads = torch.get_num_threads()
    try:
        with torch.inference_mode():
            torch.set_num_threads(1)
            one = layer(x)
            torch.set_num_threads(2)
            assert torch.equal(layer(x), one)  # each output as one thread computes it
    finally:
        torch.set_num_threads(threads)
