"""Pick beam size and length penalty on the validation split (never on test), printing BLEU for each setting.

    python scripts/tune_decode.py runs/m30k_transformer
    python scripts/tune_decode.py runs/m30k_transformer/checkpoints/average.pt --beams 1,5,10 --alphas 0,0.6,1.0,1.5

Translates the checkpoint's own validation data (its data config's `valid`) with every beam x alpha
setting and prints sacreBLEU (with its signature) and the hypotheses/references length ratio, best last.
The recipes' decoding settings were chosen this way.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from sacrebleu.metrics import BLEU

from nmt.api import load_translator
from nmt.config import DecodeConfig
from nmt.data.dataset import read_split


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a checkpoint file or a run dir (its best checkpoint)")
    parser.add_argument("--beams", default="1,5", help="comma-separated beam sizes")
    parser.add_argument("--alphas", default="0,0.6,1.0", help="comma-separated length penalties (GNMT alpha)")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    translator, cfg = load_translator(args.checkpoint, DecodeConfig(), args.device)
    valid = read_split(cfg.data, "valid")
    if valid is None:
        sys.exit(f"error: {args.checkpoint}: its data config names no validation split")
    rows = []
    for beam in (int(b) for b in args.beams.split(",")):
        for alpha in (float(a) for a in args.alphas.split(",")):
            if beam == 1 and alpha != float(args.alphas.split(",")[0]):
                continue  # greedy ignores the length penalty
            translator.decode = replace(translator.decode, beam=beam, alpha=alpha)
            hyps = translator.translate(valid.src)
            scorer = BLEU()
            bleu = scorer.corpus_score(hyps, [valid.tgt])
            rows.append((bleu.score, beam, alpha, bleu.sys_len / max(bleu.ref_len, 1)))
            print(
                f"beam {beam:>2} alpha {alpha:<4} valid BLEU {bleu.score:6.2f}  length ratio {rows[-1][3]:.3f}",
                flush=True,
            )
    best = max(rows)
    print(f"best on valid: beam {best[1]} alpha {best[2]} (BLEU {best[0]:.2f}; {scorer.get_signature()})")


if __name__ == "__main__":
    main(sys.argv[1:])
