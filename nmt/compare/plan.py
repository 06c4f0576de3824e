"""A comparison's runs before anything trains: one resolved nmt-train config per (variant, seed), checked.

Every variant must share the data (hence one tokenizer and vocabulary), the training budget and the
decoding settings; a run dir an earlier session left must hold a run with exactly these settings; the
test split is copied into the report folder, where it must match what earlier sessions scored.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field, replace
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
    "train.loss_kernel",  # bf16: nmt's C loss or torch's, equal within rounding only
    "train.dropout_kernel",  # bf16: nmt's C dropout or torch's, other masks of the same rate
    "train.norm_kernel",  # bf16: nmt's C LayerNorm or torch's, equal within rounding only
    "train.decoder_loop",  # Bahdanau's teacher forcing as one operation or step by step, equal within rounding only
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
    """One variant at one seed: its resolved training config (run_dir set; train.max_steps the shared budget), the
    budget points its test set is scored at, and, for an extended variant, the updates it trains on to afterwards and
    the further points scored there."""

    variant: str
    seed: int
    config: Config
    points: list[int] = field(default_factory=list)
    extend_steps: int | None = None
    extend_points: list[int] = field(default_factory=list)
    session: dict | None = None  # the nmt-compare invocation that plans it (provenance, RUN/conditions.json)
    budget_steps: int | None = None  # the shared budget (its point is the one the main table and diagnostics use)

    @property
    def run_dir(self) -> Path:
        return Path(self.config.run_dir)

    @property
    def label(self) -> str:
        return f"{self.variant} seed {self.seed}"

    def extended(self) -> PlannedRun:
        """The same run trained on to its extended budget (phase 2), scored at every point."""
        train = replace(self.config.train, max_steps=self.extend_steps)
        return replace(
            self, config=replace(self.config, train=train), points=self.points + self.extend_points, extend_steps=None
        )

    @property
    def steps(self) -> int:
        """The updates this plan trains to."""
        return self.config.train.max_steps


def check_host(config: Config) -> None:
    """Refuse a precision this host cannot run natively: bf16 on a CPU without bf16 matrix instructions would be
    emulated (another speed, and a rounding no other host of the comparison has), never silently changed."""
    from nmt.runtime import resolve_device
    from nmt.training.precision import native_bf16

    train = config.train
    if train.precision != "bf16":
        return
    try:
        device = resolve_device(train.device)
    except NmtError:
        return  # the trainer names a bad device itself
    if device.type == "cpu" and not native_bf16(device):
        from nmt.compare.environment import cpu_model

        raise NmtError(
            f"train.precision=bf16: this CPU ({cpu_model()}) has no bf16 matrix instructions (AVX512-BF16 or AMX), "
            "so it would emulate bf16, unlike the comparison's other runs; continue the comparison on a host with "
            "bf16, or start another one with train.precision=fp32"
        )


def valid_steps(fractions: list[float], total: int, every: int, above: int = 0) -> list[int]:
    """Fractions of `total` updates rounded down to validation steps (multiples of `every`), above `above`, with
    `total` itself always among them."""
    points = {int(total * f) // every * every for f in fractions} | {total}
    return sorted(p for p in points if p > above)


def check_budget(cfg: CompareConfig, bases: dict[str, Config]) -> tuple[list[int], list[int]]:
    """The comparison's conditions, enforced before anything trains: one explicit precision this host can run, the
    budget (updates: no time limit, no early stopping; time: a time limit), valid budget points. Returns the budget
    points and the extended variants' further points."""
    first_name, first = next(iter(bases.items()))
    train = first.train
    if train.precision == "auto":
        raise NmtError(
            "train.precision=auto: a comparison trains every run in one explicit precision (auto picks bf16 on one "
            "host and fp32 on another); give train.precision=fp32 (every CPU) or train.precision=bf16"
        )
    if cfg.budget == "time":
        if train.max_time is None:
            raise NmtError("budget=time: give train.max_time=MINUTES (and train.budget_clock=wall|cpu)")
        return [], []
    for name, base in bases.items():
        for key_name, value, why in (
            ("max_time", base.train.max_time, "a time limit stops variants at different updates"),
            ("max_epochs", base.train.max_epochs, "budget=updates counts updates only"),
            ("patience", base.train.patience, "early stopping ends variants at different updates"),
        ):
            if value is not None:
                raise NmtError(
                    f"variant {name}: train.{key_name}={value}: budget=updates trains every variant "
                    f"train.max_steps={base.train.max_steps} updates and {why}; remove it (or give budget=time)"
                )
    total, every = train.max_steps, train.valid_every
    points = cfg.budget_points or valid_steps([0.25, 0.5], total, every)
    for p in points:
        if p > total or (p % every and p != total):
            raise NmtError(
                f"budget_points: {p} is not a validation step of the runs (train.valid_every={every}, "
                f"train.max_steps={total}); expected points up to train.max_steps that are multiples of "
                "train.valid_every"
            )
    if not cfg.extend:
        return points, []
    for name, steps in cfg.extend.items():
        if steps <= total:
            raise NmtError(f"extend.{name}={steps}: expected more updates than train.max_steps={total}")
    longest = max(cfg.extend.values())
    further = cfg.extend_points or valid_steps([0.5, 0.75], longest, every, above=total)
    for p in further:
        if p <= total or p > longest or (p % every and p not in cfg.extend.values()):
            raise NmtError(
                f"extend_points: {p} is not a validation step past the shared budget (train.max_steps={total}, "
                f"train.valid_every={every}, longest extension {longest}); expected multiples of train.valid_every "
                f"between them (variant {first_name})"
            )
    return points, further


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


def check_shared(plans: list[PlannedRun]) -> None:
    """Every variant must share the data (hence the tokenizer and vocabulary), the budget and the decoding settings."""
    first = flatten(asdict(plans[0].config))
    for plan in plans[1:]:
        flat = flatten(asdict(plan.config))
        for key in first:
            if key == "train.snapshot_at":
                continue  # the budget points, and an extended variant's further ones
            if key.startswith(SAME_FOR_ALL) and flat[key] != first[key]:
                raise NmtError(
                    f"variant {plan.variant}: {key}={flat[key]} but {plans[0].variant} has {first[key]}; every "
                    "variant must share the data (one tokenizer and vocabulary), the training budget, the settings "
                    "that set how fast it trains (threads, precision, batching, validation) and the decoding "
                    "settings; set it in `shared` or on the command line"
                )


def check_existing(plan: PlannedRun) -> None:
    """A run dir left by an earlier nmt-compare must hold a run with exactly these settings."""
    saved_path = plan.run_dir / "config.yaml"
    if not saved_path.is_file():
        return
    saved: Config = config_from_yaml(saved_path.read_text(encoding="utf-8"))
    if plan.extend_steps is not None and saved.train.max_steps == plan.extend_steps:
        saved = replace(saved, train=replace(saved.train, max_steps=plan.steps))  # phase 2 of this plan started
    if [p for p in saved.train.snapshot_at if p <= plan.steps] == plan.points:
        saved = replace(saved, train=replace(saved.train, snapshot_at=plan.config.train.snapshot_at))  # extended later
    differences = [d for d in config_differences(saved, plan.config) if d.split(":")[0] not in IGNORED]
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
