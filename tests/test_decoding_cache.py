"""A decoding copy's Transformer steps (decoding_copy: prescaled queries, padded cross-attention keys, caches
allocated ahead and written in place) give what the training model's steps give, however a state is used."""

import math

import pytest
import torch

from nmt.config import ModelConfig
from nmt.engine import decoding_copy
from nmt.engine import transformer as engine
from nmt.engine.transformer import ROOM, SHORT
from nmt.models.builders import build_model
from nmt.models.seq2seq import reorder
from nmt.search import BOS, beam_search, greedy_search
from tests.conftest import random_batch

VOCAB = 40


def pair(heads: int = 2, dim: int = 32):
    """The same Transformer twice: as trained, and as a decoding copy."""
    cfg = ModelConfig(dim=dim, layers=2, dropout=0.0, arch="transformer", heads=heads, ffn_dim=64)
    torch.manual_seed(0)
    trained = build_model(cfg, VOCAB, VOCAB, joint=True).eval()
    torch.manual_seed(0)
    return trained, decoding_copy(build_model(cfg, VOCAB, VOCAB, joint=True).eval(), "fp32")


def run_steps(model, src, src_mask, tokens):
    """Logits (B, T, V) and attention (B, T, S) of stepping through tokens (B, T) one position at a time."""
    enc = model.encode(src, src_mask)
    state = model.init_state(enc)
    logits, attn = [], []
    for t in range(tokens.size(1)):
        out, state, a = model.step(tokens[:, t], enc, state)
        logits.append(out)
        attn.append(a)
    return torch.stack(logits, 1), torch.stack(attn, 1), state


@pytest.mark.parametrize("heads", [2, 4])  # head dim 16 (1/4: prescaled exactly) and 8 (1/sqrt(8): scaled per step)
def test_decoding_copy_steps_equal_teacher_forcing_past_the_allocated_room(heads):
    trained, copy = pair(heads)
    assert isinstance(copy.decoder, engine.TransformerDecoder) and not isinstance(
        trained.decoder, engine.TransformerDecoder
    )
    assert (copy.decoder.layers[0].self_attn.scale == 1.0) == (math.frexp(1 / math.sqrt(32 // heads))[0] == 0.5)
    steps = ROOM * 3 + 5  # the caches grow more than once
    batch = random_batch(VOCAB, src_lens=(7, 3, 20, 1), tgt_lens=(steps,) * 4, seed=3)
    tokens = torch.cat([torch.full((4, 1), BOS), batch.tgt_in[:, 1:steps]], 1)
    with torch.no_grad():
        forced = trained(batch.src, batch.src_mask, tokens)  # (B, T, V)
        want_attn = trained.decoder.features(tokens, trained.encoder(batch.src, batch.src_mask), True)[1]
        got, attn, state = run_steps(copy, batch.src, batch.src_mask, tokens)
    torch.testing.assert_close(got, forced, rtol=0, atol=1e-5)
    assert attn.shape == want_attn.shape  # (B, T, S): the padded keys never show
    torch.testing.assert_close(attn, want_attn, rtol=0, atol=1e-6)
    assert copy.decoder.caches(state)[0][0].size(2) == steps


def test_a_state_stepped_twice_gives_the_same_result_both_times():
    """Writing a step's keys in place must not change a state that another step already extended."""
    _, copy = pair()
    batch = random_batch(VOCAB, src_lens=(5, 2), tgt_lens=(4, 4), seed=1)
    with torch.no_grad():
        enc = copy.encode(batch.src, batch.src_mask)
        state = copy.init_state(enc)
        for t in range(3):
            _, state, _ = copy.step(batch.tgt_in[:, t], enc, state)
        first, after_first, _ = copy.step(torch.tensor([5, 6]), enc, state)
        second, after_second, _ = copy.step(torch.tensor([7, 8]), enc, state)  # the same state again
        again, _, _ = copy.step(torch.tensor([5, 6]), enc, state)
        # the first branch still holds its own keys: one more step from it equals a fresh replay
        onward, _, _ = copy.step(torch.tensor([9, 9]), enc, after_first)
        replay = copy.init_state(enc)
        for token in [batch.tgt_in[:, 0], batch.tgt_in[:, 1], batch.tgt_in[:, 2], torch.tensor([5, 6])]:
            _, replay, _ = copy.step(token, enc, replay)
        fresh, _, _ = copy.step(torch.tensor([9, 9]), enc, replay)
    assert torch.equal(first, again)
    assert not torch.equal(first, second)
    assert torch.equal(onward, fresh)
    keys_first, keys_second = copy.decoder.caches(after_first)[0][0], copy.decoder.caches(after_second)[0][0]
    assert not torch.equal(keys_first[:, :, 3], keys_second[:, :, 3])


def test_reordered_states_share_the_caches_and_each_branch_steps_as_its_own_replay():
    """A reorder (beam search's, after every step) copies no cache: it permutes the rows' ancestors, and the keys
    stay where their step wrote them. Two reorders of one state, each stepped, still give their own replays."""
    _, copy = pair()
    batch = random_batch(VOCAB, src_lens=(5, 2), tgt_lens=(4, 4), seed=2)
    tokens = [batch.tgt_in[:, 0], torch.tensor([5, 6]), torch.tensor([7, 8])]
    with torch.no_grad():
        enc = copy.encode(batch.src, batch.src_mask)
        empty = copy.init_state(enc)
        first, after_first, _ = copy.step(tokens[0], enc, empty)
        other, _, _ = copy.step(torch.tensor([3, 4]), enc, empty)  # the empty state stepped again
        onward, _, _ = copy.step(tokens[1], enc, after_first)  # the first branch is still its own
        replay = copy.step(tokens[0], enc, copy.init_state(enc))[1]
        assert not torch.equal(first, other)
        assert torch.equal(copy.step(tokens[1], enc, replay)[0], onward)
        state = empty
        for token in tokens:
            _, state, _ = copy.step(token, enc, state)
        swapped, kept = reorder(state, torch.tensor([1, 0])), reorder(state, torch.tensor([0, 0]))
        swapped_enc, kept_enc = reorder(enc, torch.tensor([1, 0])), reorder(enc, torch.tensor([0, 0]))
        if "self_anc" in state:  # the native kernels: no cache copied
            assert swapped["shared_k0"] is state["shared_k0"] and kept["shared_k0"] is state["shared_k0"]
        a, after_a, _ = copy.step(torch.tensor([9, 10]), swapped_enc, swapped)
        b, _, _ = copy.step(torch.tensor([11, 12]), kept_enc, kept)
        a2, _, _ = copy.step(torch.tensor([13, 13]), swapped_enc, after_a)
        for index, token, got in (
            (torch.tensor([1, 0]), torch.tensor([9, 10]), a),
            (torch.tensor([0, 0]), torch.tensor([11, 12]), b),
        ):
            e = reorder(enc, index)
            replay = copy.init_state(e)
            for t in tokens:
                _, replay, _ = copy.step(t[index], e, replay)
            want, replay, _ = copy.step(token, e, replay)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
            if index.tolist() == [1, 0]:
                want2, _, _ = copy.step(torch.tensor([13, 13]), e, replay)
                torch.testing.assert_close(a2, want2, rtol=0, atol=1e-6)


def test_decoding_copy_searches_equal_the_trained_model_with_short_and_long_sources():
    trained, copy = pair()
    batch = random_batch(VOCAB, src_lens=(SHORT + 4, 3, 9, 1), tgt_lens=(3, 3, 3, 3), seed=5)
    max_len = torch.full((4,), ROOM + 10)
    with torch.no_grad():
        for search in (
            lambda m: greedy_search(m, batch.src, batch.src_mask, max_len),
            lambda m: [h[0] for h in beam_search(m, batch.src, batch.src_mask, max_len, 4)],
        ):
            a, b = search(trained), search(copy)
            assert [h.tokens for h in a] == [h.tokens for h in b]
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
            for x, y in zip(a, b):
                assert x.attention.shape == y.attention.shape
                torch.testing.assert_close(x.attention, y.attention, rtol=0, atol=1e-5)


def test_a_state_reordered_before_its_first_step_steps_as_the_trained_model_does():
    """Tiling the empty initial state (any reorder at t = 0) leaves caches with no room behind them."""
    trained, copy = pair()
    batch = random_batch(VOCAB, src_lens=(5, 2), tgt_lens=(4, 4), seed=2)
    tile = torch.tensor([0, 0, 1, 1, 1])
    with torch.no_grad():
        results = []
        for model in (trained, copy):
            enc = model.encode(batch.src, batch.src_mask)
            state = reorder(model.init_state(enc), tile)
            enc = reorder(enc, tile)
            steps = []
            for t in range(ROOM + 2):
                logits, state, _ = model.step(torch.full((5,), 4 + t % 7), enc, state)
                steps.append(logits)
            results.append(torch.stack(steps, 1))
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=1e-5)
