"""GET /metrics: the server's counters in the Prometheus text format (prometheus-client), one registry per app.

nmt_requests_total{path, code}       HTTP requests answered, by route and status code
nmt_request_seconds{path}            their latency (histogram)
nmt_sentences_total                  lines translated (sentences/s: rate(nmt_sentences_total[1m]))
nmt_batches_total                    decoding batches run
nmt_batch_lines                      lines per batch (histogram)
nmt_batch_seconds                    seconds per batch (histogram)
nmt_queue_lines                      lines waiting to be decoded now
nmt_running_batches                  batches being decoded now
nmt_requests_in_flight               HTTP requests being handled now
nmt_streams_total{outcome}           streams ended: done, disconnected, timeout (504 event), stalled (a client
                                     that took nothing for serve.timeout_s), error
nmt_stream_events_total              step events sent by streams
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self, queue_lines: Callable[[], int], running: Callable[[], int], in_flight: Callable[[], int]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("nmt_requests", "HTTP requests answered", ["path", "code"], registry=r)
        self.latency = Histogram("nmt_request_seconds", "HTTP request latency", ["path"], buckets=LATENCY, registry=r)
        self.sentences = Counter("nmt_sentences", "lines translated", registry=r)
        self.batches = Counter("nmt_batches", "decoding batches run", registry=r)
        self.batch_lines = Histogram(
            "nmt_batch_lines", "lines per batch", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=r
        )
        self.batch_seconds = Histogram("nmt_batch_seconds", "seconds per batch", buckets=LATENCY, registry=r)
        Gauge("nmt_queue_lines", "lines waiting to be decoded", registry=r).set_function(queue_lines)
        Gauge("nmt_running_batches", "batches being decoded", registry=r).set_function(running)
        Gauge("nmt_requests_in_flight", "HTTP requests being handled", registry=r).set_function(in_flight)
        self.streams = Counter("nmt_streams", "streams ended, by outcome", ["outcome"], registry=r)
        self.stream_events = Counter("nmt_stream_events", "step events sent by streams", registry=r)

    def batch(self, lines: int, seconds: float) -> None:
        self.batches.inc()
        self.sentences.inc(lines)
        self.batch_lines.observe(lines)
        self.batch_seconds.observe(seconds)

    def stream(self, outcome: str) -> None:
        self.streams.labels(outcome).inc()

    def request(self, path: str, code: int, seconds: float) -> None:
        self.requests.labels(path, str(code)).inc()
        self.latency.labels(path).observe(seconds)

    def text(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
