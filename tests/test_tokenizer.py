import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nmt.data.tokenizer import BOS, EOS, PAD, UNK, Tokenizer

SENTENCES = ["the cat sat on the mat", "a dog ran in the park", "the bird sang a song"] * 5


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_round_trip_and_special_ids(model_type):
    tok = Tokenizer.train(SENTENCES, [s.upper() for s in SENTENCES], vocab_size=1000, model_type=model_type, joint=True)
    assert tok.src_vocab_size < 1000  # shrinks to what a tiny corpus supports
    assert [tok.src.id_to_piece(i) for i in (PAD, UNK, BOS, EOS)] == ["<pad>", "<unk>", "<s>", "</s>"]
    ids = tok.encode_tgt(["THE CAT SAT"])
    assert tok.decode_tgt(ids) == ["THE CAT SAT"]
    assert all(i > EOS for i in ids[0])


def test_separate_vocabularies_and_state_round_trip():
    tok = Tokenizer.train(SENTENCES, ["der hund lief"] * 10, vocab_size=40, model_type="unigram", joint=False)
    assert not tok.joint and tok.src_vocab_size != tok.tgt_vocab_size
    again = Tokenizer.from_state(tok.state())
    assert again.encode_src(["the cat"]) == tok.encode_src(["the cat"])
    assert again.decode_tgt(again.encode_tgt(["der hund"])) == ["der hund"]


# --- properties on arbitrary Unicode text --------------------------------------------------------
# Training text in several scripts; with character_coverage=1.0 each of its characters is in the vocabulary.
SCRIPTS = [
    "the quick brown fox jumps",
    "Straße über Äpfel é ñ ç",
    "ελληνικά κείμενα",
    "русский текст",
    "日本語のテキスト",
    "عربي نص",
    "emoji 😀 🚀 ok",
    "FIGURES 0123456789 A B",
]
# What users type besides that: other whitespace and line breaks, and compatibility forms NFKC folds into it.
VARIANTS = "\t\r\n\u00a0\u2028\u3000\u2003ﬁＡＢ０１"
FOLD = str.maketrans("ＡＢ０１", "AB01")  # NFKC of the full-width forms (and "ﬁ" -> "fi")


@pytest.fixture(scope="module")
def multi_script():
    return Tokenizer.train(SCRIPTS * 10, SCRIPTS * 10, 300, "unigram", joint=True)


@settings(max_examples=200, deadline=None)
@given(text=st.text())
def test_any_unicode_text_encodes_to_valid_ids(multi_script, text):
    ids = multi_script.encode_src([text])[0]
    assert all(EOS < i < multi_script.src_vocab_size or i == UNK for i in ids)
    assert isinstance(multi_script.decode_tgt([ids])[0], str)


@settings(max_examples=200, deadline=None)
@given(text=st.text(st.sampled_from(sorted(set("".join(SCRIPTS)) | set(VARIANTS))), max_size=40))
def test_round_trip_gives_the_normalized_text(multi_script, text):
    """decode(encode(x)) is x as SentencePiece normalizes it (NFKC, whitespace runs to one space, ends
    trimmed), for text whose normalized characters are in the vocabulary; no character is lost or added."""
    sp = multi_script.src
    if not hasattr(sp, "normalize"):
        pytest.skip("SentencePiece < 0.2 has no normalize()")
    normalized = sp.normalize(text)  # spaces shown as "▁", with a leading "▁" unless empty
    assert all(sp.piece_to_id(c) != UNK for c in normalized.replace("▁", ""))
    assert multi_script.decode_tgt(multi_script.encode_tgt([text]))[0] == normalized.removeprefix("▁").replace("▁", " ")
    assert normalized.replace("▁", " ").split() == text.replace("ﬁ", "fi").translate(FOLD).split()


def test_a_large_corpus_is_sampled_the_same_way_each_time():
    from nmt.data.tokenizer import sample_lines

    lines = [f"line {i}" for i in range(1000)]
    sample = sample_lines(lines, 100)
    assert len(sample) == 100 and sample == sample_lines(
        lines, 100
    )  # seeded: every process trains on the same sentences
    assert sample == sorted(sample, key=lines.index) and len(set(sample)) == 100  # in corpus order, no repeats
    assert sample_lines(lines, 1000) is lines
