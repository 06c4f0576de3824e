"""Lexically constrained beam search: the outputs contain every constraint phrase (where the beam and length
allow), never an avoided phrase, for every model family; and the per-line settings reach it from the CLI, the API
and the server."""

import json

import pytest
import torch

import nmt
from nmt.cli import translate as translate_cli
from nmt.constraints import advance_progress, allocate, constrained_beam_search, satisfied
from tests.test_cli import cli
from tests.test_search import ARCHS, random_sources, tiny_model
from tests.test_serve import trained_pair


def test_progress_and_allocation_worked_by_hand():
    phrases = [(5, 6, 7), (9,)]
    assert advance_progress((0, 0), [5], phrases) == (1, 0)
    assert advance_progress((1, 0), [5, 6], phrases) == (2, 0)
    assert advance_progress((2, 0), [5, 6, 8], phrases) == (0, 0)  # left the phrase half-way: progress lost
    assert advance_progress((2, 0), [5, 6, 5], phrases) == (1, 0)  # ... but a new start counts
    assert advance_progress((2, 0), [5, 6, 7], phrases) == (3, 0)  # met
    assert advance_progress((3, 0), [5, 6, 7, 1, 9], phrases) == (3, 1)  # met phrases stay met
    # K = 4 over progress levels 0..3 (one place each); level 2 is empty, so its place goes to the most advanced
    banks = {3: ["a3", "b3"], 1: ["a1"], 0: ["a0", "b0", "c0"]}
    assert allocate(4, banks, 3) == ["a3", "a1", "a0", "b3"]


@pytest.mark.parametrize("arch", ARCHS)
def test_every_output_holds_its_constraints_and_none_of_the_avoided(arch):
    model, batch = tiny_model(arch, seed=4), random_sources(5)
    constraints = [[(9, 10)], [(7,), (12,)], [], [(20, 21, 22)], [(5,)]]
    plain = constrained_beam_search(model, batch.src, batch.src_mask, torch.full((5,), 10), 4, [[]] * 5)
    avoid = [  # each sentence's own first choice, unless it is a constraint's token
        [(h[0].tokens[0],)] if h[0].tokens and all(h[0].tokens[0] not in p for p in need) else []
        for h, need in zip(plain, constraints)
    ]
    found = constrained_beam_search(
        model, batch.src, batch.src_mask, torch.full((5,), 10), 5, constraints, avoid, alpha=0.6, nbest=2
    )
    for hyps, need, ban in zip(found, constraints, avoid):
        assert hyps and satisfied(hyps[0].tokens, need), (hyps[0].tokens, need)
        for h in hyps:
            assert not any(tuple(h.tokens[i : i + len(p)]) == p for p in ban for i in range(len(h.tokens)))
            assert h.attention.size(0) >= len(h.tokens)
        for h in hyps:
            assert h.attention.size(1) <= batch.src.size(1)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("k", [1, 4])
def test_a_prefix_is_forced_first_and_the_constraints_still_hold(arch, k):
    """The interactive case: every output starts with its prefix and holds its constraints; a constraint the prefix
    already contains counts as met (the output need not repeat it); without constraints the result is plain beam
    search's from the same prefix (the same tokens)."""
    from nmt.search import beam_search, greedy_search

    model, batch = tiny_model(arch, seed=4), random_sources(4)  # 5 sentences
    max_len = torch.full((5,), 12)
    prefix = [[9, 10], [7], [11, 12, 13], [5, 6], [8]]
    constraints = [[(20, 21)], [(7,), (12,)], [(12, 13)], [(5, 6)], [(14,)]]  # sentences 2 and 3: met by the prefix
    found = constrained_beam_search(model, batch.src, batch.src_mask, max_len, k, constraints, prefix=prefix)
    for hyps, start, need in zip(found, prefix, constraints):
        tokens = hyps[0].tokens
        assert tokens[: len(start)] == start and satisfied(tokens, need), (tokens, start, need)
    for b in (2, 3):  # nothing left to force: the search is free after the prefix
        assert found[b][0].tokens.count(prefix[b][0]) >= 1
    free = constrained_beam_search(model, batch.src, batch.src_mask, max_len, k, [[]] * 5, prefix=[[9, 10]] * 5)
    tensor = torch.tensor([[9, 10]] * 5)
    plain = (
        [[h] for h in greedy_search(model, batch.src, batch.src_mask, max_len, prefix=tensor)]
        if k == 1
        else beam_search(model, batch.src, batch.src_mask, max_len, k, prefix=tensor)
    )
    assert [h[0].tokens for h in free] == [h[0].tokens for h in plain]
    for a, b in zip(free, plain):
        assert abs(a[0].score - b[0].score) < 1e-4


@pytest.mark.parametrize("arch", ARCHS)
def test_repetition_control_holds_in_the_constrained_search(arch):
    """no_repeat_ngram_size and repetition_penalty are honoured with constraints, not dropped: no output repeats
    a bigram (outside what its constraints and prefix force), and the penalty changes what is chosen."""
    from nmt.search import Repetition

    model, batch = tiny_model(arch, seed=4), random_sources(5)
    max_len = torch.full((5,), 16)
    constraints = [[(9,)], [(7,)], [], [(20,)], [(5,)]]
    found = constrained_beam_search(
        model, batch.src, batch.src_mask, max_len, 3, constraints, repetition=Repetition(no_repeat=2)
    )
    for hyps, need in zip(found, constraints):
        tokens = hyps[0].tokens
        grams = [tuple(tokens[i : i + 2]) for i in range(len(tokens) - 1)]
        assert len(grams) == len(set(grams)), tokens
        assert satisfied(tokens, need)
    plain = constrained_beam_search(model, batch.src, batch.src_mask, max_len, 3, constraints)
    penalised = constrained_beam_search(
        model, batch.src, batch.src_mask, max_len, 3, constraints, repetition=Repetition(penalty=5.0)
    )
    assert [h[0].tokens for h in plain] != [h[0].tokens for h in penalised]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, toy_dir):
    return trained_pair(tmp_path_factory, toy_dir)


def test_constraints_from_the_api_the_cli_and_the_server(runs, toy_dir, tmp_path, capsys):
    sources = (toy_dir / "test.src").read_text().splitlines()[:4]
    model = nmt.load(runs["b"], beam=4, max_len_a=1.0, max_len_b=8)
    words = ["pulkor", "hel"]
    out = model.translate(sources, constraints=[words[:1], [], words, [words[1]]])
    assert words[0] in out[0] and all(w in out[2] for w in words) and words[1] in out[3]
    assert all(words[0] not in text for text in model.translate(sources, avoid=[words[0]]))
    typed = model.translate(sources, prefix="hel", constraints=words[:1], no_repeat_ngram_size=3)
    assert all(text.startswith("hel") and words[0] in text for text in typed)
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": sources[0], "constraints": words}) + "\n\n")
    code, _, err = cli(
        translate_cli.main,
        [
            f"checkpoint={runs['b']}",
            f"input={src}",
            f"output={tmp_path}/out",
            "input_format=jsonl",
            "decode=beam",
            "decode.max_len_a=1.0",
            "decode.max_len_b=8",
        ],
        capsys,
    )
    assert code == 0, err
    lines = (tmp_path / "out").read_text().splitlines()
    assert len(lines) == 2 and all(w in lines[0] for w in words) and lines[1] == ""

    from starlette.testclient import TestClient

    from nmt.config import DecodeConfig, ServeSettings
    from nmt.serve.app import create_app
    from nmt.serve.models import load_model

    decode = DecodeConfig(beam=4, max_len_a=1.0, max_len_b=8)
    served = [load_model("a", runs["b"], decode, torch.device("cpu"))]
    with TestClient(create_app(served, ServeSettings(access_log=False), decode), base_url="http://localhost") as c:
        reply = c.post("/v1/translate", json={"text": sources[:2], "constraints": words, "avoid": ["vu"]})
        assert reply.status_code == 200, reply.text
        for result in reply.json()["translations"]:
            assert all(w in result["text"] for w in words)
        typed = c.post("/v1/translate", json={"text": sources[:1], "prefix": "hel", "constraints": ["pulkor"]})
        assert typed.status_code == 200, typed.text
        text = typed.json()["translations"][0]["text"]
        assert text.startswith("hel") and "pulkor" in text
        bad = c.post("/v1/translate", json={"text": sources[:2], "constraints": "pulkor"})
        assert bad.status_code == 422 and bad.json()["field"] == "constraints"
