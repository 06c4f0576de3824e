import pytest
import torch

from nmt.config import ModelConfig
from nmt.data.batching import make_batch
from nmt.models.builders import build_model
from nmt.search import greedy_search
from tests.conftest import random_batch as shared_random_batch

VOCAB = 20


def tiny(norm="pre", scale=True, **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(dim=32, layers=2, heads=4, ffn_dim=64, dropout=0.1, norm=norm, scale=scale, **kw)
    return build_model(cfg, VOCAB, VOCAB, joint=True).eval()


def random_batch(seed=0):
    return shared_random_batch(VOCAB, tgt_lens=(6, 2, 4), seed=seed)


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("scale", [True, False])
def test_incremental_step_equals_teacher_forcing(norm, scale):
    model, batch = tiny(norm, scale), random_batch()
    with torch.no_grad():
        enc = model.encode(batch.src, batch.src_mask)
        full, attn = model.decoder(batch.tgt_in, enc, need_attn=True)  # (B, T, V), (B, T, S)
        state = model.init_state(enc)
        for t in range(batch.tgt_in.size(1)):
            logits, state, step_attn = model.step(batch.tgt_in[:, t], enc, state)
            torch.testing.assert_close(logits, full[:, t], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(step_attn, attn[:, t], atol=1e-5, rtol=1e-5)


def test_attention_sums_to_one_and_ignores_padding():
    model, batch = tiny(), random_batch()
    with torch.no_grad():
        _, attn = model.decoder(batch.tgt_in, model.encode(batch.src, batch.src_mask), need_attn=True)
    torch.testing.assert_close(attn.sum(-1), torch.ones(attn.shape[:2]))
    assert (attn.masked_select(~batch.src_mask[:, None, :].expand_as(attn)) == 0).all()


def test_attention_per_layer_and_head_and_its_plotting_reduction():
    model, batch = tiny(), random_batch()
    with torch.no_grad():
        enc = model.encode(batch.src, batch.src_mask)
        maps = model.decoder.attention_maps(batch.tgt_in, enc)  # (B, L, N, T, S)
        _, attn = model.decoder(batch.tgt_in, enc, need_attn=True)
    assert maps.shape == (3, 2, 4, batch.tgt_in.size(1), batch.src.size(1))
    torch.testing.assert_close(maps.sum(-1), torch.ones(maps.shape[:-1]))
    assert (maps.masked_select(~batch.src_mask[:, None, None, None, :].expand_as(maps)) == 0).all()
    assert not torch.allclose(maps[:, 0], maps[:, 1])  # the layers differ
    torch.testing.assert_close(attn, maps[:, -1].mean(1))  # plotted: last layer, mean over heads


def test_padding_does_not_change_a_sentence():
    model, batch = tiny(), random_batch()
    with torch.no_grad():
        together = model(batch.src, batch.src_mask, batch.tgt_in)
        for row in range(batch.src.size(0)):
            s, t = int(batch.src_mask[row].sum()), int((batch.tgt_out[row] != 0).sum())
            alone = model(
                batch.src[row : row + 1, :s], batch.src_mask[row : row + 1, :s], batch.tgt_in[row : row + 1, :t]
            )
            torch.testing.assert_close(alone[0], together[row, :t], atol=1e-5, rtol=1e-5)


def test_greedy_alone_equals_in_batch():
    model, batch = tiny(), random_batch()
    limit = torch.full((3,), 8)
    together = greedy_search(model, batch.src, batch.src_mask, limit)
    for row in range(3):
        s = int(batch.src_mask[row].sum())
        alone = greedy_search(model, batch.src[row : row + 1, :s], batch.src_mask[row : row + 1, :s], limit[:1])[0]
        assert alone.tokens == together[row].tokens
        assert alone.score == pytest.approx(together[row].score, abs=1e-4)


def test_tied_embeddings_share_one_matrix():
    model = tiny()
    assert model.decoder.output.weight is model.decoder.embed.tokens.weight
    assert model.encoder.embed is model.decoder.embed
    untied = build_model(
        ModelConfig(dim=32, layers=1, heads=4, ffn_dim=64, tie_embeddings=False), VOCAB, VOCAB, joint=True
    )
    assert untied.decoder.output.weight is not untied.decoder.embed.tokens.weight


def test_learns_to_reverse_sequences():
    """A synthetic task that needs attention: output the source reversed. One layer learns it in these 300 updates
    (measured, torch seeds 0-3: accuracy 0.93-0.97) in half the time of two."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(dim=64, layers=1, heads=4, ffn_dim=128, dropout=0.0), VOCAB, VOCAB, joint=True)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)

    def sample(n):
        seqs = [
            torch.randint(4, VOCAB, (int(torch.randint(3, 8, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)
        ]
        return seqs, [s[::-1] for s in seqs]

    for _ in range(300):
        batch = make_batch(*sample(64))
        logits = model(batch.src, batch.src_mask, batch.tgt_in)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    src, tgt = sample(100)
    batch = make_batch(src)
    hyps = greedy_search(model, batch.src, batch.src_mask, torch.full((100,), 12))
    accuracy = sum(h.tokens == t for h, t in zip(hyps, tgt)) / len(tgt)
    assert accuracy > 0.6, accuracy  # an untrained model gets 0


# Learning the toy language pair through the real trainer: tests/test_toy_learning.py's transformer case (the toy
# comparison's Transformer, d64, one layer, 250 updates), which trained the same thing as a test here did.


def test_explicit_attention_products_equal_sdpa(monkeypatch):
    """On a CPU, bf16 and dropout take the explicit products (nmt.models.transformer.explicit_products); fp32
    evaluation takes SDPA. With the same weights in float32 both give the same logits (causal and padding masks)."""
    from nmt.models import transformer as T

    model, batch = tiny(), random_batch()
    with torch.no_grad():
        sdpa = model(batch.src, batch.src_mask, batch.tgt_in)
        with monkeypatch.context() as patch:
            patch.setattr(T, "explicit_products", lambda q, dropout: True)
            explicit = model(batch.src, batch.src_mask, batch.tgt_in)
    assert not T.explicit_products(torch.zeros(1), 0.0) and T.explicit_products(
        torch.zeros(1, dtype=torch.bfloat16), 0.0
    )
    assert T.explicit_products(torch.zeros(1), 0.1)
    torch.testing.assert_close(explicit, sdpa, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("names", [("q_proj", "k_proj", "v_proj"), ("k_proj", "v_proj")])
def test_joint_projections_under_autocast_equal_the_separate_layers_within_rounding(names):
    """Under bf16 autocast W^Q, W^K, W^V of one input run as one product (x cast once): the outputs and every
    gradient equal the three layers' within bf16 rounding; without autocast `project` is the layers themselves."""
    from nmt.models.transformer import MultiHeadAttention, project

    torch.manual_seed(0)
    attn = MultiHeadAttention(64, 4, 0.0)
    linears = [getattr(attn, name) for name in names]
    x = torch.randn(3, 7, 64, requires_grad=True)
    outputs = {}
    for joint in (True, False):
        attn.zero_grad()
        x.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ys = project(x, *linears) if joint else tuple(linear(x) for linear in linears)
        sum((y.float() * torch.linspace(-1, 1, y.numel()).view_as(y)).sum() for y in ys).backward()
        grads = [x.grad.clone()] + [p.grad.clone() for linear in linears for p in (linear.weight, linear.bias)]
        outputs[joint] = ([y.float() for y in ys], grads)
    for a, b in zip(outputs[True][0] + outputs[True][1], outputs[False][0] + outputs[False][1]):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
    plain = project(x, *linears)  # no autocast: each layer as written, bit for bit
    assert all(torch.equal(p, linear(x)) for p, linear in zip(plain, linears))
