"""nmt-train [overrides]: train a model from recipes/ (config.yaml + data/ model/ train/ decode/ experiment/)."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from omegaconf import OmegaConf

from nmt.cli.common import compose, print_help, run
from nmt.config import Config, config_from_yaml
from nmt.errors import NmtError

USAGE = """
usage: nmt-train [KEY=VALUE ...]

Train a model from the recipes. Examples:
  nmt-train experiment=quickstart run_dir=runs/quickstart
  nmt-train data=multi30k_en_de data.root=../shared/data/multi30k model=transformer train.max_steps=2000
  nmt-train data=parallel data.train=corpus/train data.valid=corpus/dev data.src=en data.tgt=de
  nmt-train resume=runs/quickstart train.max_steps=4000     (continue a run)
"""


def _flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_differences(old: Config, new: Config) -> list[str]:
    """`key: old -> new` for every setting that differs."""
    a, b = _flatten(asdict(old)), _flatten(asdict(new))
    return [f"{key}: {a.get(key)} -> {b.get(key)}" for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]


def resume_config(run_dir: Path, overrides: list[str]) -> Config:
    """The run's saved config, with KEY=VALUE overrides applied (groups cannot change on resume)."""
    saved_path = run_dir / "config.yaml"
    if not saved_path.is_file():
        raise NmtError(f"resume={run_dir}: no config.yaml there; expected a run dir written by nmt-train")
    saved = config_from_yaml(saved_path.read_text(encoding="utf-8"))
    keys = [o for o in overrides if not o.startswith("resume=")]
    if bad := [o for o in keys if "." not in o.split("=")[0] and not o.startswith("run_dir=")]:
        raise NmtError(f"resume: cannot change a recipe group on resume ({', '.join(bad)}); only KEY.SUB=VALUE overrides")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(saved), OmegaConf.from_dotlist(keys))
        cfg = OmegaConf.to_object(merged)
    except Exception as err:  # omegaconf validation errors name the key
        raise NmtError(f"resume: {str(err).splitlines()[0]}") from None
    cfg.resume, cfg.run_dir = str(run_dir), str(run_dir)
    for line in config_differences(saved, cfg):
        if not line.startswith(("resume:", "run_dir:")):
            print(f"resume: setting changed: {line}")
    return cfg


def main(argv: list[str]) -> None:
    from nmt.training.checkpoint import LAST
    from nmt.training.trainer import Trainer

    if "-h" in argv or "--help" in argv:
        return print_help(USAGE)
    resume = next((a.split("=", 1)[1] for a in argv if a.startswith("resume=")), None)
    if resume:
        cfg = resume_config(Path(resume), argv)
        last = Path(resume) / "checkpoints" / LAST
        if not last.is_file():
            raise NmtError(f"resume={resume}: no checkpoints/{LAST} to resume from")
    else:
        cfg = compose("config", argv)
    run_dir = Path(cfg.run_dir or time.strftime("outputs/%Y-%m-%d/%H-%M-%S"))
    trainer = Trainer(cfg, run_dir)
    if resume:
        trainer.restore(last)
    trainer.fit()
    print(f"run dir: {run_dir}")


def entry() -> None:
    run(main)


if __name__ == "__main__":
    entry()
