"""Model.stream (nmt.streaming): the final event is Model.translate's answer for every model family, greedy and beam;
one event per decoding step, each a real hypothesis of the search; what does not stream is refused in one line.

The models are tiny and untrained (random weights, a SentencePiece model of 64 pieces trained on the toy corpus in
memory): their outputs run to the length limit, which gives long streams in milliseconds. A scripted decoder with
hand-written probabilities (tests/test_search.py) checks the top of the beam changing course and finished_only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nmt.api import Loaded, Model
from nmt.config import Config, DecodeConfig, ModelConfig
from nmt.data.tokenizer import BOS, EOS, Tokenizer
from nmt.engine import decoding_copy
from nmt.errors import NmtError
from nmt.models.builders import build_model
from nmt.models.ensemble import Ensemble
from nmt.streaming import NotStreamable, stream_steps
from nmt.translation import Translator
from tests.test_search import GREEDY_MISSES, PENALTY_FLIPS, Scripted, W, X, Y

FAMILIES = {
    "transformer": dict(arch="transformer", heads=2, ffn_dim=64),
    "bahdanau": dict(arch="bahdanau"),
    "luong": dict(arch="luong"),
    "luong_local_m": dict(arch="luong", window="local_m", window_size=2),
    "luong_local_p": dict(arch="luong", window="local_p", window_size=2),
    "hard": dict(arch="luong", attention="hard"),
}
DECODE = DecodeConfig(max_len_a=1.0, max_len_b=4)


@pytest.fixture(scope="module")
def tokenizer(toy_dir):
    src = (toy_dir / "train.src").read_text().splitlines()[:500]
    tgt = (toy_dir / "train.tgt").read_text().splitlines()[:500]
    return Tokenizer.train(src, tgt, 64, "unigram", joint=True)


@pytest.fixture(scope="module")
def lines(toy_dir):
    return (toy_dir / "test.src").read_text().splitlines()[:4]


def trained(family: str, tokenizer: Tokenizer, seed: int = 0) -> torch.nn.Module:
    """A tiny model of the family with random weights (the trained model: nmt.models)."""
    torch.manual_seed(seed)
    cfg = ModelConfig(dim=32, layers=1, dropout=0.0, **FAMILIES[family])
    return build_model(cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.joint).eval()


def api_model(model: torch.nn.Module, tokenizer: Tokenizer, precision: str = "fp32", **decode) -> Model:
    """nmt.Model over the decoding copy of `model` (as nmt.load makes it)."""
    copy = model if isinstance(model, Ensemble) else decoding_copy(model, precision)
    settings = DecodeConfig(**(vars(DECODE) | {"precision": precision} | decode))
    return Model(Loaded(copy, tokenizer, Config(), 0, "tiny"), settings, torch.device("cpu"), "tiny")


def output_steps(event) -> list[int]:
    """An event's output steps: its ids, and EOS where it has an EOS step."""
    return event.ids + [EOS] * (event.length - len(event.ids))


def check_events(events: list) -> None:
    """One final event, last; `keep` is the common start of consecutive events, whose attention agrees there."""
    assert [e.final for e in events] == [False] * (len(events) - 1) + [True]
    for before, event in zip(events, events[1:]):
        a, b = output_steps(before), output_steps(event)
        keep = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert event.keep == keep
        assert np.array_equal(event.attention[:keep], before.attention[:keep])
    for event in events:
        assert event.attention.shape[0] == event.length
        assert ((event.attention >= 0) & (event.attention <= 1 + 1e-6)).all()  # local-p's rows sum to less than 1


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("beam", [1, 3])
def test_the_final_event_is_the_translation(family, beam, tokenizer, lines):
    model = api_model(trained(family, tokenizer), tokenizer)
    progressive = 0
    for line in lines:
        events = list(model.stream(line, beam=beam, attention=True))
        final = events[-1]
        rich = model.translate(line, beam=beam, return_attention=True)
        assert final.text == rich.text == model.translate(line, beam=beam)  # the plain call too (it skips scores)
        assert final.tokens == rich.tokens[0] and final.score == pytest.approx(rich.scores[0], abs=1e-6)
        assert np.array_equal(final.attention, rich.attention[0])
        assert len(events) - 1 == final.step  # one event per decoding step
        check_events(events)
        if beam == 1:  # one path: each event extends the one before, and its attention is the final's start
            for before, event in zip(events, events[1:-1]):
                assert event.keep == before.length == event.length - 1
            assert all(np.array_equal(e.attention, final.attention[: e.length]) for e in events)
        progressive += len(events) > 2
    assert progressive >= len(lines) // 2  # these untrained models write long outputs: many steps to see


@pytest.mark.parametrize("family", ["transformer", "bahdanau", "luong_local_p"])
def test_each_beam_event_is_a_hypothesis_the_model_gives_under_teacher_forcing(family, tokenizer, lines):
    """The top of the beam is followed back through the search's back-pointers; its attention rows equal the
    attention of the same tokens fed to the trained model in one teacher-forced pass."""
    trained_model = trained(family, tokenizer, seed=1)
    model = api_model(trained_model, tokenizer)
    for line in lines[1:2]:
        src = torch.tensor([tokenizer.encode_src([line])[0] + [EOS]])
        enc = trained_model.encoder(src, torch.ones_like(src, dtype=torch.bool))
        for event in model.stream(line, beam=3, attention=True):
            steps = output_steps(event)
            with torch.no_grad():
                _, attention = trained_model.decoder(torch.tensor([[BOS] + steps[:-1]]), enc, need_attn=True)
            np.testing.assert_allclose(event.attention, attention[0].numpy(), atol=1e-5, rtol=1e-4)


def scripted_translator(tokenizer: Tokenizer, beam: int, alpha: float = 0.0) -> Translator:
    decode = DecodeConfig(beam=beam, alpha=alpha, max_len_a=0, max_len_b=10)
    return Translator(Scripted({10: GREEDY_MISSES, 11: PENALTY_FLIPS}), tokenizer, decode, torch.device("cpu"))


def stream_ids(translator: Translator, first: int, finished_only: bool = False) -> list[tuple[list[int], bool]]:
    return [(e.ids, e.finished) for e in stream_steps(translator, [first], None, False, finished_only)]


def test_the_top_of_the_beam_changes_course_and_finished_only_shows_finished_hypotheses(tokenizer):
    """GREEDY_MISSES, beam 2: X tops the beam; at step 2 "W" finishes (p .36) and no live hypothesis can beat it (X Y:
    .2), so the search ends there. PENALTY_FLIPS, beam 2, alpha 1: X, then Y Y overtakes it, Y Y Y; "X" finishes
    first, "Y Y Y" beats it by the length penalty."""
    beam = scripted_translator(tokenizer, 2)
    assert stream_ids(beam, 10) == [([X], False), ([W], True), ([W], True)]
    assert stream_ids(beam, 10, finished_only=True) == [([W], True), ([W], True)]
    flips = scripted_translator(tokenizer, 2, alpha=1.0)
    assert stream_ids(flips, 11) == [
        ([X], False),
        ([Y, Y], False),
        ([Y, Y, Y], False),
        ([Y] * 3, True),
        ([Y] * 3, True),
    ]
    assert [e.keep for e in stream_steps(flips, [11], None, False, False)] == [0, 0, 2, 3, 4]  # Y Y: a new course
    assert stream_ids(flips, 11, finished_only=True) == [([X], True), ([Y] * 3, True), ([Y] * 3, True)]
    greedy = scripted_translator(tokenizer, 1)
    assert stream_ids(greedy, 10) == [([X], False), ([X, Y], False), ([X, Y], True), ([X, Y], True)]
    assert stream_ids(greedy, 10, finished_only=True) == [([X, Y], True), ([X, Y], True)]


def test_prefix_sampling_repetition_ensemble_shortlist_and_int8_stream_as_they_translate(tokenizer, lines, tmp_path):
    base = trained("transformer", tokenizer)
    prefix = tokenizer.decode_tgt([[20, 30]])[0]
    plain = api_model(base, tokenizer)
    for options in (
        {"beam": 1, "prefix": prefix},
        {"beam": 3, "prefix": prefix},
        {"sampling": True, "seed": 5, "temperature": 1.5},
        {"beam": 3, "no_repeat_ngram_size": 2, "repetition_penalty": 1.2},
    ):
        for line in lines[:2]:
            events = list(plain.stream(line, attention=True, **options))
            check_events(events)
            assert events[-1].text == plain.translate(line, **options), options
            if "prefix" in options:
                start = tokenizer.encode_tgt([prefix])[0]
                assert all(e.ids[: len(start)] == start for e in events)
    ensemble = Ensemble([decoding_copy(base), decoding_copy(trained("luong", tokenizer))]).eval()
    vmap = tmp_path / "vmap.txt"
    pieces = [tokenizer.tgt.id_to_piece(i) for i in range(tokenizer.tgt_vocab_size)]
    vmap.write_text(
        "\t"
        + " ".join(pieces[4:14])
        + "\n"
        + "".join(f"{p}\t{pieces[(7 * i) % 60 + 4]}\n" for i, p in enumerate(pieces[4:]))
    )
    for model in (
        api_model(ensemble, tokenizer),
        api_model(base, tokenizer, shortlist=str(vmap)),
        api_model(base, tokenizer, precision="int8"),
    ):
        for beam in (1, 3):
            events = list(model.stream(lines[0], beam=beam, attention=True))
            check_events(events)
            assert events[-1].text == model.translate(lines[0], beam=beam) and len(events) > 2


def test_what_does_not_stream_is_refused_in_one_line(tokenizer, lines):
    model = api_model(trained("transformer", tokenizer), tokenizer)
    for options, words in (
        ({"nbest": 2}, "nbest=2: a stream shows one hypothesis"),
        ({"beam": 3, "nbest": 3}, "nbest=3"),
        ({"constraints": ["pulkor"]}, "constraints: lexically constrained search does not stream"),
        ({"avoid": ["pulkor"]}, "avoid: lexically constrained search does not stream"),
    ):
        with pytest.raises(NotStreamable) as info:
            model.stream(lines[0], **options)  # refused at the call, before any decoding
        assert isinstance(info.value, ValueError) and words in str(info.value) and "\n" not in str(info.value)
    for call, words in (
        (lambda: model.stream(lines[:2]), "text: expected one string"),
        (lambda: model.stream(lines[0], sampling=True, prefix="pul"), "a target prefix with decode.sampling=true"),
        (lambda: model.stream(lines[0], bem=2), "bem: not a decoding setting"),
        (lambda: model.stream(lines[0], prefix=3), "prefix: expected a string or None"),
    ):
        with pytest.raises(NmtError, match=words):
            call()
    (blank,) = model.stream("   ", attention=True)
    assert blank.final and blank.text == model.translate("   ") == "" and blank.attention.shape == (0, 0)


def test_decoding_runs_only_as_the_events_are_read(tokenizer, lines):
    model = api_model(trained("bahdanau", tokenizer), tokenizer)
    calls = []
    step = model.loaded.model.step
    model.loaded.model.step = lambda *args, **kwargs: calls.append(1) or step(*args, **kwargs)
    events = model.stream(lines[0])
    assert not calls
    first, second = next(events), next(events)
    assert (first.step, second.step, len(calls)) == (1, 2, 2)
    events.close()  # the consumer stops: nothing more is decoded
    assert len(calls) == 2
