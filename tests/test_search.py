"""Search: a scripted decoder with hand-written step probabilities, then invariants for every model family."""

import math

import pytest
import torch
from torch import nn

from nmt.config import ModelConfig
from nmt.data.batching import make_batch
from nmt.data.tokenizer import BOS, EOS, PAD
from nmt.models.builders import BUILDERS, build_model
from nmt.search import beam_search, filter_logits, greedy_search, length_penalty, sample_search

X, Y, W = 4, 5, 6  # token ids of the scripted vocabulary (0-3 are PAD, UNK, BOS, EOS)
V = 7

# Greedy takes the likelier first word and misses the best sentence:
#   greedy: X .5, then Y .4 (over X .35, EOS .25), then EOS 1     -> "X Y"   p = .5 * .4 = .20
#   beam 2 also keeps W .4, whose EOS .9 gives                    -> "W"     p = .4 * .9 = .36
GREEDY_MISSES = {
    (): {X: 0.5, W: 0.4, EOS: 0.1},
    (X,): {Y: 0.4, X: 0.35, EOS: 0.25},
    (W,): {EOS: 0.9, X: 0.1},
}

# A short and a long sentence that the length penalty ranks differently. Beam 2, step by step:
#   t0: X .6, Y .4                                   live: X, Y
#   t1: YY .4, X-EOS .36, XW .24                     finished "X" (p .36, 2 steps); live: YY, XW
#   t2: YYY .4, XWW .24                              live: YYY, XWW
#   t3: YYY-EOS .3, XWWW .24, YYYW .1                finished "Y Y Y" (p .3, 4 steps): 2 finished, done
# alpha = 0: ln .36 = -1.0217 beats ln .3 = -1.2040, so "X" wins.
# alpha = 1: lp(2) = (5+2)/6 = 7/6 and lp(4) = (5+4)/6 = 1.5:
#   "X": -1.0217 / (7/6) = -0.8757;  "Y Y Y": -1.2040 / 1.5 = -0.8027, so "Y Y Y" wins.
PENALTY_FLIPS = {
    (): {X: 0.6, Y: 0.4},
    (X,): {EOS: 0.6, W: 0.4},
    (X, W): {W: 1.0},
    (X, W, W): {W: 1.0},
    (Y,): {Y: 1.0},
    (Y, Y): {Y: 1.0},
    (Y, Y, Y): {EOS: 0.75, W: 0.25},
}


class Scripted(nn.Module):
    """A decoder whose next-token probabilities are looked up by the prefix output so far.

    `tables` maps a source's first token to its table {prefix: {token: probability}}; a prefix not in
    the table ends the sentence (EOS with probability 1). The state carries the prefix, so search
    reorders it like any model's state. Attention is uniform over the real source tokens. As the
    interface says, `enc` has one row per sentence and the step rows are sentence-major, R // B each.
    """

    def __init__(self, tables: dict[int, dict[tuple, dict[int, float]]]):
        super().__init__()
        self.tables = tables

    def encode(self, src, src_mask):
        return {"first": src[:, 0], "src_mask": src_mask}

    def init_state(self, enc):
        return {"prefix": torch.zeros(enc["first"].size(0), 0, dtype=torch.long)}

    def step(self, prev, enc, state):
        prefix = torch.cat([state["prefix"], prev[:, None]], 1)  # (R, T) with BOS first
        per_sentence = prev.size(0) // enc["first"].size(0)
        probs = torch.zeros(prev.size(0), V)
        for row, (first, tokens) in enumerate(
            zip(enc["first"].repeat_interleave(per_sentence).tolist(), prefix[:, 1:].tolist())
        ):
            for token, p in self.tables[first].get(tuple(tokens), {EOS: 1.0}).items():
                probs[row, token] = p
        mask = enc["src_mask"].float().repeat_interleave(per_sentence, 0)
        return probs.log(), {"prefix": prefix}, mask / mask.sum(1, keepdim=True)


def scripted(*tables):
    """A model and a batch: sentence i has source token 10 + i and follows tables[i]."""
    model = Scripted({10 + i: table for i, table in enumerate(tables)})
    batch = make_batch([[10 + i] for i in range(len(tables))])
    return model, batch.src, batch.src_mask


def limit(src, n):
    return torch.full((src.size(0),), n)


def test_beam_finds_the_sentence_greedy_misses():
    model, src, mask = scripted(GREEDY_MISSES)
    greedy = greedy_search(model, src, mask, limit(src, 10))[0]
    assert greedy.tokens == [X, Y] and greedy.score == pytest.approx(math.log(0.5 * 0.4))
    best = beam_search(model, src, mask, limit(src, 10), k=2)[0][0]
    assert best.tokens == [W] and best.score == pytest.approx(math.log(0.4 * 0.9))


def test_length_penalty_changes_the_winner_as_computed_on_paper():
    model, src, mask = scripted(PENALTY_FLIPS)
    plain = beam_search(model, src, mask, limit(src, 10), k=2, alpha=0.0, nbest=2)[0]
    assert [h.tokens for h in plain] == [[X], [Y, Y, Y]]
    assert [h.norm_score for h in plain] == pytest.approx([math.log(0.36), math.log(0.3)])
    penalised = beam_search(model, src, mask, limit(src, 10), k=2, alpha=1.0, nbest=2)[0]
    assert [h.tokens for h in penalised] == [[Y, Y, Y], [X]]
    assert [h.norm_score for h in penalised] == pytest.approx([-1.2040 / 1.5, -1.0217 / (7 / 6)], abs=1e-4)
    assert penalised[0].score == pytest.approx(math.log(0.3)) and length_penalty(4, 1.0) == 1.5


@pytest.mark.parametrize("max_len", [1, 2, 3])
def test_max_length_is_respected(max_len):
    model, src, mask = scripted(PENALTY_FLIPS, GREEDY_MISSES)
    lengths = torch.tensor([max_len, max_len + 1])  # per sentence
    for hyps, n in zip(beam_search(model, src, mask, lengths, k=3, nbest=3), lengths.tolist()):
        assert hyps and all(len(h.tokens) <= n and h.attention.size(0) <= n for h in hyps)
    for hyp, n in zip(greedy_search(model, src, mask, lengths), lengths.tolist()):
        assert len(hyp.tokens) <= n
    # cut at one step, the best sentence is the likeliest first word with no EOS
    assert beam_search(model, src, mask, torch.tensor([1, 1]), k=2)[0][0].tokens == [X]


def test_min_length_is_respected():
    model, src, mask = scripted(PENALTY_FLIPS, GREEDY_MISSES)
    for hyps in beam_search(model, src, mask, limit(src, 10), k=3, min_len=2, nbest=3):
        assert hyps and all(len(h.tokens) >= 2 for h in hyps)
    assert [h.tokens for h in greedy_search(model, src, mask, limit(src, 10), min_len=2)] == [[X, W, W, W], [X, Y]]


def test_nbest_is_sorted_and_distinct():
    model, src, mask = scripted(PENALTY_FLIPS, GREEDY_MISSES)
    for alpha in (0.0, 0.6):
        for hyps in beam_search(model, src, mask, limit(src, 6), k=4, alpha=alpha, nbest=4):
            assert len(hyps) == 4
            scores = [h.norm_score for h in hyps]
            assert scores == sorted(scores, reverse=True)
            assert len({tuple(h.tokens) for h in hyps}) == 4


def test_scripted_sentences_alone_equal_in_a_batch():
    model, src, mask = scripted(PENALTY_FLIPS, GREEDY_MISSES, PENALTY_FLIPS)
    together = beam_search(model, src, mask, limit(src, 8), k=3, alpha=0.6, nbest=3)
    for row in range(3):
        alone = beam_search(model, src[row : row + 1], mask[row : row + 1], limit(src, 8)[:1], k=3, alpha=0.6, nbest=3)[
            0
        ]
        assert [(h.tokens, h.score) for h in alone] == [(h.tokens, h.score) for h in together[row]]


def test_sampling_filters_and_keeps_limits():
    logp = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert torch.isinf(filter_logits(logp, 1.0, 2, 1.0)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logp, 1.0, 0, 0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logp, 1.0, 0, 0.5)).tolist() == [[False, True, True, True]]
    model, src, mask = scripted(GREEDY_MISSES, PENALTY_FLIPS)
    gen = torch.Generator().manual_seed(0)
    samples = sample_search(model, src, mask, limit(src, 3), n=20, generator=gen, min_len=1)
    assert all(len(s) == 20 and all(1 <= len(h.tokens) <= 3 for h in s) for s in samples)
    assert len({tuple(h.tokens) for h in samples[0]}) > 1  # not just the greedy output
    top1 = sample_search(model, src, mask, limit(src, 10), n=3, top_k=1, generator=gen)
    assert all(h.tokens == g.tokens for s, g in zip(top1, greedy_search(model, src, mask, limit(src, 10))) for h in s)


# --- every model family ----------------------------------------------------------------------

VOCAB = 24
TINY = dict(dim=32, layers=2, heads=4, ffn_dim=64, dropout=0.0)  # keys every arch understands
PER_ARCH: dict[str, dict] = {}  # extra settings for an arch, if it needs any to be tiny


def tiny_model(arch: str, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(ModelConfig(arch=arch, **(TINY | PER_ARCH.get(arch, {}))), VOCAB, VOCAB, joint=True).eval()


def random_sources(seed: int = 0, lengths=(7, 3, 11, 5, 1)):
    g = torch.Generator().manual_seed(seed)
    return make_batch([torch.randint(4, VOCAB, (n,), generator=g).tolist() for n in lengths])


ARCHS = sorted(BUILDERS)


@pytest.mark.parametrize("arch", ARCHS)
def test_beam_1_equals_greedy(arch):
    model, batch = tiny_model(arch), random_sources()
    limits = torch.tensor([9, 4, 12, 6, 3])
    greedy = greedy_search(model, batch.src, batch.src_mask, limits)
    beam = beam_search(model, batch.src, batch.src_mask, limits, k=1)
    for g, (b,) in zip(greedy, beam):
        assert g.tokens == b.tokens
        assert g.score == pytest.approx(b.score, abs=1e-5)
        torch.testing.assert_close(g.attention, b.attention)


@pytest.mark.parametrize("arch", ["transformer", "bahdanau"])
def test_greedy_without_scores_gives_the_same_outputs(arch):
    """scores=False (nmt-translate's one text per line) skips the normaliser only: same tokens and attention,
    NaN scores; with a prefix too."""
    model, batch = tiny_model(arch), random_sources()
    limits = torch.tensor([9, 4, 12, 6, 3])
    prefix = torch.full((5, 2), 7)
    for pre in (None, prefix):
        scored = greedy_search(model, batch.src, batch.src_mask, limits, prefix=pre)
        unscored = greedy_search(model, batch.src, batch.src_mask, limits, prefix=pre, scores=False)
        for a, b in zip(scored, unscored):
            assert a.tokens == b.tokens and math.isfinite(a.score) and math.isnan(b.score)
            torch.testing.assert_close(a.attention, b.attention)


@pytest.mark.parametrize("arch", ARCHS)
def test_beam_alone_equals_in_a_batch(arch):
    model, batch = tiny_model(arch), random_sources(1)
    limits = torch.full((5,), 10)
    together = beam_search(model, batch.src, batch.src_mask, limits, k=5, alpha=0.6, nbest=3)
    for row in range(5):
        s = int(batch.src_mask[row].sum())
        alone = beam_search(
            model, batch.src[row : row + 1, :s], batch.src_mask[row : row + 1, :s], limits[:1], k=5, alpha=0.6, nbest=3
        )[0]
        assert [h.tokens for h in alone] == [h.tokens for h in together[row]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in together[row]], abs=1e-4)
        torch.testing.assert_close(alone[0].attention, together[row][0].attention, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_beam_scores_equal_recomputing_each_prefix(arch):
    """The cached, reordered decoder state gives what teacher forcing the whole output gives."""
    model, batch = tiny_model(arch, seed=1), random_sources(2)
    hyps = beam_search(model, batch.src, batch.src_mask, torch.full((5,), 8), k=4, nbest=4)
    with torch.no_grad():
        for row, options in enumerate(hyps):
            s = int(batch.src_mask[row].sum())
            enc = model.encode(batch.src[row : row + 1, :s], batch.src_mask[row : row + 1, :s])
            for h in options:
                steps = h.attention.size(0)
                out = (h.tokens + [EOS])[:steps]
                logits, attn = model.decoder(torch.tensor([[BOS] + out[:-1]]), enc, need_attn=True)
                score = logits.log_softmax(-1)[0, torch.arange(steps), torch.tensor(out)].sum()
                assert float(score) == pytest.approx(h.score, abs=1e-4)
                torch.testing.assert_close(attn[0], h.attention, atol=1e-5, rtol=1e-4)


# The model ranks PAD and BOS first (label smoothing gives them mass); no search may emit them.
SPECIALS_FIRST = {(): {PAD: 0.4, BOS: 0.3, X: 0.2, EOS: 0.1}, (X,): {BOS: 0.6, PAD: 0.3, EOS: 0.1}}


def test_pad_and_bos_are_never_emitted():
    model, src, mask = scripted(SPECIALS_FIRST, SPECIALS_FIRST)
    assert [h.tokens for h in greedy_search(model, src, mask, limit(src, 5))] == [[X], [X]]
    assert greedy_search(model, src, mask, limit(src, 5))[0].score == pytest.approx(math.log(0.2 * 0.1))
    for hyps in beam_search(model, src, mask, limit(src, 5), k=2, nbest=2):
        assert [h.tokens for h in hyps] == [
            [],
            [X],
        ]  # EOS at once (p .1) beats X EOS (.2 * .1); nothing else is allowed
    samples = sample_search(model, src, mask, limit(src, 5), n=50, generator=torch.Generator().manual_seed(0))
    assert all(PAD not in h.tokens and BOS not in h.tokens for hyps in samples for h in hyps)


class CountingSteps:
    """A model that counts the rows its steps run, and likes EOS more than the random model does (so hypotheses
    finish while others live on)."""

    def __init__(self, model, eos_bias: float = 2.0):
        self.model, self.rows, self.eos_bias = model, 0, eos_bias

    def __getattr__(self, name):
        return getattr(self.model, name)

    def step(self, prev, enc, state, **kwargs):
        self.rows += prev.numel()
        logits, state, attn = self.model.step(prev, enc, state, **kwargs)
        logits = logits.clone()
        logits[:, EOS] += self.eos_bias
        return logits, state, attn


@pytest.mark.parametrize("arch", ARCHS)
def test_the_early_exit_returns_what_the_search_without_it_returns_in_fewer_steps(arch, monkeypatch):
    """A sentence leaves the beam once no live hypothesis can beat its nbest-th finished one (a summed
    log-probability only falls): the same n-best lists and scores, for any length penalty; fewer step rows."""
    from nmt import search

    model, batch = tiny_model(arch, seed=3), random_sources(2, lengths=(7, 3, 11, 5, 1, 9, 4))
    limits = torch.full((7,), 14)
    fewer = 0
    for alpha, nbest in ((0.0, 1), (0.0, 3), (0.6, 1), (1.0, 2)):
        runs = {}
        for exit_on in (True, False):
            monkeypatch.setattr(search._Beams, "early_exit", exit_on)
            counted = CountingSteps(model)
            found = beam_search(counted, batch.src, batch.src_mask, limits, 4, alpha=alpha, nbest=nbest)
            runs[exit_on] = (found, counted.rows)
        (with_exit, rows_exit), (without, rows_full) = runs[True], runs[False]
        for a, b in zip(with_exit, without):
            assert [h.tokens for h in a] == [h.tokens for h in b]
            assert [h.norm_score for h in a] == pytest.approx([h.norm_score for h in b], abs=1e-6)
        assert rows_exit <= rows_full
        fewer += rows_exit < rows_full
    assert fewer >= 1  # at alpha 0 the exit saves steps on these sentences


@pytest.mark.parametrize("width", [8000, 6350, 40, 37])  # blocks of 64, of 50; one block or none: plain argmax
def test_row_argmax_and_row_topk_equal_torch_with_ties(width):
    from nmt.search import row_argmax, row_topk

    g = torch.Generator().manual_seed(width)
    x = torch.randint(-5, 6, (9, width), generator=g).float()  # few distinct values: ties everywhere
    x[0] = 3.0  # a row of equal values
    x[1, -1] = 100.0  # the largest value last
    assert torch.equal(row_argmax(x), x.argmax(1))  # the first largest, as argmax
    y = torch.randn(9, width, generator=g)
    values, index = row_topk(y, 5)
    want = y.topk(5, dim=1)
    assert torch.equal(values, want.values) and torch.equal(index, want.indices)


@pytest.mark.parametrize("step, min_len", [(0, 0), (1, 3)])
def test_greedy_choice_equals_argmax_of_log_probs(step, min_len):
    from nmt.search import greedy_choice, log_probs

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 640, generator=g) * 4
    logits[0, PAD] = logits[1, BOS] = logits[2, EOS] = 50.0  # the forbidden tokens are the largest logits
    logp = log_probs(logits.clone(), step, min_len)
    tokens, gained = greedy_choice(logits.clone(), step, min_len)
    assert torch.equal(tokens, logp.argmax(1)) and not bool(torch.isin(tokens, torch.tensor([PAD, BOS])).any())
    assert (int(tokens[2]) == EOS) == (step >= min_len)
    assert torch.allclose(gained, logp.gather(1, tokens[:, None]).squeeze(1), atol=1e-5)
    unscored, none = greedy_choice(logits.clone(), step, min_len, scores=False)
    assert torch.equal(unscored, tokens) and none is None
