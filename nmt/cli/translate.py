"""nmt-translate checkpoint=PATH [input=FILE] [output=FILE] [decode.beam=K ...]: translate a text file."""

from __future__ import annotations

import sys
from contextlib import nullcontext

from tqdm import tqdm

from nmt.cli.common import compose, print_help, run
from nmt.config import Config, DecodeConfig
from nmt.data.corpus import decode_utf8, read_lines, split_lines
from nmt.fileio import atomic_open
from nmt.runtime import resolve_device
from nmt.translation import Translator

USAGE = """
usage: nmt-translate checkpoint=PATH [input=FILE] [output=FILE] [decode.beam=K] [decode.batch_size=N]

Translate one sentence per line; reads stdin and writes stdout unless input/output are given.
Every input line gives one output line (empty lines stay empty), in order. checkpoint may be a
checkpoint file or a run dir (its best checkpoint). Examples:
  nmt-translate checkpoint=runs/quickstart input=data/toy/test.src output=test.hyp
  echo "ze bosize dibope" | nmt-translate checkpoint=runs/quickstart
"""


def load_translator(checkpoint: str, decode: DecodeConfig, device_name: str) -> tuple[Translator, Config]:
    """A Translator for a checkpoint file or run dir, and the config the model was trained with."""
    from nmt.training.checkpoint import load_checkpoint, model_from_checkpoint

    device = resolve_device(device_name)
    model, tokenizer, train_cfg = model_from_checkpoint(load_checkpoint(checkpoint, device), device)
    return Translator(model, tokenizer, decode, device), train_cfg


def read_input(path: str | None) -> list[str]:
    """Lines of a file, or of stdin when path is None."""
    if path is None:
        return split_lines(decode_utf8(sys.stdin.buffer.read(), "<stdin>"))
    return read_lines(path)


def main(argv: list[str]) -> None:
    if "-h" in argv or "--help" in argv:
        return print_help(USAGE)
    cfg = compose("translate", argv)
    translator, _ = load_translator(cfg.checkpoint, cfg.decode, cfg.device)
    lines = read_input(cfg.input)
    to_file = cfg.output is not None
    out = atomic_open(cfg.output, "w", key="output") if to_file else nullcontext(sys.stdout)
    bar = tqdm(total=len(lines), unit="sent", file=sys.stderr, disable=None if to_file and cfg.progress else True)
    with out as f:
        for start in range(0, len(lines), cfg.chunk_size):
            for text in translator.translate(lines[start : start + cfg.chunk_size], progress=bar.update):
                f.write(text + "\n")
    bar.close()


def entry() -> None:
    run(main)


if __name__ == "__main__":
    entry()
