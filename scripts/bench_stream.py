"""First-token latency and total time of a streamed translation against the plain call, on nmt-serve over loopback.

    python scripts/bench_stream.py --checkpoint runs/quickstart --source data/toy/test.src --requests 20 --beam 5

It starts `nmt-serve checkpoint=... host=127.0.0.1 port=0 serve.max_wait_ms=0` in a subprocess (its own loopback
address only; --threads torch threads), then for each of --requests sentences (the non-blank lines of --source in
order, cycled) sends the sentence, one request at a time over one keep-alive connection, to
POST /v1/translate/stream and to POST /v1/translate (alternating which goes first, after --warmup rounds not
counted). It prints the median and p90 over the requests of: the stream's time to its first step event (the first
token), to the line's final event, and to the end of the stream; the plain call's time; the stream's total over the
plain call's (median of the per-request ratios); and how many streamed texts equal the plain call's (all should).
Every figure depends on the machine and on what else runs on it: say so beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_serve import launch, stop_server  # noqa: E402  (scripts/bench_serve.py: the server's start and stop)


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    """nmt-serve on a free loopback port, answering at once (serve.max_wait_ms=0); (the process, its base URL)."""
    return launch(args.checkpoint, args.threads, ["serve.max_wait_ms=0", f"decode.beam={args.beam}"])


def streamed(client: httpx.Client, body: dict) -> tuple[float, float, float, str]:
    """Seconds to the first step event, to the line's final event and to the end; the final text."""
    started = time.perf_counter()
    first = final = None
    text, name = "", "message"
    with client.stream("POST", "/v1/translate/stream", json=body) as response:
        if response.status_code != 200:
            sys.exit(f"the stream answered {response.status_code}: {response.read().decode()[:200]}")
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
                if name == "error":
                    sys.exit(f"the stream failed: {data['error']}")
                if name == "message" and first is None:
                    first = time.perf_counter() - started  # the first step's event (or a blank line's result)
                if data.get("final"):
                    final, text = time.perf_counter() - started, data["result"]["text"]
                name = "message"
    return first or 0.0, final or 0.0, time.perf_counter() - started, text


def plain(client: httpx.Client, body: dict) -> tuple[float, str]:
    started = time.perf_counter()
    response = client.post("/v1/translate", json=body)
    if response.status_code != 200:
        sys.exit(f"the plain call answered {response.status_code}: {response.text[:200]}")
    return time.perf_counter() - started, response.json()["translations"][0]["text"]


def figures(name: str, seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"  {name:<28} median {statistics.median(seconds) * 1000:8.1f} ms   p90 {p90 * 1000:8.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a run dir or checkpoint file")
    parser.add_argument("--source", required=True, help="a text file, one sentence per line")
    parser.add_argument("--requests", type=int, default=20, help="sentences measured (each streamed and plain)")
    parser.add_argument("--warmup", type=int, default=2, help="rounds first, not counted")
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--attention", action="store_true", help="ask for the attention (rows in every event)")
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    args = parser.parse_args()
    if args.requests < 1 or args.warmup < 0:
        sys.exit("--requests must be at least 1 and --warmup at least 0")
    sentences = [line.strip() for line in Path(args.source).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not sentences:
        sys.exit(f"--source {args.source}: no sentence in it")
    server, base = start_server(args)
    rows: dict[str, list[float]] = {"first": [], "final": [], "end": [], "plain": [], "ratio": []}
    equal = 0
    try:
        with httpx.Client(base_url=base, timeout=600) as client:
            for k in range(args.warmup + args.requests):
                body = {"text": [sentences[k % len(sentences)]], "beam": args.beam, "attention": args.attention}
                if k % 2:
                    seconds, text = plain(client, body)
                    first, final, end, streamed_text = streamed(client, body)
                else:
                    first, final, end, streamed_text = streamed(client, body)
                    seconds, text = plain(client, body)
                if k < args.warmup:
                    continue
                equal += streamed_text == text
                for key, value in (("first", first), ("final", final), ("end", end), ("plain", seconds)):
                    rows[key].append(value)
                rows["ratio"].append(end / seconds)
    finally:
        stop_server(server)
    print(f"{args.requests} requests, beam {args.beam}, attention {args.attention}, threads {args.threads}")
    print(figures("stream: first step event", rows["first"]))
    print(figures("stream: the line's result", rows["final"]))
    print(figures("stream: end", rows["end"]))
    print(figures("plain /v1/translate", rows["plain"]))
    print(f"  stream end / plain           median {statistics.median(rows['ratio']):8.2f}x")
    print(f"  streamed texts equal to the plain call's: {equal}/{args.requests}")


if __name__ == "__main__":
    main()
