"""nmt-train [overrides]: train a model from recipes/ (config.yaml + data/ model/ train/ decode/ experiment/)."""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path

from omegaconf import OmegaConf

from nmt.cli.common import compose, print_help, run
from nmt.config import RUN_KEYS, Config, config_differences
from nmt.config import flatten as _flatten
from nmt.errors import NmtError

USAGE = """
usage: nmt-train [KEY=VALUE ...]

Train a model from the recipes. Examples:
  nmt-train experiment=quickstart run_dir=runs/quickstart
  nmt-train data=multi30k_en_de data.root=data/multi30k model=transformer train.max_steps=2000
  nmt-train data=parallel data.train=corpus/train data.valid=corpus/dev data.src=en data.tgt=de
  nmt-train resume=runs/quickstart train.max_steps=4000     (continue a run exactly where it stopped)
  nmt-train experiment=quickstart run_dir=runs/q resume=auto  (continue runs/q if it has a checkpoint, else start it:
                                                           for jobs that restart, e.g. torchrun --max-restarts=N)
  nmt-train init_from=runs/quickstart data=parallel data.train=corpus/train run_dir=runs/tuned
                                                           (fine-tune: its weights, a fresh optimizer)
"""

# Settings a checkpoint's weights and vocabulary depend on: they cannot change on resume or init_from.
VOCABULARY_KEYS = ("data.vocab_size", "data.spm_model", "data.joint_vocab")
FREE_MODEL_KEYS = ("model.dropout",)


def fixed_keys(cfg: Config) -> list[str]:
    """The flattened keys a checkpoint's weights and tokenizer fix: the model's shape and the vocabulary."""
    return [
        k
        for k in _flatten(asdict(cfg))
        if (k.startswith("model.") and k not in FREE_MODEL_KEYS) or k in VOCABULARY_KEYS
    ]


def mismatches(saved: Config, asked: Config, keys: list[str]) -> list[str]:
    """`key is X in the checkpoint, Y asked` for each of `keys` that differs."""
    a, b = _flatten(asdict(saved)), _flatten(asdict(asked))
    return [f"{k} is {a.get(k)} in the checkpoint, {b.get(k)} asked" for k in keys if a.get(k) != b.get(k)]


def print_differences(label: str, saved: Config, cfg: Config) -> None:
    for line in config_differences(saved, cfg):
        if line.split(":")[0] not in RUN_KEYS:
            print(f"{label}: setting differs from the checkpoint: {line}")


def resume_config(run_dir: Path, overrides: list[str], saved: Config) -> Config:
    """The run's checkpointed config with KEY.SUB=VALUE overrides (groups, model shape and vocabulary stay)."""
    keys = [o for o in overrides if not o.startswith("resume=")]
    if bad := [o for o in keys if "." not in o.split("=")[0] and not o.startswith("run_dir=")]:
        raise NmtError(
            f"resume: cannot change a recipe group on resume ({', '.join(bad)}); only KEY.SUB=VALUE overrides"
        )
    try:
        merged = OmegaConf.merge(OmegaConf.structured(saved), OmegaConf.from_dotlist(keys))
        cfg = OmegaConf.to_object(merged)
    except Exception as err:  # omegaconf validation errors carry the key
        key = getattr(err, "full_key", None)
        raise NmtError(f"resume: {key + ': ' if key else ''}{str(err).splitlines()[0]}") from None
    if bad := mismatches(saved, cfg, fixed_keys(saved)):
        raise NmtError(f"resume={run_dir}: cannot change what the weights depend on: {'; '.join(bad)}")
    if saved.train.early_stop_metric != cfg.train.early_stop_metric:
        raise NmtError(
            f"resume={run_dir}: train.early_stop_metric cannot change on resume ({saved.train.early_stop_metric} -> "
            f"{cfg.train.early_stop_metric}): best.pt and patience are ranked by {saved.train.early_stop_metric}; "
            "start a new run with init_from= to rank by another metric"
        )
    cfg.resume, cfg.init_from = str(run_dir), None
    cfg.run_dir = cfg.run_dir if any(o.startswith("run_dir=") for o in keys) else str(run_dir)
    print_differences("resume", saved, cfg)
    return cfg


def _explicit_keys(overrides: list[str], cfg: Config) -> set[str]:
    """The flattened keys the command line sets, directly or through a `model=NAME` group."""
    keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
    if "model" in keys:
        keys |= {k for k in _flatten(asdict(cfg)) if k.startswith("model.")}
    return keys


def init_from_config(cfg: Config, overrides: list[str], saved: Config) -> Config:
    """The new run's config with the checkpoint's model shape and vocabulary settings.

    Recipe defaults yield to the checkpoint; a value set on the command line that differs is an error.
    """
    explicit = _explicit_keys(overrides, cfg)
    fixed = fixed_keys(saved)
    if bad := mismatches(saved, cfg, [k for k in fixed if k in explicit]):
        raise NmtError(
            f"init_from={cfg.init_from}: the checkpoint does not match the model asked for: {'; '.join(bad)} "
            "(fine-tuning keeps the checkpoint's architecture and vocabulary; drop these overrides)"
        )
    cfg.model = replace(
        saved.model, **{k.split(".", 1)[1]: getattr(cfg.model, k.split(".", 1)[1]) for k in FREE_MODEL_KEYS}
    )
    for key in VOCABULARY_KEYS:
        name = key.split(".", 1)[1]
        setattr(cfg.data, name, getattr(saved.data, name))
    print_differences("init_from", saved, cfg)
    return cfg


def check_fetched(cfg: Config) -> None:
    """A public corpus that is not in data.root yet: say how to get it, rather than a missing-file error."""
    if cfg.data.fetch == "multi30k" and cfg.data.hf is None:
        from nmt.data.fetch import missing_files, multi30k_files

        if missing_files(cfg.data.root, multi30k_files((cfg.data.src, cfg.data.tgt))):
            raise NmtError(
                f"data.root={cfg.data.root}: Multi30k is not there; run `nmt-prepare data={cfg.data.name}` once to "
                "download it, or set data.root to a folder holding {train,val,test_2016_flickr}"
                + f".{{{cfg.data.src},{cfg.data.tgt}}}.gz"
            )


def resolve_auto_resume(argv: list[str]) -> list[str]:
    """resume=auto (for restarted jobs, e.g. torchrun --max-restarts): continue run_dir if it holds a checkpoint,
    else start it."""
    if "resume=auto" not in argv:
        return argv
    run_dir = next((a.split("=", 1)[1] for a in argv if a.startswith("run_dir=")), None)
    if not run_dir:
        raise NmtError(
            "resume=auto needs run_dir=DIR: the run to continue if it holds checkpoints/last.pt, or to start"
        )
    rest = [a for a in argv if a != "resume=auto"]
    if (Path(run_dir) / "checkpoints" / "last.pt").is_file():
        # the recipe groups (experiment=, model=, ...) were composed when the run started; the checkpoint holds them
        keys = [a for a in rest if not a.startswith("run_dir=") and "." in a.split("=", 1)[0]]
        return keys + [f"resume={run_dir}"]
    return rest


def run_training(argv: list[str] | None, config: Config | None = None, log=None):
    """Train from command-line overrides (resume=, init_from= included) or from a Config.

    Returns (run dir, results.json's figures, whether this is the main process)."""
    from nmt.training.checkpoint import LAST, checkpoint_config, load_checkpoint
    from nmt.training.trainer import Trainer

    argv = resolve_auto_resume(argv or [])
    resume = (
        next((a.split("=", 1)[1] for a in argv if a.startswith("resume=")), None) if config is None else config.resume
    )
    payload = None
    if resume:
        if any(a.startswith("init_from=") for a in argv) or (config is not None and config.init_from):
            raise NmtError(
                "resume= and init_from= do not go together: resume continues a run, "
                "init_from starts a new one from a checkpoint"
            )
        last = Path(resume) / "checkpoints" / LAST
        if not last.is_file():
            raise NmtError(f"resume={resume}: no checkpoints/{LAST} there; expected a run dir written by nmt-train")
        payload = load_checkpoint(last)
        cfg = resume_config(Path(resume), argv, checkpoint_config(payload)) if config is None else config
    else:
        cfg = compose("config", argv) if config is None else config
        if cfg.init_from:
            payload = load_checkpoint(cfg.init_from)
            cfg = init_from_config(cfg, argv, checkpoint_config(payload))
    check_fetched(cfg)
    run_dir = Path(cfg.run_dir or time.strftime("outputs/%Y-%m-%d/%H-%M-%S"))
    trainer = Trainer(cfg, run_dir, log=log, checkpoint=payload)
    try:
        results = trainer.fit()
    finally:
        trainer.dist.close()
    return run_dir, results, trainer.dist.main


def main(argv: list[str]) -> None:
    if "-h" in argv or "--help" in argv:
        return print_help(USAGE)
    run_dir, _, main_process = run_training(argv)
    if main_process:
        print(f"run dir: {run_dir}")


def entry() -> None:
    run(main)


if __name__ == "__main__":
    entry()
