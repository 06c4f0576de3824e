"""Decoding speed: sentences/s and output tokens/s for greedy and beam 5 at several batch sizes.

    OMP_NUM_THREADS=1 python scripts/bench_decode.py                       # untrained models, fixed output length
    OMP_NUM_THREADS=1 python scripts/bench_decode.py --checkpoint runs/m30k # a trained model, its own lengths

Source: Multi30k test_2016_flickr (English, 1,000 sentences) from --data (default ../shared/data/multi30k).
Models: a Transformer (3+3 layers, d256, 4 heads, FFN 1024) and, when the arch exists in BUILDERS, a
1-layer GRU Bahdanau model (d256); or the model of --checkpoint.

An untrained model's outputs end at random, so without --checkpoint every output is made exactly
--fixed-len tokens long (decode.min_len = max length = fixed-len; default: the mean length of the German
references in subword tokens), which makes greedy and beam do the work a trained model's outputs of
that length need. The tokenizer is then a joint SentencePiece model trained on Multi30k train (vocab 8000).

Each figure is the median of --runs timed runs after one warm-up. Peak memory is the largest resident set
size seen while decoding (sampled every 5 ms), and its rise over the size before. Beam 5 one sentence at a
time (batch 1) runs on the first --unbatched sentences; the script checks that batched beam 5 gives the
same outputs for them and prints the batched / unbatched speed ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nmt.config import DecodeConfig, ModelConfig  # noqa: E402
from nmt.data.corpus import read_lines  # noqa: E402
from nmt.data.tokenizer import Tokenizer  # noqa: E402
from nmt.errors import NmtError  # noqa: E402
from nmt.models.seq2seq import BUILDERS, build_model  # noqa: E402
from nmt.translation import Translator  # noqa: E402

MODELS = {
    "transformer": dict(arch="transformer", dim=256, layers=3, heads=4, ffn_dim=1024, dropout=0.0),
    "bahdanau": dict(arch="bahdanau", dim=256, layers=1, dropout=0.0, cell="gru"),
}


def rss_mib() -> float:
    """Resident set size of this process now (Linux /proc), in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakMemory:
    """The largest resident set size seen while the block runs (sampled every 5 ms)."""

    def __enter__(self) -> "PeakMemory":
        self.before = self.peak = rss_mib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss_mib())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mib())


def model_config(name: str) -> ModelConfig:
    """A ModelConfig from MODELS[name], keeping only the keys this ModelConfig has."""
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    return ModelConfig(**{k: v for k, v in MODELS[name].items() if k in known})


def time_decoding(translator: Translator, lines: list[str], runs: int) -> dict:
    """Median seconds over `runs` (after a warm-up on a few lines), sentences/s, output tokens/s, peak memory."""
    translator.translate_lines(lines[:8])
    times, peaks = [], []
    for _ in range(runs):
        with PeakMemory() as memory:
            start = time.perf_counter()
            results = translator.translate_lines(lines)
            times.append(time.perf_counter() - start)
        peaks.append((memory.peak, memory.peak - memory.before))
    seconds = statistics.median(times)
    tokens = sum(len(r.hyps[0].tokens) for r in results if r.hyps)
    return {
        "seconds": seconds,
        "sent_s": len(lines) / seconds,
        "tok_s": tokens / seconds,
        "peak_mib": max(p[0] for p in peaks),
        "rise_mib": max(p[1] for p in peaks),
        "outputs": [r.hyps[0].tokens for r in results],
    }


def decode_config(args, beam: int, batch_size: int, fixed_len: int | None) -> DecodeConfig:
    if fixed_len is None:
        return DecodeConfig(beam=beam, alpha=0.6 if beam > 1 else 0.0, batch_size=batch_size)
    return DecodeConfig(beam=beam, batch_size=batch_size, max_len_a=0.0, max_len_b=fixed_len, min_len=fixed_len)


def bench_model(name: str, model, tokenizer, lines: list[str], args, fixed_len: int | None) -> None:
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    print(f"\n== {name}: {params / 1e6:.1f}M parameters, vocab {tokenizer.tgt_vocab_size}, {len(lines)} sentences ==")
    print(f"{'search':<8} {'batch':>5} {'sent/s':>8} {'tok/s':>8} {'median s':>9} {'peak MiB':>9} {'rise MiB':>9}")
    results = {}
    for beam in (1, 5):
        for batch_size in args.batch_sizes:
            translator = Translator(model, tokenizer, decode_config(args, beam, batch_size, fixed_len), torch.device("cpu"))
            r = time_decoding(translator, lines, args.runs)
            results[beam, batch_size] = r
            label = "greedy" if beam == 1 else f"beam {beam}"
            print(f"{label:<8} {batch_size:>5} {r['sent_s']:>8.1f} {r['tok_s']:>8.0f} {r['seconds']:>9.2f} {r['peak_mib']:>9.0f} {r['rise_mib']:>9.0f}", flush=True)
    subset = lines[: args.unbatched]
    alone = time_decoding(Translator(model, tokenizer, decode_config(args, 5, 1, fixed_len), torch.device("cpu")), subset, args.runs)
    batched = Translator(model, tokenizer, decode_config(args, 5, max(args.batch_sizes), fixed_len), torch.device("cpu"))
    same = [r.hyps[0].tokens for r in batched.translate_lines(subset)] == alone["outputs"]
    best = max((r["sent_s"], b) for (beam, b), r in results.items() if beam == 5)
    print(
        f"beam 5 one sentence at a time ({len(subset)} sentences): {alone['sent_s']:.1f} sent/s, {alone['tok_s']:.0f} tok/s; "
        f"batched (batch {best[1]}) / unbatched = {best[0] / alone['sent_s']:.1f}x; "
        f"batched outputs {'equal' if same else 'DIFFER FROM'} the unbatched ones"
    )


def untrained(args) -> tuple[Tokenizer, int, list[tuple[str, torch.nn.Module]]]:
    """A SentencePiece model on Multi30k train, the fixed output length, and untrained models."""
    start = time.perf_counter()
    src, tgt = read_lines(args.data / "train.en.gz"), read_lines(args.data / "train.de.gz")
    tokenizer = Tokenizer.train(src, tgt, args.vocab_size, "unigram", joint=True)
    refs = tokenizer.encode_tgt(read_lines(args.data / "test_2016_flickr.de.gz"))
    fixed_len = args.fixed_len or round(statistics.mean(len(r) for r in refs))
    print(f"tokenizer trained in {time.perf_counter() - start:.0f}s; outputs fixed at {fixed_len} tokens (untrained models)")
    models = []
    for name in args.archs:
        if name not in BUILDERS:
            print(f"(skipping {name}: not in BUILDERS {sorted(BUILDERS)})")
            continue
        torch.manual_seed(0)
        models.append((name, build_model(model_config(name), tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, True)))
    return tokenizer, fixed_len, models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k")
    parser.add_argument("--checkpoint", help="a trained checkpoint or run dir (else untrained models, fixed length)")
    parser.add_argument("--archs", nargs="+", default=list(MODELS), help="untrained models to build")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[16, 64, 128])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=1000, help="the first N test sentences")
    parser.add_argument("--unbatched", type=int, default=100, help="sentences for beam 5 one at a time")
    parser.add_argument("--fixed-len", type=int, default=None)
    parser.add_argument("--vocab-size", type=int, default=8000)
    args = parser.parse_args()
    lines = read_lines(args.data / "test_2016_flickr.en.gz")[: args.sentences]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s) (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}), "
          f"CPU, {os.cpu_count()} cores, load average {load} (others' work slows a shared machine)")
    if args.checkpoint:
        from nmt.training.checkpoint import load_checkpoint, model_from_checkpoint

        model, tokenizer, cfg = model_from_checkpoint(load_checkpoint(args.checkpoint), torch.device("cpu"))
        bench_model(f"{cfg.model.arch} from {args.checkpoint}", model, tokenizer, lines, args, None)
        return
    tokenizer, fixed_len, models = untrained(args)
    for name, model in models:
        bench_model(f"{name} (untrained)", model, tokenizer, lines, args, fixed_len)


if __name__ == "__main__":
    try:
        main()
    except NmtError as err:
        sys.exit(f"error: {err} (pass --data DIR, the folder with Multi30k's *.gz files)")
