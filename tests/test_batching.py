import random

import torch

from nmt.data.batching import make_batch, token_batches
from nmt.data.tokenizer import BOS, EOS, PAD


def lengths(n=500, seed=0):
    rng = random.Random(seed)
    return [rng.randint(1, 40) for _ in range(n)], [rng.randint(1, 40) for _ in range(n)]


def test_every_pair_exactly_once_per_epoch_within_budget():
    src, tgt = lengths()
    for epoch in range(3):
        batches = token_batches(src, tgt, batch_tokens=200, seed=1, epoch=epoch)
        assert sorted(i for b in batches for i in b) == list(range(len(src)))
        for b in batches:
            padded = len(b) * max(max(src[i], tgt[i]) + 1 for i in b)
            assert padded <= 200


def test_oversized_example_gets_its_own_batch():
    batches = token_batches([5, 300, 6], [5, 2, 6], batch_tokens=64, seed=0, epoch=0)
    assert [1] in batches and sorted(i for b in batches for i in b) == [0, 1, 2]


def test_order_depends_only_on_seed_and_epoch():
    src, tgt = lengths()
    a = token_batches(src, tgt, 300, seed=1, epoch=0)
    assert a == token_batches(src, tgt, 300, seed=1, epoch=0)
    assert a != token_batches(src, tgt, 300, seed=1, epoch=1)
    assert a != token_batches(src, tgt, 300, seed=2, epoch=0)


def test_every_epoch_has_the_same_batch_shapes():
    """Only which sentences of equal lengths share a batch, and the batches' order, change between epochs: the
    shapes (sentences, longest source, longest target) repeat, so compiled kernels for them are found again
    (nmt/training/kernel_cache.py; docs/benchmarks.md, "A whole epoch against the same batches")."""
    src, tgt = lengths()

    def shapes(epoch):
        batches = token_batches(src, tgt, 300, seed=1, epoch=epoch)
        return sorted((len(b), max(src[i] for i in b), max(tgt[i] for i in b), sum(tgt[i] for i in b)) for b in batches)

    assert shapes(0) == shapes(1) == shapes(2)
    assert token_batches(src, tgt, 300, seed=1, epoch=0) != token_batches(src, tgt, 300, seed=1, epoch=1)


def test_make_batch_layout():
    batch = make_batch([[5, 6], [7]], [[8], [9, 10]])
    assert batch.src.tolist() == [[5, 6, EOS], [7, EOS, PAD]]
    assert batch.src_mask.tolist() == [[True, True, True], [True, True, False]]
    assert batch.tgt_in.tolist() == [[BOS, 8, PAD], [BOS, 9, 10]]
    assert batch.tgt_out.tolist() == [[8, EOS, PAD], [9, 10, EOS]]
    assert batch.target_tokens == 5 and batch.src.dtype == torch.long
