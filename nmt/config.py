"""Config schemas: the one place where defaults live, and where every value is checked.

Hydra composes `recipes/` on top of these dataclasses, so a misspelt key or a wrong type fails at
composition with the key named. Only the CLI entry points see Hydra; they turn the composed config
into these plain dataclasses and pass explicit arguments on to the modules.

Each key that has a valid range or a fixed set of names declares it beside its default:
`key(default, at_least(1))`, `key(default, one_of(...))`. Every schema's `__post_init__` runs those
checks (and its combination checks), so a bad value fails at composition, before any data is read or
any run dir is written, with one line naming the key and what is allowed. Environment checks (is
CUDA there?) happen where the device is opened, since a saved config must load on any machine.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from nmt.errors import NmtError
from nmt.models.checks import check_model_config


@dataclass(frozen=True)
class Rule:
    """A check of one value: `ok(value)`, what is expected (for the message), and a value it rejects (for tests)."""

    ok: Callable[[Any], bool]
    expected: str
    bad: Any


def at_least(low: float) -> Rule:
    return Rule(lambda v: v >= low, f"expected at least {low}", low - 1)


def positive() -> Rule:
    return Rule(lambda v: v > 0, "expected a positive number", 0)


def in_range(low: float, high: float, high_open: bool = True, low_open: bool = False) -> Rule:
    """low <= v < high (or <= high; or low < v)."""
    lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
    ok = lambda v: (v > low if low_open else v >= low) and (v < high if high_open else v <= high)  # noqa: E731
    return Rule(ok, f"expected a number in {lo}{low}, {high}{hi}", high + 1)


def one_of(*choices: str) -> Rule:
    return Rule(lambda v: v in choices, f"unknown; expected one of {', '.join(choices)}", "no_such_name")


DEVICE = Rule(
    lambda v: re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", v) is not None,
    "unknown; expected auto, cpu, cuda, cuda:N or mps",
    "gpu",
)


def key(default: Any, rule: Rule | None = None) -> Any:
    """A schema field with its default and the rule its value must pass (None is always allowed)."""
    return field(default=default, metadata={"rule": rule} if rule else {})


def check_fields(obj: Any, prefix: str) -> None:
    """Apply every field's rule; the first failure raises `PREFIXKEY=VALUE: expected ...`."""
    for f in fields(obj):
        rule, value = f.metadata.get("rule"), getattr(obj, f.name)
        if rule is not None and value is not None and value is not MISSING and not rule.ok(value):
            raise NmtError(f"{prefix}{f.name}={value}: {rule.expected}")


def require(condition: bool, message: str) -> None:
    """A combination check: raise `message` unless `condition`."""
    if not condition:
        raise NmtError(message)


@dataclass
class DataConfig:
    """Where the parallel text comes from and how it is filtered and tokenized."""

    name: str = "parallel"
    src: str = "src"
    tgt: str = "tgt"
    root: str = ""  # a folder some recipes resolve train/valid/test against
    train: str = MISSING  # PREFIX (PREFIX.src, PREFIX.tgt, optionally .gz), or a .tsv / .jsonl file
    valid: Optional[str] = None
    test: Optional[str] = None
    hf: Optional[str] = None  # a `datasets` dataset (local save_to_disk folder or hub name)
    synthetic: Optional[str] = key(
        None, one_of("toy")
    )  # "toy": generate the toy corpus into the train folder if missing
    synthetic_seed: int = key(1, at_least(0))
    fetch: Optional[str] = key(
        None, one_of("multi30k")
    )  # nmt-prepare downloads this public corpus into data.root when missing
    max_len: int = key(100, at_least(1))  # training pairs longer than this (subword tokens, either side) are removed
    max_ratio: Optional[float] = key(
        3.0, at_least(1)
    )  # pairs whose longer side is this many times the shorter are removed
    vocab_size: int = key(8000, at_least(8))
    spm_model: str = key("unigram", one_of("unigram", "bpe"))
    spm_sample: int = key(
        500_000, in_range(1, 2_000_000, high_open=False)
    )  # the tokenizer trains on a seeded sample of at most this many sentences (unigram: ~2 KB of memory each)
    joint_vocab: bool = True
    # SentencePiece sampling of the training pairs, afresh each epoch (0 = off): for BPE the merge-dropout probability
    # (BPE-dropout, 0.1 usual), for unigram the smoothing alpha (subword regularization);
    # valid/test/translation never sample
    src_subword_alpha: float = key(0.0, in_range(0, 1, high_open=False))
    tgt_subword_alpha: float = key(0.0, in_range(0, 1, high_open=False))
    cache_dir: str = "data/cache"
    num_proc: int = key(
        2, at_least(1)
    )  # processes that encode a corpus (datasets.map); a split under 2,000 pairs uses one

    def __post_init__(self) -> None:
        check_fields(self, "data.")
        for name in ("src", "tgt", "cache_dir"):
            require(bool(getattr(self, name)), f"data.{name}: expected a non-empty value")


@dataclass
class ModelConfig:
    """Architecture; `arch` picks the builder in nmt.models.builders.BUILDERS.

    One flat schema for every arch: each key says which archs read it (the others ignore it).
    """

    arch: str = "transformer"  # transformer | bahdanau | luong
    dim: int = key(
        256, at_least(1)
    )  # model width: Transformer d_model; RNN decoder state and encoder output (both directions together)
    layers: int = key(3, at_least(1))  # Transformer layers per stack; RNN layers in the encoder and in the decoder
    heads: int = key(4, at_least(1))  # transformer: attention heads (model.dim must be a multiple)
    ffn_dim: int = key(1024, at_least(1))  # transformer: feed-forward inner size
    dropout: float = key(0.1, in_range(0, 1))
    norm: str = key("pre", one_of("pre", "post"))  # transformer: layer norm before or after each sub-layer
    scale: bool = True  # transformer: divide attention scores by sqrt(d_head)
    tie_embeddings: bool = True  # target input/output; source too when the vocabulary is joint
    embed_scale: bool = (
        True  # RNN: embeddings read out times sqrt(E) (nmt.models.rnn.ScaledEmbedding); false: as stored
    )
    # --- RNN encoder-decoders (bahdanau, luong) ---
    embed_dim: Optional[int] = key(None, at_least(1))  # token embedding size (None: same as dim)
    cell: str = "lstm"  # gru | lstm
    bidirectional: bool = True  # encoder reads both ways; each direction gets dim / 2
    bridge: str = "bridge"  # initial decoder state: bridge (tanh(W h_enc_final)) | zero
    score: str = "general"  # additive | dot | general | concat | location (nmt.models.attention.SCORES)
    window: str = "global"  # global | local_m | local_p (Luong et al. 2015, sec. 3.2)
    window_size: int = key(
        10, at_least(1)
    )  # D: local windows cover [p_t - D, p_t + D]; local-p's Gaussian has sigma = D / 2
    input_feeding: bool = True  # luong: feed the attentional vector h~_{t-1} into the next RNN input
    attention: str = "soft"  # soft | hard (one sampled source position per step, straight-through Gumbel-softmax)
    gumbel_tau: float = key(1.0, positive())  # hard: temperature of the Gumbel-softmax relaxation behind the gradients
    max_src_len: int = key(
        256, at_least(1)
    )  # location score: one weight row per source position; later positions share the last

    def __post_init__(self) -> None:
        """An unknown name, a value out of range or an impossible combination fails at composition."""
        check_fields(self, "model.")
        check_model_config(self)


@dataclass
class TrainConfig:
    """Optimisation, validation and checkpointing."""

    max_steps: int = key(10000, at_least(1))
    max_epochs: Optional[int] = key(None, at_least(1))
    max_time: Optional[float] = key(
        None, positive()
    )  # minutes of training (validation and saving not counted): stop at the first update past it
    budget_clock: str = key(
        "wall", one_of("wall", "cpu")
    )  # what train.max_time counts: wall-clock seconds, or this process's CPU seconds
    batch_tokens: int = key(4096, at_least(1))  # padded tokens per batch (per process with torchrun)
    accumulate: int = key(1, at_least(1))  # batches per update: the update of an N-times larger batch
    precision: str = key(
        "fp32", one_of("fp32", "bf16", "fp16", "auto")
    )  # bf16: autocast (fp32 master weights); fp16: CUDA only; auto: bf16 where the hardware has it
    # the loss and its gradient: torch (blockwise torch operators), native (nmt's C kernels: one pass per row, within
    # rounding of torch's), or auto: native for bf16 training on a CPU, torch in fp32 (nmt/training/loss.py)
    loss_kernel: str = key("auto", one_of("auto", "native", "torch"))
    # dropout's masks: torch (16-bit masks from torch's generator, nmt/models/dropout.py), native (nmt's C kernel: the
    # mask drawn and applied in one pass, other draws of the same rate), or auto: native for bf16 training on a CPU,
    # torch in fp32 (nmt/training/native_dropout.py)
    dropout_kernel: str = key("auto", one_of("auto", "native", "torch"))
    # the Transformer's pre-norm LayerNorms: torch (float32, cast to bf16 by the products that read them), native
    # (nmt's C kernel: the output written in bf16, the gradient read in bf16, within rounding of torch's), or auto:
    # native for bf16 training on a CPU, torch in fp32 (nmt/training/native_norm.py). torch by default until the
    # figures of the bf16 Transformer models are measured again with it (docs/benchmarks.md)
    norm_kernel: str = key("torch", one_of("auto", "native", "torch"))
    # the Bahdanau decoder's teacher forcing (a GRU of one layer, the additive score): steps (one recorded step after
    # another), fused (the loop as one operation with its backward written out, the score in nmt's C kernel for bf16
    # on a CPU; within rounding of steps) or auto: fused for bf16 training on a CPU, steps in fp32, whose numbers the
    # attention study records (nmt/models/bahdanau_loop.py)
    decoder_loop: str = key("auto", one_of("auto", "fused", "steps"))
    lr: float = key(5e-4, positive())  # peak learning rate, reached at the end of warm-up
    schedule: str = key("inverse_sqrt", one_of("inverse_sqrt", "constant", "cosine"))
    warmup: int = key(1000, at_least(0))
    label_smoothing: float = key(0.1, in_range(0, 1))
    clip_norm: float = key(1.0, at_least(0))  # gradient norm limit (0: no clipping)
    valid_every: int = key(1000, at_least(1))
    save_every: int = key(1000, at_least(1))
    keep_last: int = key(
        3, at_least(1)
    )  # the newest N step checkpoints kept (checkpoints/step_N.pt; last.pt is the newest)
    keep_best: int = key(
        1, at_least(1)
    )  # the best M step checkpoints by early_stop_metric also kept (best.pt is the best)
    early_stop_metric: str = key(
        "bleu", one_of("bleu", "chrf", "loss")
    )  # the validation score that picks best.pt and drives patience
    patience: Optional[int] = key(
        None, at_least(1)
    )  # stop after this many validations in a row without a new best (None: never)
    max_bad_steps: int = key(
        5, at_least(1)
    )  # stop after this many updates in a row skipped for a non-finite loss or gradient
    valid_bleu_sentences: Optional[int] = key(
        None, at_least(1)
    )  # translate only the first N validation sentences for BLEU
    # steps N at which checkpoints/best_at_N.pt keeps the best checkpoint so far by validation (the model a run of N
    # updates would choose; nmt-compare's budget points, which it makes validation steps). Steps past max_steps are
    # not reached (until a run is resumed with a larger train.max_steps).
    snapshot_at: list[int] = field(default_factory=list)
    log_every: int = key(50, at_least(1))  # a progress line (train.log, stdout) and TensorBoard scalars every N updates
    seed: int = key(1, at_least(0))
    device: str = key("auto", DEVICE)  # auto | cpu | cuda | cuda:N
    threads: Optional[int] = key(None, at_least(1))  # torch intra-op threads (None: torch's default)
    # torchrun: how long a collective may wait for the other processes (rank 0 validating alone, say) before the job
    # fails; data preparation is waited for on a file, without it
    dist_timeout_min: float = key(60.0, positive())
    progress: bool = True  # a progress bar when stderr is a terminal

    def __post_init__(self) -> None:
        check_fields(self, "train.")
        for step in self.snapshot_at:
            require(
                isinstance(step, int) and step >= 1,
                f"train.snapshot_at: {step!r}: expected numbers of updates >= 1",
            )


@dataclass
class DecodeConfig:
    """Search settings for validation BLEU, nmt-translate and nmt-evaluate (see nmt/search.py)."""

    beam: int = key(1, at_least(1))  # beam width K; 1 is greedy search
    alpha: float = key(
        0.0, at_least(0)
    )  # GNMT length penalty ((5 + len) / 6) ** alpha; hypotheses are ranked by score / penalty
    max_len_a: float = key(1.5, at_least(0))  # output length limit: a * source length + b (subword tokens)
    max_len_b: int = key(10, at_least(0))
    min_len: int = key(0, at_least(0))  # EOS is forbidden before this many output tokens
    nbest: int = key(1, at_least(1))  # hypotheses per sentence (at most beam; any number when sampling)
    sampling: bool = False  # draw each token at random instead of searching (beam is then ignored)
    temperature: float = key(
        1.0, positive()
    )  # sampling: divide the log-probabilities by this (< 1 sharpens, > 1 flattens)
    top_k: int = key(0, at_least(0))  # sampling: draw among the k likeliest tokens only (0: all)
    top_p: float = key(
        1.0, in_range(0, 1, high_open=False, low_open=True)
    )  # sampling: the smallest set of tokens whose probability reaches p
    seed: int = key(1, at_least(0))  # sampling: random seed
    no_repeat_ngram_size: int = key(0, at_least(0))  # N > 0: no n-gram of N tokens twice in an output (0: off)
    repetition_penalty: float = key(1.0, positive())  # > 1: tokens already output are less likely (1: off)
    max_src_len: int = key(1024, at_least(1))  # longer sources are cut to this many subword tokens, with a warning
    batch_size: int = key(64, at_least(1))  # sentences per batch
    batch_tokens: int = key(32768, at_least(1))  # and at most this many beam rows x padded source tokens per batch
    # linear layers in bf16 or int8 for every search (nmt/engine/quantize.py):
    # translate, evaluate, serve, validation, nmt-compare
    precision: str = key("fp32", one_of("fp32", "bf16", "int8"))
    # a vocabulary map (nmt-shortlist): the output layer scores only each batch's candidate tokens
    shortlist: Optional[str] = None
    # each hypothesis' log-probability: null computes it where it is shown (the API's Result, n-best lines, the
    # server), false lets greedy search skip its normaliser (a log-sum-exp over the vocabulary per row and step;
    # scores are then NaN; beam search and sampling rank by them, so compute them anyway)
    scores: Optional[bool] = None

    def __post_init__(self) -> None:
        check_fields(self, "decode.")
        require(
            self.sampling or self.nbest <= self.beam,
            f"decode.nbest={self.nbest}: at most decode.beam={self.beam} hypotheses (or set decode.sampling=true)",
        )
        require(
            self.max_len_a > 0 or self.max_len_b > 0,
            "decode.max_len_a=0 and decode.max_len_b=0: no output could be produced; expected one of them positive",
        )


def check_workers(workers: int, decode: DecodeConfig) -> None:
    """Worker processes search batches in any order of completion: fine for search,
    not for sampling's shared generator."""
    require(
        workers == 1 or not decode.sampling,
        f"workers={workers} with decode.sampling=true: each worker would draw from its own generator and the "
        "samples would depend on which worker took a batch; expected workers=1 for sampling",
    )


@dataclass
class Config:
    """A training run (nmt-train, nmt-prepare)."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    run_dir: Optional[str] = None  # default: outputs/DATE/TIME
    resume: Optional[str] = None  # a run dir to continue exactly from its checkpoints/last.pt
    init_from: Optional[str] = (
        None  # a checkpoint (or run dir) whose weights and tokenizer start a new run (fine-tuning)
    )


@dataclass
class AlignConfig:
    """Word alignments from the attention (nmt/alignments.py): alignments_out=FILE, the API and the server."""

    method: str = key("argmax", one_of("argmax", "threshold"))  # each target word's likeliest source word, or all
    threshold: float = key(0.5, in_range(0, 1, high_open=False, low_open=True))  # method=threshold: least weight
    layer: Optional[int] = None  # a Transformer's decoder layer (0 first, -1 last); None: the search's attention
    head: Optional[int] = key(None, at_least(0))  # a Transformer's head in that layer; None: the mean over heads

    def __post_init__(self) -> None:
        check_fields(self, "align.")


@dataclass
class TranslateConfig:
    """nmt-translate: a checkpoint, an input and an output (stdin/stdout by default)."""

    checkpoint: str = MISSING
    input: Optional[str] = None
    output: Optional[str] = None
    chunk_size: int = key(
        10000, at_least(1)
    )  # lines read, translated and written at a time (sorted by length inside a chunk)
    attention_out: Optional[str] = None  # write each line's attention matrix: FILE.npz, else JSON lines
    alignments_out: Optional[str] = None  # write each line's word alignment, Pharaoh `i-j` links (see align.*)
    align: AlignConfig = field(default_factory=AlignConfig)
    input_format: str = key("text", one_of("text", "jsonl"))  # jsonl: {"text": ..., "prefix": ...} per line
    plot_dir: Optional[str] = None  # write attention heat-maps (PNG) of the first plot_n sentences here
    plot_n: int = key(10, at_least(0))
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    device: str = key("auto", DEVICE)
    threads: Optional[int] = key(
        None, at_least(1)
    )  # torch intra-op threads (None: torch's default, one per core; 1 per worker with workers > 1)
    workers: int = key(
        1, at_least(1)
    )  # processes that search batches, each with its own copy of the model (CPU; see nmt/workers.py)
    progress: bool = True  # a bar over the input file's lines on stderr (when stderr is a terminal)

    def __post_init__(self) -> None:
        check_fields(self, "")
        check_workers(self.workers, self.decode)


@dataclass
class CometConfig:
    """COMET (unbabel-comet, the comet extra; nmt.evaluation.comet): the model and how to run it. Nothing is fetched:
    the model is a checkpoint on disk or a name already downloaded into the Hugging Face cache."""

    # a COMET checkpoint (MODEL/checkpoints/model.ckpt), its folder MODEL, or a downloaded name (Unbabel/wmt22-comet-da)
    model: Optional[str] = None
    batch_size: int = key(16, at_least(1))  # segments per batch
    device: str = key("auto", one_of("auto", "cpu", "cuda"))  # auto: CUDA when available
    progress: bool = True  # COMET's progress bar (on stderr)
    # the folder of cached scores, one file per (model, sources, hypotheses, references); default: ~/.cache/nmt/comet
    # for nmt-evaluate and nmt.score, OUT/comet_cache for nmt-compare
    cache: Optional[str] = None

    def __post_init__(self) -> None:
        check_fields(self, "comet.")


def check_metric_list(metrics: list[str], comet: CometConfig) -> None:
    """Known names, each once; COMET needs its model."""
    from nmt.evaluation.metrics import check_metrics

    check_metrics(metrics)
    require(
        "comet" not in metrics or comet.model is not None,
        "metrics: comet needs its model: give comet.model=PATH (MODEL/checkpoints/model.ckpt or its folder) or the "
        "name of a downloaded model (e.g. comet.model=Unbabel/wmt22-comet-da)",
    )


@dataclass
class EvaluateConfig:
    """nmt-evaluate: score a checkpoint on a split of its data or on src/ref files, or score hyp against ref."""

    checkpoint: Optional[str] = None
    split: str = key("test", one_of("train", "valid", "test"))
    src: Optional[str] = None
    ref: Optional[str] = None
    hyp: Optional[str] = None  # an existing translation to score (no checkpoint needed)
    hyp_out: Optional[str] = None
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    device: str = key("auto", DEVICE)
    threads: Optional[int] = key(
        None, at_least(1)
    )  # torch intra-op threads (None: torch's default; 1 per worker with workers > 1)
    workers: int = key(1, at_least(1))  # processes that search batches, as nmt-translate's workers
    progress: bool = True
    # printed in this order: bleu, chrf, chrf++, ter, bleu_lc (sacrebleu) and comet (needs comet.model, and src=FILE
    # with hyp=FILE); comet.model=... alone adds comet to the list
    metrics: list[str] = field(default_factory=lambda: ["bleu", "chrf", "chrf++", "ter", "bleu_lc"])
    comet: CometConfig = field(default_factory=CometConfig)

    def __post_init__(self) -> None:
        check_fields(self, "")
        check_workers(self.workers, self.decode)
        if self.comet.model is not None and "comet" not in self.metrics:
            self.metrics = [*self.metrics, "comet"]
        check_metric_list(self.metrics, self.comet)


@dataclass
class AverageConfig:
    """nmt-average: the weights of a run's newest step checkpoints averaged into one checkpoint."""

    run: str = MISSING  # a run dir written by nmt-train
    last: int = key(3, at_least(1))  # how many of its newest checkpoints/step_N.pt to average
    output: Optional[str] = None  # default: RUN/checkpoints/average.pt

    def __post_init__(self) -> None:
        check_fields(self, "")


@dataclass
class ServeSettings:
    """nmt-serve's limits per request and its batching (the `serve.` keys)."""

    max_lines: int = key(64, at_least(1))  # lines per request
    max_chars: int = key(20000, at_least(1))  # characters per request, all lines together
    max_beam: int = key(16, at_least(1))  # the widest beam a request may ask for (nbest is at most its beam)
    max_wait_ms: float = key(5.0, at_least(0))  # the first request of a batch waits this long for others to join it
    max_batch_lines: int = key(256, at_least(1))  # a batch closes early once its requests hold this many lines
    access_log: bool = True  # one JSON log line per request on stderr
    timeout_s: float = key(60.0, positive())  # a request not answered by then gets a JSON 504 and its work is dropped
    max_queue_lines: int = key(4096, at_least(1))  # lines waiting to be decoded; past it 503 + Retry-After
    max_requests: int = key(256, at_least(1))  # HTTP requests handled at once; past it 503 + Retry-After
    long_tokens: int = key(512, at_least(1))  # a line of more beam rows x source tokens is "long": batched apart
    workers: int = key(1, at_least(1))  # search processes (N > 1: each loads the models; 1: threads of this process)
    shutdown_s: float = key(30.0, at_least(0))  # on SIGTERM or Ctrl-C, in-flight requests get this long to finish
    # Host header names (any port) the server answers; others get a JSON 400 (DNS rebinding). "*" accepts any.
    allowed_hosts: list[str] = field(default_factory=lambda: ["localhost", "127.0.0.1", "::1"])

    def __post_init__(self) -> None:
        check_fields(self, "serve.")
        for name in self.allowed_hosts:
            require(
                isinstance(name, str) and name.strip() != "" and "/" not in name,
                f"serve.allowed_hosts: {name!r}: expected host names such as localhost or example.org, or *",
            )


@dataclass
class ServeConfig:
    """nmt-serve: one or two checkpoints behind an HTTP API and a page that shows their attention."""

    checkpoint: str = MISSING  # model "a": a checkpoint file or a run dir
    compare: Optional[str] = None  # model "b", shown beside "a" on the page
    host: str = "127.0.0.1"  # another address (0.0.0.0: every interface) is the user's explicit choice
    port: int = key(8000, in_range(0, 65535, high_open=False))  # 0: any free port (the address is printed)
    serve: ServeSettings = field(default_factory=ServeSettings)
    decode: DecodeConfig = field(default_factory=DecodeConfig)  # the default search; requests may set beam and nbest
    device: str = key("auto", DEVICE)
    threads: Optional[int] = key(None, at_least(1))  # torch intra-op threads (None: torch's default)

    def __post_init__(self) -> None:
        check_fields(self, "")
        require(
            not self.decode.sampling,
            "decode.sampling=true: nmt-serve decodes by search only "
            "(a sample would depend on which requests share a batch)",
        )
        require(
            self.decode.beam <= self.serve.max_beam,
            f"decode.beam={self.decode.beam}: above serve.max_beam={self.serve.max_beam}",
        )


@dataclass
class SlurmConfig:
    """What each run's job asks SLURM for (nmt-compare launcher=slurm, through submitit)."""

    partition: Optional[str] = None  # None: the cluster's default partition
    gpus_per_node: int = key(1, at_least(0))
    cpus_per_task: int = key(4, at_least(1))
    mem_gb: Optional[float] = key(None, positive())
    timeout_min: int = key(240, at_least(1))  # the job's time limit (also submitit_local's)
    array_parallelism: int = key(16, at_least(1))  # jobs of the array running at once
    account: Optional[str] = None
    constraint: Optional[str] = None

    def __post_init__(self) -> None:
        check_fields(self, "slurm.")


@dataclass
class ClaimSpec:
    """A claim nmt-compare tests (nmt/compare/claims.py): a declared comparison and the test that decides it.

    kind: better (A scores higher than B), non_inferior (A loses less than `margin` against B), interaction ((A - B)
    is larger than (C - D)), long_range (A - B is larger on the longest sources than on the shortest), stability
    (A's seeds vary less than B's, and B diverges or skips updates no more), cheaper (A trains faster than B: speed
    probes; `curves` names the attention cost curves of scripts/bench_attention.py that bear on it, A's then B's).
    """

    name: str = MISSING  # a short id, e.g. "4b"
    text: str = MISSING  # the claim in words
    kind: str = key("better", one_of("better", "non_inferior", "interaction", "long_range", "stability", "cheaper"))
    a: str = MISSING
    b: str = MISSING
    c: Optional[str] = None  # interaction: the second pair (C, D)
    d: Optional[str] = None
    margin: Optional[float] = key(None, positive())  # non_inferior: the BLEU A may lose, stated before the runs
    curves: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_fields(self, f"claims.{self.name}.")
        require(
            self.kind != "interaction" or (self.c is not None and self.d is not None),
            f"claims.{self.name}: an interaction compares (a - b) with (c - d); give c and d",
        )
        require(
            self.kind != "non_inferior" or self.margin is not None,
            f"claims.{self.name}: a non-inferiority claim needs its margin (BLEU), stated before the runs",
        )

    def variants(self) -> list[str]:
        return [v for v in (self.a, self.b, self.c, self.d) if v is not None]


@dataclass
class CompareConfig:
    """nmt-compare: train named variants on the same data, budget and decoding, then decode the test set and report.

    Each variant is a list of nmt-train overrides; a run gets `shared`, then the variant's own overrides, then
    the command line's KEY=VALUE (`extra`), then its seed (a later value for the same key wins).
    """

    out: str = "runs/compare"  # the report folder; run dirs go to OUT/runs/VARIANT/seedN
    name: Optional[str] = None  # the report's title (an experiment sets it)
    overrides: dict[str, list[str]] = field(default_factory=dict)  # variant name -> its nmt-train overrides
    shared: list[str] = field(default_factory=list)  # nmt-train overrides every variant gets (data, sizes, budget)
    extra: list[str] = field(default_factory=list)  # the command line's nmt-train KEY=VALUE, applied to every variant
    variants: list[str] = field(default_factory=list)  # the variants to run, in this order (empty: all of `overrides`)
    seeds: list[int] = field(default_factory=lambda: [1])  # train.seed values; every variant runs with each
    # variant -> its own seeds instead of `seeds` (e.g. 5 seeds for the variants of a claim 3 seeds could not decide)
    seeds_for: dict[str, list[int]] = field(default_factory=dict)
    # updates: every variant trains the same train.max_steps updates on the same batches (the same data seen), whatever
    # machine runs it, and the test set is scored at each of budget_points. time: every variant trains train.max_time
    # minutes (train.budget_clock), and a run trained beside other work (contention_limit) is refused until re-run.
    budget: str = key("updates", one_of("updates", "time"))
    # updates at which the test set is scored, declared before training (each with the best checkpoint by validation
    # among the first N updates); empty: 1/4, 1/2 and all of train.max_steps. Each must be a validation step.
    budget_points: list[int] = field(default_factory=list)
    # variant -> train.max_steps beyond the shared budget: these variants train on after every run has reached it
    # (the same runs, resumed), and are scored at extend_points as well: where one family passes another
    extend: dict[str, int] = field(default_factory=dict)
    extend_points: list[int] = field(default_factory=list)  # empty: the extended budget's 1/2, 3/4 and all
    extend_seeds: list[int] = field(default_factory=list)  # the seeds that train on (empty: all of the variant's)
    # a run whose training wall time exceeds its CPU time per thread by more than this factor trained beside other
    # work: it is flagged, its speed left out of every speed figure (and, under budget=time, it is trained again)
    contention_limit: float = key(1.15, at_least(1))
    probe: bool = False  # measure the variants' training speed (probes.json) instead of training the comparison
    probe_steps: int = key(200, at_least(1))  # updates timed per probe (after probe_warmup untimed ones)
    probe_warmup: int = key(20, at_least(0))
    probe_repeats: int = key(3, at_least(1))  # probes per variant, each in a fresh process
    claims: list[ClaimSpec] = field(default_factory=list)  # declared claims, tested in claims.md (compare/claims.py)
    baseline: Optional[str] = (
        None  # the variant the others are tested against (default, or when not among `variants`: the first)
    )
    report_only: bool = False  # rebuild the report from the runs in OUT, training nothing
    bootstrap: int = key(1000, at_least(1))  # draws of the paired cluster bootstrap over test sentences
    bootstrap_seed: int = key(12345, at_least(1))  # the seed of the bootstrap's draws (numpy)
    align: Optional[str] = (
        None  # gold word alignments of the test set (Pharaoh i-j); default: the test prefix + .align if it exists
    )
    heatmap_lines: list[int] = field(
        default_factory=list
    )  # test lines (from 0) drawn as heat maps; empty: 3 picked by length
    length_buckets: int = key(5, at_least(1))  # BLEU by source length: this many buckets of about equal size
    under_attended: float = key(
        0.5, at_least(0)
    )  # coverage: a source token with less attention mass than this is under-attended
    over_attended: float = key(2.0, positive())  # ... and with more than this, over-attended
    jobs: int = key(
        1, at_least(1)
    )  # runs trained at once, each in its own process (e.g. 2 single-thread runs on 2 cores)
    launcher: str = key(
        "local", one_of("local", "submitit_local", "slurm")
    )  # local: `jobs` processes here; slurm: a job per run
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    progress: bool = True  # a bar over the whole comparison when stderr is a terminal
    # comet.model=...: the report scores every finished run's test output with COMET too (cached in OUT/comet_cache)
    comet: CometConfig = field(default_factory=CometConfig)

    def __post_init__(self) -> None:
        check_fields(self, "")
        require(
            self.over_attended > self.under_attended,
            f"over_attended={self.over_attended}: expected more than under_attended={self.under_attended}",
        )
        require(
            bool(self.seeds) and len(set(self.seeds)) == len(self.seeds) and min(self.seeds) >= 0,
            f"seeds={self.seeds}: expected distinct seeds >= 0",
        )
        known = (
            f"expected one of {', '.join(self.overrides)}"
            if self.overrides
            else "none are defined: give experiment=compare_NAME (recipes/experiment/compare_*.yaml), "
            "or overrides.NAME=[...]"
        )
        for name in self.variants + ([self.baseline] if self.baseline else []):
            require(name in self.overrides, f"variants: no variant named '{name}'; {known}")
        for name, seeds in self.seeds_for.items():
            require(name in self.overrides, f"seeds_for.{name}: no variant named '{name}'; {known}")
            require(
                bool(seeds) and len(set(seeds)) == len(seeds) and min(seeds) >= 0,
                f"seeds_for.{name}={seeds}: expected distinct seeds >= 0",
            )
        for name, steps in self.extend.items():
            require(name in self.overrides, f"extend.{name}: no variant named '{name}'; {known}")
            require(isinstance(steps, int) and steps >= 1, f"extend.{name}={steps}: expected a number of updates")
        for key_name in ("budget_points", "extend_points"):
            points = getattr(self, key_name)
            require(
                all(isinstance(p, int) and p >= 1 for p in points) and points == sorted(set(points)),
                f"{key_name}={points}: expected increasing numbers of updates >= 1",
            )
        if self.budget == "time":
            require(
                not self.budget_points and not self.extend,
                "budget=time: budget_points and extend are numbers of updates; give them with budget=updates",
            )
        names = [c.name for c in self.claims]
        require(len(set(names)) == len(names), f"claims: names must be distinct; got {', '.join(names)}")
        for claim in self.claims:
            for name in claim.variants():
                require(name in self.overrides, f"claims.{claim.name}: no variant named '{name}'; {known}")

    def seeds_of(self, name: str) -> list[int]:
        """The seeds variant `name` runs with."""
        return list(self.seeds_for.get(name, self.seeds))

    def all_seeds(self) -> list[int]:
        """Every seed some selected variant runs with, in order."""
        return sorted({s for name in self.selected() for s in self.seeds_of(name)})

    def selected(self) -> list[str]:
        """The variants this comparison runs, in order."""
        return list(self.variants or self.overrides)

    def baseline_name(self) -> str:
        """`baseline` when it is among the variants run, else the first of them."""
        return self.baseline if self.baseline in self.selected() else self.selected()[0]


@dataclass
class ExportConfig:
    """nmt-export: a trained Transformer converted for an inference engine."""

    checkpoint: str = MISSING  # a checkpoint file or a run dir (its best checkpoint)
    format: str = key("ctranslate2", one_of("ctranslate2", "hf"))  # hf: Hugging Face Transformers
    out: str = MISSING  # the model directory to write (must not exist yet, or be empty)
    quantization: Optional[str] = key(
        None, one_of("int8", "int8_float32", "int16", "float16", "bfloat16")
    )  # weights as stored (None: float32)
    shortlist: Optional[str] = None  # ctranslate2: a vocabulary map (nmt-shortlist) written beside it as vmap.txt
    max_positions: int = key(
        2048, at_least(1)
    )  # position table size: the longest source or output (subword tokens) the exported model takes

    def __post_init__(self) -> None:
        check_fields(self, "")


@dataclass
class ShortlistConfig:
    """nmt-shortlist: a vocabulary shortlist (CTranslate2's vocabulary map) learned from a run's training corpus."""

    checkpoint: str = MISSING  # a checkpoint file or a run dir: its tokenizer, and its data config's training split
    out: str = MISSING  # the vocabulary map to write (decode.shortlist=OUT; nmt-export shortlist=OUT)
    src: Optional[str] = None  # another parallel corpus to learn from: source file (with tgt), one sentence a line
    tgt: Optional[str] = None
    frequent: int = key(100, at_least(1))  # the most frequent target tokens, candidates in every batch
    per_source: int = key(20, at_least(1))  # each source token's likeliest translations (IBM Model 1)
    iterations: int = key(5, at_least(1))  # EM iterations of IBM Model 1

    def __post_init__(self) -> None:
        check_fields(self, "")
        require((self.src is None) == (self.tgt is None), "src and tgt go together: give both files, or neither")


def register_configs() -> None:
    """Register the schemas with Hydra's ConfigStore (the recipes' `defaults` name them)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="base_config", node=Config)
    store.store(name="base_translate", node=TranslateConfig)
    store.store(name="base_evaluate", node=EvaluateConfig)
    store.store(name="base_average", node=AverageConfig)
    store.store(name="base_serve", node=ServeConfig)
    store.store(name="base_compare", node=CompareConfig)
    store.store(name="base_export", node=ExportConfig)
    store.store(name="base_shortlist", node=ShortlistConfig)


def to_object(cfg: DictConfig):
    """The composed config as plain dataclasses (interpolations resolved)."""
    return OmegaConf.to_object(cfg)


RUN_KEYS = ("resume", "init_from", "run_dir")  # where a run goes, not what it trains


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    """A nested dict (e.g. dataclasses.asdict of a config) as {"train.max_steps": 10000, ...}."""
    out: dict[str, object] = {}
    for name, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def config_differences(old: Config, new: Config) -> list[str]:
    """`key: old -> new` for every setting that differs."""
    from dataclasses import asdict

    a, b = flatten(asdict(old)), flatten(asdict(new))
    return [f"{key}: {a.get(key)} -> {b.get(key)}" for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]


def config_from_yaml(text: str) -> Config:
    """A run's saved config (as stored in checkpoints), validated against the schema."""
    merged = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(text))
    return OmegaConf.to_object(merged)


def config_to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
