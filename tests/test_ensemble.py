"""Ensembles: the mean of the models' log-probabilities, through the one search; checkpoint=a,b on the command line."""

import pytest
import torch

from nmt.cli import translate
from nmt.config import Config, DataConfig, ModelConfig
from nmt.data.tokenizer import BOS, EOS, Tokenizer
from nmt.models.builders import build_model
from nmt.models.ensemble import Ensemble
from nmt.search import beam_search, greedy_search
from nmt.training.checkpoint import save_checkpoint
from tests.conftest import random_batch, write
from tests.test_cli import cli

VOCAB = 30


def members():
    torch.manual_seed(0)
    transformer = build_model(
        ModelConfig(dim=32, layers=2, heads=4, ffn_dim=64, dropout=0.0), VOCAB, VOCAB, joint=True
    ).eval()
    rnn = build_model(
        ModelConfig(arch="bahdanau", cell="gru", score="additive", dim=32, layers=1, dropout=0.0),
        VOCAB,
        VOCAB,
        joint=True,
    ).eval()
    return transformer, rnn


def test_one_model_alone_or_twice_decodes_as_itself():
    model, _ = members()
    batch = random_batch(VOCAB, src_lens=(7, 3, 5, 1), tgt_lens=(1, 1, 1, 1))
    limits = torch.full((4,), 8)
    alone = beam_search(model, batch.src, batch.src_mask, limits, k=3, alpha=0.6, nbest=2)
    for ensemble in (Ensemble([model]), Ensemble([model, model])):
        together = beam_search(ensemble, batch.src, batch.src_mask, limits, k=3, alpha=0.6, nbest=2)
        assert [[h.tokens for h in hyps] for hyps in together] == [[h.tokens for h in hyps] for hyps in alone]
        assert [h.score for hyps in together for h in hyps] == pytest.approx(
            [h.score for hyps in alone for h in hyps], abs=1e-5
        )


def test_ensemble_scores_are_the_renormalised_mean_of_the_members_log_probabilities():
    """Scores of the ensemble's beam hypotheses, recomputed by teacher forcing each member separately."""
    transformer, rnn = members()
    ensemble = Ensemble([transformer, rnn])
    batch = random_batch(VOCAB, src_lens=(7, 3, 5), tgt_lens=(1, 1, 1), seed=4)
    limits = torch.full((3,), 7)
    hyps = beam_search(ensemble, batch.src, batch.src_mask, limits, k=4, nbest=4)
    assert [h.tokens for h in greedy_search(ensemble, batch.src, batch.src_mask, limits)] == [
        beam_search(ensemble, batch.src, batch.src_mask, limits, k=1)[i][0].tokens for i in range(3)
    ]
    with torch.no_grad():
        for row, options in enumerate(hyps):
            s = int(batch.src_mask[row].sum())
            src, mask = batch.src[row : row + 1, :s], batch.src_mask[row : row + 1, :s]
            for h in options:
                steps = h.attention.size(0)
                out = (h.tokens + [EOS])[:steps]
                tgt_in = torch.tensor([[BOS] + out[:-1]])
                mean = torch.stack(
                    [m.decoder(tgt_in, m.encoder(src, mask))[0].log_softmax(-1) for m in (transformer, rnn)]
                ).mean(0)
                score = mean.log_softmax(-1)[0, torch.arange(steps), torch.tensor(out)].sum()
                assert float(score) == pytest.approx(h.score, abs=1e-4)
                torch.testing.assert_close(h.attention.sum(-1), torch.ones(steps))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Two checkpoints with one tokenizer (different architectures), one with another tokenizer."""
    folder = tmp_path_factory.mktemp("ensemble")
    words = "the a cat dog sat on mat house red blue big small runs sees".split()
    corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(5)) for i in range(100)]
    shared, other = (
        Tokenizer.train(corpus, corpus, 60, "unigram", joint=True),
        Tokenizer.train(corpus, corpus, 50, "bpe", joint=True),
    )
    paths = []
    for name, tokenizer, model_cfg in (
        ("transformer", shared, ModelConfig(dim=16, layers=1, heads=2, ffn_dim=32, dropout=0.0)),
        ("bahdanau", shared, ModelConfig(arch="bahdanau", cell="gru", score="additive", dim=16, layers=1, dropout=0.0)),
        ("other", other, ModelConfig(dim=16, layers=1, heads=2, ffn_dim=32, dropout=0.0)),
    ):
        torch.manual_seed(len(paths))
        cfg = Config(data=DataConfig(train="unused"), model=model_cfg)
        save_checkpoint(
            folder / f"{name}.pt",
            build_model(model_cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, True),
            cfg,
            tokenizer,
            step=0,
        )
        paths.append(folder / f"{name}.pt")
    return paths


def test_command_line_ensemble_and_a_vocabulary_mismatch(checkpoints, tmp_path, capsys):
    a, b, other = checkpoints
    source = write(tmp_path / "in.txt", ["the cat sat", "", "a big dog runs"])
    fast = ["decode.max_len_a=0", "decode.max_len_b=5", "decode=beam", "decode.beam=3"]
    code, _, err = cli(
        translate.main, [f"checkpoint={a},{b}", f"input={source}", f"output={tmp_path / 'out.txt'}", *fast], capsys
    )
    assert code == 0, err
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").count("\n") == 3
    assert "sentences/s" in err and "tokens/s" in err
    code, _, err = cli(
        translate.main, [f"checkpoint={a},{other}", f"input={source}", f"output={tmp_path / 'bad.txt'}", *fast], capsys
    )
    assert code == 2 and f"error: {other}: its vocabulary differs from {a}'s" in err and err.count("\n") == 1
    assert not (tmp_path / "bad.txt").exists()
