"""Score one finished run on the test set: RUN/test.hyp, RUN/test.atN.hyp, RUN/eval.json and RUN/heatmaps.json.

At each budget point N the model a run of N updates would choose (checkpoints/best_at_N.pt, the best by validation
score among the first N updates) translates the test set with the run's own decoding settings (the same for every
variant); BLEU, chrF, chrF++ and TER come from sacrebleu with their signatures (the report fills chrF++ in, from
test.hyp, for runs scored before it was added: nmt.compare.report.fill_scores). The model at the shared budget (or
best.pt, for a time budget) is then probed: the reference forced through it (nmt.compare.probe) for the attention
diagnostics, the alignment scores against gold word alignments and the heat maps. eval.json is written last, so its
presence means the run is scored. COMET (comet.model=) is scored by the report, not here (nmt.compare.report).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nmt.api import load_model
from nmt.compare.probe import ForcedAttention, forced_attention, forced_layer_attention
from nmt.config import DecodeConfig
from nmt.data.dataset import read_split
from nmt.data.tokenizer import Tokenizer
from nmt.evaluation.alignment import (
    AlignmentScore,
    GoldAlignment,
    argmax_links,
    merge_to_words,
    read_pharaoh,
    word_index,
)
from nmt.evaluation.diagnostics import AttentionStats
from nmt.evaluation.metrics import corpus_score
from nmt.fileio import atomic_open
from nmt.runtime import resolve_device
from nmt.training.checkpoint import BEST, checkpoint_config, load_checkpoint
from nmt.translation import Translator, decode_settings

EVAL, HYP, HEATMAPS = "eval.json", "test.hyp", "heatmaps.json"
EVAL_VERSION = 3  # 3: test scored at budget points (eval.json "points"); 2: attention figures on renormalised rows,
# per-layer AER; older eval.json files are scored again
END = "</s>"
SCORED = ("bleu", "chrf", "chrf++", "ter", "bleu_lc")  # eval.json's "scores" (chrf++ is not in older files)


@dataclass
class TestSet:
    """The test pairs every variant is scored on, their gold alignments if any, the lines drawn as heat maps, the
    attention thresholds; `align_sha256` names the gold alignment text (None without one)."""

    src: list[str]
    ref: list[str]
    gold: list[GoldAlignment] | None
    heatmap_lines: list[int]
    under: float = 0.5
    over: float = 2.0
    align_sha256: str | None = None


def eval_settings(test: TestSet, decode: DecodeConfig) -> dict:
    """Every setting that changes a number of eval.json: a run scored with other settings is scored again."""
    return {
        "test_sha256": test_digest(test.src, test.ref),
        "align_sha256": test.align_sha256,
        "heatmap_lines": list(test.heatmap_lines),
        "under_attended": test.under,
        "over_attended": test.over,
        "decode": decode_settings(decode),
        "version": EVAL_VERSION,
    }


def tokenizer_digest(tokenizer: Tokenizer) -> str:
    """sha256 of the SentencePiece model(s): equal digests mean the same vocabulary and segmentation."""
    digest = hashlib.sha256()
    for side, model in sorted(tokenizer.state().items()):
        digest.update(side.encode() + b"\0" + model)
    return digest.hexdigest()


def test_digest(src: list[str], ref: list[str]) -> str:
    """sha256 of the test set's text, to tell whether two runs were scored on the same sentences."""
    return hashlib.sha256("\n".join(src + ["\0"] + ref).encode("utf-8", "surrogatepass")).hexdigest()


def word_positions(
    tokenizer: Tokenizer, src_ids: list[int], tgt_ids: list[int], src: str, ref: str
) -> tuple[list[int], list[int]] | None:
    """The word of each source and reference piece, or None where pieces and whitespace words disagree."""
    src_words = word_index([tokenizer.src.id_to_piece(i) for i in src_ids])
    tgt_words = word_index([tokenizer.tgt.id_to_piece(i) for i in tgt_ids])
    if max(src_words, default=-1) + 1 != len(src.split()) or max(tgt_words, default=-1) + 1 != len(ref.split()):
        return None
    return src_words, tgt_words


def heatmap_record(
    line: int,
    forced: ForcedAttention,
    words: tuple[list[int], list[int]] | None,
    tokenizer: Tokenizer,
    src_ids: list[int],
    tgt_ids: list[int],
    src: str,
    ref: str,
) -> dict:
    """One sentence for the heat-map figure: reference words x (source words + </s>),
    or pieces when words do not fit."""
    if words is None:
        labels_src = [tokenizer.src.id_to_piece(i) for i in src_ids] + [END]
        labels_tgt = [tokenizer.tgt.id_to_piece(i) for i in tgt_ids]
        matrix = forced.attention[: len(tgt_ids)]
        unit = "piece"
    else:
        src_words, tgt_words = words
        matrix = merge_to_words(
            forced.attention, src_words + [max(src_words, default=-1) + 1], tgt_words
        )  # </s> as its own column
        labels_src, labels_tgt, unit = src.split() + [END], ref.split(), "word"
    return {"line": line, "unit": unit, "src": labels_src, "tgt": labels_tgt, "attention": np.round(matrix, 4).tolist()}


def alignment_score(
    attention: list[np.ndarray], words: list[tuple[list[int], list[int]] | None], gold: list[GoldAlignment]
) -> dict:
    """AER, precision, recall of argmax links against gold, with the sentences scored and skipped (pieces that do not
    merge into the whitespace words)."""
    score, skipped = AlignmentScore(), 0
    for matrix, positions, links in zip(attention, words, gold):
        if positions is None:
            skipped += 1
        else:
            score.add(argmax_links(merge_to_words(matrix, *positions)), links)
    return {**score.as_dict(), "scored": len(gold) - skipped, "skipped": skipped}


def layer_alignment(
    model, tokenizer: Tokenizer, src: list[str], tgt: list[str], gold: list[GoldAlignment], device
) -> list[dict] | None:
    """A Transformer's alignment scores layer by layer (cross-attention averaged over heads); None for an RNN."""
    src_ids, tgt_ids = tokenizer.encode_src(src), tokenizer.encode_tgt(tgt)
    layers = forced_layer_attention(model, src_ids, tgt_ids, device)
    if layers is None:
        return None
    words = [word_positions(tokenizer, src_ids[k], tgt_ids[k], src[k], tgt[k]) for k in range(len(src))]
    return (
        [alignment_score([m[layer] for m in layers], words, gold) for layer in range(layers[0].shape[0])]
        if layers
        else []
    )


def validation_gold(cfg) -> tuple[list[str], list[str], list[GoldAlignment]] | None:
    """The validation split and its gold alignments (DATA.valid + .align), to choose a Transformer layer on;
    None without."""
    path = Path(f"{cfg.data.valid}.align") if cfg.data.valid else None
    if path is None or not path.is_file():
        return None
    split = read_split(cfg.data, "valid")
    return (split.src, split.tgt, read_pharaoh(path, split.src, split.tgt)) if split is not None else None


def point_hyp(point: int) -> str:
    """RUN/test.atN.hyp: the test translation of the model chosen at budget point N."""
    return f"test.at{point}.hyp"


def translate_test(path: Path, test: TestSet) -> tuple[object, list[str], dict]:
    """Load a checkpoint as nmt-translate would (its decode.precision honoured) and translate the test set with the
    run's decoding settings: (the loaded model, the translations, their figures)."""
    cfg = checkpoint_config(load_checkpoint(path))
    device = resolve_device(cfg.train.device)
    loaded = load_model(str(path), cfg.decode.precision, device)  # the API's loading path
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    translator = Translator(loaded.model, loaded.tokenizer, cfg.decode, device)
    start, cpu = time.perf_counter(), time.process_time()
    hyps = translator.translate(test.src)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    scores = {name: corpus_score(name, hyps, test.ref) for name in SCORED}
    figures = {
        "checkpoint": f"checkpoints/{path.name}",
        "checkpoint_step": loaded.step,
        "scores": {name: {"score": round(s.score, 4), "signature": s.signature} for name, s in scores.items()},
        "decode_seconds": round(seconds, 3),
        "sentences_per_s": round(len(hyps) / seconds, 2) if seconds > 0 else None,
        "decode_cpu_seconds": round(cpu_seconds, 3),  # all threads: per thread-second with train.threads=1
        "sentences_per_cpu_s": round(len(hyps) / cpu_seconds, 2) if cpu_seconds > 0 else None,
    }
    return loaded, hyps, figures


def evaluate_run(
    run_dir: Path,
    test: TestSet,
    points: list[int] | None = None,
    primary: int | None = None,
    session: dict | None = None,
) -> dict:
    """Translate the test set with the model chosen at each budget point (checkpoints/best_at_N.pt, the best by
    validation among the first N updates; test.atN.hyp) and probe it with the one at `primary` (the shared budget;
    without points, checkpoints/best.pt): test.hyp, heatmaps.json, eval.json. Points an earlier call scored with the
    same settings are kept, so an extended run scores only its further points.

    The search and the probe run in the run's decode.precision (as nmt-translate would).
    """
    start_all = time.perf_counter()
    points = points or []
    first = run_dir / "checkpoints" / (f"best_at_{primary}.pt" if points and primary else BEST)
    cfg = checkpoint_config(load_checkpoint(first))
    settings = eval_settings(test, cfg.decode)
    earlier = _json(run_dir / EVAL)
    if earlier is not None and earlier.get("settings") != settings:
        earlier = None
    scored = dict((earlier or {}).get("points") or {})
    for point in points:
        if str(point) in scored and (run_dir / point_hyp(point)).is_file():
            continue
        _, hyps, figures = translate_test(run_dir / "checkpoints" / f"best_at_{point}.pt", test)
        with atomic_open(run_dir / point_hyp(point), key="run_dir") as f:
            f.writelines(h + "\n" for h in hyps)
        scored[str(point)] = {**figures, "hyp": point_hyp(point), "session": session}
    if earlier is not None and (run_dir / HYP).is_file():
        result = {**earlier, "points": scored}
    else:
        result = _probe(run_dir, first, test, settings)
        result["points"] = scored
        result["session"] = session
    result["scoring_seconds"] = round((earlier or {}).get("scoring_seconds", 0.0) + time.perf_counter() - start_all, 1)
    with atomic_open(run_dir / EVAL, key="run_dir") as f:
        f.write(json.dumps(result, indent=2) + "\n")
    return result


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except ValueError:
        return None


def _probe(run_dir: Path, checkpoint: Path, test: TestSet, settings: dict) -> dict:
    """test.hyp and the attention figures of one checkpoint: the translation, the reference forced through the model
    (attention diagnostics, heat maps, alignment scores)."""
    loaded, hyps, figures = translate_test(checkpoint, test)
    model, tokenizer = loaded.model, loaded.tokenizer
    cfg = checkpoint_config(load_checkpoint(checkpoint))
    device = resolve_device(cfg.train.device)
    parameters = sum(p.numel() for p in model.parameters() if p.dtype.is_floating_point)
    with atomic_open(run_dir / HYP, key="run_dir") as f:
        f.writelines(h + "\n" for h in hyps)

    src_ids, tgt_ids = tokenizer.encode_src(test.src), tokenizer.encode_tgt(test.ref)
    forced = forced_attention(model, src_ids, tgt_ids, device)
    stats, heatmaps = AttentionStats(test.under, test.over), []
    words = [word_positions(tokenizer, src_ids[k], tgt_ids[k], test.src[k], test.ref[k]) for k in range(len(test.src))]
    for k, probe in enumerate(forced):
        stats.add(probe.attention, probe.positions)
        if k in test.heatmap_lines:
            heatmaps.append(
                heatmap_record(k, probe, words[k], tokenizer, src_ids[k], tgt_ids[k], test.src[k], test.ref[k])
            )
    with atomic_open(run_dir / HEATMAPS, key="run_dir") as f:
        json.dump(sorted(heatmaps, key=lambda r: test.heatmap_lines.index(r["line"])), f)

    alignment = layers = None
    if test.gold is not None:
        alignment = {
            **alignment_score([p.attention for p in forced], words, test.gold),
            "layer": "last, mean over heads",
        }
        by_layer = layer_alignment(model, tokenizer, test.src, test.ref, test.gold, device)
        if by_layer:
            valid = validation_gold(cfg)
            valid_layers = layer_alignment(model, tokenizer, *valid, device) if valid else None
            chooser, on = (
                (valid_layers, "validation") if valid_layers else (by_layer, "test (no validation alignments)")
            )
            best = min(range(len(chooser)), key=lambda i: chooser[i]["aer"])
            layers = {"test": by_layer, "valid": valid_layers, "best_layer": best, "chosen_on": on}
            alignment = {
                **by_layer[best],
                "layer": f"layer {best + 1} of {len(by_layer)} (lowest AER on {on}), mean over heads",
            }

    return {
        **figures,
        "sentences": len(hyps),
        "test_sha256": test_digest(test.src, test.ref),
        "decode": decode_settings(cfg.decode),
        "settings": settings,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "parameters": parameters,
        "tokenizer_sha256": tokenizer_digest(tokenizer),
        "attention": {key: (round(v, 6) if isinstance(v, float) else v) for key, v in stats.as_dict().items()},
        "alignment": alignment,
        "alignment_by_layer": layers,
    }
