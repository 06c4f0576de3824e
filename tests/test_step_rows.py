"""The decoding step with several rows per sentence (beam hypotheses over one copy of the sentence's
encoding) equals the step over a copy per row; the position table equals the computed positions."""

import pytest
import torch

from nmt.config import ModelConfig
from nmt.data.tokenizer import BOS
from nmt.models.builders import build_model
from nmt.models.seq2seq import reorder
from nmt.models.transformer import POSITIONS, sinusoidal_positions
from tests.conftest import random_batch

VOCAB = 30
MODELS = {
    "transformer": dict(arch="transformer", heads=4, ffn_dim=64),
    "bahdanau": dict(arch="bahdanau", cell="gru", score="additive"),
    "luong": dict(arch="luong", cell="lstm", score="general"),
    "luong_local_m": dict(arch="luong", cell="gru", score="dot", window="local_m", window_size=2),
    "luong_local_p": dict(arch="luong", cell="gru", score="general", window="local_p", window_size=2),
    "luong_location": dict(arch="luong", cell="lstm", score="location", input_feeding=False),
    "hard": dict(arch="luong", cell="lstm", score="general", attention="hard"),
}


@pytest.mark.parametrize("name", MODELS)
def test_rows_sharing_a_sentence_equal_rows_with_their_own_copy(name):
    torch.manual_seed(0)
    model = build_model(ModelConfig(dim=32, layers=2, dropout=0.0, **MODELS[name]), VOCAB, VOCAB, joint=True).eval()
    batch = random_batch(VOCAB, src_lens=(7, 3, 5), tgt_lens=(1, 1, 1))
    per_sentence = 4
    tile = torch.arange(3).repeat_interleave(per_sentence)  # (R,) the sentence of each row
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        enc = model.encode(batch.src, batch.src_mask)
        shared = reorder(model.init_state(enc), tile)  # R rows over 3 sentences
        own_enc = reorder(enc, tile)  # R rows, each with its own copy
        own = model.init_state(own_enc)
        prev = torch.full((tile.numel(),), BOS)
        for _ in range(4):
            logits_a, shared, attn_a = model.step(prev, enc, shared)
            logits_b, own, attn_b = model.step(prev, own_enc, own)
            torch.testing.assert_close(logits_a, logits_b, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(attn_a, attn_b, atol=1e-5, rtol=1e-5)
            prev = torch.randint(4, VOCAB, (tile.numel(),), generator=g)  # rows of one sentence now differ
            keep = torch.randperm(per_sentence, generator=g)  # and follow other rows of their sentence, as beams do
            rows = (torch.arange(3)[:, None] * per_sentence + keep).reshape(-1)
            shared, own = reorder(shared, rows), reorder(own, rows)


def test_position_table_equals_the_computed_positions_and_is_not_saved():
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(dim=32, layers=1, heads=4, ffn_dim=64, dropout=0.0), VOCAB, VOCAB, joint=True
    ).eval()
    embed = model.decoder.embed
    tokens = torch.randint(4, VOCAB, (2, 5))
    for offset in (0, 3, POSITIONS - 2, POSITIONS + 10):  # the last two cross and pass the table's end
        want = embed.tokens(tokens) * 32**0.5 + sinusoidal_positions(5, 32, offset)
        torch.testing.assert_close(embed(tokens, offset), want, atol=0, rtol=0)
    assert not any("positions" in key for key in model.state_dict())  # checkpoints keep their names
