"""Target prefixes and repetition control, for every model family, greedy and beam.

Prefix: every output starts with the prefix; a hypothesis scores (and attends) as the same tokens do under teacher
forcing; the Transformer's one-pass prefill equals feeding the prefix a step at a time; an empty prefix changes
nothing; sentences with prefixes of different lengths, batched together by the Translator, equal each alone.
Repetition: no output holds an n-gram twice with no_repeat_ngram_size; the penalty lowers repeated tokens' logits as
defined; a model that repeats stops repeating.
"""

import pytest
import torch

from nmt.config import DecodeConfig
from nmt.data.batching import make_batch
from nmt.data.tokenizer import BOS, EOS
from nmt.search import NO_REPETITION, Repetition, beam_search, greedy_search, prefill, start
from tests.test_search import ARCHS, random_sources, tiny_model

PREFIXES = [[9, 5], [4, 4], [7, 8], [5, 6], [11, 12]]  # one per sentence of random_sources, all of length 2


def teacher_forced(model, src, mask, tokens, steps):
    """Sum of log-probs and the attention of the first `steps` output steps of `tokens` (+ EOS) under teacher
    forcing."""
    with torch.no_grad():
        enc = model.encode(src, mask)
        out = (tokens + [EOS])[:steps]
        logits, attn = model.decoder(torch.tensor([[BOS] + out[:-1]]), enc, need_attn=True)
        return float(logits.log_softmax(-1)[0, torch.arange(steps), torch.tensor(out)].sum()), attn[0]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("beam", [1, 4])
def test_outputs_start_with_the_prefix_and_score_as_teacher_forcing(arch, beam):
    model, batch = tiny_model(arch, seed=2), random_sources(3)
    prefix = torch.tensor(PREFIXES)
    limits = torch.full((5,), 9)
    if beam == 1:
        found = [[h] for h in greedy_search(model, batch.src, batch.src_mask, limits, alpha=0.6, prefix=prefix)]
    else:
        found = beam_search(model, batch.src, batch.src_mask, limits, k=beam, alpha=0.6, nbest=beam, prefix=prefix)
    for row, hyps in enumerate(found):
        assert hyps
        s = int(batch.src_mask[row].sum())
        for h in hyps:
            assert h.tokens[:2] == PREFIXES[row]
            steps = h.attention.size(0)
            assert steps <= 9 and steps >= 3  # the prefix's 2 steps count against the limit
            score, attn = teacher_forced(
                model, batch.src[row : row + 1, :s], batch.src_mask[row : row + 1, :s], h.tokens, steps
            )
            assert h.score == pytest.approx(score, abs=1e-4)
            assert h.norm_score == pytest.approx(score / ((5 + steps) / 6) ** 0.6, abs=1e-4)
            torch.testing.assert_close(h.attention, attn, atol=1e-5, rtol=1e-4)
        norms = [h.norm_score for h in hyps]
        assert norms == sorted(norms, reverse=True)


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_equals_a_step_per_token(arch):
    model, batch = tiny_model(arch, seed=3), random_sources(4)
    tokens = torch.tensor([[BOS] + p + [6] for p in PREFIXES])
    with torch.no_grad():
        enc = model.encode(batch.src, batch.src_mask)
        logits, state, attn = prefill(model, tokens, enc, model.init_state(enc))
        stepped = model.init_state(enc)
        for i in range(tokens.size(1)):
            one, stepped, weights = model.step(tokens[:, i], enc, stepped)
            torch.testing.assert_close(logits[:, i], one, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(attn[:, i], weights, atol=1e-5, rtol=1e-4)
        for key in state:
            torch.testing.assert_close(state[key], stepped[key], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ["transformer", "luong"])
def test_an_empty_prefix_changes_nothing(arch):
    model, batch = tiny_model(arch), random_sources(5)
    limits = torch.full((5,), 8)
    plain = beam_search(model, batch.src, batch.src_mask, limits, k=3, nbest=2)
    empty = beam_search(model, batch.src, batch.src_mask, limits, k=3, nbest=2, prefix=torch.zeros(5, 0).long())
    assert [[h.tokens for h in r] for r in plain] == [[h.tokens for h in r] for r in empty]
    with torch.no_grad():
        enc = model.encode(batch.src, batch.src_mask)
        state, pre = start(model, enc, model.init_state(enc), None, 0, NO_REPETITION)
    assert pre is None


def test_translator_batches_prefixes_of_different_lengths(toy_translator):
    translator, lines = toy_translator
    prefixes = ["pul", None, "pulkor garlis", "", "hel hel hel"]
    lines = lines[:5]
    together = translator.translate_lines(lines, prefixes=prefixes)
    for line, prefix, result in zip(lines, prefixes, together):
        alone = translator.translate_lines([line], prefixes=[prefix])[0]
        assert [h.tokens for h in alone.hyps] == [h.tokens for h in result.hyps]
        expected = translator.tokenizer.encode_tgt([prefix])[0] if prefix else []
        assert result.hyps[0].tokens[: len(expected)] == expected


@pytest.fixture(scope="module")
def toy_translator(tmp_path_factory, toy_dir):
    from nmt.api import load_translator
    from tests.test_serve import trained_pair

    runs = trained_pair(tmp_path_factory, toy_dir)
    translator, _ = load_translator(runs["a"], DecodeConfig(beam=3, max_len_a=1.0, max_len_b=4), "cpu")
    return translator, (toy_dir / "test.src").read_text().splitlines()


# --- repetition control ---


class Repeater(torch.nn.Module):
    """A decoder that loves token 5 then 6 then 5 ... and only rarely ends: it repeats unless stopped."""

    def encode(self, src, src_mask):
        return {"src_mask": src_mask, "rows": src[:, :1]}

    def init_state(self, enc):
        return {"t": torch.zeros(enc["src_mask"].size(0), dtype=torch.long)}

    def step(self, prev, enc, state):
        logits = torch.full((prev.size(0), 10), -4.0)
        favourite = torch.where(prev == 5, 6, 5)
        logits[torch.arange(prev.size(0)), favourite] = 3.0
        logits[:, 7] = 1.0
        logits[:, EOS] = -1.0
        mask = enc["src_mask"].float().repeat_interleave(prev.size(0) // enc["src_mask"].size(0), 0)
        return logits, {"t": state["t"] + 1}, mask / mask.sum(1, keepdim=True)


def ngrams(tokens, n):
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("beam", [1, 3])
def test_no_repeat_ngram_size(n, beam):
    batch = make_batch([[4, 4], [4]])
    limits = torch.full((2,), 12)
    rep = Repetition(no_repeat=n)
    plain = greedy_search(Repeater(), batch.src, batch.src_mask, limits)
    assert plain[0].tokens[:4] == [5, 6, 5, 6]  # the model repeats
    if beam == 1:
        found = [[h] for h in greedy_search(Repeater(), batch.src, batch.src_mask, limits, repetition=rep)]
    else:
        found = beam_search(Repeater(), batch.src, batch.src_mask, limits, k=beam, nbest=beam, repetition=rep)
    for hyps in found:
        for h in hyps:
            grams = ngrams(h.tokens, n)
            assert len(grams) == len(set(grams)), h.tokens
    prefix = torch.tensor([[5, 6], [5, 6]])  # the prefix counts as output already
    found = [[h] for h in greedy_search(Repeater(), batch.src, batch.src_mask, limits, prefix=prefix, repetition=rep)]
    for (h,) in found:
        assert h.tokens[:2] == [5, 6]
        assert len(ngrams(h.tokens, n)) == len(set(ngrams(h.tokens, n)))


def test_repetition_penalty_is_applied_as_defined():
    rep = Repetition(penalty=2.0)
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    history = torch.tensor([[0, 1, 1]])
    assert rep.logits(logits, history).tolist() == [[1.0, -2.0, 0.5, 3.0]]
    batch = make_batch([[4]])
    strong = greedy_search(
        Repeater(), batch.src, batch.src_mask, torch.full((1,), 10), repetition=Repetition(penalty=8)
    )
    # by hand: 5 (3.0), 6 (3.0; 5 is out: -32), then 5's 3/8 < 7's 1.0: 7; then 7's 1/8 < 5's 3/8: 5; 6 (3/8 > 1/8)
    assert strong[0].tokens[:5] == [5, 6, 7, 5, 6]
    assert greedy_search(Repeater(), batch.src, batch.src_mask, torch.full((1,), 10))[0].tokens[:3] == [5, 6, 5]


def test_repetition_settings_reach_the_search_from_the_config(toy_translator):
    translator, lines = toy_translator
    from dataclasses import replace

    from nmt.translation import Translator, decode_settings

    t = Translator(
        translator.model, translator.tokenizer, replace(translator.decode, no_repeat_ngram_size=1), translator.device
    )
    for result in t.translate_lines(lines[:6]):
        tokens = result.hyps[0].tokens
        assert len(tokens) == len(set(tokens))
    assert "no_repeat_ngram=1" in decode_settings(t.decode)
    assert decode_settings(translator.decode) == decode_settings(replace(translator.decode, repetition_penalty=1.0))
