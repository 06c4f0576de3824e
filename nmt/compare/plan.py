"""A comparison's runs before anything trains: one resolved nmt-train config per (variant, seed), checked.

Every variant must share the data (hence one tokenizer and vocabulary), the training budget and the
decoding settings; a run dir an earlier session left must hold a run with exactly these settings; the
test split is copied into the report folder, where it must match what earlier sessions scored.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from nmt.compare.evaluate import TestSet
from nmt.config import RUN_KEYS, CompareConfig, Config, DataConfig, config_differences, config_from_yaml, flatten
from nmt.data.corpus import read_lines
from nmt.data.dataset import ensure_synthetic, read_split
from nmt.errors import NmtError
from nmt.evaluation.alignment import read_pharaoh
from nmt.fileio import atomic_open

BUDGET = ("train.max_steps", "train.max_time", "train.max_epochs", "train.budget_clock")
THROUGHPUT = (
    "train.threads",
    "train.precision",
    "train.batch_tokens",
    "train.accumulate",
    "train.device",  # how fast a budget trains
    "train.valid_every",
    "train.valid_bleu_sentences",
)
SAME_FOR_ALL = ("data.", "decode.", *BUDGET, *THROUGHPUT)  # what every variant must share
IGNORED = (
    *RUN_KEYS,
    "train.progress",
    "train.threads",
    "data.cache_dir",
)  # differences that do not make an existing run another run
HEATMAP_WORDS = (6, 10)  # automatic heat-map lines: the first test sources of this many words
TEST_SRC, TEST_REF, TEST_ALIGN = "test.src", "test.ref", "test.align"


@dataclass
class PlannedRun:
    """One variant at one seed: its resolved training config (run_dir set)."""

    variant: str
    seed: int
    config: Config

    @property
    def run_dir(self) -> Path:
        return Path(self.config.run_dir)

    @property
    def label(self) -> str:
        return f"{self.variant} seed {self.seed}"


def run_dir_for(out: Path, variant: str, seed: int) -> Path:
    return out / "runs" / variant / f"seed{seed}"


def override_key(argument: str) -> str:
    """`+train.max_steps=5` -> train.max_steps."""
    return argument.split("=", 1)[0].lstrip("+~")


def merge_overrides(*lists: list[str]) -> list[str]:
    """Override lists in order; a later value for the same key replaces an earlier one."""
    merged: dict[str, str] = {}
    for overrides in lists:
        for item in overrides:
            merged[override_key(item)] = item
    return list(merged.values())


def check_shared(plans: list[PlannedRun], matched_steps: bool = False) -> None:
    """Every variant must share the data (hence the tokenizer and vocabulary), the budget and the decoding settings
    (with `matched_steps`, train.max_steps is the variant's own)."""
    first = flatten(asdict(plans[0].config))
    for plan in plans[1:]:
        flat = flatten(asdict(plan.config))
        for key in first:
            if matched_steps and key == "train.max_steps":
                continue
            if key.startswith(SAME_FOR_ALL) and flat[key] != first[key]:
                raise NmtError(
                    f"variant {plan.variant}: {key}={flat[key]} but {plans[0].variant} has {first[key]}; every "
                    "variant must share the data (one tokenizer and vocabulary), the training budget, the settings "
                    "that set how fast it trains (threads, precision, batching, validation) and the decoding "
                    "settings; set it in `shared` or on the command line"
                )


def same_updates(plan: PlannedRun) -> bool:
    """The run in the run dir finished (results.json) after exactly train.max_steps updates, not stopped early:
    trained to these steps instead, it would be the same run (schedules that depend on the run's length aside)."""
    path = plan.run_dir / "results.json"
    if not path.is_file() or plan.config.train.schedule == "cosine":
        return False
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return False
    return results.get("steps") == plan.config.train.max_steps and not results.get("early_stopped")


def check_existing(plan: PlannedRun) -> None:
    """A run dir left by an earlier nmt-compare must hold a run with exactly these settings."""
    saved_path = plan.run_dir / "config.yaml"
    if not saved_path.is_file():
        return
    saved: Config = config_from_yaml(saved_path.read_text(encoding="utf-8"))
    differences = [d for d in config_differences(saved, plan.config) if d.split(":")[0] not in IGNORED]
    if differences and all(d.split(":")[0] in BUDGET for d in differences) and same_updates(plan):
        return  # a finished run whose budget was given otherwise (e.g. in minutes) but bought exactly these updates
    if differences:
        raise NmtError(
            f"{plan.run_dir}: holds a run with other settings ({'; '.join(differences[:3])}); "
            "run the comparison into another out=, or delete that run dir to train it again"
        )


def pick_heatmap_lines(src: list[str], asked: list[int]) -> list[int]:
    """The test lines drawn as heat maps: those asked, else the first 3 sources of 6-10 words
    (else the first 3 non-empty)."""
    for line in asked:
        if not 0 <= line < len(src):
            raise NmtError(f"heatmap_lines: line {line} is not in the test set (lines 0 to {len(src) - 1})")
    if asked:
        return asked
    low, high = HEATMAP_WORDS
    fitting = [k for k, s in enumerate(src) if low <= len(s.split()) <= high]
    return (fitting or [k for k, s in enumerate(src) if s.strip()])[:3]


def prepare_test(cfg: CompareConfig, data: DataConfig, out: Path) -> tuple[TestSet, str | None]:
    """Copy the test split (and its gold alignments) into OUT; the same text must be there from an earlier session.

    Returns the test set and the gold alignment file used (cfg.align, else DATA.test + .align when it exists).
    """
    ensure_synthetic(data)
    text = read_split(data, "test")
    if text is None:
        raise NmtError("data.test: the data config names no test split; nmt-compare scores every variant on it")
    for name, lines in ((TEST_SRC, text.src), (TEST_REF, text.tgt)):
        path = out / name
        if path.is_file() and read_lines(path) != lines:
            raise NmtError(
                f"out={out}: its {name} differs from the test split of data.test={data.test}; the runs there were "
                "scored on other sentences; choose another out="
            )
    align = cfg.align or (f"{data.test}.align" if data.test and Path(f"{data.test}.align").is_file() else None)
    gold = read_pharaoh(align, text.src, text.tgt) if align else None
    for name, lines in (
        (TEST_SRC, text.src),
        (TEST_REF, text.tgt),
        *(((TEST_ALIGN, read_lines(align)),) if align else ()),
    ):
        with atomic_open(out / name, key="out") as f:
            f.writelines(line + "\n" for line in lines)
    if not align:
        (out / TEST_ALIGN).unlink(missing_ok=True)  # an earlier comparison's gold alignments are not this one's
    digest = (
        hashlib.sha256("\n".join(read_lines(align)).encode("utf-8", "surrogatepass")).hexdigest() if align else None
    )
    test = TestSet(
        text.src,
        text.tgt,
        gold,
        pick_heatmap_lines(text.src, cfg.heatmap_lines),
        cfg.under_attended,
        cfg.over_attended,
        digest,
    )
    return test, align
