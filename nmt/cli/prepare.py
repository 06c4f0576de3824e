"""nmt-prepare [overrides]: build the tokenizer and encoded dataset cache for a data config."""

from __future__ import annotations

from nmt.cli.common import compose, print_help, run

USAGE = """
usage: nmt-prepare [KEY=VALUE ...]

Read, validate, filter and tokenize a corpus ahead of training (nmt-train does it on demand too).
Recipes of public corpora (data.fetch, e.g. data=multi30k_en_de) are downloaded into data.root first
when missing (the only command that uses the network).
  nmt-prepare data=toy
  nmt-prepare data=multi30k_en_de                                   (downloads into data/multi30k)
  nmt-prepare data=multi30k_en_de data.root=../shared/data/multi30k data.vocab_size=8000
"""


def main(argv: list[str]) -> None:
    from nmt.data.dataset import prepare_data

    if "-h" in argv or "--help" in argv:
        return print_help(USAGE)
    cfg = compose("config", argv)
    if cfg.data.fetch == "multi30k":
        from nmt.data.fetch import fetch_multi30k

        fetch_multi30k(cfg.data.root, (cfg.data.src, cfg.data.tgt))
    prepared = prepare_data(cfg.data)
    tok = prepared.tokenizer
    print(
        f"tokenizer: {cfg.data.spm_model}, {'joint' if tok.joint else 'separate'} vocabulary "
        f"{tok.src_vocab_size}/{tok.tgt_vocab_size}"
    )
    for name, split in prepared.splits.items():
        print(f"{name}: {len(split)} pairs")
    print(f"cache: {prepared.cache_path}")


def entry() -> None:
    run(main)


if __name__ == "__main__":
    entry()
