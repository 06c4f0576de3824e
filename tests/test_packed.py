"""nmt.engine.packed: decoding's fp32 linear layers on MKL's packed product give what nn.Linear gives."""

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nmt.engine.packed import MIN_ROWS, PackedLinear, mkl_packed

needs_mkl = pytest.mark.skipif(mkl_packed() is None, reason="this torch has no MKL")


@needs_mkl
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("inner, out", [(32, 48), (256, 768), (1024, 256)])
def test_packed_product_equals_linear_for_every_row_count(inner, out, bias):
    torch.manual_seed(0)
    linear = nn.Linear(inner, out, bias=bias)
    packed = PackedLinear(linear)
    with torch.inference_mode():
        for rows in (1, MIN_ROWS - 1, MIN_ROWS, 17, 64, 300):
            x = torch.randn(rows, 1, inner)
            got = packed(x)
            assert got.shape == (rows, 1, out)
            torch.testing.assert_close(got, F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)
        assert packed._packed is not None  # the product ran on the packed weight
        x = torch.randn(5, 20, inner).transpose(0, 1)  # not contiguous
        torch.testing.assert_close(packed(x), F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)


@needs_mkl
def test_packed_weight_follows_changes_and_copies_and_gradients():
    torch.manual_seed(0)
    linear = nn.Linear(16, 24)
    packed = PackedLinear(linear)
    assert packed.weight is linear.weight  # shared, so a tied output layer stays tied
    x = torch.randn(MIN_ROWS + 3, 16)
    with torch.no_grad():
        packed(x)
        linear.weight.mul_(2.0)  # changed in place: packed again
        torch.testing.assert_close(packed(x), F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)
    clone = pickle.loads(pickle.dumps(packed))  # each process packs its own
    assert clone._packed is None
    torch.testing.assert_close(clone(x), packed(x), rtol=1e-5, atol=1e-5)
    assert copy.deepcopy(packed)._packed is None
    with torch.inference_mode():  # a layer made under inference mode: its weight keeps no version counter
        made = PackedLinear(nn.Linear(16, 24))
        torch.testing.assert_close(made(x), F.linear(x, made.weight, made.bias), rtol=1e-5, atol=1e-5)
    y = packed(x.requires_grad_())  # gradients wanted: torch's own product
    y.sum().backward()
    assert x.grad is not None and linear.weight.grad is not None


def test_decoding_models_run_their_decoder_on_packed_products():
    from nmt.config import ModelConfig
    from nmt.engine import decoding_copy
    from nmt.models.builders import build_model

    model = build_model(ModelConfig(arch="transformer", dim=32, layers=1, heads=4, ffn_dim=64), 40, 40, joint=True)
    model = decoding_copy(model, "fp32")
    linears = [m for m in model.decoder.modules() if isinstance(m, nn.Linear)]
    from nmt.engine.onednn import NativeLinear, OnednnLinear, fp32_backend

    kind = {"mkl": PackedLinear, "onednn": OnednnLinear, "native": NativeLinear, "torch": nn.Linear}[fp32_backend()]
    assert all(type(m) is kind for m in linears)
    assert model.decoder.output.weight is model.decoder.embed.tokens.weight  # still tied
    keys = set(model.decoder.state_dict())
    assert {"layers.0.self_attn.qkv_proj.weight", "layers.0.cross_attn.kv_proj.weight"} <= keys
