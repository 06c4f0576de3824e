"""Where decoding time goes, nmt against CTranslate2: the cost of one decoder step at a given number of rows.

    python scripts/bench_steps.py --checkpoint runs/tf_seed2/checkpoints/best.pt            # fp32, greedy and beam 5
    python scripts/bench_steps.py --checkpoint ... --precision int8 --sentences 1 4 16 64

scripts/bench_decode.py times whole files; this splits a batch's time into its steps and the rest. For each number
of sentences n (the first n of Multi30k test2016 from --data), both engines decode with every output held at
exactly L tokens (min length = max length), once with L = --short and once with L = --long:

    per step   = (time(long) - time(short)) / (long - short)       the decoder step at n * beam rows, averaged
                                                                    over positions short..long
    fixed part = time(short) - short * per step                     encoding, the first steps' set-up, the
                                                                    search's bookkeeping, (de)tokenization

Both run in this one process, one after the other, with --threads threads each (torch.set_num_threads and
CTranslate2's intra_threads), median of --runs. nmt decodes through the API (nmt.load(...).translate), as a user
does; CTranslate2 through Translator.translate_batch with pre-split pieces (its tokenization is not timed, so its
fixed part is a little smaller than nmt's for the same work). Needs `pip install ctranslate2`; the model is
exported with nmt-export into a temporary folder. Nothing else should run meanwhile (see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import gzip
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_prefix import timed  # noqa: E402  (median of runs after a warm-up)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True, help="a trained Transformer checkpoint")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    parser.add_argument("--precision", choices=["fp32", "int8"], default="fp32")
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--sentences", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--short", type=int, default=10)
    parser.add_argument("--long", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if args.long <= args.short:
        raise SystemExit(f"--long ({args.long}) must be larger than --short ({args.short})")
    try:
        import ctranslate2
        import sentencepiece as spm
    except ImportError:
        raise SystemExit("bench_steps.py needs CTranslate2: pip install ctranslate2") from None
    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(ROOT))
    import nmt
    from nmt.memory import tune_allocator

    tune_allocator()  # as the nmt CLIs do
    lines = [line.rstrip("\n") for line in gzip.open(args.data / "test_2016_flickr.en.gz", "rt", encoding="utf-8")]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ct2"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "nmt.cli.export",
                f"checkpoint={args.checkpoint}",
                "format=ctranslate2",
                f"out={folder}",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        if done.returncode:
            raise SystemExit(f"nmt-export failed:\n{done.stderr[-2000:]}")
        joint = (folder / "sentencepiece.model").is_file()
        sp = spm.SentencePieceProcessor(model_file=str(folder / ("sentencepiece.model" if joint else "source.model")))
        ct2_type = "float32" if args.precision == "fp32" else "int8"
        translator = ctranslate2.Translator(
            str(folder), device="cpu", compute_type=ct2_type, intra_threads=args.threads
        )
        model = nmt.load(args.checkpoint, precision=args.precision)
        print(
            f"per-step cost, {args.precision} (CTranslate2 {ct2_type}), {args.threads} thread(s), outputs held at "
            f"{args.short} and {args.long} tokens, median of {args.runs}"
        )
        print(
            f"{'search':<7} {'sent':>4} {'rows':>5} {'nmt ms/step':>11} {'ct2 ms/step':>11} {'nmt/ct2':>7} "
            f"{'nmt fixed ms':>12} {'ct2 fixed ms':>12}"
        )
        for beam in args.beams:
            for n in args.sentences:
                step, fixed = measure(model, translator, sp, lines[:n], beam, args)
                print(
                    f"{'greedy' if beam == 1 else f'beam {beam}':<7} {n:>4} {n * beam:>5} {step['nmt'] * 1e3:>11.2f} "
                    f"{step['ct2'] * 1e3:>11.2f} {step['nmt'] / step['ct2']:>6.2f}x {fixed['nmt'] * 1e3:>12.1f} "
                    f"{fixed['ct2'] * 1e3:>12.1f}",
                    flush=True,
                )


def measure(model, translator, sp, batch: list[str], beam: int, args) -> tuple[dict, dict]:
    """Seconds per step and of the fixed part, per engine ("nmt", "ct2"), for one batch and beam."""
    pieces = [sp.encode(line, out_type=str) for line in batch]

    def ct2(length: int) -> float:
        return timed(
            lambda: translator.translate_batch(
                pieces, beam_size=beam, min_decoding_length=length, max_decoding_length=length
            ),
            args.runs,
        )

    def ours(length: int) -> float:
        return timed(
            lambda: model.translate(
                batch, beam=beam, alpha=0.0, batch_size=len(batch), min_len=length, max_len_a=0.0, max_len_b=length
            ),
            args.runs,
        )

    times = {name: (f(args.short), f(args.long)) for name, f in (("nmt", ours), ("ct2", ct2))}
    step = {name: (b - a) / (args.long - args.short) for name, (a, b) in times.items()}
    fixed = {name: times[name][0] - args.short * step[name] for name in times}
    return step, fixed


if __name__ == "__main__":
    main()
