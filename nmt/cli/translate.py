"""nmt-translate checkpoint=PATH [input=FILE] [output=FILE] [decode=beam ...]: translate a text file."""

from __future__ import annotations

import gzip
import os
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from itertools import islice
from typing import IO

import torch
from tqdm import tqdm

from nmt.api import load_translator
from nmt.cli.common import compose, print_help, run
from nmt.config import TranslateConfig
from nmt.data.corpus import iter_lines
from nmt.errors import NmtError
from nmt.fileio import atomic_open, check_outputs
from nmt.memory import release_freed_memory
from nmt.translation import Translation, Translator, decode_settings, unscored

USAGE = """
usage: nmt-translate checkpoint=PATH[,PATH...] [input=FILE] [output=FILE] [decode=greedy|beam|sampling] [decode.KEY=VALUE ...]
                     [decode.precision=fp32|bf16|int8] [threads=N] [workers=N] [attention_out=FILE.jsonl|FILE.npz] [plot_dir=DIR plot_n=N] [chunk_size=N]
                     [input_format=text|jsonl] [alignments_out=FILE] [align.method=argmax|threshold] [align.threshold=P] [align.layer=L] [align.head=H]
                     [decode.no_repeat_ngram_size=N] [decode.repetition_penalty=P]

Translate one sentence per line; reads stdin and writes stdout unless input/output are given.
Every input line gives one output line (empty lines stay empty), in order; with decode.nbest=N > 1,
N lines `index<TAB>score<TAB>text` per input line (index counts lines from 0, score is the
length-normalised log-probability). checkpoint may be a checkpoint file or a run dir, or several
separated by commas: an ensemble, which averages the models' log-probabilities. Examples:
  nmt-translate checkpoint=runs/quickstart input=data/toy/test.src output=test.hyp
  nmt-translate checkpoint=runs/quickstart decode=beam decode.beam=5 decode.alpha=0.6 input=test.src output=test.hyp
  nmt-translate checkpoint=runs/quickstart decode=beam decode.nbest=5 input=test.src output=test.nbest
  nmt-translate checkpoint=runs/quickstart decode=sampling decode.top_p=0.9 decode.nbest=3 input=test.src
  nmt-translate checkpoint=runs/quickstart input=test.src output=test.hyp attention_out=test.attn.jsonl plot_dir=plots
  echo "ze bosize dibope" | nmt-translate checkpoint=runs/quickstart
  nmt-translate checkpoint=runs/a,runs/b input=test.src output=test.hyp           # an ensemble (same vocabulary)
  nmt-translate checkpoint=runs/quickstart decode.precision=int8 threads=2 input=test.src output=test.hyp
  nmt-translate checkpoint=runs/quickstart decode=beam workers=2 input=test.src output=test.hyp   # 2 processes x 1 thread
  nmt-translate checkpoint=runs/quickstart input=test.jsonl input_format=jsonl      # {"text": "...", "prefix": "..."}
  nmt-translate checkpoint=runs/quickstart input=test.src alignments_out=test.align align.layer=2 align.head=0
  nmt-translate checkpoint=runs/quickstart decode=beam decode.no_repeat_ngram_size=3 input=test.src
With input_format=jsonl each line is an object: "text" (required), "prefix" (the output starts with it),
"constraints" (target phrases the output must contain) and "avoid" (phrases it must not contain).
alignments_out writes one line of Pharaoh links `i-j` (source word i, target word j, from 0) per input line.
On a CPU, workers=N (one per core, each with threads=1) searches batches in N processes: faster than one
process with N threads, with the same output. Sentences/s and output tokens/s are printed on stderr at the end.
"""  # noqa: E501 (--help prints this text verbatim; wrapping it would change the output)


def start_workers(
    translator: Translator, checkpoint: str, device: str, workers: int, threads: int | None, stack: ExitStack
) -> None:
    """With workers > 1, the translator's batches are searched in that many processes (closed with `stack`)."""
    if workers == 1:
        return
    if translator.device.type != "cpu":
        raise NmtError(
            f"workers={workers} on {translator.device}: workers are processes for CPU cores; "
            "expected workers=1 on a GPU"
        )
    from nmt.workers import SearchPool

    translator.pool = stack.enter_context(SearchPool(checkpoint, translator.decode, device, workers, threads or 1))


def checkpoint_files(spec: str) -> str:
    """The checkpoint files a checkpoint= value names (run dirs resolved to their checkpoint), comma-separated."""
    from nmt.training.checkpoint import resolve_checkpoint

    files = []
    for part in (p for p in spec.split(",") if p):
        try:
            files.append(str(resolve_checkpoint(part)))
        except NmtError:
            files.append(part)  # loading will name what is wrong with it
    return ",".join(files)


def checkpoint_list(argv: list[str]) -> list[str]:
    """checkpoint=a.pt,b.pt kept as one value (Hydra reads an unquoted comma as a sweep over values)."""
    return [
        arg.replace(",", "\\,") if arg.startswith("checkpoint=") and arg[11:12] not in ("'", '"', "[") else arg
        for arg in argv
    ]


def count_lines(path: str) -> int | None:
    """The lines of a plain or gzipped file, for the progress bar (None if it cannot be read now)."""
    try:
        with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
            count, last = 0, b"\n"
            while block := f.read(1 << 20):
                count, last = count + block.count(b"\n"), block[-1:]
            return count + (last != b"\n")
    except (OSError, EOFError):
        return None


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


def translate_stream(
    cfg: TranslateConfig, translator: Translator, lines: Iterator[str], out: IO[str], stack: ExitStack
) -> tuple[int, int]:
    """Translate and write `chunk_size` lines at a time; attention records and plots as asked.

    Returns the number of sentences translated (blank lines excluded) and of output tokens (best hypotheses).
    """
    from nmt.attention_io import HeatMaps, attention_record, attention_writer

    attention = stack.enter_context(attention_writer(cfg.attention_out)) if cfg.attention_out else None
    plots = HeatMaps(cfg.plot_dir, cfg.plot_n) if cfg.plot_dir else None
    total = count_lines(cfg.input) if cfg.input and cfg.progress else None
    bar = stack.enter_context(
        tqdm(total=total, unit="line", file=sys.stderr, disable=None if cfg.input and cfg.progress else True)
    )
    aligner = alignments = None
    if cfg.alignments_out:
        from nmt.alignments import Aligner

        a = cfg.align
        aligner = Aligner(
            translator.model, translator.tokenizer, translator.device, a.method, a.threshold, a.layer, a.head
        )
        alignments = stack.enter_context(atomic_open(cfg.alignments_out, "w", key="alignments_out"))
    first = sentences = tokens = 0
    for chunk in chunks(lines, cfg.chunk_size):
        prefixes = needs = avoids = None
        if cfg.input_format == "jsonl":
            chunk, prefixes, needs, avoids = read_jsonl(chunk, cfg.input or "<stdin>", first + 1)
        results = translator.translate_lines(
            chunk, first_line=first + 1, progress=bar.update, prefixes=prefixes, constraints=needs, avoid=avoids
        )
        out.writelines(line + "\n" for line in output_lines(translator, results, first, cfg.decode.nbest))
        out.flush()
        if alignments is not None:
            alignments.writelines(aligner.pharaoh(r) + "\n" for r in results)
        for index, result in enumerate(results, first):
            record = attention_record(index, result, translator.tokenizer) if attention or plots else None
            if attention is not None:
                attention.write(record)
            if plots is not None:
                plots.write(record)
        first += len(chunk)
        sentences += sum(1 for r in results if r.hyps)
        tokens += sum(len(r.hyps[0].tokens) for r in results if r.hyps)
        del results
        release_freed_memory()
    return sentences, tokens


JSONL_FIELDS = ("text", "prefix", "constraints", "avoid")


def read_jsonl(lines: list[str], path: str, first_line: int) -> tuple[list[str], list[str | None], list, list]:
    """input_format=jsonl: each line's "text", "prefix", "constraints" and "avoid" (a blank line is a blank text);
    a mistake names the line."""
    import json

    texts: list[str] = []
    prefixes: list[str | None] = []
    needs: list[list[str]] = []
    avoids: list[list[str]] = []
    for number, line in enumerate(lines, first_line):
        where = f"{path}:{number}"
        if not line.strip():
            texts.append("")
            prefixes.append(None)
            needs.append([])
            avoids.append([])
            continue
        try:
            value = json.loads(line)
        except (json.JSONDecodeError, ValueError, RecursionError):
            raise NmtError(f'{where}: not a JSON object; expected {{"text": "...", "prefix": "..."}}') from None
        if not isinstance(value, dict):
            raise NmtError(f'{where}: a JSON {type(value).__name__}; expected an object {{"text": "..."}}')
        unknown = [k for k in value if k not in JSONL_FIELDS]
        if unknown:
            raise NmtError(f"{where}: unknown field {unknown[0]!r}; expected {', '.join(JSONL_FIELDS)}")
        text, prefix = value.get("text"), value.get("prefix")
        if not isinstance(text, str):
            raise NmtError(f'{where}: "text" {"missing" if text is None else "is not a string"}; expected a string')
        if prefix is not None and not isinstance(prefix, str):
            raise NmtError(f'{where}: "prefix" is not a string; expected a string or no "prefix"')
        for name in ("constraints", "avoid"):
            phrases = value.get(name, [])
            if not isinstance(phrases, list) or not all(isinstance(p, str) for p in phrases):
                raise NmtError(f'{where}: "{name}" is not a list of strings; expected e.g. ["Hund", "rote Jacke"]')
        texts.append(text.replace("\n", " "))
        prefixes.append(prefix)
        needs.append(value.get("constraints", []))
        avoids.append(value.get("avoid", []))
    return texts, prefixes, needs, avoids


def main(argv: list[str]) -> int | None:
    if "-h" in argv or "--help" in argv:
        return print_help(USAGE)
    cfg = compose("translate", checkpoint_list(argv))
    check_outputs(
        {"checkpoint": checkpoint_files(cfg.checkpoint), "input": cfg.input},
        {
            "output": cfg.output,
            "attention_out": cfg.attention_out,
            "alignments_out": cfg.alignments_out,
            "plot_dir": cfg.plot_dir,
        },
        folders=("plot_dir",),
    )
    threads = cfg.threads or (1 if cfg.workers > 1 else None)
    decode = cfg.decode if cfg.decode.nbest > 1 else unscored(cfg.decode)  # one best text per line: no score shown
    translator, _ = load_translator(cfg.checkpoint, decode, cfg.device, threads)
    lines = iter_lines(cfg.input)
    start = time.perf_counter()
    try:
        with ExitStack() as stack:
            start_workers(translator, cfg.checkpoint, cfg.device, cfg.workers, threads, stack)
            out = stack.enter_context(atomic_open(cfg.output, "w", key="output")) if cfg.output else sys.stdout
            sentences, tokens = translate_stream(cfg, translator, lines, out, stack)
    except BrokenPipeError:  # stdout closed early (`| head`): stop quietly, as other filters do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    seconds = max(time.perf_counter() - start, 1e-9)
    print(
        f"translated {sentences} sentences in {seconds:.1f}s: {sentences / seconds:.1f} sentences/s, "
        f"{tokens / seconds:.0f} tokens/s ({decode_settings(cfg.decode)}, "
        + (
            f"{cfg.workers} workers x {threads} thread(s))"
            if cfg.workers > 1
            else f"{torch.get_num_threads()} threads)"
        ),
        file=sys.stderr,
    )


def entry() -> None:
    run(main)


if __name__ == "__main__":
    entry()
