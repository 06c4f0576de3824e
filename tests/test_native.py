"""The fused CPU kernels (nmt.engine.native) compute what the torch operators they replace compute: the int8
chains bit for bit, attention to float rounding; the search's outputs do not depend on them or on when ended rows
leave the batch; and without a compiler everything falls back to torch."""

import pytest
import torch

import nmt.search as search
from nmt.config import ModelConfig
from nmt.engine import build as kernels
from nmt.engine import decoding_copy, layers, native
from nmt.engine.quantize import Int8Linear, pinned_row
from nmt.models.builders import build_model
from tests.conftest import random_batch

built = pytest.mark.skipif(native.library() is None, reason="no C compiler here: the kernels fall back to torch")


def torch_quantize(rows):
    scale = rows.abs().amax(1, keepdim=True).clamp_min_(1e-12).div_(127)
    return (rows / scale).round_().to(torch.int8), scale


def rows_of(count, width, seed=0):
    """Random rows at several magnitudes, one all zeros (its scale clamps), one with exact .5 ties."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(count, width, generator=g) * torch.logspace(-3, 2, count)[:, None]
    x[0] = 0.0
    if count > 1:
        x[1] = torch.arange(width) % 7 - 3.0  # scale 3 / 127: many values land on halves
        x[1, 0] = 127 * 3 / 127
    return x


@built
@pytest.mark.parametrize("width", [1, 15, 16, 17, 256, 1000])
def test_quantize_and_dequantize_equal_the_torch_operators_bit_for_bit(width):
    x = rows_of(9, width)
    q, scale = native.quantize_rows(x)
    want_q, want_scale = torch_quantize(x.clone())
    assert torch.equal(q, want_q) and torch.equal(scale, want_scale)
    product = torch.randint(-(2**20), 2**20, (9, 67), dtype=torch.int32)
    col, bias = torch.rand(67) / 50, torch.randn(67)
    assert torch.equal(native.dequantize(product, scale, col, bias), torch.mul(product, scale).mul_(col).add_(bias))
    assert torch.equal(native.dequantize(product, scale, col, None), torch.mul(product, scale).mul_(col))
    unit, unit_scale = native.unit_rows_pinned(x)
    want = x.abs().amax(1, keepdim=True).clamp_min_(1e-12)
    assert torch.equal(unit, torch.cat([x / want, pinned_row(x)])) and torch.equal(unit_scale, want)


@built
@pytest.mark.skipif(not native.vnni(), reason="this CPU has no AVX-512 VNNI")
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 6, 7, 11, 24, 101])  # blocks of 6 rows, then of 4
def test_vnni_linear_equals_quantize_int_mm_and_scaling_bit_for_bit(rows):
    torch.manual_seed(rows)
    threads = torch.get_num_threads()
    try:
        for inner, out in [(256, 768), (1024, 256), (4, 64), (256, 4096)]:
            weight_t = torch.randint(-127, 128, (inner, out), dtype=torch.int8)
            col, bias = torch.rand(out) / 100, torch.randn(out)
            x = rows_of(rows, inner, seed=rows)
            q, scale = torch_quantize(x.clone())
            want = torch.mul(torch._int_mm(q, weight_t), scale).mul_(col).add_(bias)
            for count in (1, 2):  # large products share the threads: the same numbers
                torch.set_num_threads(count)
                got = native.vnni_linear(x, *native.pack_vnni(weight_t), col, bias)
                assert torch.equal(got, want), (inner, out, count)
    finally:
        torch.set_num_threads(threads)
    assert native.pack_vnni(torch.zeros(6, 64, dtype=torch.int8)) is None  # inner not a multiple of 4
    assert native.pack_vnni(torch.zeros(8, 48, dtype=torch.int8)) is None  # outputs not a multiple of 64


@built
def test_an_int8_linear_gives_the_same_numbers_with_and_without_the_kernels(monkeypatch):
    torch.manual_seed(0)
    layer = Int8Linear(torch.nn.Linear(256, 768))
    index = torch.randperm(768)[:100]
    cut = layer.rows(index)  # a shortlist's cut: 100 units, padded to 128 for the kernels
    x = torch.randn(40, 256)
    fused = [m(x[:n]) for m in (layer, cut) for n in (1, 7, 24, 40)]  # few rows (vnni_linear) and more
    if native.vnni():
        assert cut.native_pack() and cut.native_pack()[0].numel() == 256 * 128
        # arranged from gathered rows, byte for byte what packing the gathered columns (and zeros) gives
        assert cut.out_features == 128 and bool((cut.weight_t[:, 100:] == 0).all())
        columns = cut.weight_t.contiguous()
        assert all(torch.equal(a, b) for a, b in zip(cut.native_pack()[:2], native.pack_vnni(columns)))
        # the 28 outputs past the cut's units are -inf: no token
        assert bool((fused[-1][:, 100:] == float("-inf")).all())
    assert torch.equal(fused[-1][:, :100], fused[3][:, index])  # a unit's result does not depend on the cut
    monkeypatch.setattr(native, "library", lambda: None)
    plain = [m(x[:n]) for m in (layer, cut) for n in (1, 7, 24, 40)]
    for a, b in zip(fused, plain):
        assert a.shape == b.shape and torch.equal(a, b)


def torch_attention(q, k, v, bias):
    """q (B, N, G, D), k/v (B, N, W, D), bias (B, 1, 1, W) -> out (B, N, G, D), weights (B, N, G, W)."""
    weights = (q @ k.transpose(-2, -1) + bias).softmax(-1)
    return weights @ v, weights


@built
@pytest.mark.parametrize("dim", [8, 16, 64, 72])  # the plain loops (8, 72) and the AVX-512 ones (16, 64)
@pytest.mark.parametrize("group", [1, 5])
def test_attention_kernel_equals_softmax_attention(dim, group):
    torch.manual_seed(dim + group)
    sentences, heads, width = 3, 4, 19
    q = torch.randn(sentences * group, heads * dim)
    k, v = torch.randn(sentences, heads, width, dim), torch.randn(sentences, heads, width, dim)
    bias = torch.zeros(sentences, 1, 1, width)
    bias[0, ..., 11:] = float("-inf")  # a short source
    out, weights = native.attend(q, k, v, bias, 1.0, True)
    want, want_weights = torch_attention(q.view(sentences, group, heads, dim).transpose(1, 2), k, v, bias)
    torch.testing.assert_close(out, want.transpose(1, 2).reshape(sentences * group, -1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weights, want_weights, rtol=1e-5, atol=1e-6)
    assert bool((weights[0, ..., 11:] == 0).all())  # masked keys get exactly nothing
    alone, _ = native.attend(q[:group].contiguous(), k[:1].contiguous(), v[:1].contiguous(), bias[:1], 1.0, False)
    assert torch.equal(alone, out[:group])  # a sentence's result does not depend on its batch


@built
def test_self_attention_kernel_writes_the_cache_and_attends_over_it():
    torch.manual_seed(1)
    rows, heads, dim, room, t = 5, 4, 16, 12, 6
    qkv = torch.randn(rows, 3 * heads * dim)
    keys, values = torch.randn(rows, heads, room, dim), torch.randn(rows, heads, room, dim)
    view_k, view_v = keys[:, :, : t + 1], values[:, :, : t + 1]
    out = native.self_attend(qkv, view_k, view_v, t, 0.25)
    q, k, v = qkv.view(rows, 3, heads, dim).unbind(1)
    assert torch.equal(keys[:, :, t], k) and torch.equal(values[:, :, t], v)
    scores = (q[:, :, None] @ keys[:, :, : t + 1].transpose(-2, -1)) * 0.25
    want = scores.softmax(-1) @ values[:, :, : t + 1]
    torch.testing.assert_close(out, want.reshape(rows, -1), rtol=0, atol=2e-6)


def tiny(precision):
    cfg = ModelConfig(dim=64, layers=2, dropout=0.0, arch="transformer", heads=4, ffn_dim=128)
    torch.manual_seed(0)
    return decoding_copy(build_model(cfg, 50, 50, joint=True).eval(), precision)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_greedy_outputs_do_not_depend_on_when_ended_rows_leave_the_batch(precision, monkeypatch):
    model = tiny(precision)
    batch = random_batch(50, src_lens=(9, 3, 14, 5, 7, 11, 2, 6), tgt_lens=(4,) * 8, seed=5)
    max_len = torch.randint(3, 25, (8,), generator=torch.Generator().manual_seed(2))
    results = []
    for share in (0.0, 0.25, 1.0):
        monkeypatch.setattr(search, "compact_share", share)
        hyps = search.greedy_search(model, batch.src, batch.src_mask, max_len)
        results.append([(h.tokens, h.score, h.attention) for h in hyps])
    for other in results[1:]:
        for (tokens, score, attn), (tokens2, score2, attn2) in zip(results[0], other):
            assert tokens == tokens2
            if precision == "int8":  # per-row scales and exact int32 products: the same numbers in any batch
                assert score == score2 and torch.equal(attn, attn2)
            else:  # fp32 products of different row counts may take different kernels (last bits)
                assert abs(score - score2) < 1e-4
                torch.testing.assert_close(attn, attn2, rtol=0, atol=1e-5)
    assert [len(r[0]) for r in results[0]] != [len(results[0][0][0])] * 8  # rows did end at different steps


@built
def test_decoding_with_and_without_the_kernels_agrees(monkeypatch):
    model = tiny("int8")
    batch = random_batch(50, src_lens=(9, 3, 14, 5), tgt_lens=(4,) * 4, seed=7)
    max_len = torch.full((4,), 12)
    fused = [h[0] for h in search.beam_search(model, batch.src, batch.src_mask, max_len, 3)]
    monkeypatch.setattr(native, "library", lambda: None)
    plain = [h[0] for h in search.beam_search(model, batch.src, batch.src_mask, max_len, 3)]
    assert [h.tokens for h in fused] == [h.tokens for h in plain]
    for a, b in zip(fused, plain):
        assert abs(a.score - b.score) < 1e-4


def test_without_a_compiler_or_with_nmt_native_0_there_are_no_kernels(monkeypatch, tmp_path):
    monkeypatch.setattr(kernels, "_compiler", lambda: None)
    assert native.build(tmp_path) is None
    monkeypatch.setenv("NMT_NATIVE", "0")
    assert kernels.load()[0] is None


@built
def test_the_library_is_built_once_into_the_cache_folder(tmp_path):
    path = native.build(tmp_path)
    assert path is not None and path.parent == tmp_path and path.name.startswith("kernels-")
    stamp = path.stat().st_mtime_ns
    assert native.build(tmp_path) == path and path.stat().st_mtime_ns == stamp  # reused, not rebuilt
    # the library and its recorded hash, no temporary files left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, path.with_suffix(".sha256").name])


@pytest.mark.skipif(native._compiler() is None, reason="no C compiler here")
def test_the_kernels_compile_wherever_there_is_a_compiler(tmp_path):
    """The fallback to torch is for machines without a compiler, never a cover for a source that does not build."""
    assert native.build(tmp_path) is not None
    assert native.library() is not None


@built
@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_a_whole_layer_in_one_call_steps_as_the_layer_does(precision, monkeypatch):
    """native.layer_step (int8) and layer_step32 (fp32 on MKL's packed products or nmt's AVX-512 one) against the
    same decoding copy stepping through torch's operators, over more steps than the caches' first room."""
    from nmt.engine.onednn import fp32_backend

    model = tiny(precision)
    layer = model.decoder.layers[0]
    made = layers.layer8(layer) if precision == "int8" else layers.layer32(layer)
    if made is None:  # no fused layer: only where its products are not built here
        assert (precision == "int8" and not native.vnni()) or (
            precision == "fp32" and fp32_backend() not in ("mkl", "native")
        )
        pytest.skip(f"no fused {precision} layer on this machine")
    batch = random_batch(50, src_lens=(9, 3, 14), tgt_lens=(30,) * 3, seed=4)

    def steps():
        enc = model.encode(batch.src, batch.src_mask)
        state, out = model.init_state(enc), []
        with torch.no_grad():
            for t in range(30):
                logits, state, attn = model.step(batch.tgt_in[:, t], enc, state)
                out.append((logits, attn))
        return out

    fused = steps()
    monkeypatch.setattr(layers, "layer8", lambda layer: None)
    monkeypatch.setattr(layers, "layer32", lambda layer: None)
    plain = steps()
    tolerance = 1e-5 if precision == "fp32" else 2e-3  # int8: a norm's last bit can move a value's quantum
    for (a, attn_a), (b, attn_b) in zip(fused, plain):
        torch.testing.assert_close(a, b, rtol=0, atol=tolerance)
        torch.testing.assert_close(attn_a, attn_b, rtol=0, atol=tolerance)


@built
@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_the_whole_decoder_step_in_one_call_equals_its_layers_called_one_by_one(precision, norm, monkeypatch):
    """native.decoder_step (embedding, every layer, final norm, attention mean) against the same decoding copy
    calling each layer's kernel from Python: beam search (rows reordered every step) and greedy give the same
    hypotheses, scores and attention; a token outside the vocabulary is an IndexError, not a read out of bounds."""
    from nmt.engine.transformer import TransformerDecoder

    cfg = ModelConfig(dim=64, layers=2, dropout=0.0, arch="transformer", heads=4, ffn_dim=128, norm=norm)
    torch.manual_seed(1)
    model = decoding_copy(build_model(cfg, 50, 50, joint=True).eval(), precision)
    batch = random_batch(50, src_lens=(9, 3, 14, 5), tgt_lens=(4,) * 4, seed=6)
    max_len = torch.full((4,), 20)
    calls = []
    real = native.decoder_step
    monkeypatch.setattr(native, "decoder_step", lambda *a: calls.append(1) or real(*a))

    def searches():
        with torch.no_grad():
            greedy = search.greedy_search(model, batch.src, batch.src_mask, max_len)
            beams = search.beam_search(model, batch.src, batch.src_mask, max_len, 4, nbest=2)
        return [(h.tokens, h.score, h.attention) for h in greedy + [h for hyps in beams for h in hyps]]

    whole = searches()
    if not calls:
        pytest.skip(f"no fused {precision} layers on this machine")
    monkeypatch.setattr(TransformerDecoder, "_whole_step", lambda *a: None)
    calls.clear()
    layers = searches()
    assert not calls
    # int8: as for the encoder below, a norm's last bit (the portable C's sums run in another order than the AVX-512
    # ones) can move a value's quantum; the tokens must still be the same
    score_tolerance, attn_tolerance = (1e-4, 1e-5) if precision == "fp32" else (2e-2, 2e-2)
    for (tokens, score, attn), (tokens2, score2, attn2) in zip(whole, layers):
        assert tokens == tokens2
        assert abs(score - score2) < score_tolerance
        torch.testing.assert_close(attn, attn2, rtol=0, atol=attn_tolerance)
    monkeypatch.undo()
    enc = model.encode(batch.src, batch.src_mask)
    with pytest.raises(IndexError):
        model.step(torch.tensor([1, 2, 50, 3]), enc, model.init_state(enc))


@built
@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_the_whole_encoder_in_one_call_equals_its_modules(precision, norm, monkeypatch):
    """native.encoder_forward (embedding, every layer, final norm) against the same decoding copy's modules: the
    memory to float rounding (its norms are the kernels', not torch's), each sentence's alone as in its padded
    batch, and the same greedy outputs; a token outside the vocabulary is an IndexError."""
    from nmt.engine.transformer import TransformerEncoder

    cfg = ModelConfig(dim=64, layers=2, dropout=0.0, arch="transformer", heads=4, ffn_dim=128, norm=norm)
    torch.manual_seed(2)
    model = decoding_copy(build_model(cfg, 50, 50, joint=True).eval(), precision)
    batch = random_batch(50, src_lens=(9, 3, 14, 5), tgt_lens=(4,) * 4, seed=7)
    calls = []
    real = native.encoder_forward
    monkeypatch.setattr(native, "encoder_forward", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        whole = model.encoder(batch.src, batch.src_mask)["memory"]
        n = int(batch.src_mask[2].sum())  # the longest sentence, alone
        alone = model.encoder(batch.src[2:3, :n], batch.src_mask[2:3, :n])["memory"]
        found = search.greedy_search(model, batch.src, batch.src_mask, torch.full((4,), 12))
    if not calls:
        pytest.skip(f"no fused {precision} layers on this machine")
    monkeypatch.setattr(TransformerEncoder, "_whole", lambda *a: None)
    with torch.no_grad():
        modules = model.encoder(batch.src, batch.src_mask)["memory"]
        found2 = search.greedy_search(model, batch.src, batch.src_mask, torch.full((4,), 12))
    mask = batch.src_mask[..., None]
    assert not whole[~batch.src_mask].any()  # padding is taken out of the layers' products: its rows are zero
    tolerance = 1e-5 if precision == "fp32" else 2e-2  # int8: a norm's last bit can move a value's quantum
    torch.testing.assert_close(whole * mask, modules * mask, rtol=0, atol=tolerance)
    if precision == "int8":  # per-row scales, exact int32 sums: a sentence's numbers do not depend on its batch
        assert torch.equal(alone[0], whole[2, :n])
    torch.testing.assert_close(alone[0], whole[2, :n], rtol=0, atol=1e-5)
    assert [h.tokens for h in found] == [h.tokens for h in found2]
    monkeypatch.undo()
    with pytest.raises(IndexError):
        model.encode(batch.src.clamp(max=0) + 50, batch.src_mask)


@built
@pytest.mark.parametrize("width", [1, 7, 16, 8000, 8003])
def test_row_argmax_is_torchs_argmax_first_index_on_ties(width):
    torch.manual_seed(width)
    x = torch.randn(6, width)
    x[1] = 3.0  # all tied: the first
    if width > 5:
        x[2, 2] = x[2, width - 1] = 50.0  # a tie between two places
        x[3, width - 1] = 50.0  # the largest in the tail past the last 16
    x[4, :] = float("-inf")  # every token forbidden
    assert torch.equal(native.row_argmax(x), x.argmax(1))
    assert torch.equal(search.row_argmax(x), x.argmax(1))


@built
@pytest.mark.parametrize("width", [1, 3, 7, 16, 8000, 8003])
def test_row_argmax_with_banned_tokens_is_torchs_argmax_of_the_masked_row(width):
    """Greedy search's choice: the argmax after x[:, banned] = -inf, without writing x (search.greedy_choice)."""
    torch.manual_seed(width)
    x = torch.randn(8, width)
    banned = [0, 1, 2][: max(width - 1, 0)] + ([width - 1] if width > 9 else [])
    x[1] = 3.0  # all tied: the first token not banned
    if width > 9:
        x[2, 1] = 50.0  # the best token banned: the best of the others
        x[3, 0] = x[3, 5] = x[3, 6] = 40.0  # the best shared by a banned and two free places: the first free one
        x[4, width - 1] = 60.0  # the best banned in the tail past the last 16
    x[5, :] = float("-inf")  # every token impossible: index 0, as argmax
    x[6, 3:] = float("-inf")  # only banned tokens finite: the masked row is all -inf, index 0
    masked = x.clone()
    masked[:, banned] = float("-inf")
    before = x.clone()
    assert torch.equal(native.row_argmax(x, banned), masked.argmax(1))
    assert torch.equal(x, before)  # not written
    assert torch.equal(native.row_argmax(x, []), x.argmax(1))
    assert torch.equal(search.row_argmax(x.clone(), banned), masked.argmax(1))
    if width > max(search.forbidden(0, 1)):
        tokens, scores = search.greedy_choice(x.clone(), step=0, min_len=1)  # PAD, BOS and EOS forbidden
        reference = x.clone()
        reference[:, search.forbidden(0, 1)] = float("-inf")
        assert torch.equal(tokens, reference.argmax(1))
        expected = x.log_softmax(1).gather(1, tokens[:, None]).squeeze(1)  # normalised over every token
        finite = torch.isfinite(expected)
        assert finite.sum() >= 6 and torch.allclose(scores[finite], expected[finite], atol=1e-5)


@built
@pytest.mark.parametrize("width", [12, 40, 8000, 8003])
def test_log_softmax_topk_is_the_best_of_log_softmax_outside_the_banned_tokens(width):
    torch.manual_seed(width)
    x = torch.randn(7, width) * 4
    x[0, 1] = 100.0  # a banned token that would win
    x[1, width - 1] = 60.0  # the best in the tail past the last 16
    banned = [0, 1, 2]
    values, index = native.log_softmax_topk(x, 9, banned)
    logp = x.log_softmax(-1)
    logp[:, banned] = float("-inf")
    want_values, want_index = logp.topk(9, dim=1)
    assert torch.equal(index, want_index)
    torch.testing.assert_close(values, want_values, rtol=0, atol=2e-5)
    x[:, search.PAD] = x[:, search.BOS] = 200.0
    top = search.candidates(x, step=0, min_len=0, count=9)  # PAD, BOS banned (EOS too before min_len)
    assert top is not None and not bool(((top[1] == search.PAD) | (top[1] == search.BOS)).any())
    assert search.candidates(x[:, :10], step=0, min_len=5, count=9) is None  # too few tokens left: torch's path
