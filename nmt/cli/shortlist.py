"""nmt-shortlist checkpoint=RUN out=FILE: a vocabulary shortlist learned from the run's training corpus."""

from __future__ import annotations

import time

from nmt.cli.common import compose, print_help, run
from nmt.errors import NmtError
from nmt.fileio import check_outputs

USAGE = """
usage: nmt-shortlist checkpoint=RUN_DIR|FILE out=FILE [frequent=100] [per_source=20] [iterations=5] [src=FILE tgt=FILE]

Learn a vocabulary shortlist from the training split of the run's data config (or src=/tgt= files): the
`frequent` most frequent target tokens, and each source token's `per_source` likeliest translations
(IBM Model 1, `iterations` EM iterations, over the run's own subword tokens). The file is CTranslate2's
vocabulary map. Decoding with it, the output layer scores only each batch's candidates:
  nmt-shortlist checkpoint=runs/multi30k_transformer out=runs/multi30k_transformer/shortlist.tsv
  nmt-translate checkpoint=runs/multi30k_transformer decode.shortlist=runs/multi30k_transformer/shortlist.tsv ...
  nmt-export checkpoint=runs/multi30k_transformer out=ct2 shortlist=runs/multi30k_transformer/shortlist.tsv
"""  # noqa: E501 (--help prints this text verbatim)


def main(argv: list[str]) -> None:
    if "-h" in argv or "--help" in argv:
        return print_help(USAGE)
    cfg = compose("shortlist", argv)
    check_outputs(
        {"checkpoint": cfg.checkpoint, **({"src": cfg.src, "tgt": cfg.tgt} if cfg.src else {})}, {"out": cfg.out}
    )
    from nmt.api import load_model
    from nmt.data.corpus import read_lines
    from nmt.data.dataset import read_split
    from nmt.shortlist import build, write

    loaded = load_model(cfg.checkpoint)
    if cfg.src is not None:
        src, tgt = read_lines(cfg.src), read_lines(cfg.tgt)
        if len(src) != len(tgt):
            raise NmtError(f"{cfg.src} has {len(src)} lines but {cfg.tgt} has {len(tgt)}; they must match")
        where = f"{cfg.src} / {cfg.tgt}"
    else:
        text = read_split(loaded.config.data, "train")
        if text is None:
            raise NmtError(f"checkpoint={cfg.checkpoint}: its data config names no training split; give src= and tgt=")
        src, tgt, where = text.src, text.tgt, "the run's training split"
    start = time.perf_counter()
    table = build(loaded.tokenizer, src, tgt, cfg.frequent, cfg.per_source, cfg.iterations)
    write(table, cfg.out)
    print(
        f"shortlist: {len(table) - 1} source tokens x up to {cfg.per_source} candidates, {len(table[''])} frequent "
        f"tokens, from {len(src):,} pairs of {where} in {time.perf_counter() - start:.1f}s: {cfg.out}"
    )


def entry() -> None:
    run(main)


if __name__ == "__main__":
    entry()
