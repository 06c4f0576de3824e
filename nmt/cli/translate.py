"""nmt-translate checkpoint=PATH [input=FILE] [output=FILE] [decode=beam ...]: translate a text file."""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack
from itertools import islice
from typing import IO, Iterator

from tqdm import tqdm

from nmt.cli.common import compose, print_help, run
from nmt.config import Config, DecodeConfig, TranslateConfig
from nmt.data.corpus import iter_lines
from nmt.fileio import atomic_open
from nmt.runtime import resolve_device
from nmt.translation import Translation, Translator

USAGE = """
usage: nmt-translate checkpoint=PATH [input=FILE] [output=FILE] [decode=greedy|beam|sampling] [decode.KEY=VALUE ...]
                     [attention_out=FILE.jsonl|FILE.npz] [plot_dir=DIR plot_n=N] [chunk_size=N]

Translate one sentence per line; reads stdin and writes stdout unless input/output are given.
Every input line gives one output line (empty lines stay empty), in order; with decode.nbest=N > 1,
N lines `index<TAB>score<TAB>text` per input line (index counts lines from 0, score is the
length-normalised log-probability). checkpoint may be a checkpoint file or a run dir. Examples:
  nmt-translate checkpoint=runs/quickstart input=data/toy/test.src output=test.hyp
  nmt-translate checkpoint=runs/quickstart decode=beam decode.beam=5 decode.alpha=0.6 input=test.src output=test.hyp
  nmt-translate checkpoint=runs/quickstart decode=beam decode.nbest=5 input=test.src output=test.nbest
  nmt-translate checkpoint=runs/quickstart decode=sampling decode.top_p=0.9 decode.nbest=3 input=test.src
  nmt-translate checkpoint=runs/quickstart input=test.src output=test.hyp attention_out=test.attn.jsonl plot_dir=plots
  echo "ze bosize dibope" | nmt-translate checkpoint=runs/quickstart
"""


def load_translator(checkpoint: str, decode: DecodeConfig, device_name: str) -> tuple[Translator, Config]:
    """A Translator for a checkpoint file or run dir, and the config the model was trained with."""
    from nmt.training.checkpoint import load_checkpoint, model_from_checkpoint

    device = resolve_device(device_name, key="device")
    model, tokenizer, train_cfg = model_from_checkpoint(load_checkpoint(checkpoint, device), device)
    return Translator(model, tokenizer, decode, device), train_cfg


def chunks(lines: Iterator[str], size: int) -> Iterator[list[str]]:
    """Consecutive lists of `size` lines (the last may be shorter)."""
    while chunk := list(islice(lines, size)):
        yield chunk


def one_line(text: str) -> str:
    """Output text that cannot split a line or a field."""
    return text.replace("\n", " ").replace("\r", " ").replace("\t", " ")


def output_lines(translator: Translator, results: list[Translation], first_index: int, nbest: int) -> Iterator[str]:
    """The best text per result; with nbest > 1, `index<TAB>score<TAB>text` per hypothesis (nbest lines for a blank)."""
    texts = iter(translator.detokenize([h for r in results for h in r.hyps]))
    for index, result in enumerate(results, first_index):
        if nbest == 1:
            yield one_line(next(texts)) if result.hyps else ""
            continue
        if not result.hyps:
            yield from (f"{index}\t0.0000\t" for _ in range(nbest))
        for hyp in result.hyps:
            yield f"{index}\t{hyp.norm_score:.4f}\t{one_line(next(texts))}"


def translate_stream(cfg: TranslateConfig, translator: Translator, lines: Iterator[str], out: IO[str], stack: ExitStack) -> None:
    """Translate and write `chunk_size` lines at a time; attention records and plots as asked."""
    from nmt.attention_io import HeatMaps, attention_record, attention_writer

    attention = stack.enter_context(attention_writer(cfg.attention_out)) if cfg.attention_out else None
    plots = HeatMaps(cfg.plot_dir, cfg.plot_n) if cfg.plot_dir else None
    bar = stack.enter_context(tqdm(unit="sent", file=sys.stderr, disable=None if cfg.output and cfg.progress else True))
    first = 0
    for chunk in chunks(lines, cfg.chunk_size):
        results = translator.translate_lines(chunk, first_line=first + 1, progress=bar.update)
        out.writelines(line + "\n" for line in output_lines(translator, results, first, cfg.decode.nbest))
        out.flush()
        for index, result in enumerate(results, first):
            record = attention_record(index, result, translator.tokenizer) if attention or plots else None
            if attention is not None:
                attention.write(record)
            if plots is not None:
                plots.write(record)
        first += len(chunk)


def main(argv: list[str]) -> int | None:
    if "-h" in argv or "--help" in argv:
        return print_help(USAGE)
    cfg = compose("translate", argv)
    translator, _ = load_translator(cfg.checkpoint, cfg.decode, cfg.device)
    lines = iter_lines(cfg.input)
    try:
        with ExitStack() as stack:
            out = stack.enter_context(atomic_open(cfg.output, "w", key="output")) if cfg.output else sys.stdout
            translate_stream(cfg, translator, lines, out, stack)
    except BrokenPipeError:  # stdout closed early (`| head`): stop quietly, as other filters do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def entry() -> None:
    run(main)


if __name__ == "__main__":
    entry()
