"""Subword sampling (BPE-dropout, unigram subword regularization): each epoch tokenizes the training pairs
afresh, reproducibly, into other segmentations of the very same text."""

import numpy as np
import pytest

from nmt.config import DataConfig
from nmt.data.dataset import prepare_data
from nmt.data.sampling import sampled_pairs
from nmt.training.trainer import Trainer
from tests.conftest import tiny_config


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def prepared(request, toy_dir, tmp_path_factory):
    data = DataConfig(
        train=str(toy_dir / "train"),
        valid=str(toy_dir / "valid"),
        vocab_size=200,
        spm_model=request.param,
        cache_dir=str(tmp_path_factory.mktemp("cache")),
    )
    return prepare_data(data, log=lambda line: None)


def rows(pairs, side: int, count: int) -> list[list[int]]:
    batch = pairs.batch(list(range(count)))
    ids, mask = (batch.src, batch.src_mask) if side == 0 else (batch.tgt_out, batch.tgt_out > 0)
    return [row[m][:-1].tolist() for row, m in zip(ids, mask)]  # without EOS


def test_a_sample_is_another_segmentation_of_the_same_text(prepared):
    split, tok = prepared.splits["train"], prepared.tokenizer
    n = len(split)
    cached, sampled = split.lengths(), sampled_pairs(split, tok, (0.3, 0.3), seed=1, epoch=0)
    src, tgt = rows(sampled, 0, n), rows(sampled, 1, n)
    assert tok.src.decode(src) == list(split.src_text) and tok.decode_tgt(tgt) == list(split.tgt_text)
    assert src != rows(split, 0, n) and tgt != rows(split, 1, n)
    assert sum(sampled.lengths()[0]) > sum(cached[0]) and sum(sampled.lengths()[1]) > sum(
        cached[1]
    )  # finer on the whole


def test_the_same_seed_and_epoch_give_the_same_sample(prepared):
    split, tok = prepared.splits["train"], prepared.tokenizer
    sample = lambda seed, epoch: rows(sampled_pairs(split, tok, (0.3, 0.3), seed, epoch), 0, 200)  # noqa: E731
    first = sample(1, 0)
    sample(1, 1)  # another draw in between
    assert sample(1, 0) == first and sample(1, 1) != first and sample(2, 0) != first


def test_a_side_at_zero_keeps_the_cached_ids(prepared):
    split, tok = prepared.splits["train"], prepared.tokenizer
    sampled = sampled_pairs(split, tok, (0.0, 0.3), seed=1, epoch=0)
    assert rows(sampled, 0, 50) == rows(split, 0, 50) and rows(sampled, 1, 50) != rows(split, 1, 50)


def test_training_resamples_each_epoch_and_covers_every_pair_once(toy_dir, tmp_path):
    cfg = tiny_config(toy_dir, tmp_path / "cache")
    cfg.data.src_subword_alpha = cfg.data.tgt_subword_alpha = 0.2
    t = Trainer(cfg, tmp_path / "run", log=lambda line: None)
    n = len(t.data.splits["train"])
    epochs, batchings = [], []
    for epoch in (0, 1, 0):  # epoch 0 again, as a resumed run makes it: the same sample and batches
        t.epoch = epoch
        batches = t.epoch_batches()
        assert sorted(i for b in batches for i in b) == list(range(n))
        epochs.append(np.asarray(t.epoch_lens))
        batchings.append(batches)
        assert t.my_batches(batches[:1])[0].src.shape[1] == max(t.epoch_lens[0][i] for i in batches[0]) + 1  # + EOS
    assert not np.array_equal(epochs[0], epochs[1])
    assert np.array_equal(epochs[0], epochs[2]) and batchings[0] == batchings[2]
    assert (epochs[0].sum(1) > np.asarray([t.src_lens, t.tgt_lens]).sum(1)).all()
