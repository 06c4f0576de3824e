"""Config schemas: the one place where defaults live.

Hydra composes `recipes/` on top of these dataclasses, so a misspelt key or a wrong type fails at
composition with the key named. Only the CLI entry points see Hydra; they turn the composed config
into these plain dataclasses and pass explicit arguments on to the modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING, DictConfig, OmegaConf


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
    synthetic: Optional[str] = None  # "toy": generate the toy corpus into the train/valid/test folder if missing
    synthetic_seed: int = 1
    max_len: int = 100  # training pairs longer than this (subword tokens, either side) are removed
    max_ratio: Optional[float] = 3.0  # pairs whose longer side is this many times the shorter are removed
    vocab_size: int = 8000
    spm_model: str = "unigram"  # unigram | bpe
    joint_vocab: bool = True
    cache_dir: str = "data/cache"


@dataclass
class ModelConfig:
    """Architecture; `arch` picks the builder in nmt.models.seq2seq.BUILDERS.

    One flat schema for every arch: each key says which archs read it (the others ignore it).
    """

    arch: str = "transformer"  # transformer | bahdanau | luong
    dim: int = 256  # model width: Transformer d_model; RNN decoder state and encoder output (both directions together)
    layers: int = 3  # Transformer layers per stack; RNN layers in the encoder and in the decoder
    heads: int = 4  # transformer: attention heads
    ffn_dim: int = 1024  # transformer: feed-forward inner size
    dropout: float = 0.1
    norm: str = "pre"  # transformer: pre | post (layer norm before or after each sub-layer)
    scale: bool = True  # transformer: divide attention scores by sqrt(d_head)
    tie_embeddings: bool = True  # target input/output; source too when the vocabulary is joint
    # --- RNN encoder-decoders (bahdanau, luong) ---
    embed_dim: Optional[int] = None  # token embedding size (None: same as dim)
    cell: str = "lstm"  # gru | lstm
    bidirectional: bool = True  # encoder reads both ways; each direction gets dim / 2
    bridge: str = "bridge"  # initial decoder state: bridge (tanh(W h_enc_final)) | zero
    score: str = "general"  # additive | dot | general | concat | location (nmt.models.attention.SCORES)
    window: str = "global"  # global | local_m | local_p (Luong et al. 2015, sec. 3.2)
    window_size: int = 10  # D: local windows cover [p_t - D, p_t + D]; local-p's Gaussian has sigma = D / 2
    input_feeding: bool = True  # luong: feed the attentional vector h~_{t-1} into the next RNN input
    attention: str = "soft"  # soft | hard (one sampled source position per step, straight-through Gumbel-softmax)
    gumbel_tau: float = 1.0  # hard: temperature of the Gumbel-softmax relaxation behind the gradients
    max_src_len: int = 256  # location score: one weight row per source position; later positions share the last

    def __post_init__(self) -> None:
        """An unknown name or impossible combination fails at composition, with the valid choices listed."""
        from nmt.models.seq2seq import check_model_config

        check_model_config(self)


@dataclass
class TrainConfig:
    """Optimisation, validation and checkpointing."""

    max_steps: int = 10000
    max_epochs: Optional[int] = None
    batch_tokens: int = 4096
    lr: float = 5e-4  # peak learning rate, reached at the end of warm-up
    schedule: str = "inverse_sqrt"  # inverse_sqrt | constant
    warmup: int = 1000
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    valid_every: int = 1000
    save_every: int = 1000
    keep_last: int = 3  # the newest N step checkpoints kept (checkpoints/step_N.pt; last.pt is the newest)
    keep_best: int = 1  # the best M step checkpoints by early_stop_metric also kept (best.pt is the best)
    early_stop_metric: str = "bleu"  # bleu | chrf | loss: the validation score that picks best.pt and drives patience
    patience: Optional[int] = None  # stop after this many validations in a row without a new best (None: never)
    max_bad_steps: int = 5  # stop after this many updates in a row skipped for a non-finite loss or gradient
    valid_bleu_sentences: Optional[int] = None  # translate only the first N validation sentences for BLEU
    log_every: int = 50
    seed: int = 1
    device: str = "auto"  # auto | cpu | cuda
    threads: Optional[int] = None  # torch intra-op threads (None: torch's default)
    progress: bool = True


@dataclass
class DecodeConfig:
    """Search settings for validation BLEU, nmt-translate and nmt-evaluate (see nmt/search.py)."""

    beam: int = 1  # beam width K; 1 is greedy search
    alpha: float = 0.0  # GNMT length penalty ((5 + len) / 6) ** alpha; hypotheses are ranked by score / penalty
    max_len_a: float = 1.5  # output length limit: a * source length + b (subword tokens)
    max_len_b: int = 10
    min_len: int = 0  # EOS is forbidden before this many output tokens
    nbest: int = 1  # hypotheses per sentence (at most beam; any number when sampling)
    sampling: bool = False  # draw each token at random instead of searching (beam is then ignored)
    temperature: float = 1.0  # sampling: divide the log-probabilities by this (< 1 sharpens, > 1 flattens)
    top_k: int = 0  # sampling: draw among the k likeliest tokens only (0: all)
    top_p: float = 1.0  # sampling: draw from the smallest set of tokens whose probability reaches p (nucleus)
    seed: int = 1  # sampling: random seed
    max_src_len: int = 1024  # longer sources are cut to this many subword tokens, with a warning
    batch_size: int = 64  # sentences per batch
    batch_tokens: int = 32768  # and at most this many beam rows x padded source tokens per batch


@dataclass
class Config:
    """A training run (nmt-train, nmt-prepare)."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    run_dir: Optional[str] = None  # default: outputs/DATE/TIME
    resume: Optional[str] = None  # a run dir to continue exactly from its checkpoints/last.pt
    init_from: Optional[str] = None  # a checkpoint (or run dir) whose weights and tokenizer start a new run (fine-tuning)


@dataclass
class TranslateConfig:
    """nmt-translate: a checkpoint, an input and an output (stdin/stdout by default)."""

    checkpoint: str = MISSING
    input: Optional[str] = None
    output: Optional[str] = None
    chunk_size: int = 10000  # lines read, translated and written at a time (sorted by length inside a chunk)
    attention_out: Optional[str] = None  # write each line's attention matrix: FILE.npz, else JSON lines
    plot_dir: Optional[str] = None  # write attention heat-maps (PNG) of the first plot_n sentences here
    plot_n: int = 10
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    device: str = "auto"
    progress: bool = True


@dataclass
class EvaluateConfig:
    """nmt-evaluate: score a checkpoint on a split of its data or on src/ref files, or score hyp against ref."""

    checkpoint: Optional[str] = None
    split: str = "test"
    src: Optional[str] = None
    ref: Optional[str] = None
    hyp: Optional[str] = None  # an existing translation to score (no checkpoint needed)
    hyp_out: Optional[str] = None
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    device: str = "auto"
    progress: bool = True


@dataclass
class AverageConfig:
    """nmt-average: the weights of a run's newest step checkpoints averaged into one checkpoint."""

    run: str = MISSING  # a run dir written by nmt-train
    last: int = 3  # how many of its newest checkpoints/step_N.pt to average
    output: Optional[str] = None  # default: RUN/checkpoints/average.pt


def register_configs() -> None:
    """Register the schemas with Hydra's ConfigStore (the recipes' `defaults` name them)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="base_config", node=Config)
    store.store(name="base_translate", node=TranslateConfig)
    store.store(name="base_evaluate", node=EvaluateConfig)
    store.store(name="base_average", node=AverageConfig)


def to_object(cfg: DictConfig):
    """The composed config as plain dataclasses (interpolations resolved)."""
    return OmegaConf.to_object(cfg)


def config_from_yaml(text: str) -> Config:
    """A run's saved config (as stored in checkpoints), validated against the schema."""
    merged = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(text))
    return OmegaConf.to_object(merged)


def config_to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
