"""COMET with Unbabel's unbabel-comet (the optional `comet` extra): offline, cached, and its bootstrap.

COMET (Rei et al. 2020; the usual model, wmt22-comet-da, Rei et al. 2022) reads each (source, hypothesis,
reference) triple with a pretrained encoder and regresses a segment score; a system's score is the mean of its
segment scores. This module:
- finds the model without fetching anything: a checkpoint file (MODEL/checkpoints/model.ckpt beside
  MODEL/hparams.yaml, COMET's layout), that folder, or the name of a model already downloaded into the Hugging Face
  cache; a model that is not there is an error that says what to fetch once, and how;
- loads it offline (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE and local_files_only), so a missing file is an error,
  never a download;
- caches each scored (model, sources, hypotheses, references) as CACHE/<key>.json: scoring the same text with the
  same model again reads the file and loads no model;
- tests a COMET difference between two systems with the paired cluster bootstrap over segment scores.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

from nmt.errors import NmtError
from nmt.evaluation.significance import BootstrapResult, bootstrap_p, draw_weights

# the extra also pins what unbabel-comet's numpy<2 needs (pyarrow<26); transformers<5 keeps it apart from the hf extra
EXTRA = (
    "pip install -e '.[comet]' in the clone's folder (best in an environment of its own: COMET needs "
    "transformers<5, the hf extra transformers 5)"
)
OWN_ENV = "python -m venv ~/.venvs/nmt-comet && ~/.venvs/nmt-comet/bin/pip install -e '.[comet]'"  # in the clone
SIZES = {"Unbabel/wmt22-comet-da": "about 2.3 GB"}  # what the fetch downloads, for the message
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name on the Hugging Face Hub
TOKENIZER_FILES = ("tokenizer.json", "sentencepiece.bpe.model", "spm.model", "vocab.txt")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
NOISY_LOGGERS = ("comet", "pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric", "lightning.fabric")
DIGITS = 4  # COMET is on a 0-1 scale: shown with 4 decimals


def default_cache() -> Path:
    """$XDG_CACHE_HOME/nmt/comet, else ~/.cache/nmt/comet."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nmt" / "comet"


def fetch_command(name: str) -> str:
    """The command that downloads a COMET model and its encoder's tokenizer and config into the Hugging Face cache
    (loading it once fetches the encoder's files, which the model's hparams.yaml names)."""
    code = f"from comet import download_model, load_from_checkpoint; load_from_checkpoint(download_model({name!r}))"
    return f'python -c "{code}"'


def encoder_fetch_command(encoder: str) -> str:
    """The command that downloads an encoder's config and tokenizer (a few MB) into the Hugging Face cache."""
    code = (
        f"from transformers import AutoConfig, AutoTokenizer; AutoConfig.from_pretrained({encoder!r}); "
        f"AutoTokenizer.from_pretrained({encoder!r})"
    )
    return f'python -c "{code}"'


def comet_version(key: str) -> str:
    """The installed unbabel-comet's version; a clear line when it is missing, or when the installed transformers is
    one it declares it cannot run with (COMET 2.2's encoder fails on transformers 5's model outputs)."""
    try:
        version = metadata.version("unbabel-comet")
    except metadata.PackageNotFoundError:
        raise NmtError(
            f"{key}: COMET needs the unbabel-comet package (the comet extra), which is not installed; install it "
            f"with: {EXTRA}"
        ) from None
    from packaging.requirements import Requirement

    for text in metadata.requires("unbabel-comet") or []:
        requirement = Requirement(text)
        if requirement.name == "transformers" and requirement.marker is None:
            have = metadata.version("transformers")
            if not requirement.specifier.contains(have, prereleases=True):
                raise NmtError(
                    f"{key}: unbabel-comet {version} needs transformers{requirement.specifier}, but this environment "
                    f"has transformers {have} (which the hf extra needs); score COMET in an environment of its own: "
                    f"{OWN_ENV}"
                )
    return version


@dataclass
class Checkpoint:
    """A COMET model found on disk: its checkpoint file, the name it is shown by, its hparams.yaml."""

    path: Path
    name: str
    hparams: dict

    def fingerprint(self) -> str:
        """sha256 of hparams.yaml, the checkpoint's size, and its first and last MiB (a torch checkpoint is a zip
        file whose last bytes hold the CRC of every tensor): the same model under any path, read in milliseconds."""
        digest = hashlib.sha256((self.path.parents[1] / "hparams.yaml").read_bytes())
        size = self.path.stat().st_size
        digest.update(str(size).encode())
        with open(self.path, "rb") as f:
            digest.update(f.read(1 << 20))
            f.seek(max(0, size - (1 << 20)))
            digest.update(f.read())
        return digest.hexdigest()


def _cached_file(repo: str, filename: str) -> str | None:
    """A file of a Hugging Face repository in the local cache, or None (never a download)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, filename)
    return found if isinstance(found, str) else None


def find_checkpoint(model: str, key: str = "comet.model") -> Checkpoint:
    """The checkpoint `model` names: a checkpoint file, a COMET model folder (with checkpoints/model.ckpt), or a
    downloaded name (owner/name in the Hugging Face cache). Nothing is fetched; each failure is one line."""
    path = Path(model).expanduser()
    if path.is_dir():
        found = next((p for p in (path / "checkpoints" / "model.ckpt", path / "model.ckpt") if p.is_file()), None)
        if found is None:
            raise NmtError(
                f"{key}={model}: no checkpoints/model.ckpt in that folder; expected a COMET model folder "
                "(hparams.yaml and checkpoints/model.ckpt) or its checkpoint file"
            )
        path = found
    elif not path.is_file():
        if not HUB_NAME.fullmatch(model):
            raise NmtError(
                f"{key}={model}: no such file or folder; expected a COMET checkpoint (MODEL/checkpoints/model.ckpt), "
                "its folder, or the name of a downloaded model (e.g. Unbabel/wmt22-comet-da)"
            )
        cached = _cached_file(model, "checkpoints/model.ckpt")
        if cached is None or _cached_file(model, "hparams.yaml") is None:
            size = f"{SIZES[model]}, " if model in SIZES else ""
            raise NmtError(
                f"{key}={model}: not downloaded; fetch it once with: {fetch_command(model)} ({size}into the Hugging "
                f"Face cache, $HF_HOME or ~/.cache/huggingface), or give {key}=PATH/checkpoints/model.ckpt"
            )
        return Checkpoint(Path(cached), model, _hparams(Path(cached), model, key))
    return Checkpoint(path, path.parents[1].name or path.stem, _hparams(path, model, key))


def _hparams(checkpoint: Path, model: str, key: str) -> dict:
    """MODEL/hparams.yaml (COMET reads the model's class from it), checked for what loading needs."""
    import yaml

    file = checkpoint.parents[1] / "hparams.yaml"
    if not file.is_file():
        raise NmtError(
            f"{key}={model}: no hparams.yaml in {file.parent}; expected COMET's layout, MODEL/hparams.yaml beside "
            "MODEL/checkpoints/model.ckpt"
        )
    try:
        hparams = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise NmtError(f"{key}={model}: {file} is not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(hparams, dict) or "class_identifier" not in hparams:
        raise NmtError(f"{key}={model}: {file} names no class_identifier; expected a COMET model's hparams.yaml")
    encoder = hparams.get("pretrained_model")
    if isinstance(encoder, str) and not Path(encoder).is_dir():
        if _cached_file(encoder, "config.json") is None or not any(_cached_file(encoder, f) for f in TOKENIZER_FILES):
            raise NmtError(
                f"{key}={model}: its encoder {encoder} (hparams.yaml's pretrained_model) has no config and tokenizer "
                f"in the Hugging Face cache; fetch them once (a few MB) with: {encoder_fetch_command(encoder)}"
            )
    return hparams


@contextmanager
def offline_and_quiet() -> Iterator[None]:
    """The Hugging Face libraries offline, and COMET's and Lightning's info lines and warnings silenced; the root
    logger as it was (importing comet calls logging.basicConfig)."""
    saved_env = {name: os.environ.get(name) for name in OFFLINE}
    root = logging.getLogger()
    saved_root = (list(root.handlers), root.level)
    saved_levels = {name: logging.getLogger(name).level for name in NOISY_LOGGERS}
    os.environ.update(OFFLINE)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        root.handlers[:] = saved_root[0]
        root.setLevel(saved_root[1])
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)


@dataclass
class CometResult:
    """COMET of one system: a score per segment, their mean, the signature; `cached` when read from the cache."""

    segments: list[float]
    system: float
    signature: str
    cached: bool = False


def text_digest(lines: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogatepass")).hexdigest()


class CometScorer:
    """Scores (sources, hypotheses, references) with one COMET model; the model loads on the first uncached call.

    model: a checkpoint, its folder or a downloaded name (find_checkpoint); device: auto, cpu or cuda; cache: the
    folder of cached scores (None: default_cache(); False: no cache); key: the setting named in errors.
    """

    def __init__(
        self,
        model: str,
        batch_size: int = 16,
        device: str = "auto",
        progress: bool = True,
        cache: str | Path | None | bool = None,
        key: str = "comet.model",
    ) -> None:
        from nmt.runtime import resolve_device

        self.key, self.given = key, model
        self.version = comet_version(key)
        self.checkpoint = find_checkpoint(model, key)
        self.device = resolve_device(device, key.replace("model", "device"))
        self.batch_size, self.progress = batch_size, progress
        self.cache = None if cache is False else Path(default_cache() if cache in (None, True) else cache)
        self.fingerprint = self.checkpoint.fingerprint()
        self.signature = f"model:{self.checkpoint.name}|fingerprint:{self.fingerprint[:12]}|comet:{self.version}"
        self._model = None

    def _load(self):
        """COMET's own loading (comet.load_from_checkpoint), offline."""
        if self._model is None:
            with offline_and_quiet():
                try:
                    from comet import load_from_checkpoint

                    self._model = load_from_checkpoint(str(self.checkpoint.path), local_files_only=True)
                except Exception as err:  # torch, Lightning, transformers: any failure means this model did not load
                    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
                    raise NmtError(
                        f"{self.key}={self.given}: COMET could not load it offline ({type(err).__name__}: {first})"
                    ) from None
        return self._model

    def cache_file(self, sources: Sequence[str], hyps: Sequence[str], refs: Sequence[str]) -> Path | None:
        """CACHE/<sha256 of the model's fingerprint and the three texts>.json."""
        if self.cache is None:
            return None
        key = hashlib.sha256(
            "\0".join([self.fingerprint, text_digest(sources), text_digest(hyps), text_digest(refs)]).encode()
        ).hexdigest()
        return self.cache / f"{key}.json"

    def score(self, sources: Sequence[str], hyps: Sequence[str], refs: Sequence[str]) -> CometResult:
        """COMET of each hypothesis given its source and reference, and their mean; from the cache when scored
        before."""
        if not len(sources) == len(hyps) == len(refs):
            raise NmtError(
                f"{self.key}: {len(sources)} sources, {len(hyps)} hypotheses and {len(refs)} references; COMET "
                "scores triples line by line, so the counts must match"
            )
        if not hyps:
            raise NmtError(f"{self.key}: no sentences to score")
        file = self.cache_file(sources, hyps, refs)
        if file is not None and file.is_file():
            try:
                entry = json.loads(file.read_text(encoding="utf-8"))
                if len(entry["segments"]) == len(hyps):
                    return CometResult(entry["segments"], entry["system"], entry["signature"], cached=True)
            except (ValueError, KeyError, TypeError):
                pass  # a damaged entry is scored again and rewritten
        start = time.perf_counter()
        model = self._load()
        samples = [{"src": s, "mt": h, "ref": r} for s, h, r in zip(sources, hyps, refs)]
        gpus = 1 if self.device.type == "cuda" else 0
        with offline_and_quiet():
            found = model.predict(
                samples,
                batch_size=self.batch_size,
                gpus=gpus,
                devices=[self.device.index or 0] if gpus else None,
                accelerator="gpu" if gpus else "cpu",
                progress_bar=self.progress,
                num_workers=None if gpus else 0,  # COMET's default on a GPU: 2 workers prepare batches
            )
        segments = [float(s) for s in found.scores]
        result = CometResult(segments, float(np.mean(segments)), self.signature)
        if file is not None:
            self._write(file, result, len(hyps), time.perf_counter() - start, text_digest(hyps))
        return result

    def _write(self, file: Path, result: CometResult, sentences: int, seconds: float, hyp_sha256: str) -> None:
        from nmt.fileio import atomic_open

        try:
            file.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise NmtError(f"comet cache {file.parent}: cannot create it ({err.strerror or err})") from None
        entry = {
            "model": self.checkpoint.name,
            "fingerprint": self.fingerprint,
            "signature": result.signature,
            "sentences": sentences,
            "hyp_sha256": hyp_sha256,
            "system": result.system,
            "segments": result.segments,
            "seconds": round(seconds, 2),
            "device": str(self.device),
            "batch_size": self.batch_size,
        }
        with atomic_open(file, key="comet cache") as f:
            f.write(json.dumps(entry) + "\n")


def api_comet(
    hyps: list[str],
    refs: list[list[str]],
    sources: Sequence[str] | None,
    model: str | None,
    batch_size: int,
    device: str,
    progress: bool,
    cache: str | Path | None | bool,
) -> CometResult:
    """nmt.score's COMET: its arguments checked (named as nmt.score names them), then a CometScorer."""
    if model is None:
        raise NmtError("metrics: comet needs comet_model=PATH (a COMET checkpoint or its folder) or a downloaded name")
    if sources is None:
        raise NmtError("comet_model: COMET reads each hypothesis with its source; give sources=[...], one per line")
    if len(refs) != 1:
        raise NmtError(f"comet_model: COMET scores against one reference per line; got {len(refs)} reference lists")
    sources = list(sources)
    if len(sources) != len(hyps):
        raise NmtError(f"sources: {len(sources)} lines for {len(hyps)} hypotheses; expected one source per hypothesis")
    if device not in ("auto", "cpu", "cuda"):
        raise NmtError(f"comet_device={device!r}: expected auto, cpu or cuda")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise NmtError(f"comet_batch_size={batch_size!r}: expected a whole number >= 1")
    return CometScorer(model, batch_size, device, progress, cache, key="comet_model").score(sources, hyps, refs[0])


# --- is a COMET difference real? ------------------------------------------------------------------------------------


def segment_bootstrap(
    baseline: np.ndarray,
    system: np.ndarray,
    seeds: list[int],
    samples: int,
    seed: int,
    weights: np.ndarray | None = None,
) -> BootstrapResult:
    """The paired cluster bootstrap of a mean-of-segments metric (COMET): baseline, system (seeds, N) segment scores
    of the same seeds in the same order.

    As nmt.evaluation.significance.cluster_bootstrap does for BLEU: a draw picks N test sentences with replacement
    and takes every seed's output of each picked sentence for both systems; a seed's score on the draw is the mean
    of its drawn segment scores (weights @ scores / N, weights (samples, N) counting how often each sentence was
    picked), a system's the mean over its seeds, the draw's delta system minus baseline. The interval is the
    2.5th-97.5th percentile of the deltas; p the two-sided bootstrap p-value (significance.bootstrap_p).
    """
    if seed <= 0:
        raise ValueError(f"bootstrap seed {seed}: expected a positive seed")
    sentences = baseline.shape[1]
    weights = draw_weights(sentences, samples, seed) if weights is None else weights
    observed = float(system.mean() - baseline.mean())
    draws = (weights @ (system - baseline).T).mean(1) / sentences  # (samples,): mean over seeds of weighted means
    low, high = np.percentile(draws, [2.5, 97.5])
    return BootstrapResult(
        observed, float(low), float(high), bootstrap_p(draws, observed), len(draws), sentences, list(seeds)
    )
