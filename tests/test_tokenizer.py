import pytest

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
