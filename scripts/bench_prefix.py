"""What a target prefix costs: the prefix through the decoder in one pass (the Transformer's `prefill`) against one
step per token (what a search that forces the prefix token by token does), and a whole greedy search with a prefix.

    python scripts/bench_prefix.py [--checkpoint RUN] [--threads 2] [--sentences 64] [--lengths 5,10,20]

Without --checkpoint it builds an untrained Transformer of the Multi30k recipe's size (3+3 layers, d256, 8,000
words; its speed is what matters here, not its output). Sources are random token ids of 15 tokens. Prints the
median of --repeats timings per row. Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nmt.config import ModelConfig  # noqa: E402
from nmt.data.batching import make_batch  # noqa: E402
from nmt.data.tokenizer import BOS  # noqa: E402
from nmt.models.builders import build_model  # noqa: E402
from nmt.search import greedy_search, max_lengths  # noqa: E402


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", help="a trained model (else an untrained Multi30k-sized Transformer)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--lengths", default="5,10,20")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.checkpoint:
        from nmt.api import load_model

        model = load_model(args.checkpoint).model
    else:
        cfg = ModelConfig(arch="transformer", dim=256, layers=3, heads=4, ffn_dim=1024, dropout=0.0)
        model = build_model(cfg, 8000, 8000, joint=True).eval()
    vocab = model.decoder.output.out_features
    g = torch.Generator().manual_seed(1)
    batch = make_batch([torch.randint(4, vocab, (15,), generator=g).tolist() for _ in range(args.sentences)])
    print(
        f"target prefix cost: {'checkpoint ' + args.checkpoint if args.checkpoint else 'untrained Transformer d256'}, "
        f"{args.sentences} sentences of 15 tokens, {args.threads} threads, median of {args.repeats}"
    )
    print("| prefix tokens | one pass ms | step by step ms | ratio | greedy, no prefix ms | greedy with prefix ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        enc = model.encode(batch.src, batch.src_mask)
        limits = max_lengths(batch.src_mask, 1.5, 10)
        plain = timed(lambda: greedy_search(model, batch.src, batch.src_mask, limits), args.repeats)
        for length in (int(n) for n in args.lengths.split(",")):
            prefix = torch.randint(4, vocab, (args.sentences, length), generator=g)
            tokens = torch.cat([torch.full((args.sentences, 1), BOS), prefix], 1)

            def one_pass(tokens=tokens):
                model.decoder.prefill(tokens, enc, model.init_state(enc))

            def stepwise(tokens=tokens):
                state = model.init_state(enc)
                for i in range(tokens.size(1)):
                    _, state, _ = model.step(tokens[:, i], enc, state)

            fast, slow = timed(one_pass, args.repeats), timed(stepwise, args.repeats)
            with_prefix = timed(
                lambda prefix=prefix: greedy_search(model, batch.src, batch.src_mask, limits, prefix=prefix),
                args.repeats,
            )
            print(
                f"| {length} | {1000 * fast:.1f} | {1000 * slow:.1f} | {slow / fast:.1f}x | {1000 * plain:.0f} "
                f"| {1000 * with_prefix:.0f} |"
            )


if __name__ == "__main__":
    main()
