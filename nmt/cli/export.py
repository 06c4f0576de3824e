"""nmt-export checkpoint=RUN format=ctranslate2 out=DIR: a trained model converted for an inference engine."""

from __future__ import annotations

import sys

import torch

from nmt.cli.common import compose, print_help, run
from nmt.errors import NmtError

USAGE = """
usage: nmt-export checkpoint=PATH format=ctranslate2|hf out=DIR [quantization=int8|int8_float32|int16|float16|bfloat16] [max_positions=N] [shortlist=FILE]

Convert a Transformer checkpoint (a file or a run dir) into a CTranslate2 model directory, with the
SentencePiece model beside it (needs `pip install -e '.[ct2]' in the nmt clone`). Examples:
  nmt-export checkpoint=runs/quickstart format=ctranslate2 out=exported/quickstart
  nmt-export checkpoint=runs/m30k/checkpoints/best.pt format=ctranslate2 out=m30k_ct2 quantization=int8
  nmt-export checkpoint=runs/m30k format=hf out=m30k_hf     # Hugging Face Transformers (pip install -e '.[hf]' in the nmt clone)
  nmt-export checkpoint=runs/m30k out=m30k_ct2 shortlist=m30k.vmap   # with a vocabulary map (nmt-shortlist): use_vmap=True
Then, in Python:
  import ctranslate2, sentencepiece as spm
  sp = spm.SentencePieceProcessor(model_file="exported/quickstart/sentencepiece.model")
  out = ctranslate2.Translator("exported/quickstart").translate_batch([sp.encode("ze bosize", out_type=str)])
  print(sp.decode(out[0].hypotheses[0]))
"""  # noqa: E501 (--help prints this text verbatim; wrapping it would change the output)


def main(argv: list[str]) -> None:
    if "-h" in argv or "--help" in argv:
        return print_help(USAGE)
    cfg = compose("export", [a.replace(",", "\\,") if a.startswith("checkpoint=") else a for a in argv])
    if "," in cfg.checkpoint:
        raise NmtError(
            f"checkpoint={cfg.checkpoint}: several checkpoints (an ensemble); nmt-export writes one model: give one "
            "checkpoint, or average them first (nmt-average)"
        )
    from nmt.export.ctranslate2 import export_ctranslate2
    from nmt.fileio import check_outputs
    from nmt.training.checkpoint import load_checkpoint, model_from_checkpoint

    payload = load_checkpoint(cfg.checkpoint)
    check_outputs({"checkpoint": payload["path"]}, {"out": cfg.out}, folders=("out",))
    model, tokenizer, train_cfg = model_from_checkpoint(payload, torch.device("cpu"))
    if cfg.format == "hf":
        from nmt.export.hf import export_hf

        if cfg.quantization:
            raise NmtError(f"quantization={cfg.quantization}: format=hf writes float32 weights; leave it unset")
        if cfg.shortlist:
            raise NmtError(f"shortlist={cfg.shortlist}: format=hf has no vocabulary map; it is for format=ctranslate2")
        out = export_hf(model, train_cfg, tokenizer, cfg.out, min(cfg.max_positions, 1024), payload["path"])
    else:
        out = export_ctranslate2(
            model, train_cfg, tokenizer, cfg.out, cfg.quantization, cfg.max_positions, payload["path"], cfg.shortlist
        )
    print(
        f"wrote {out} ({cfg.format}, {cfg.quantization or 'float32'} weights) from {payload['path']}", file=sys.stderr
    )


def entry() -> None:
    run(main)


if __name__ == "__main__":
    entry()
