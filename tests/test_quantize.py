"""decode.precision: bf16 and int8 linear layers stay close to fp32, and the search invariants still hold."""

import pytest
import torch
from torch import nn

from nmt.config import ModelConfig
from nmt.data.tokenizer import BOS, EOS
from nmt.engine import decoding_copy
from nmt.engine.quantize import Bf16Linear, Int8Linear
from nmt.models.attention import Attention
from nmt.models.builders import build_model
from nmt.search import beam_search, greedy_search
from tests.conftest import random_batch

VOCAB = 40
MODELS = {
    "transformer": dict(arch="transformer", heads=4, ffn_dim=64),
    "bahdanau": dict(arch="bahdanau", cell="gru", score="additive"),
    "luong_concat": dict(arch="luong", cell="lstm", score="concat"),  # concat reads W_a's weight directly
    "luong_local_p": dict(
        arch="luong", cell="gru", score="general", window="local_p", window_size=2, input_feeding=False
    ),
}


def tiny(name: str, precision: str = "fp32"):
    torch.manual_seed(0)
    model = build_model(ModelConfig(dim=32, layers=2, dropout=0.0, **MODELS[name]), VOCAB, VOCAB, joint=True).eval()
    return decoding_copy(model, precision)


@pytest.mark.parametrize("make, tolerance", [(Int8Linear, 0.02), (Bf16Linear, 0.01)])
def test_reduced_linear_is_close_to_fp32(make, tolerance):
    torch.manual_seed(0)
    linear = nn.Linear(64, 300)
    x = torch.randn(3, 7, 64) * torch.logspace(-2, 1, 7)[None, :, None]  # rows of very different scales
    reduced = make(linear)
    with torch.no_grad():
        want, got = linear(x), reduced(x).float()
    assert got.shape == want.shape
    # relative to each row's size: per-row input scales keep small rows as precise as large ones
    error = (got - want).norm(dim=-1) / want.norm(dim=-1)
    assert float(error.max()) < tolerance, error.max()


def test_only_linears_outside_the_attention_scorers_are_replaced():
    model = tiny("luong_concat", "int8")
    scorer = model.decoder.attention  # concat reads W_a's weight directly: it stays an fp32 nn.Linear
    assert isinstance(scorer, Attention) and type(scorer.W_a) is nn.Linear and type(scorer.v_a) is nn.Linear
    outside = [m for name, m in model.named_modules() if not name.startswith("decoder.attention")]
    assert not any(type(m) is nn.Linear for m in outside)
    assert isinstance(model.decoder.output, Int8Linear) and isinstance(model.decoder.W_c, Int8Linear)
    assert model.decoder.embed.weight.dtype == torch.float32  # the tied embedding keeps its fp32 weight


@pytest.mark.parametrize("precision", ["bf16", "int8"])
@pytest.mark.parametrize("name", MODELS)
def test_beam_scores_equal_recomputing_each_prefix(name, precision):
    """The reduced model's cached steps give what its teacher forcing gives (the same rounding per token)."""
    model, batch = tiny(name, precision), random_batch(VOCAB, src_lens=(7, 3, 5, 1), tgt_lens=(1, 1, 1, 1), seed=2)
    limits = torch.full((4,), 7)
    hyps = beam_search(model, batch.src, batch.src_mask, limits, k=3, nbest=3)
    greedy = greedy_search(model, batch.src, batch.src_mask, limits)
    tolerance = 0.05 if precision == "bf16" else 1e-3
    with torch.no_grad():
        for row, options in enumerate(hyps):
            s = int(batch.src_mask[row].sum())
            enc = model.encode(batch.src[row : row + 1, :s], batch.src_mask[row : row + 1, :s])
            assert [
                h.tokens
                for h in beam_search(
                    model, batch.src[row : row + 1, :s], batch.src_mask[row : row + 1, :s], limits[:1], k=1
                )[0]
            ] == [greedy[row].tokens]
            for h in options:
                steps = h.attention.size(0)
                out = (h.tokens + [EOS])[:steps]
                logits, _ = model.decoder(torch.tensor([[BOS] + out[:-1]]), enc)
                score = logits.float().log_softmax(-1)[0, torch.arange(steps), torch.tensor(out)].sum()
                assert float(score) == pytest.approx(h.score, abs=tolerance)


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_reduced_model_stays_close_to_fp32(precision):
    batch = random_batch(VOCAB, src_lens=(7, 3, 5), tgt_lens=(6, 2, 4), seed=3)
    with torch.no_grad():
        want = tiny("transformer")(batch.src, batch.src_mask, batch.tgt_in).log_softmax(-1)
        got = tiny("transformer", precision)(batch.src, batch.src_mask, batch.tgt_in).float().log_softmax(-1)
    real = batch.tgt_out != 0
    assert float((got - want).abs()[real].max()) < 0.1
    assert float((got.argmax(-1) == want.argmax(-1))[real].float().mean()) > 0.9


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision=fp8: expected one of fp32, bf16, int8"):
        decoding_copy(tiny("transformer"), "fp8")


def test_bf16_rows_are_padded_to_few_shapes():
    from nmt.engine.quantize import bucket

    sizes = [bucket(rows) for rows in range(1, 5000)]
    assert all(
        0 <= size - rows < max(8, rows / 4) for rows, size in zip(range(1, 5000), sizes)
    )  # at most 7 rows or 25% more
    assert len(set(sizes)) < 50  # oneDNN keeps memory per shape: thousands of row counts meet a few dozen shapes
    assert bucket(64) == 64 and bucket(320) == 320 and bucket(65) == 80


def test_int8_vocabulary_layer_rows_are_independent_of_their_batch():
    """A layer of ONEDNN_MIN_OUT outputs or more takes oneDNN's int8 product on a CPU (one input range for the
    whole tensor): a row still gets exactly what it gets alone, as precise as the torch._int_mm path, and the
    layer pickles (its packed weights are made again in the process that runs it)."""
    import pickle

    from nmt.engine.quantize import ONEDNN_MIN_OUT, onednn_int8

    torch.manual_seed(0)
    linear = nn.Linear(64, ONEDNN_MIN_OUT)
    layer = Int8Linear(linear)
    x = torch.randn(6, 64) * torch.logspace(-3, 1, 6)[:, None]  # rows of very different scales
    with torch.no_grad():
        got, want = layer(x), linear(x)
        alone = torch.cat([layer(x[i : i + 1]) for i in range(6)])
        small = layer.rows(torch.arange(300))  # a shortlist's cut (on the native kernel: whole blocks of 64)
        near = (small(x)[:, :300] - got[:, :300]).norm(dim=-1) / got[:, :300].norm(dim=-1)  # the int8 paths agree
        assert small.out_features in (300, 320) and float(near.max()) < 0.02
        copy = pickle.loads(pickle.dumps(layer))
        assert copy._packed is None and torch.equal(copy(x), got)
    assert torch.equal(alone, got)
    assert float(((got - want).norm(dim=-1) / want.norm(dim=-1)).max()) < 0.02
    assert (layer._packed is not False) == onednn_int8()  # oneDNN where this torch has it


def test_fused_projections_compute_what_the_separate_ones_do():
    """Decoding copies (decoding_copy) multiply Q/K/V (self-attention) and K/V (cross-attention) in one product each;
    teacher forcing, cached steps and searches give what the model with separate projections gives."""
    torch.manual_seed(0)
    cfg = ModelConfig(dim=32, layers=2, dropout=0.0, arch="transformer", heads=4, ffn_dim=64)
    separate = build_model(cfg, VOCAB, VOCAB, joint=True).eval()
    torch.manual_seed(0)
    fused = decoding_copy(build_model(cfg, VOCAB, VOCAB, joint=True), "fp32")  # same weights, then fused
    assert not hasattr(fused.encoder.layers[0].attn, "q_proj")  # the separate layers are dropped
    layer = fused.decoder.layers[1]
    assert layer.self_attn.qkv_proj.out_features == 3 * 32 and layer.cross_attn.kv_proj.out_features == 2 * 32
    assert hasattr(layer.cross_attn, "q_proj") and not hasattr(layer.cross_attn, "k_proj")
    assert decoding_copy(fused, "fp32").state_dict().keys() == fused.state_dict().keys()  # a copy of a copy
    batch = random_batch(VOCAB, src_lens=(7, 3, 5, 1), tgt_lens=(6, 2, 4, 3), seed=4)
    with torch.no_grad():
        want = separate(batch.src, batch.src_mask, batch.tgt_in)
        got = fused(batch.src, batch.src_mask, batch.tgt_in)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        max_len = torch.full((4,), 8)
        for search in (
            lambda m: greedy_search(m, batch.src, batch.src_mask, max_len),
            lambda m: [h[0] for h in beam_search(m, batch.src, batch.src_mask, max_len, 3)],
        ):
            a, b = search(separate), search(fused)
            assert [h.tokens for h in a] == [h.tokens for h in b]
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
    int8 = decoding_copy(build_model(cfg, VOCAB, VOCAB, joint=True), "int8")
    assert isinstance(int8.decoder.layers[0].self_attn.qkv_proj, Int8Linear)  # fused before quantizing


def test_short_softmax_equals_softmax_for_short_rows():
    from nmt.engine.transformer import short_softmax

    torch.manual_seed(0)
    for width in (1, 2, 7, 15):
        scores = torch.randn(6, 4, 3, width) * 5
        scores[0, 0, 0, 0] = float("-inf")  # a masked key
        if width == 1:
            scores[0, 0, 0, 0] = 0.0
        torch.testing.assert_close(short_softmax(scores), scores.softmax(-1), rtol=0, atol=1e-6)
