"""Score one finished run on the test set: RUN/test.hyp, RUN/eval.json and RUN/heatmaps.json.

The best checkpoint (by validation score) translates the test set with the run's own decoding settings
(the same for every variant); BLEU, chrF and TER come from sacrebleu with their signatures. The
reference is then forced through the model (nmt.compare.probe) for the attention diagnostics, the
alignment scores against gold word alignments and the heat maps. eval.json is written last, so its
presence means the run is complete.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nmt.compare.probe import ForcedAttention, forced_attention
from nmt.data.tokenizer import Tokenizer
from nmt.evaluation.alignment import AlignmentScore, GoldAlignment, argmax_links, merge_to_words, word_index
from nmt.evaluation.diagnostics import AttentionStats
from nmt.evaluation.metrics import corpus_score
from nmt.fileio import atomic_open
from nmt.runtime import resolve_device
from nmt.training.checkpoint import BEST, checkpoint_config, load_checkpoint, model_from_checkpoint
from nmt.translation import Translator, decode_settings

EVAL, HYP, HEATMAPS = "eval.json", "test.hyp", "heatmaps.json"
END = "</s>"


@dataclass
class TestSet:
    """The test pairs every variant is scored on, their gold alignments if any, and the lines drawn as heat maps."""

    src: list[str]
    ref: list[str]
    gold: list[GoldAlignment] | None
    heatmap_lines: list[int]


def tokenizer_digest(tokenizer: Tokenizer) -> str:
    """sha256 of the SentencePiece model(s): equal digests mean the same vocabulary and segmentation."""
    digest = hashlib.sha256()
    for side, model in sorted(tokenizer.state().items()):
        digest.update(side.encode() + b"\0" + model)
    return digest.hexdigest()


def test_digest(src: list[str], ref: list[str]) -> str:
    """sha256 of the test set's text, to tell whether two runs were scored on the same sentences."""
    return hashlib.sha256("\n".join(src + ["\0"] + ref).encode("utf-8", "surrogatepass")).hexdigest()


def word_positions(tokenizer: Tokenizer, src_ids: list[int], tgt_ids: list[int], src: str, ref: str) -> tuple[list[int], list[int]] | None:
    """The word of each source and reference piece, or None where pieces and whitespace words disagree."""
    src_words = word_index([tokenizer.src.id_to_piece(i) for i in src_ids])
    tgt_words = word_index([tokenizer.tgt.id_to_piece(i) for i in tgt_ids])
    if max(src_words, default=-1) + 1 != len(src.split()) or max(tgt_words, default=-1) + 1 != len(ref.split()):
        return None
    return src_words, tgt_words


def heatmap_record(line: int, forced: ForcedAttention, words: tuple[list[int], list[int]] | None, tokenizer: Tokenizer,
                   src_ids: list[int], tgt_ids: list[int], src: str, ref: str) -> dict:
    """One sentence for the heat-map figure: reference words x (source words + </s>), or pieces when words do not fit."""
    if words is None:
        labels_src = [tokenizer.src.id_to_piece(i) for i in src_ids] + [END]
        labels_tgt = [tokenizer.tgt.id_to_piece(i) for i in tgt_ids]
        matrix = forced.attention[: len(tgt_ids)]
        unit = "piece"
    else:
        src_words, tgt_words = words
        matrix = merge_to_words(forced.attention, src_words + [max(src_words, default=-1) + 1], tgt_words)  # </s> as its own column
        labels_src, labels_tgt, unit = src.split() + [END], ref.split(), "word"
    return {"line": line, "unit": unit, "src": labels_src, "tgt": labels_tgt, "attention": np.round(matrix, 4).tolist()}


def evaluate_run(run_dir: Path, test: TestSet, under: float, over: float) -> dict:
    """Translate and probe the test set with RUN/checkpoints/best.pt; write test.hyp, heatmaps.json and eval.json."""
    payload = load_checkpoint(run_dir / "checkpoints" / BEST)
    device = resolve_device(checkpoint_config(payload).train.device)
    model, tokenizer, cfg = model_from_checkpoint(payload, device)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    translator = Translator(model, tokenizer, cfg.decode, device)
    start = time.perf_counter()
    hyps = translator.translate(test.src)
    seconds = time.perf_counter() - start
    with atomic_open(run_dir / HYP, key="run_dir") as f:
        f.writelines(h + "\n" for h in hyps)
    scores = {name: corpus_score(name, hyps, test.ref) for name in ("bleu", "chrf", "ter", "bleu_lc")}

    src_ids, tgt_ids = tokenizer.encode_src(test.src), tokenizer.encode_tgt(test.ref)
    forced = forced_attention(model, src_ids, tgt_ids, device)
    stats, alignment, skipped, heatmaps = AttentionStats(under, over), AlignmentScore(), 0, []
    for k, probe in enumerate(forced):
        stats.add(probe.attention, probe.positions)
        words = word_positions(tokenizer, src_ids[k], tgt_ids[k], test.src[k], test.ref[k])
        if test.gold is not None:
            if words is None:
                skipped += 1
            else:
                alignment.add(argmax_links(merge_to_words(probe.attention, *words)), test.gold[k])
        if k in test.heatmap_lines:
            heatmaps.append(heatmap_record(k, probe, words, tokenizer, src_ids[k], tgt_ids[k], test.src[k], test.ref[k]))
    with atomic_open(run_dir / HEATMAPS, key="run_dir") as f:
        json.dump(sorted(heatmaps, key=lambda r: test.heatmap_lines.index(r["line"])), f)

    result = {
        "checkpoint": f"checkpoints/{BEST}",
        "checkpoint_step": payload["step"],
        "sentences": len(hyps),
        "test_sha256": test_digest(test.src, test.ref),
        "decode": decode_settings(cfg.decode),
        "decode_seconds": round(seconds, 3),
        "sentences_per_s": round(len(hyps) / seconds, 2) if seconds > 0 else None,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "tokenizer_sha256": tokenizer_digest(tokenizer),
        "scores": {name: {"score": round(s.score, 4), "signature": s.signature} for name, s in scores.items()},
        "attention": {key: (round(v, 6) if isinstance(v, float) else v) for key, v in stats.as_dict().items()},
        "alignment": None if test.gold is None else {**alignment.as_dict(), "skipped": skipped},
    }
    with atomic_open(run_dir / EVAL, key="run_dir") as f:
        f.write(json.dumps(result, indent=2) + "\n")
    return result
