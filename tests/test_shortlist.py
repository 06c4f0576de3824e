"""The vocabulary shortlist: IBM Model 1 finds a dictionary's translations; a shortlisted step is the full step's
logits at the candidates' columns (every model, every precision); with every token a candidate, decoding is the
same as without; candidates include what prefixes and constraints name; the file's errors are one line."""

import numpy as np
import pytest
import torch

import nmt
from nmt.cli import shortlist as shortlist_cli
from nmt.cli import translate as translate_cli
from nmt.engine import decoding_copy
from nmt.engine.shortlist import Shortlisted
from nmt.search import beam_search, greedy_search
from nmt.shortlist import SPECIALS, Shortlist, ibm1
from tests.test_cli import cli
from tests.test_errors import one_error_line
from tests.test_search import ARCHS, VOCAB, random_sources, tiny_model
from tests.test_serve import trained_pair


def test_ibm1_learns_a_dictionary_from_shuffled_sentences():
    rng = np.random.default_rng(0)
    vocab = 40
    meaning = {s: (s * 7) % (vocab - SPECIALS) + SPECIALS for s in range(SPECIALS, vocab)}  # a bijection
    src, tgt = [], []
    for _ in range(400):
        words = rng.choice(np.arange(SPECIALS, vocab), size=rng.integers(2, 7), replace=False).tolist()
        src.append(words)
        tgt.append(rng.permutation([meaning[w] for w in words]).tolist())
    pair_s, pair_t, prob = ibm1(src, tgt, vocab, vocab, iterations=10)
    for s, t in meaning.items():
        mine = pair_s == s
        assert pair_t[mine][prob[mine].argmax()] == t
        assert prob[mine].sum() == pytest.approx(1.0)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("arch", ARCHS)
def test_a_shortlisted_step_is_the_full_step_at_the_candidates(arch, precision):
    model = decoding_copy(tiny_model(arch), precision)
    batch = random_sources()
    vocab = torch.tensor(sorted({0, 1, 2, 3, 9, 11, 17, 23, VOCAB - 1}))
    short = Shortlisted(model, vocab)
    enc = model.encode(batch.src, batch.src_mask)
    full_state, short_state = model.init_state(enc), short.init_state(enc)
    prev_local = torch.tensor([2, 5, 4, len(vocab) - 1, 2])  # BOS, then candidates by their local id
    with torch.inference_mode():
        for _ in range(3):
            full, full_state, attn = model.step(vocab[prev_local], enc, full_state)
            mine, short_state, attn_short = short.step(prev_local, enc, short_state)
            # an int8 cut on the native kernel has whole blocks of 64 outputs: the extra ones are -inf, no token
            assert mine.size(1) == short.vocab.numel() >= len(vocab)
            assert bool((mine[:, len(vocab) :] == float("-inf")).all())
            torch.testing.assert_close(mine[:, : len(vocab)], full[:, vocab], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(attn_short, attn)
            prev_local = mine.argmax(-1)


@pytest.mark.parametrize("arch", ARCHS)
def test_with_every_token_a_candidate_the_search_is_unchanged(arch):
    model, batch = tiny_model(arch), random_sources()
    limits = torch.tensor([9, 4, 12, 6, 3])
    short = Shortlisted(model, torch.arange(VOCAB))
    for plain, mine in (
        (
            greedy_search(model, batch.src, batch.src_mask, limits),
            greedy_search(short, batch.src, batch.src_mask, limits),
        ),
        (
            [h[0] for h in beam_search(model, batch.src, batch.src_mask, limits, 4, alpha=0.6)],
            [h[0] for h in beam_search(short, batch.src, batch.src_mask, limits, 4, alpha=0.6)],
        ),
    ):
        for a, b in zip(plain, mine):
            assert a.tokens == b.tokens and a.score == pytest.approx(b.score, abs=1e-5)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, toy_dir):
    return trained_pair(tmp_path_factory, toy_dir)


def test_nmt_shortlist_then_decoding_with_it_from_the_cli_and_the_api(runs, toy_dir, tmp_path, capsys):
    table = tmp_path / "shortlist.tsv"
    code, out, err = cli(shortlist_cli.main, [f"checkpoint={runs['b']}", f"out={table}", "frequent=30"], capsys)
    assert code == 0, err
    assert "source tokens x up to 20 candidates, 30 frequent tokens" in out
    lines = table.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("\t") and len(lines[0].split("\t")[1].split()) == 30  # the fixed line first
    assert all(len(line.split("\t")) == 2 for line in lines)
    sources = (toy_dir / "test.src").read_text().splitlines()[:20]
    model = nmt.load(runs["b"], beam=4, max_len_a=1.0, max_len_b=8)
    listed = nmt.load(runs["b"], beam=4, max_len_a=1.0, max_len_b=8, shortlist=str(table))
    loaded = Shortlist.read(str(table), listed.tokenizer)
    results = listed.translate(sources, rich=True)
    assert len(results) == len(sources)
    allowed = set(loaded.candidates(listed.tokenizer.encode_src(sources)))  # the union of every batch's candidates
    for result in results:
        assert {listed.tokenizer.tgt.piece_to_id(p) for p in result.tokens[0]} <= allowed
    assert len(allowed) < listed.tokenizer.tgt_vocab_size  # a real shortlist: not every token
    # every target piece as a fixed candidate: the same translations as without a shortlist
    every = tmp_path / "every.tsv"
    pieces = [listed.tokenizer.tgt.id_to_piece(i) for i in range(SPECIALS, listed.tokenizer.tgt_vocab_size)]
    every.write_text("\t" + " ".join(pieces) + "\n", encoding="utf-8")
    whole = nmt.load(runs["b"], beam=4, max_len_a=1.0, max_len_b=8, shortlist=str(every))
    assert whole.translate(sources) == model.translate(sources)
    assert whole.translate(sources[:3], prefix=["hel"] * 3) == model.translate(sources[:3], prefix=["hel"] * 3)
    out_file = tmp_path / "out.txt"
    src_file = tmp_path / "in.txt"
    src_file.write_text("\n".join(sources) + "\n")
    code, _, err = cli(
        translate_cli.main,
        [f"checkpoint={runs['b']}", f"input={src_file}", f"output={out_file}", f"decode.shortlist={table}"],
        capsys,
    )
    assert code == 0, err
    assert len(out_file.read_text().splitlines()) == len(sources)


def test_prefix_and_constraint_tokens_join_the_candidates(runs, toy_dir, tmp_path):
    table = tmp_path / "tiny.tsv"
    model = nmt.load(runs["b"], beam=4, max_len_a=1.0, max_len_b=8)
    tok = model.tokenizer
    fixed = [tok.tgt.id_to_piece(i) for i in range(SPECIALS, SPECIALS + 8)]
    table.write_text("\t" + " ".join(fixed) + "\n", encoding="utf-8")  # 8 fixed candidates, no dictionary
    listed = nmt.load(runs["b"], beam=4, max_len_a=1.0, max_len_b=8, shortlist=str(table))
    sources = (toy_dir / "test.src").read_text().splitlines()[:3]
    word = "pulkor"
    out = listed.translate(sources, constraints=[[word]] * 3)
    assert all(word in text for text in out)
    out = listed.translate(sources, prefix=[word] * 3)
    assert all(text.startswith(word) for text in out)


def test_shortlist_mistakes_are_one_line(runs, tmp_path, capsys):
    bad = tmp_path / "bad.tsv"
    piece = nmt.load(runs["b"]).tokenizer.tgt.id_to_piece(10)
    bad.write_text(f"\t{piece}\nno tab here\n", encoding="utf-8")
    src = tmp_path / "in.txt"
    src.write_text("a b\n")
    args = [f"checkpoint={runs['b']}", f"input={src}", f"output={tmp_path}/out"]
    code, _, err = cli(translate_cli.main, args + [f"decode.shortlist={bad}"], capsys)
    one_error_line(code, err, f"error: {bad}:2: expected SOURCE_PIECE<TAB>TARGET_PIECES")
    bad.write_text("\tzzqqxx\n", encoding="utf-8")
    code, _, err = cli(translate_cli.main, args + [f"decode.shortlist={bad}"], capsys)
    one_error_line(code, err, f"error: {bad}:1: 'zzqqxx' is not in the model's target vocabulary")
    code, _, err = cli(translate_cli.main, args + [f"decode.shortlist={tmp_path}/none.tsv"], capsys)
    one_error_line(code, err, f"error: decode.shortlist={tmp_path}/none.tsv: no such file")
    bad.write_text("\t" + "\n", encoding="utf-8")
    code, _, err = cli(translate_cli.main, args + [f"decode.shortlist={bad}", "decode=beam", "decode.beam=5"], capsys)
    one_error_line(code, err, "fixed candidates are fewer than decode.beam=5 + 2")
    assert not (tmp_path / "out").exists()
    code, _, err = cli(shortlist_cli.main, [f"checkpoint={runs['b']}", f"out={tmp_path}/s.tsv", f"src={src}"], capsys)
    one_error_line(code, err, "error: src and tgt go together")
