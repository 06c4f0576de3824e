"""Each attention family learns the toy task at the toy comparison's own settings
(the experiment a new user runs first).

A regression guard: a change of initialisation for Multi30k once left every RNN variant of compare_attention_toy near
BLEU 1 after its 250 updates while the README still showed 79. Each family below trains exactly as the comparison
trains it (its shared overrides, the variant's own, seed 1, one thread) on the toy corpus the recipe generates.
"""

import pytest

from nmt.cli.common import compose
from nmt.compare.plan import merge_overrides
from nmt.training.trainer import Trainer

# one variant per family of the zoo, and the validation BLEU it must pass after the 250 updates (seed 1 measured
# at commit time: bahdanau 44.8, luong_general 27.8, luong_local_p 53.3, hard 26.4, transformer 30.3; an RNN whose
# embeddings read out at 1/sqrt(E) scale stays near 1)
FAMILIES = {"bahdanau": 20.0, "luong_general": 15.0, "luong_local_p": 20.0, "hard": 12.0, "transformer": 15.0}


@pytest.fixture(scope="module")
def toy_experiment():
    return compose("compare", ["experiment=compare_attention_toy"])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp(
        "toy_recipe_data"
    )  # the recipe's corpus is generated here once, and its tokenizer cached


@pytest.mark.parametrize("variant", list(FAMILIES))
def test_each_family_learns_the_toy_at_the_comparisons_settings(variant, toy_experiment, folder, tmp_path_factory):
    data = [
        f"data.train={folder}/toy/train",
        f"data.valid={folder}/toy/valid",
        f"data.test={folder}/toy/test",
        f"data.cache_dir={folder}/cache",
    ]
    # one validation, at the end (the comparison validates every 25 updates to choose its budget points' models;
    # validation does not change training, and ten of them were most of this test's time)
    once = ["train.valid_every=250", "train.save_every=250"]
    overrides = merge_overrides(
        toy_experiment.shared, toy_experiment.overrides[variant], data, ["train.progress=false", "train.seed=1", *once]
    )
    cfg = compose("config", overrides)
    assert cfg.train.max_steps == 250 and cfg.model.dim == 64 and cfg.train.threads == 1  # the comparison's settings
    results = Trainer(cfg, tmp_path_factory.mktemp(variant)).fit()
    assert results["steps"] == 250
    assert results["best"]["score"] >= FAMILIES[variant], (
        f"{variant}: valid BLEU {results['best']['score']:.1f} after 250 updates"
    )
