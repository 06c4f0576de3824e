"""A bounded load test of nmt-serve on loopback: concurrent clients, a fixed number of requests, then it stops.

    OMP_NUM_THREADS=1 python scripts/bench_serve.py --checkpoint runs/quickstart --source data/toy/test.src

It starts `nmt-serve checkpoint=... host=127.0.0.1 port=0` in a subprocess (its own address only, never
another host), waits for the address it prints, and runs --clients threads that each send --requests
POST /v1/translate requests of 1 to --max-lines sentences drawn from --source with a fixed --seed. It prints
requests/s and sentences/s over the whole run, the p50/p99 latency of a request, the failures (a non-200
answer, a connection error, or a result count that differs from the line count), and the server's
batching (requests per decoded batch and how busy the decoding thread was, from /health), and the CPU
time of the server and of the clients. Then it stops the server, translates the same sentences in this
process all at once, as nmt-translate does (same model, beam and threads), and prints the server's
throughput as a fraction of that, per wall-clock second and per CPU second. On a machine shared with
other jobs the wall-clock figures move with their load; the per-CPU-second ratio much less.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nmt.config import DecodeConfig  # noqa: E402


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    """nmt-serve on a free loopback port; (the process, its base URL)."""
    command = [
        sys.executable,
        "-m",
        "nmt.cli.serve",
        f"checkpoint={args.checkpoint}",
        "host=127.0.0.1",
        "port=0",
        f"threads={args.threads}",
        "serve.access_log=false",
        f"serve.max_wait_ms={args.max_wait_ms}",
        f"serve.max_lines={args.max_lines}",
        f"decode.beam={args.beam}",
    ]
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=sys.stderr, text=True, env=env, cwd=ROOT)
    deadline = time.monotonic() + 300
    for line in server.stdout:
        print(f"  {line.rstrip()}")
        if found := re.search(r"serving (http://127\.0\.0\.1:\d+)/", line):
            threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()  # keep the pipe drained
            return server, found.group(1)
        if time.monotonic() > deadline:
            break
    stop_server(server)
    sys.exit(f"nmt-serve did not start (exit code {server.returncode})")


def stop_server(server: subprocess.Popen) -> None:
    """Ctrl-C, then a kill if it has not stopped within 20 s."""
    if server.poll() is None:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def plan(sentences: list[str], args: argparse.Namespace) -> list[list[list[str]]]:
    """For each client, its requests: 1 to max_lines sentences each, drawn with the seed."""
    rng = random.Random(args.seed)
    return [
        [rng.sample(sentences, rng.randint(1, args.max_lines)) for _ in range(args.requests)]
        for _ in range(args.clients)
    ]


def client(base: str, requests: list[list[str]], beam: int, latencies: list[float], failures: list[str]) -> None:
    """Send the requests one after another over one keep-alive connection."""
    with httpx.Client(base_url=base, timeout=120) as http:
        for lines in requests:
            started = time.perf_counter()
            try:
                response = http.post("/v1/translate", json={"text": lines, "beam": beam})
                ok = response.status_code == 200 and len(response.json()["translations"]) == len(lines)
                reason = "" if ok else f"HTTP {response.status_code}: {response.text[:120]}"
            except (httpx.HTTPError, ValueError, KeyError) as err:
                reason = f"{type(err).__name__}: {err}"
            latencies.append(time.perf_counter() - started)
            if reason:
                failures.append(reason)


def load(base: str, work: list[list[list[str]]], beam: int) -> tuple[float, list[float], list[str]]:
    """Run every client at once; (wall seconds, latencies, failures)."""
    latencies: list[float] = []
    failures: list[str] = []
    threads = [threading.Thread(target=client, args=(base, requests, beam, latencies, failures)) for requests in work]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started, latencies, failures


def baseline(args: argparse.Namespace, sentences: list[str]) -> tuple[float, float]:
    """The same sentences translated in this process at once, as nmt-translate does: (wall, CPU) seconds."""
    import torch

    from nmt.api import load_translator

    torch.set_num_threads(args.threads)
    translator, _ = load_translator(args.checkpoint, DecodeConfig(beam=args.beam), "cpu")
    started, cpu = time.perf_counter(), time.process_time()
    translator.translate(sentences)
    return time.perf_counter() - started, time.process_time() - cpu


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", default="runs/quickstart", help="a checkpoint file or run dir")
    parser.add_argument("--source", default="data/toy/test.src", help="sentences to draw requests from (one per line)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=200, help="requests per client")
    parser.add_argument("--max-lines", type=int, default=5, help="each request holds 1 to this many sentences")
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server (and of the baseline)")
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="the server's serve.max_wait_ms")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the in-process translation of the same sentences"
    )
    args = parser.parse_args()
    sentences = [line for line in Path(args.source).read_text(encoding="utf-8").splitlines() if line.strip()]
    work = plan(sentences, args)
    total = sum(len(lines) for requests in work for lines in requests)
    print(
        f"nmt-serve load test: {args.clients} clients x {args.requests} requests of 1-{args.max_lines} sentences "
        f"({total} sentences, seed {args.seed}), beam {args.beam}, {args.threads} thread(s), "
        f"max_wait {args.max_wait_ms} ms"
    )
    server, base = start_server(args)
    try:
        httpx.post(f"{base}/v1/translate", json={"text": sentences[:2]}, timeout=120).raise_for_status()  # warm-up
        before, cpu = httpx.get(f"{base}/health").json(), (cpu_seconds(server.pid), time.process_time())
        wall, latencies, failures = load(base, work, args.beam)
        after, cpu = (
            httpx.get(f"{base}/health").json(),
            (cpu_seconds(server.pid) - cpu[0], time.process_time() - cpu[1]),
        )
    finally:
        stop_server(server)
    requests = args.clients * args.requests
    batches = after["batches"] - before["batches"]
    print(f"requests/s   {requests / wall:.1f}  ({requests} requests in {wall:.1f} s)")
    print(f"sentences/s  {total / wall:.1f}")
    print(f"latency      p50 {1000 * percentile(latencies, 50):.0f} ms, p99 {1000 * percentile(latencies, 99):.0f} ms")
    busy = after["decode_s"] - before["decode_s"]
    print(
        f"batches      {batches} ({requests / max(batches, 1):.1f} requests per batch); the decoding thread was busy "
        f"{100 * busy / wall:.0f}% of the time"
    )
    decode_cpu = after["decode_cpu_s"] - before["decode_cpu_s"]
    print(
        f"CPU time     server {cpu[0]:.1f} s (decoding {decode_cpu:.1f} s, the rest HTTP, JSON and batching), "
        f"load-test clients {cpu[1]:.1f} s, in {wall:.1f} s of wall time on {os.cpu_count()} cores"
    )
    print(f"failures     {len(failures)}" + (f" (first: {failures[0]})" if failures else ""))
    if not args.no_baseline:
        alone, alone_cpu = baseline(args, [line for requests in work for lines in requests for line in lines])
        print(
            f"in-process   {total / alone:.1f} sentences/s for the same sentences at once; the server reached "
            f"{alone / wall:.2f}x of it"
        )
        print(
            f"per CPU-s    server {total / cpu[0]:.1f} sentences, in-process {total / alone_cpu:.1f} "
            f"({alone_cpu / cpu[0]:.2f}x): the fair comparison on a machine shared with other jobs"
        )
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
