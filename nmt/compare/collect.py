"""Read a comparison's files back: the plan (OUT/comparison.yaml), the test set, and each run's files.

Everything the report shows comes from here: RUN/config.yaml, results.json (nmt-train), eval.json,
test.hyp and heatmaps.json (nmt.compare.evaluate), train.log (the learning curves).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from nmt.compare.curves import Curve, read_curve
from nmt.compare.evaluate import EVAL, HEATMAPS, HYP
from nmt.compare.plan import TEST_ALIGN, TEST_REF, TEST_SRC, run_dir_for
from nmt.compare.runner import CONDITIONS, RESULTS, train_seconds
from nmt.config import CompareConfig, Config, config_from_yaml
from nmt.data.corpus import read_lines
from nmt.errors import NmtError
from nmt.evaluation.alignment import GoldAlignment, read_pharaoh

PLAN, SESSIONS = "comparison.yaml", "sessions.json"


@dataclass
class RunRecord:
    """One (variant, seed): what its files hold; `finished` when it was trained and scored."""

    variant: str
    seed: int
    run_dir: Path
    config: Config | None = None
    results: dict | None = None
    evaluation: dict | None = None
    hyps: list[str] | None = None
    heatmaps: list[dict] = field(default_factory=list)
    curve: Curve = field(default_factory=Curve)
    conditions: list[dict] = field(default_factory=list)  # RUN/conditions.json: how each part of the run trained
    point_hyps: dict[int, list[str]] = field(default_factory=dict)  # budget point -> RUN/test.atN.hyp

    def points(self) -> dict[int, dict]:
        """The budget points this run was scored at: {N: eval.json's figures of the model chosen at N}."""
        return {
            int(k): v for k, v in ((self.evaluation or {}).get("points") or {}).items() if int(k) in self.point_hyps
        }

    def point_score(self, point: int, metric: str = "bleu") -> float | None:
        found = self.points().get(point)
        return found["scores"][metric]["score"] if found else None

    @property
    def finished(self) -> bool:
        return self.results is not None and self.evaluation is not None and self.hyps is not None

    def score(self, metric: str) -> float:
        return self.evaluation["scores"][metric]["score"]  # type: ignore[index]


def _json(path: Path) -> dict | list | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def read_run(out: Path, variant: str, seed: int) -> RunRecord:
    run_dir = run_dir_for(out, variant, seed)
    record = RunRecord(variant, seed, run_dir)
    if (run_dir / "config.yaml").is_file():
        record.config = config_from_yaml((run_dir / "config.yaml").read_text(encoding="utf-8"))
    record.results = _json(run_dir / RESULTS)  # type: ignore[assignment]
    record.evaluation = _json(run_dir / EVAL)  # type: ignore[assignment]
    if (run_dir / HYP).is_file():
        record.hyps = read_lines(run_dir / HYP)
    for point, figures in ((record.evaluation or {}).get("points") or {}).items():
        if (run_dir / figures["hyp"]).is_file():
            record.point_hyps[int(point)] = read_lines(run_dir / figures["hyp"])
    record.heatmaps = _json(run_dir / HEATMAPS) or []  # type: ignore[assignment]
    record.conditions = _json(run_dir / CONDITIONS) or []  # type: ignore[assignment]
    results = record.results or {}
    record.curve = read_curve(run_dir / "train.log", results.get("steps"), train_seconds(results) if results else None)
    return record


def read_plan(out: Path) -> CompareConfig:
    """The comparison's resolved settings, as the last nmt-compare in OUT saved them."""
    path = out / PLAN
    if not path.is_file():
        raise NmtError(f"out={out}: no {PLAN} there; expected a folder written by nmt-compare")
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(CompareConfig), OmegaConf.load(path)))
    except NmtError:
        raise
    except Exception as err:  # omegaconf raises many types; all mean "not a valid saved comparison"
        raise NmtError(f"{path}: not a valid comparison plan ({str(err).splitlines()[0]})") from None


@dataclass
class TestData:
    src: list[str]
    ref: list[str]
    gold: list[GoldAlignment] | None


def read_test(out: Path) -> TestData:
    """OUT/test.src, test.ref and (if present) test.align, as nmt-compare copied them at the start."""
    if not (out / TEST_SRC).is_file() or not (out / TEST_REF).is_file():
        raise NmtError(f"out={out}: no {TEST_SRC}/{TEST_REF} there; expected a folder written by nmt-compare")
    src, ref = read_lines(out / TEST_SRC), read_lines(out / TEST_REF)
    gold = read_pharaoh(out / TEST_ALIGN, src, ref) if (out / TEST_ALIGN).is_file() else None
    return TestData(src, ref, gold)


def read_sessions(out: Path) -> list[dict]:
    return _json(out / SESSIONS) or []  # type: ignore[return-value]
