"""RNN encoder-decoders (Bahdanau, Luong and their attention variants): the decoder-interface invariants,
the config checks, and a copy task each variant learns in seconds."""

import pytest
import torch

from nmt.config import ModelConfig
from nmt.data.batching import make_batch
from nmt.errors import NmtError
from nmt.models.builders import build_model
from nmt.search import greedy_search
from tests.conftest import random_batch as shared_random_batch

VOCAB = 20

# name -> ModelConfig overrides; together they cover every score, window, cell, bridge and switch
VARIANTS = {
    "bahdanau": dict(arch="bahdanau", cell="gru", score="additive"),
    "bahdanau_lstm_zero_bridge": dict(arch="bahdanau", cell="lstm", score="additive", bridge="zero", embed_dim=12),
    "luong_dot": dict(arch="luong", score="dot"),
    "luong_general": dict(arch="luong", score="general"),
    "luong_concat": dict(arch="luong", score="concat"),
    "luong_location": dict(arch="luong", score="location"),
    "luong_gru_no_feeding": dict(arch="luong", cell="gru", score="general", input_feeding=False),
    "luong_local_m": dict(arch="luong", score="general", window="local_m", window_size=2),
    "luong_local_p": dict(arch="luong", score="general", window="local_p", window_size=2),
    "luong_local_p_dot_unidirectional": dict(
        arch="luong", score="dot", window="local_p", window_size=2, bidirectional=False
    ),
    "hard": dict(arch="luong", score="general", attention="hard"),
}
# the variants that learn the copy task (the other two differ from these only in cell, bridge or direction)
SOFT = [
    name for name in VARIANTS if name not in ("hard", "bahdanau_lstm_zero_bridge", "luong_local_p_dot_unidirectional")
]


def tiny(name, **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(**({"dim": 16, "layers": 2, "dropout": 0.1} | VARIANTS[name] | kw))
    return build_model(cfg, VOCAB, VOCAB, joint=True).eval()


def random_batch(seed=0):
    return shared_random_batch(VOCAB, tgt_lens=(9, 2, 4), seed=seed)


@pytest.mark.parametrize("name", VARIANTS)
def test_incremental_step_equals_teacher_forcing(name):
    model, batch = tiny(name), random_batch()
    with torch.no_grad():
        enc = model.encode(batch.src, batch.src_mask)
        full, attn = model.decoder(batch.tgt_in, enc, need_attn=True)  # (B, T, V), (B, T, S)
        state = model.init_state(enc)
        for t in range(batch.tgt_in.size(1)):
            logits, state, step_attn = model.step(batch.tgt_in[:, t], enc, state)
            torch.testing.assert_close(logits, full[:, t], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(step_attn, attn[:, t], atol=1e-5, rtol=1e-5)
    assert all(value.size(0) == 3 for value in state.values())  # batch on dim 0: beams reorder with index_select
    assert (attn.masked_select(~batch.src_mask[:, None, :].expand_as(attn)) == 0).all()


@pytest.mark.parametrize("name", VARIANTS)
def test_padding_does_not_change_a_sentence(name):
    model, batch = tiny(name), random_batch()
    limit = torch.full((3,), 8)
    with torch.no_grad():
        together = model(batch.src, batch.src_mask, batch.tgt_in)
    searched = greedy_search(model, batch.src, batch.src_mask, limit)
    for row in range(batch.src.size(0)):
        s, t = int(batch.src_mask[row].sum()), int((batch.tgt_out[row] != 0).sum())
        src, mask = batch.src[row : row + 1, :s], batch.src_mask[row : row + 1, :s]
        with torch.no_grad():
            alone = model(src, mask, batch.tgt_in[row : row + 1, :t])
        torch.testing.assert_close(alone[0], together[row, :t], atol=1e-5, rtol=1e-5)
        hyp = greedy_search(model, src, mask, limit[:1])[0]
        assert hyp.tokens == searched[row].tokens
        assert hyp.score == pytest.approx(searched[row].score, abs=1e-4)


@pytest.mark.parametrize("name", VARIANTS)
def test_beam_search_reorders_the_rnn_state(name):
    """beam 1 == greedy; beam 3 gives a sentence the same hypotheses alone as in a padded batch."""
    from nmt.search import beam_search

    model, batch = tiny(name), random_batch()
    limit = torch.full((3,), 8)
    greedy = greedy_search(model, batch.src, batch.src_mask, limit)
    assert [h[0].tokens for h in beam_search(model, batch.src, batch.src_mask, limit, k=1)] == [
        h.tokens for h in greedy
    ]
    together = beam_search(model, batch.src, batch.src_mask, limit, k=3, nbest=3)
    for row in range(3):
        s = int(batch.src_mask[row].sum())
        alone = beam_search(
            model, batch.src[row : row + 1, :s], batch.src_mask[row : row + 1, :s], limit[:1], k=3, nbest=3
        )[0]
        assert [h.tokens for h in alone] == [h.tokens for h in together[row]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in together[row]], abs=1e-4)


@pytest.mark.parametrize("name", ["bahdanau", "luong_local_p", "hard"])
def test_weights_round_trip_through_a_state_dict(name):
    """What a checkpoint does: rebuild from the config, load the weights (tied ones included), same outputs."""
    model, batch = tiny(name), random_batch()
    torch.manual_seed(123)
    rebuilt = build_model(
        ModelConfig(**({"dim": 16, "layers": 2, "dropout": 0.1} | VARIANTS[name])), VOCAB, VOCAB, joint=True
    ).eval()
    rebuilt.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(
            rebuilt(batch.src, batch.src_mask, batch.tgt_in), model(batch.src, batch.src_mask, batch.tgt_in)
        )
    assert rebuilt.decoder.output.weight is rebuilt.decoder.embed.weight is rebuilt.encoder.embed.weight


def test_lstm_state_lives_in_the_state_dict_with_the_batch_first():
    model, batch = tiny("luong_general"), random_batch()
    state = model.init_state(model.encode(batch.src, batch.src_mask))
    assert state["h"].shape == state["c"].shape == (3, 2, 16)  # (B, L, H)
    assert state["feed"].shape == (3, 16) and state["t"].tolist() == [0, 0, 0]
    assert "feed" not in tiny("luong_gru_no_feeding").init_state(model.encode(batch.src, batch.src_mask))
    zero = tiny("bahdanau_lstm_zero_bridge")
    enc = zero.encode(batch.src, batch.src_mask)
    assert (enc["init_h"] == 0).all() and (enc["init_c"] == 0).all()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(arch="luong", cell="rnn"), "model.cell=rnn: unknown; expected one of gru, lstm"),
        (dict(arch="luong", bridge="mean"), "model.bridge=mean: unknown; expected one of bridge, zero"),
        (
            dict(arch="luong", score="cosine"),
            "model.score=cosine: unknown; expected one of additive, dot, general, concat, location",
        ),
        (dict(arch="luong", score="location", window="local_p"), "location attention is global only"),
        (dict(arch="luong", window="local"), "model.window=local: unknown"),
        (dict(arch="luong", dim=15), "needs an even dim"),
        (dict(arch="luong", embed_dim=8), "model.embed_dim == model.dim"),
        (dict(arch="rnn"), "model.arch=rnn: unknown; expected one of bahdanau, luong, transformer"),
    ],
)
def test_invalid_settings_fail_with_the_key_named(overrides, message):
    with pytest.raises(NmtError, match=message):
        build_model(ModelConfig(**({"dim": 16, "layers": 1} | overrides)), VOCAB, VOCAB, joint=True)


def test_overrides_on_a_recipe_compose_and_mistakes_fail_at_composition():
    from nmt.cli.common import compose
    from nmt.models.attention import LocalWindow

    cfg = compose("config", ["model=luong", "model.score=dot", "model.window=local_p", "model.window_size=5"])
    model = build_model(cfg.model, VOCAB, VOCAB, joint=True)
    assert isinstance(model.decoder.attention, LocalWindow) and model.decoder.attention.size == 5
    with pytest.raises(NmtError, match="model.score=cosin: unknown"):
        compose("config", ["model=luong", "model.score=cosin"])
    with pytest.raises(NmtError, match="location attention is global only"):
        compose("config", ["model=luong_local_p", "model.score=location"])


def copy_accuracy(name: str, steps: int) -> float:
    """Train a tiny model to copy sequences of 3-6 tokens; exact-match accuracy of greedy output."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    cfg = ModelConfig(**({"dim": 32, "layers": 1, "dropout": 0.0} | VARIANTS[name]))
    model = build_model(cfg, VOCAB, VOCAB, joint=True)
    opt = torch.optim.Adam(model.parameters(), lr=1.5e-2)

    def sample(n):
        return [
            torch.randint(4, VOCAB, (int(torch.randint(3, 7, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)
        ]

    for _ in range(steps):
        seqs = sample(64)
        batch = make_batch(seqs, seqs)
        logits = model(batch.src, batch.src_mask, batch.tgt_in)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    seqs = sample(100)
    batch = make_batch(seqs)
    hyps = greedy_search(model, batch.src, batch.src_mask, torch.full((100,), 10))
    return sum(h.tokens == s for h, s in zip(hyps, seqs)) / len(seqs)


@pytest.mark.parametrize("name", SOFT)
def test_soft_attention_learns_to_copy(name):
    accuracy = copy_accuracy(name, steps=120)
    assert accuracy > 0.6, accuracy  # 0.76-1.0 at 90 steps when written, before the embeddings' readout scale


def test_hard_attention_learns_to_copy():
    accuracy = copy_accuracy("hard", steps=90)
    assert accuracy > 0.4, accuracy  # 0.76 when written
