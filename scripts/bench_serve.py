"""A bounded load test of nmt-serve on loopback: fixed work, then it stops. Three scenarios:

    python scripts/bench_serve.py --checkpoint runs/quickstart --source data/toy/test.src            # levels
    python scripts/bench_serve.py --scenario mix --seconds 60      # small requests, then with expensive ones beside
    python scripts/bench_serve.py --scenario soak --seconds 600 --rate 20    # steady load; is the RSS flat?

It starts `nmt-serve checkpoint=... host=127.0.0.1 port=0` in a subprocess (its own address only, never another
host; --threads torch threads, --workers search processes), waits for the address it prints, and then:

  levels  for each of --levels concurrent clients (default 1, 8, 64), each client sends --requests requests of 1 to
          --max-lines sentences drawn from --source with a fixed --seed, one after another over a keep-alive
          connection. A row per level: requests/s, sentences/s, p50/p95/p99 latency, answers by status code
          (and connection errors by type), the server's RSS and peak RSS (VmHWM) after the level, requests per
          batch; then the same sentences translated in this process at once, as nmt-translate does.
  mix     --clients clients send small requests for --seconds; then again with one expensive request (--heavy-lines
          lines of --heavy-words words, beam --heavy-beam) every --every seconds from another client. It prints the
          small requests' p50/p99 alone and beside the expensive ones, and their ratio (the server's promise: within
          3x), and the expensive requests' latencies.
  soak    requests at a steady --rate per second for --seconds, from a pool of clients; RSS sampled every 10 s. It
          prints the RSS at the end of the first minute and after, the largest change from it (flat: within 10%),
          the answers by code and the latency percentiles per minute.

Every figure depends on what else runs on the machine: say so beside it.
"""

from __future__ import annotations

import argparse
import collections
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
    options = [
        f"serve.max_wait_ms={args.max_wait_ms}",
        f"serve.max_lines={max(args.max_lines, args.heavy_lines)}",
        f"serve.max_chars={200000}",
        f"serve.workers={args.workers}",
        f"serve.max_requests={max(256, 2 * max(args.levels))}",
        f"decode.beam={args.beam}",
    ]
    return launch(args.checkpoint, args.threads, options)


def launch(checkpoint: str, threads: int, options: list[str]) -> tuple[subprocess.Popen, str]:
    """nmt-serve of `checkpoint` with `threads` threads and the given overrides on a free loopback port, its
    output echoed; (the process, its base URL). Exits with one line when it does not start within 300 s."""
    command = [
        sys.executable,
        "-m",
        "nmt.cli.serve",
        f"checkpoint={checkpoint}",
        "host=127.0.0.1",
        "port=0",
        f"threads={threads}",
        "serve.access_log=false",
        *options,
    ]
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
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
    """SIGTERM (a graceful stop), then a kill if it has not stopped within 30 s."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
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


def memory_mb(pid: int) -> tuple[float, float]:
    """(RSS, peak RSS) in MiB of a process and its children (the search processes), from /proc."""
    pids = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(c) for c in children]
    except OSError:
        pass
    rss = peak = 0.0
    for p in pids:
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        found = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, flags=re.M))
        rss += int(found.get("VmRSS", 0)) / 1024
        peak += int(found.get("VmHWM", 0)) / 1024
    return rss, peak


class Tally:
    """Latencies and answers by status code (or connection error type), from many client threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.codes: collections.Counter[str] = collections.Counter()
        self.first_failure = ""

    def add(self, seconds: float, code: str, failure: str = "") -> None:
        with self.lock:
            if code == "200":
                self.latencies.append(seconds)
            self.codes[code] += 1
            if failure and not self.first_failure:
                self.first_failure = failure

    def codes_text(self) -> str:
        return ", ".join(f"{code}: {n}" for code, n in sorted(self.codes.items()))

    def failures(self) -> int:
        return sum(n for code, n in self.codes.items() if code not in ("200", "503"))


def send(http: httpx.Client, lines: list[str], beam: int, tally: Tally) -> None:
    started = time.perf_counter()
    try:
        response = http.post("/v1/translate", json={"text": lines, "beam": beam})
        code = str(response.status_code)
        failure = ""
        if code == "200" and len(response.json()["translations"]) != len(lines):
            code, failure = "wrong-count", f"{len(lines)} lines sent, another count answered"
        elif code not in ("200", "503"):
            failure = f"HTTP {code}: {response.text[:120]}"
    except (httpx.HTTPError, ValueError, KeyError) as err:
        code, failure = type(err).__name__, f"{type(err).__name__}: {err}"
    tally.add(time.perf_counter() - started, code, failure)


def percentile(values: list[float], q: int) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def ms(values: list[float], q: int) -> str:
    return f"{1000 * percentile(values, q):.0f}"


def plan(sentences: list[str], clients: int, args: argparse.Namespace) -> list[list[list[str]]]:
    """For each client, its requests: 1 to max_lines sentences each, drawn with the seed."""
    rng = random.Random(args.seed)
    return [
        [rng.sample(sentences, rng.randint(1, args.max_lines)) for _ in range(args.requests)] for _ in range(clients)
    ]


def run_clients(base: str, work: list[list[list[str]]], beam: int) -> tuple[float, Tally]:
    """Every client at once, each sending its requests one after another; (wall seconds, tally)."""
    tally = Tally()

    def client(requests: list[list[str]]) -> None:
        with httpx.Client(base_url=base, timeout=300) as http:
            for lines in requests:
                send(http, lines, beam, tally)

    threads = [threading.Thread(target=client, args=(requests,)) for requests in work]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started, tally


def baseline(args: argparse.Namespace, sentences: list[str]) -> tuple[float, float]:
    """The same sentences translated in this process at once, as nmt-translate does: (wall, CPU) seconds."""
    import torch

    from nmt.api import load_translator

    torch.set_num_threads(args.threads)
    translator, _ = load_translator(args.checkpoint, DecodeConfig(beam=args.beam), "cpu")
    started, cpu = time.perf_counter(), time.process_time()
    translator.translate(sentences)
    return time.perf_counter() - started, time.process_time() - cpu


def levels(args: argparse.Namespace, sentences: list[str], server: subprocess.Popen, base: str) -> int:
    print(
        "| clients | requests | requests/s | sentences/s | p50 ms | p95 ms | p99 ms | answers | RSS MiB | peak MiB "
        "| requests/batch |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    failures, all_sentences, cpu_used = 0, [], 0.0
    for clients in args.levels:
        work = plan(sentences, clients, args)
        total = sum(len(lines) for requests in work for lines in requests)
        before, cpu = httpx.get(f"{base}/health").json(), cpu_seconds(server.pid)
        wall, tally = run_clients(base, work, args.beam)
        after = httpx.get(f"{base}/health").json()
        cpu_used += cpu_seconds(server.pid) - cpu
        rss, peak = memory_mb(server.pid)
        batches = max(after["batches"] - before["batches"], 1)
        requests = clients * args.requests
        print(
            f"| {clients} | {requests} | {requests / wall:.1f} | {total / wall:.1f} | {ms(tally.latencies, 50)} "
            f"| {ms(tally.latencies, 95)} | {ms(tally.latencies, 99)} | {tally.codes_text()} | {rss:.0f} | {peak:.0f} "
            f"| {(after['requests'] - before['requests']) / batches:.1f} |",
            flush=True,
        )
        failures += tally.failures()
        all_sentences += [line for requests in work for lines in requests for line in lines]
        if tally.first_failure:
            print(f"  first failure: {tally.first_failure}")
    if not args.no_baseline:
        alone, alone_cpu = baseline(args, all_sentences)
        print(
            f"in-process: the same {len(all_sentences)} sentences at once, as nmt-translate does: "
            f"{len(all_sentences) / alone:.1f} sentences/s, {len(all_sentences) / alone_cpu:.1f} per CPU second; "
            f"the server: {len(all_sentences) / max(cpu_used, 1e-9):.1f} per CPU second of its own"
        )
    return failures


def mix(args: argparse.Namespace, sentences: list[str], server: subprocess.Popen, base: str) -> int:
    rng = random.Random(args.seed)
    words = " ".join(sentences).split()
    heavy = [" ".join(rng.choices(words, k=args.heavy_words)) for _ in range(args.heavy_lines)]

    def small_load(with_heavy: bool) -> tuple[Tally, Tally]:
        small, big = Tally(), Tally()
        stop = time.monotonic() + args.seconds

        def client(seed: int) -> None:
            r = random.Random(seed)
            with httpx.Client(base_url=base, timeout=300) as http:
                while time.monotonic() < stop:
                    send(http, r.sample(sentences, r.randint(1, args.max_lines)), args.beam, small)

        def expensive() -> None:
            with httpx.Client(base_url=base, timeout=600) as http:
                while time.monotonic() < stop:
                    started = time.monotonic()
                    send(http, heavy, args.heavy_beam, big)
                    time.sleep(max(0.0, args.every - (time.monotonic() - started)))

        threads = [threading.Thread(target=client, args=(args.seed + i,)) for i in range(args.clients)]
        if with_heavy:
            threads.append(threading.Thread(target=expensive))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return small, big

    alone, _ = small_load(False)
    beside, big = small_load(True)
    print("| small requests | answers | p50 ms | p95 ms | p99 ms |")
    print("|---|---|---:|---:|---:|")
    for name, tally in (("alone", alone), ("beside expensive ones", beside)):
        print(
            f"| {name} | {tally.codes_text()} | {ms(tally.latencies, 50)} | {ms(tally.latencies, 95)} "
            f"| {ms(tally.latencies, 99)} |"
        )
    ratio = percentile(beside.latencies, 99) / percentile(alone.latencies, 99)
    print(
        f"expensive requests ({args.heavy_lines} lines of {args.heavy_words} words, beam {args.heavy_beam}, one every "
        f"{args.every:g} s): {big.codes_text()}; latency p50 {ms(big.latencies, 50)} ms, max "
        f"{1000 * max(big.latencies, default=float('nan')):.0f} ms"
    )
    print(f"small requests' p99 beside the expensive ones: {ratio:.2f}x their p99 alone (the promise: within 3x)")
    return alone.failures() + beside.failures() + big.failures() + (ratio > 3)


def soak(args: argparse.Namespace, sentences: list[str], server: subprocess.Popen, base: str) -> int:
    tally_by_minute: dict[int, Tally] = collections.defaultdict(Tally)
    rss: list[tuple[float, float]] = []
    started = time.monotonic()
    stop = started + args.seconds
    pool = threading.BoundedSemaphore(64)
    rng = random.Random(args.seed)

    def one(lines: list[str], minute: int) -> None:
        try:
            with httpx.Client(base_url=base, timeout=300) as http:
                send(http, lines, args.beam, tally_by_minute[minute])
        finally:
            pool.release()

    def sample() -> None:
        while time.monotonic() < stop:
            rss.append((time.monotonic() - started, memory_mb(server.pid)[0]))
            time.sleep(10)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    threads = []
    n = 0
    while (now := time.monotonic()) < stop:
        due = started + n / args.rate
        if due > now:
            time.sleep(due - now)
        pool.acquire()
        minute = int((time.monotonic() - started) // 60)
        t = threading.Thread(target=one, args=(rng.sample(sentences, rng.randint(1, args.max_lines)), minute))
        t.start()
        threads.append(t)
        n += 1
    for t in threads:
        t.join()
    print("| minute | answers | p50 ms | p99 ms |")
    print("|---:|---|---:|---:|")
    for minute, tally in sorted(tally_by_minute.items()):
        print(f"| {minute + 1} | {tally.codes_text()} | {ms(tally.latencies, 50)} | {ms(tally.latencies, 99)} |")
    after_warmup = [m for t, m in rss if t >= 60] or [m for _, m in rss]
    reference = after_warmup[0]
    change = max(abs(m - reference) / reference for m in after_warmup)
    print(
        f"RSS: {reference:.0f} MiB after the first minute, {after_warmup[-1]:.0f} MiB at the end, largest change "
        f"{100 * change:.1f}% ({len(rss)} samples, every 10 s): {'flat' if change <= 0.10 else 'NOT flat'} "
        f"(within 10%); {n} requests at {args.rate:g}/s"
    )
    return sum(t.failures() for t in tally_by_minute.values()) + (change > 0.10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", choices=("levels", "mix", "soak"), default="levels")
    parser.add_argument("--checkpoint", default="runs/quickstart", help="a checkpoint file or run dir")
    parser.add_argument("--source", default="data/toy/test.src", help="sentences to draw requests from (one per line)")
    parser.add_argument("--levels", default="1,8,64", help="levels: concurrent clients, comma-separated")
    parser.add_argument("--requests", type=int, default=50, help="levels: requests per client")
    parser.add_argument("--clients", type=int, default=8, help="mix: clients sending small requests")
    parser.add_argument("--seconds", type=float, default=60, help="mix: seconds per half; soak: the whole soak")
    parser.add_argument("--every", type=float, default=3.0, help="mix: seconds between expensive requests")
    parser.add_argument("--heavy-lines", type=int, default=8, help="mix: lines of an expensive request")
    parser.add_argument("--heavy-words", type=int, default=150, help="mix: words per line of an expensive request")
    parser.add_argument("--heavy-beam", type=int, default=8, help="mix: the beam of an expensive request")
    parser.add_argument("--rate", type=float, default=20, help="soak: requests per second")
    parser.add_argument("--max-lines", type=int, default=5, help="each small request holds 1 to this many sentences")
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server (and of the baseline)")
    parser.add_argument("--workers", type=int, default=1, help="the server's serve.workers")
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="the server's serve.max_wait_ms")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-baseline", action="store_true", help="levels: skip the in-process translation")
    args = parser.parse_args()
    args.levels = [int(n) for n in args.levels.split(",")]
    sentences = [line for line in Path(args.source).read_text(encoding="utf-8").splitlines() if line.strip()]
    print(
        f"nmt-serve load test ({args.scenario}): {args.checkpoint}, beam {args.beam}, {args.threads} thread(s), "
        f"{args.workers} worker(s), max_wait {args.max_wait_ms} ms, seed {args.seed}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f} at the start"
    )
    server, base = start_server(args)
    try:
        httpx.post(f"{base}/v1/translate", json={"text": sentences[:2]}, timeout=120).raise_for_status()  # warm-up
        failures = {"levels": levels, "mix": mix, "soak": soak}[args.scenario](args, sentences, server, base)
    finally:
        stop_server(server)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
