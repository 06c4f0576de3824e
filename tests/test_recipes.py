"""Every recipe composes, builds its model and takes one training step."""

import json

import pytest
import torch

from nmt.cli.common import compose, group_options
from nmt.data.batching import make_batch
from nmt.models.builders import build_model
from tests.conftest import MULTI30K

GROUPS = group_options()


def test_recipe_groups_exist():
    for group in ("data", "model", "train", "decode", "experiment"):
        assert GROUPS[group], group


@pytest.mark.parametrize("model", GROUPS["model"])
def test_every_model_recipe_builds_and_steps(model):
    cfg = compose("config", [f"model={model}"])
    torch.manual_seed(0)
    net = build_model(cfg.model, 50, 50, joint=True)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.train.lr)
    batch = make_batch([[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]])
    logits = net(batch.src, batch.src_mask, batch.tgt_in)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=0)
    opt.zero_grad()
    loss.backward()
    before = [p.detach().clone() for p in net.parameters()]
    opt.step()
    assert torch.isfinite(loss)
    assert any(not torch.equal(b, p) for b, p in zip(before, net.parameters()))


@pytest.mark.parametrize("group", ["data", "train", "decode", "experiment"])
def test_every_other_recipe_composes(group):
    for name in [n for n in GROUPS[group] if not n.startswith("compare_")]:  # compare_*: nmt-compare's, below
        overrides = [f"{group}={name}"] + (["data.train=corpus/train"] if name == "parallel" else [])
        cfg = compose("config", overrides)
        assert cfg.train.max_steps > 0 and cfg.decode.beam >= 1


def test_multi30k_recipe_resolves_paths_against_root():
    cfg = compose("config", ["data=multi30k_en_de", "data.root=/corpora/m30k"])
    assert (cfg.data.train, cfg.data.valid, cfg.data.test) == (
        "/corpora/m30k/train",
        "/corpora/m30k/val",
        "/corpora/m30k/test_2016_flickr",
    )
    assert (cfg.data.src, cfg.data.tgt) == ("en", "de")


@pytest.mark.parametrize("name", [n for n in GROUPS["experiment"] if n.startswith("compare_")])
def test_every_compare_experiment_plans_and_builds_its_variants(name, tmp_path):
    from nmt.cli.compare import plan_runs

    cfg = compose("compare", [f"experiment={name}"])
    plans = plan_runs(
        cfg, tmp_path
    )  # every variant's nmt-train config; they share the data, budget and decoding (or this raises)
    assert len(cfg.selected()) >= 10 and len(plans) == sum(len(cfg.seeds_of(v)) for v in cfg.selected())
    assert cfg.baseline_name() in cfg.selected()
    built = {}
    for plan in plans:
        if plan.variant not in built:
            model = build_model(plan.config.model, 50, 50, joint=True)
            built[plan.variant] = (plan.config.model, sum(p.numel() for p in model.parameters()))
    assert list(built) == cfg.selected()  # every variant, in the experiment's order
    assert [p.variant for p in plans[: len(built)]] == cfg.selected() and {p.seed for p in plans[: len(built)]} == {
        cfg.seeds[0]
    }  # seed by seed
    assert len({m.dim for m, _ in built.values()}) == 1  # one model width for every variant
    for name, (model, parameters) in built.items():
        assert parameters > 1000, name
        overrides = " ".join(cfg.overrides[name])
        expected_arch = (
            "transformer" if "transformer" in overrides else "bahdanau" if "bahdanau" in overrides else "luong"
        )
        assert model.arch == expected_arch, name
        if "model.score=" in overrides:
            assert f"model.score={model.score}" in overrides, name
    for plan in plans:  # one budget in updates for every run, scored at the declared points; no time limit
        assert plan.config.train.max_steps == plans[0].config.train.max_steps and plan.config.train.max_time is None
        assert plan.points and plan.config.train.snapshot_at[: len(plan.points)] == plan.points
        assert plan.config.train.precision != "auto"
        if plan.extend_steps is not None:
            assert plan.extended().steps == cfg.extend[plan.variant] > plan.steps


@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"Multi30k not found at {MULTI30K} (set NMT_MULTI30K)")
@pytest.mark.parametrize(
    "name", [n for n in GROUPS["experiment"] if n.startswith("multi30k_") and n.endswith("_10min")]
)
def test_ten_minute_multi30k_recipes_train_on_the_corpus_to_their_time_budget(name, tmp_path, tmp_path_factory, capsys):
    """Each 10-minute recipe, with its budget cut to 3 seconds: it trains on the real corpus, stops on time,
    validates and saves; the README's next step (nmt-average of the last checkpoints, then nmt-evaluate) takes
    what it wrote."""
    from nmt.cli import average, train

    cfg = compose("config", [f"experiment={name}"])
    assert cfg.train.max_time == 10 and cfg.data.name == "multi30k_en_de" and cfg.train.precision == "auto"
    cache = tmp_path_factory.getbasetemp() / "multi30k_cache"  # one tokenizer and encoding for the three recipes
    run = tmp_path / "run"
    argv = [
        f"experiment={name}",
        f"data.root={MULTI30K}",
        "data.vocab_size=2000",
        f"data.cache_dir={cache}",
        "train.max_time=0.05",
        "train.save_every=1",
        "train.valid_bleu_sentences=4",
        "decode.max_len_a=0",
        "decode.max_len_b=3",
        "train.progress=false",
        f"run_dir={run}",
    ]
    assert train.main(argv) is None, capsys.readouterr().err
    results = json.loads((run / "results.json").read_text())
    assert results["timed_out"] and results["steps"] >= 1 and results["precision"] in ("bf16", "fp32")
    # two checkpoints where the 3 seconds made two updates (a loaded machine may make one: its average is of one)
    last = min(2, results["steps"])
    assert average.main([f"run={run}", f"last={last}"]) is None, capsys.readouterr().err
    assert (run / "checkpoints" / "average.pt").is_file()


# What the README's results table publishes for each Multi30k recipe: architecture and parameters (joint BPE 8,000).
PUBLISHED = {
    "multi30k_transformer": ("transformer", 7.6),
    "multi30k_luong": ("luong", 4.5),
    "multi30k_bahdanau": ("bahdanau", 3.5),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_multi30k_recipes_build_the_models_the_readme_describes(name):
    cfg = compose("config", [f"experiment={name}", "data.root=/nonexistent"])
    arch, millions = PUBLISHED[name]
    assert cfg.model.arch == arch and cfg.data.vocab_size == 8000 and cfg.model.dim == 256
    net = build_model(cfg.model, 8000, 8000, joint=True)
    weights = {p.data_ptr(): p.numel() for p in net.parameters()}  # tied weights counted once
    assert round(sum(weights.values()) / 1e6, 1) == millions
