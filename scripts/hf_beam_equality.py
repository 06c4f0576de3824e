"""Count the sentences where a Hugging Face export (nmt-export format=hf) translates as nmt does, per search.

    python scripts/hf_beam_equality.py runs/hf_beam_m30k ~/data/multi30k/test_2016_flickr --sentences 50

Exports the checkpoint into a temporary folder (or --out), takes the first N lines of PREFIX.SRC (the run's source
language; plain or .gz), and translates them with nmt (Translator, the checkpoint's max_len_a/max_len_b) and with
Transformers' generate through the exported custom_generate (nmt's search, nmt/export/hf_generate.py), for greedy
and beam 5 at alpha 0, 0.6 and 1.0. For contrast it also counts Transformers' own beam search (num_beams=5,
length_penalty=0 or 1, early_stopping=True, max_new_tokens the longest of nmt's limits) against nmt's beam 5 at the
same alpha. Prints "equal/total" per line; no network.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

SEARCHES = {"greedy": (1, 0.0), "beam 5 alpha 0": (5, 0.0), "beam 5 alpha 0.6": (5, 0.6), "beam 5 alpha 1.0": (5, 1.0)}


def tokens(rows: torch.Tensor) -> list[list[int]]:
    """generate's rows as nmt's token lists (no <s>, </s>, <pad>)."""
    from nmt.data.tokenizer import EOS, PAD

    out = []
    for row in rows.tolist():
        row = row[1:]
        out.append([t for t in (row[: row.index(EOS)] if EOS in row else row) if t != PAD])
    return out


def compare(checkpoint: str, prefix: str | Path, out: str | Path, sentences: int = 50) -> dict[str, tuple[int, int]]:
    """{search: (equal, total)} for the first `sentences` lines of PREFIX.<source language>."""
    import transformers

    from nmt.cli import export
    from nmt.data.corpus import read_lines
    from nmt.training.checkpoint import load_checkpoint, model_from_checkpoint
    from nmt.translation import Translator

    payload = load_checkpoint(checkpoint)
    model, tokenizer, cfg = model_from_checkpoint(payload, torch.device("cpu"))
    export.main([f"checkpoint={payload['path']}", "format=hf", f"out={out}"])
    suffix = f".{cfg.data.src}"
    path = Path(f"{prefix}{suffix}")
    lines = read_lines(path if path.exists() else Path(f"{path}.gz"))[:sentences]
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(out)).eval()
    batch = transformers.AutoTokenizer.from_pretrained(str(out))(lines, return_tensors="pt", padding=True)
    report = {}
    for name, (beam, alpha) in SEARCHES.items():
        decode = replace(cfg.decode, beam=beam, alpha=alpha, nbest=1, sampling=False)
        translator = Translator(model, tokenizer, decode, torch.device("cpu"))
        ours = [r.hyps[0].tokens for r in translator.translate_lines(lines)]
        with torch.no_grad():
            rows = hf.generate(**batch, custom_generate=str(out), trust_remote_code=True, num_beams=beam, alpha=alpha)
        report[name] = (sum(a == b for a, b in zip(tokens(rows), ours)), len(lines))
        if beam > 1 and alpha in (0.0, 1.0):  # Transformers' own beam search, for contrast
            longest = int(((batch["attention_mask"].sum(1) - 1).float() * decode.max_len_a + decode.max_len_b).max())
            with torch.no_grad():
                rows = hf.generate(
                    **batch, num_beams=5, length_penalty=alpha, early_stopping=True, max_new_tokens=longest
                )
            report[f"{name}, Transformers' beam search length_penalty={alpha}"] = (
                sum(a == b for a, b in zip(tokens(rows), ours)),
                len(lines),
            )
    return report


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a checkpoint file or a run dir")
    parser.add_argument("prefix", help="the test set's path without the language suffix, e.g. .../test_2016_flickr")
    parser.add_argument("--sentences", type=int, default=50)
    parser.add_argument("--out", help="the export folder (new); default: a temporary folder")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        report = compare(args.checkpoint, args.prefix, args.out or Path(tmp) / "hf", args.sentences)
    for name, (equal, total) in report.items():
        print(f"{name}: {equal}/{total} equal to nmt's")


if __name__ == "__main__":
    main(sys.argv[1:])
