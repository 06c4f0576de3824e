"""The Python API: load a trained model and translate, score translations, train from recipes.

    import nmt
    model = nmt.load("runs/m30k_transformer")              # a run dir or a checkpoint file; device, precision
    model.translate(["A man rides a bike."], beam=5)        # -> ["Ein Mann fährt Fahrrad."]
    model.translate(lines, beam=5, nbest=3, return_attention=True)   # -> [Result, ...]
    for event in model.stream("A man rides a bike.", beam=5):  # the output after every decoding step
        print(event.text, event.final)
    model.translate_file("in.txt", "out.txt", batch_size=64)
    nmt.score(hypotheses, references)                       # sacrebleu BLEU, chrF, chrF++, TER with signatures
    nmt.train(["experiment=quickstart", "run_dir=runs/q"])  # -> TrainResult(run_dir, results)

This is the one way in: the command-line tools, the server and nmt-compare load models through
`load_model` here, so a setting such as decode.precision means the same everywhere.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from nmt.config import Config, DecodeConfig, check_fields
from nmt.data.corpus import iter_lines
from nmt.data.tokenizer import Tokenizer
from nmt.engine import PRECISIONS, decoding_copy
from nmt.errors import NmtError
from nmt.fileio import atomic_open
from nmt.models.ensemble import Ensemble
from nmt.models.seq2seq import Seq2Seq
from nmt.runtime import resolve_device
from nmt.translation import Translation, Translator, unscored

if TYPE_CHECKING:
    from nmt.streaming import StreamEvent

PathLike = str | os.PathLike

__all__ = ["Model", "Result", "Score", "TrainResult", "load", "load_model", "load_translator", "score", "train"]


# --- loading: the one path -------------------------------------------------------------------------------------
@dataclass
class Loaded:
    """A model ready to decode (in its precision, eval mode), its tokenizer, training config,
    step and checkpoint path."""

    model: Seq2Seq | Ensemble
    tokenizer: Tokenizer
    config: Config
    step: int
    path: str


_WARNED: set[str] = set()  # warnings already printed by this process


def load_model(
    checkpoint: str | PathLike | Sequence[PathLike], precision: str = "fp32", device: torch.device | str = "cpu"
) -> Loaded:
    """The model of a checkpoint (file or run dir: its best checkpoint), or the ensemble of several (a list, or
    one string with commas), converted to `precision` (fp32, bf16 or int8 linear layers) for decoding.

    The models of an ensemble must share the tokenizer (a checkpoint with another vocabulary is named in the error).
    """
    from nmt.training.checkpoint import load_checkpoint, model_from_checkpoint

    if precision not in PRECISIONS:
        raise NmtError(f"precision={precision}: expected one of {', '.join(PRECISIONS)}")
    device = resolve_device(device, key="device") if isinstance(device, str) else device
    paths = (
        [str(p) for p in checkpoint]
        if isinstance(checkpoint, (list, tuple))
        else [p for p in str(checkpoint).split(",") if p]
    )
    if not paths:
        raise NmtError("checkpoint: expected a checkpoint file or a run dir")
    payloads = [load_checkpoint(path, device) for path in paths]
    loaded = [model_from_checkpoint(payload, device) for payload in payloads]
    tokenizer, train_cfg = loaded[0][1], loaded[0][2]
    for path, (_, other, _) in zip(paths[1:], loaded[1:]):
        if other.state() != tokenizer.state():
            raise NmtError(
                f"{path}: its vocabulary differs from {paths[0]}'s; the models of an ensemble must share one tokenizer"
            )
    from nmt.training.precision import check_bf16, slow_decode_precision

    check_bf16(precision, torch.device(device), "decode.precision")
    slow = slow_decode_precision(precision, torch.device(device))
    if slow and slow not in _WARNED:  # once per process
        _WARNED.add(slow)
        print(f"warning: {slow}", file=sys.stderr)
    models = []
    while loaded:  # one trained model at a time becomes its decoding copy, and is let go
        models.append(decoding_copy(loaded.pop(0)[0], precision))
    model = models[0] if len(models) == 1 else Ensemble(models).eval()
    return Loaded(model, tokenizer, train_cfg, payloads[0]["step"], payloads[0]["path"])


def load_translator(
    checkpoint: str, decode: DecodeConfig, device_name: str, threads: int | None = None
) -> tuple[Translator, Config]:
    """A Translator for a checkpoint file or run dir (or a comma-separated ensemble),
    and the config it was trained with."""
    device = resolve_device(device_name, key="device")
    if threads is not None:
        torch.set_num_threads(threads)
    loaded = load_model(checkpoint, decode.precision, device)
    return Translator(loaded.model, loaded.tokenizer, decode, device), loaded.config


# --- results ---------------------------------------------------------------------------------------------------
@dataclass
class Result:
    """One input line translated: its hypotheses (best first) with scores, subword tokens and attention if asked."""

    source: str
    hypotheses: list[str]  # [] for a blank line
    scores: list[float]  # length-normalised log-probabilities (the search's ranking)
    tokens: list[list[str]]  # each hypothesis's target subwords
    source_tokens: list[str]  # the source subwords as translated (cut to decode.max_src_len), then </s>
    attention: list[np.ndarray] | None = None  # per hypothesis (output steps incl. EOS, source tokens incl. </s>)
    alignments: list[list[tuple[int, int]]] | None = None  # per hypothesis, word links (source i, target j) from 0

    @property
    def text(self) -> str:
        """The best hypothesis ('' for a blank line)."""
        return self.hypotheses[0] if self.hypotheses else ""


@dataclass
class Score:
    """A corpus score and its sacrebleu signature."""

    score: float
    signature: str

    def __float__(self) -> float:
        return self.score


# --- the model -------------------------------------------------------------------------------------------------
_DECODE_KEYS = {f.name for f in fields(DecodeConfig)}


class Model:
    """A trained model ready to translate (made by `nmt.load`)."""

    def __init__(self, loaded: Loaded, decode: DecodeConfig, device: torch.device, source: str):
        self.loaded, self.decode, self.device, self.source = loaded, decode, device, source

    @property
    def config(self) -> Config:
        """The resolved config the model was trained with."""
        return self.loaded.config

    @property
    def tokenizer(self) -> Tokenizer:
        return self.loaded.tokenizer

    def __repr__(self) -> str:
        m = self.config.model
        from nmt.engine.native import describe

        native = describe() if self.device.type == "cpu" else "none (not a CPU)"
        product = ""
        if self.device.type == "cpu" and self.decode.precision == "fp32":
            from nmt.engine.onednn import fp32_backend

            product = f" on {fp32_backend()} products"  # which fp32 linear the decoding copy runs (NMT_FP32_GEMM)
        return (
            f"nmt.Model({self.source!r}, arch={m.arch}, step={self.loaded.step}, device={self.device}, "
            f"{self.decode.precision}{product}, native={native})"
        )

    def settings(self, **overrides: Any) -> DecodeConfig:
        """The decoding settings of one call: the model's defaults with these keys replaced
        (decode.* names, plus beam)."""
        unknown = sorted(set(overrides) - _DECODE_KEYS)
        if unknown:
            raise NmtError(f"{unknown[0]}: not a decoding setting; expected one of {', '.join(sorted(_DECODE_KEYS))}")
        given = {k: v for k, v in overrides.items() if v is not None}
        if "precision" in given and given["precision"] != self.decode.precision:
            raise NmtError(
                f"precision={given['precision']}: the model was loaded in {self.decode.precision}; "
                "give precision= to nmt.load"
            )
        if given.get("nbest", 1) > 1 and "beam" not in given and not given.get("sampling", self.decode.sampling):
            given["beam"] = max(self.decode.beam, given["nbest"])
        try:
            settings = replace(self.decode, **given)
            check_fields(settings, "")
        except (TypeError, ValueError) as err:
            raise NmtError(str(err)) from None
        return settings

    def _translator(self, decode: DecodeConfig) -> Translator:
        return Translator(self.loaded.model, self.tokenizer, decode, self.device)

    def translate(
        self,
        lines: str | Sequence[str],
        *,
        beam: int | None = None,
        nbest: int | None = None,
        return_attention: bool = False,
        prefix: str | Sequence[str | None] | None = None,
        constraints: Sequence[str] | Sequence[Sequence[str]] | None = None,
        avoid: Sequence[str] | Sequence[Sequence[str]] | None = None,
        return_alignments: bool = False,
        align_method: str = "argmax",
        align_threshold: float = 0.5,
        align_layer: int | None = None,
        align_head: int | None = None,
        rich: bool | None = None,
        **decode: Any,
    ) -> Any:
        """Translate one string or a list of lines; every line gets a result, in order (a blank line gets "").

        Returns the best translation per line (a string for a string), or with `nbest` > 1, `return_attention` or
        `return_alignments` (or rich=True) a `Result` per line. `prefix`: the target text every output starts with
        (one string for all lines, or one per line, None for none). `constraints` / `avoid`: target phrases every
        output must contain / must not contain (a list of strings for all lines, or one list per line), by
        lexically constrained beam search. `return_alignments`: word links per hypothesis
        from the attention (`align_*`: see nmt.alignments). Other keyword arguments are decoding settings (alpha,
        max_len_a, sampling, no_repeat_ngram_size, repetition_penalty, ...).
        """
        single = isinstance(lines, str)
        batch = [lines] if single else list(lines)
        for k, line in enumerate(batch):
            if not isinstance(line, str):
                raise NmtError(f"lines[{k}]: expected a string, got {type(line).__name__}")
        prefixes = self._prefixes(prefix, len(batch))
        needs, avoids = self._phrases(constraints, len(batch), "constraints"), self._phrases(avoid, len(batch), "avoid")
        settings = self.settings(beam=beam, nbest=nbest, **decode)
        want_rich = rich if rich is not None else (settings.nbest > 1 or return_attention or return_alignments)
        translator = self._translator(settings if want_rich else unscored(settings))  # texts only: no scores
        aligner = None
        if return_alignments:
            from nmt.alignments import Aligner

            aligner = Aligner(
                self.loaded.model, self.tokenizer, self.device, align_method, align_threshold, align_layer, align_head
            )
        with torch.inference_mode():
            translations = translator.translate_lines(
                [" ".join(line.split()) for line in batch], prefixes=prefixes, constraints=needs, avoid=avoids
            )
        if not want_rich:
            best = translator.tokenizer.decode_tgt([t.hyps[0].tokens if t.hyps else [] for t in translations])
            texts = [text if t.hyps else "" for text, t in zip(best, translations)]
            return texts[0] if single else texts
        results = [self._result(line, t, translator, return_attention, aligner) for line, t in zip(batch, translations)]
        return results[0] if single else results

    @staticmethod
    def _phrases(value: Any, count: int, name: str) -> list[list[str]] | None:
        if value is None:
            return None
        items = list(value)
        if all(isinstance(p, str) for p in items):
            return [items] * count
        if len(items) != count or not all(
            isinstance(line, (list, tuple)) and all(isinstance(p, str) for p in line) for line in items
        ):
            raise NmtError(
                f"{name}: expected a list of strings (for every line) or one list of strings per line ({count})"
            )
        return [list(line) for line in items]

    @staticmethod
    def _prefixes(prefix: str | Sequence[str | None] | None, count: int) -> list[str | None] | None:
        if prefix is None:
            return None
        if isinstance(prefix, str):
            return [prefix] * count
        prefixes = list(prefix)
        if len(prefixes) != count:
            raise NmtError(f"prefix: {len(prefixes)} prefixes for {count} lines; expected one per line (or one string)")
        for k, p in enumerate(prefixes):
            if p is not None and not isinstance(p, str):
                raise NmtError(f"prefix[{k}]: expected a string or None, got {type(p).__name__}")
        return prefixes

    def _result(
        self, line: str, translation: Translation, translator: Translator, attention: bool, aligner: Any = None
    ) -> Result:
        tok = self.tokenizer
        texts = translator.detokenize(translation.hyps) if translation.hyps else []
        pieces = [[tok.tgt.id_to_piece(i) for i in h.tokens] for h in translation.hyps]
        source = [tok.src.id_to_piece(i) for i in translation.src_ids] + ["</s>"] if translation.hyps else []
        maps = [h.attention.float().numpy() for h in translation.hyps] if attention else None
        links = [aligner.links(translation, k) for k in range(len(translation.hyps))] if aligner else None
        return Result(line, texts, [float(h.norm_score) for h in translation.hyps], pieces, source, maps, links)

    def stream(
        self,
        text: str,
        *,
        beam: int | None = None,
        prefix: str | None = None,
        attention: bool = False,
        finished_only: bool = False,
        nbest: int | None = None,
        constraints: Sequence[str] | None = None,
        avoid: Sequence[str] | None = None,
        **decode: Any,
    ) -> Iterator[StreamEvent]:
        """Translate one line as it is decoded: a `StreamEvent` after every decoding step (the tokens and text so
        far; for beam search the top of the beam, or with finished_only=True the best finished hypothesis when it
        changes; the step's attention row when `attention`), then a final event (final=True) whose text is what
        `translate(text, ...)` returns with the same settings. nbest > 1, constraints and avoid do not stream:
        refused with `nmt.streaming.NotStreamable` (a ValueError). See nmt.streaming."""
        from nmt.streaming import blank_event, check_streamable, events

        if not isinstance(text, str):
            raise NmtError(f"text: expected one string (Model.stream translates one line), got {type(text).__name__}")
        if prefix is not None and not isinstance(prefix, str):
            raise NmtError(f"prefix: expected a string or None, got {type(prefix).__name__}")
        settings = self.settings(beam=beam, nbest=nbest, **decode)
        check_streamable(settings, constraints, avoid, prefix)
        translator = self._translator(settings)
        line = " ".join(text.split())
        if not line:
            return iter([blank_event(attention)])
        src_ids = translator.encode([line])[0]
        prefix_ids = translator.encode_prefixes([prefix])[0] if prefix else []
        return events(translator, src_ids, prefix_ids or None, attention, finished_only)

    def translate_file(
        self, src: PathLike, out: PathLike, *, batch_size: int = 64, beam: int | None = None, **decode: Any
    ) -> int:
        """Translate a text file (plain or .gz) line by line into `out`, streaming `batch_size` lines at a time; the
        output has one line per input line and appears only when complete. Returns the number of lines."""
        if batch_size < 1:
            raise NmtError(f"batch_size={batch_size}: expected at least 1")
        if Path(out).resolve() == Path(src).resolve():
            raise NmtError(f"out={out}: is the input file; choose another output path")
        translator = self._translator(unscored(self.settings(beam=beam, **decode)))  # text out: no scores
        count, chunk = 0, []
        with atomic_open(str(out), "w", key="out") as f:

            def flush() -> None:
                with torch.inference_mode():
                    texts = translator.translate(chunk)
                f.writelines(text.replace("\n", " ") + "\n" for text in texts)

            for line in iter_lines(str(src)):
                chunk.append(line)
                if len(chunk) == batch_size:
                    flush()
                    count, chunk = count + len(chunk), []
            if chunk:
                flush()
                count += len(chunk)
        return count


def load(
    path: PathLike | Sequence[PathLike],
    device: str = "auto",
    precision: str = "fp32",
    threads: int | None = None,
    **decode: Any,
) -> Model:
    """Load a trained model from a run dir (its best checkpoint), a checkpoint file, or a list of them (an ensemble).

    device: "cpu", "cuda", "mps" or "auto" (the GPU if there is one); precision: fp32, bf16 or int8 linear layers;
    threads: torch's CPU threads for this process (None leaves them as they are). Other keyword arguments set the
    default decoding settings (beam, alpha, nbest, ...; decode.* names); otherwise the run's own decode settings.
    """
    dev = resolve_device(device, key="device")
    if threads is not None:
        if threads < 1:
            raise NmtError(f"threads={threads}: expected at least 1")
        torch.set_num_threads(threads)
    loaded = load_model(path if isinstance(path, (list, tuple)) else str(path), precision, dev)
    base = replace(loaded.config.decode, precision=precision)
    model = Model(loaded, base, dev, str(path))
    model.decode = model.settings(**decode) if decode else base
    return model


def score(
    hypotheses: Sequence[str],
    references: Sequence[str] | Sequence[Sequence[str]],
    metrics: Sequence[str] = ("bleu", "chrf", "chrf++", "ter"),
    sources: Sequence[str] | None = None,
    comet_model: str | None = None,
    comet_batch_size: int = 16,
    comet_device: str = "auto",
    comet_progress: bool = True,
    comet_cache: str | Path | None | bool = None,
) -> dict[str, Score]:
    """Corpus scores of hypotheses against one reference per line (or several: a list of reference lists), from
    sacrebleu; and COMET (the comet extra, nmt.evaluation.comet) when `comet_model` names a COMET checkpoint, its
    folder or a downloaded model (never fetched): the mean of its segment scores, which need `sources` and one
    reference per line. COMET scores are cached in `comet_cache` (None: ~/.cache/nmt/comet; False: none)."""
    from nmt.evaluation.metrics import METRICS, check_metrics

    hyps = list(hypotheses)
    refs = (
        [list(references)] if references and isinstance(next(iter(references)), str) else [list(r) for r in references]
    )
    for k, ref in enumerate(refs):
        if len(ref) != len(hyps):
            raise NmtError(
                f"references[{k}]: {len(ref)} lines for {len(hyps)} hypotheses; expected one reference per hypothesis"
            )
    metrics = list(metrics) + (["comet"] if comet_model is not None and "comet" not in metrics else [])
    check_metrics(metrics)
    result = {}
    for name in metrics:
        if name == "comet":
            from nmt.evaluation.comet import api_comet

            found = api_comet(
                hyps, refs, sources, comet_model, comet_batch_size, comet_device, comet_progress, comet_cache
            )
            result[name] = Score(found.system, found.signature)
            continue
        scorer = METRICS[name]()
        found = scorer.corpus_score(hyps, refs)
        result[name] = Score(float(found.score), str(scorer.get_signature()))
    return result


@dataclass
class TrainResult:
    """Where a training run wrote its files, and its results.json."""

    run_dir: Path
    results: dict


def train(overrides: Sequence[str] | None = None, config: Config | None = None, log: Any = print) -> TrainResult:
    """Train a model: from recipe overrides as on the command line (`["experiment=quickstart", "run_dir=runs/q"]`), or
    from a `Config`. `log` receives the training log's lines (None: quiet). Returns the run dir and results.json."""
    from nmt.cli.train import run_training

    if (overrides is None) == (config is None):
        raise NmtError("nmt.train: give overrides=[...] or config=Config(...), one of them")
    run_dir, results, _ = run_training(
        list(overrides) if overrides is not None else None, config, log or (lambda line: None)
    )
    return TrainResult(Path(run_dir), results)
