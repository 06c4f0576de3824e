"""POST /v1/translate/stream (nmt.serve.streams): each line's result equals /v1/translate's, events come while the
line is decoded, the request is checked as /v1/translate's, and a stream takes its turn on the lanes, stops when its
client leaves or its deadline passes, and never waits for a slow reader.

Functional checks go through the test client (which reads a response whole); timing, disconnects and slow readers
over real HTTP on loopback (uvicorn in a thread, tests/test_serve_hostile.py's `serving`), with each decoding step
steps by tests/test_serve_hostile.py's `steps` so that a line takes a second or more with the tiny models."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

from starlette.testclient import TestClient  # noqa: E402

from nmt.serve import lanes  # noqa: E402
from nmt.serve.app import create_app  # noqa: E402
from nmt.serve.models import load_model  # noqa: E402
from nmt.serve.scheduler import Overloaded  # noqa: E402
from tests.conftest import STEP  # noqa: E402
from tests.test_serve import DECODE, LOCAL, SETTINGS, trained_pair  # noqa: E402
from tests.test_serve_hostile import BASE, serving  # noqa: E402

STREAM = "/v1/translate/stream"


@pytest.fixture(scope="module")
def models(tmp_path_factory, toy_dir):
    runs = trained_pair(tmp_path_factory, toy_dir)
    return [load_model(name, path, DECODE, torch.device("cpu")) for name, path in runs.items()]


@pytest.fixture(scope="module")
def client(models):
    with TestClient(create_app(models, SETTINGS, DECODE), base_url=LOCAL) as c:
        yield c


@pytest.fixture(scope="module")
def sources(toy_dir):
    return (toy_dir / "test.src").read_text().splitlines()


def parse(text: str) -> list[tuple[str, dict]]:
    """The (event name, data) of each Server-Sent Event of a response body."""
    found = []
    for block in text.strip("\n").split("\n\n"):
        name, data = "message", None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
        found.append((name, data))
    return found


def stream(client, body) -> list[tuple[str, dict]]:
    response = client.post(STREAM, json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return parse(response.text)


def replay(events: list[dict]) -> tuple[list[str], list[list[float]]]:
    """A line's tokens and attention rows as a client rebuilds them from its step events (`keep`, then rows)."""
    rows: list[list[float]] = []
    for event in events:
        rows = rows[: event["keep"]] + event.get("attention", [])
    return events[-1]["tokens"], rows


@pytest.mark.parametrize("model, beam", [("a", 1), ("a", 3), ("b", 1), ("b", 3)])
def test_each_line_streams_to_the_result_of_the_plain_call(client, sources, model, beam):
    lines = [sources[0], "", " ".join(sources[1:3]), sources[3]]
    body = {"text": lines, "beam": beam, "model": model, "attention": [0, 1, 2]}
    events = stream(client, body)
    plain = client.post("/v1/translate", json=body).json()
    name, done = events[-1]
    assert name == "done" and {k: done[k] for k in ("model", "decode", "warnings")} == {
        k: plain[k] for k in ("model", "decode", "warnings")
    }
    lines_seen = [data["line"] for _, data in events[:-1]]
    assert lines_seen == sorted(lines_seen)  # line after line
    for i, expected in enumerate(plain["translations"]):
        mine = [data for _, data in events[:-1] if data["line"] == i]
        made, (final,) = mine[:-1], mine[-1:]
        assert final["final"] and final["result"] == expected  # attention, scores and all
        assert [e["step"] for e in made] == list(range(1, len(made) + 1))  # one event per decoding step
        if not lines[i].strip():
            assert not made
            continue
        assert made and all(not e.get("final") for e in made)
        assert made[-1]["text"] == expected["text"] or beam > 1  # greedy's last step is its output
        if i in body["attention"]:
            assert made[0]["src"] == expected["attention"]["src"] and all("src" not in e for e in made[1:])
            tokens, rows = replay(made)
            if beam == 1:  # the rows drawn step by step are the result's
                assert rows == expected["attention"]["weights"]
            assert all(len(row) == len(expected["attention"]["src"]) for row in rows)
        else:
            assert all("attention" not in e for e in made)
    assert max(sum(1 for _, d in events[:-1] if d["line"] == i) for i in range(len(lines))) > 3  # progressive


def test_finished_only_sends_finished_hypotheses(client, sources):
    body = {"text": [sources[5]], "beam": 3, "finished_only": True}
    events = stream(client, body)
    assert all(data["finished"] for _, data in events[:-2])
    assert (
        events[-2][1]["result"]
        == client.post("/v1/translate", json={"text": [sources[5]], "beam": 3}).json()["translations"][0]
    )


@pytest.mark.parametrize(
    "body, status, field, message",
    [
        (b"{not json", 400, None, "not valid JSON"),
        (b'{"text": ["x"], "nbest": 2, "beam": 2}', 422, "nbest", "nbest=2: a stream shows one hypothesis"),
        (b'{"text": ["x"], "constraints": ["y"]}', 422, "constraints", "constrained search does not stream"),
        (b'{"text": ["x"], "avoid": [["y"]]}', 422, "avoid", "constrained search does not stream"),
        (b'{"text": ["x"], "finished_only": "yes"}', 422, "finished_only", 'finished_only="yes": expected true or'),
        (b'{"text": ["x"], "stream": true}', 422, "stream", "expected text, beam, nbest,"),
        (b'{"text": ["x"], "beam": 7}', 422, "beam", "beam=7: expected an integer in [1, 6]"),
        (json.dumps({"text": ["x"] * 9}).encode(), 413, "text", "text: 9 lines; at most serve.max_lines=8"),
    ],
)
def test_mistakes_are_json_errors_before_the_stream_starts(client, body, status, field, message):
    response = client.post(STREAM, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status and response.headers["content-type"].startswith("application/json")
    assert response.json()["field"] == field and message in response.json()["error"], response.json()
    form = client.post(STREAM, content=b'{"text": ["x"]}', headers={"content-type": "text/plain"})
    assert form.status_code == 415


def test_a_full_queue_is_a_503_and_a_decoding_failure_an_error_event(client, sources, models, monkeypatch):
    scheduler = client.app.state.scheduler

    def full(*args, **kwargs):
        raise Overloaded(9, 8, 2)

    monkeypatch.setattr(scheduler, "submit", full)
    response = client.post(STREAM, json={"text": [sources[0]]})
    assert response.status_code == 503 and response.headers["retry-after"] == "2"
    assert "serve.max_queue_lines=8" in response.json()["error"]
    monkeypatch.undo()

    def broken(*args):
        raise RuntimeError("out of memory at /secret/host/path (simulated)")

    monkeypatch.setattr(lanes, "stream", broken)
    (name, error), *rest = [e for e in stream(client, {"text": [sources[0], sources[1]]}) if e[0] != "message"]
    assert name == "error" and not rest  # the stream ends there
    assert error == {"error": "decoding failed (the server's log has the details)", "field": None, "status": 500}
    monkeypatch.undo()
    assert stream(client, {"text": [sources[0]]})[-1][0] == "done"  # and the server goes on
    metrics = client.get("/metrics").text
    assert 'nmt_streams_total{outcome="error"} 1.0' in metrics and "nmt_stream_events_total" in metrics


def test_a_streamed_line_is_a_batch_of_its_own_taken_in_its_turn():
    from nmt.serve.scheduler import Scheduler

    seen = []

    def work(lane, key, payloads, cancel):
        seen.append(list(payloads))
        return list(payloads)

    async def main():
        scheduler = Scheduler(work, 1, 5.0, 100, 10**6, 10**6, 100)
        scheduler.start()
        started = time.monotonic()
        tickets = [
            scheduler.submit("s", ["s0"], [1], solo=True),
            scheduler.submit("k", ["a1", "a2"], [1, 1]),
            scheduler.submit("s", ["s1"], [1], solo=True),
            scheduler.submit("s", ["s2"], [1], solo=True),
            scheduler.submit("k", ["b1"], [1]),
        ]
        results = await asyncio.gather(*(t.future for t in tickets))
        waited = time.monotonic() - started
        await scheduler.stop()
        return results, waited

    results, waited = asyncio.run(main())
    assert results == [["s0"], ["a1", "a2"], ["s1"], ["s2"], ["b1"]]
    # by arrival: each solo line alone, never with another solo line of its key; the others batched as before
    assert seen == [["s0"], ["a1", "b1", "a2"], ["s1"], ["s2"]]
    assert waited < 5.0  # no batch waited max_wait for company (the first line was a solo one)


# --- over real HTTP ---


def timed(base: str, body: dict, timeout: float = 60) -> list[tuple[float, str, dict]]:
    """(arrival time, event name, data) of each event of a stream, read as it comes."""
    found, name = [], "message"
    with httpx.stream("POST", f"{base}{STREAM}", json=body, timeout=timeout) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                found.append((time.monotonic(), name, json.loads(line.removeprefix("data: "))))
                name = "message"
    return found


def health(base: str) -> dict:
    return httpx.get(f"{base}/health", timeout=10).json()


def until(condition, seconds: float = 10.0) -> bool:
    """Poll `condition` until it holds (True) or `seconds` pass (False)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_events_come_while_the_line_is_decoded_and_the_stream_takes_its_turn(models, sources, steps):
    line = " ".join(sources[:3])
    with serving(models, BASE) as (base, _):
        ended = {}

        def plain():
            time.sleep(0.3)  # while the stream's first line is decoded
            response = httpx.post(f"{base}/v1/translate", json={"text": [sources[9]]}, timeout=60)
            ended["plain"] = time.monotonic()
            assert response.status_code == 200

        other = threading.Thread(target=plain)
        other.start()
        events = timed(base, {"text": [line, line], "attention": True})
        other.join(timeout=60)
    first_line = [(at, data) for at, name, data in events if name == "message" and data["line"] == 0]
    assert len(first_line) > 5
    (first, _), (last, final) = first_line[0], first_line[-1]
    assert final["final"] and last - first > 3 * STEP  # the first events came well before the line was done
    assert ended["plain"] < events[-1][0]  # the plain request was answered before the stream's last line


def output_steps(models, line: str) -> int:
    """The most decoding steps model a's greedy search may take for a line (DECODE: its length + 4)."""
    ids, _, _ = models[0].encode([line])
    return len(ids[0]) + DECODE.max_len_b


def open_stream(base: str, body: dict) -> socket.socket:
    """A stream request on a raw socket (its answer not read)."""
    data = json.dumps(body).encode()
    host, port = base.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(
        b"POST /v1/translate/stream HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
    )
    return s


def test_a_client_that_disconnects_mid_stream_stops_its_decoding(models, sources, steps):
    long = " ".join(sources[:14])
    with serving(models, BASE) as (base, _):
        s = open_stream(base, {"text": [long]})
        received = b""
        while b"data: " not in received:  # the first step event
            received += s.recv(4096)
        s.close()  # the client goes away mid-stream
        assert until(lambda: health(base)["running"] == 0), "the abandoned line is still being decoded"
        stopped = len(steps)
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
        assert 'nmt_streams_total{outcome="disconnected"} 1.0' in metrics
        assert httpx.post(f"{base}/v1/translate", json={"text": [sources[0]]}, timeout=60).status_code == 200
        assert len(steps) - stopped <= output_steps(models, sources[0])  # the plain request's steps only
    assert stopped < output_steps(models, long) // 2  # far fewer steps than the line's output could take


def test_a_stream_past_its_deadline_ends_with_an_error_event(models, sources, steps):
    with serving(models, replace(BASE, timeout_s=1.0)) as (base, _):
        events = timed(base, {"text": [" ".join(sources[:14])]})
        assert until(lambda: health(base)["running"] == 0)
        count = len(steps)
        assert httpx.post(f"{base}/v1/translate", json={"text": [sources[0]]}, timeout=60).status_code == 200
        assert len(steps) - count <= output_steps(models, sources[0])
    names = [name for _, name, _ in events]
    assert names[-1] == "error" and names.count("message") >= 2 and "done" not in names
    error = events[-1][2]
    assert error["status"] == 504 and "serve.timeout_s=1" in error["error"]


def test_a_slow_reader_holds_no_lane(models, sources, steps):
    line = " ".join(sources[:4])
    with serving(models, BASE) as (base, _):
        s = open_stream(base, {"text": [line], "attention": True})  # nothing read while it is decoded
        assert until(lambda: len(steps) > 3)
        assert until(lambda: health(base)["running"] == 0 and health(base)["queued"] == 0)  # decoded, unread
        assert httpx.post(f"{base}/v1/translate", json={"text": [sources[0]]}, timeout=60).status_code == 200
        received = b""
        while not received.endswith(b"0\r\n\r\n"):  # the last chunk of the answer
            chunk = s.recv(65536)
            assert chunk, received[-200:]
            received += chunk
        s.close()
    assert b"event: done" in received and received.count(b'"final":true') == 1


def test_a_client_that_stops_reading_is_cut_off_and_holds_no_lane(models, sources, monkeypatch):
    """A client that reads nothing, with small socket buffers on both sides: the server's writes block, other
    requests are answered meanwhile, and after serve.timeout_s without progress the stream is dropped."""
    import tests.test_serve_hostile as hostile

    real = hostile.listen

    def small_buffers(host, port):  # accepted connections inherit the listening socket's send buffer
        sock = real(host, port)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        return sock

    monkeypatch.setattr(hostile, "listen", small_buffers)
    settings = replace(BASE, timeout_s=2.0)
    with serving(models, settings) as (base, _):
        data = json.dumps({"text": [" ".join(sources[:14])] * 3, "attention": True}).encode()
        host, port = base.removeprefix("http://").split(":")
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # before connecting: a small window
        s.connect((host, int(port)))
        s.sendall(
            b"POST /v1/translate/stream HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
        )
        started = time.monotonic()
        assert httpx.post(f"{base}/v1/translate", json={"text": [sources[0]]}, timeout=60).status_code == 200
        metrics = lambda: httpx.get(f"{base}/metrics", timeout=10).text  # noqa: E731
        assert until(lambda: 'nmt_streams_total{outcome="stalled"} 1.0' in metrics(), 20)
        assert time.monotonic() - started >= settings.timeout_s
        assert health(base)["running"] == 0 and health(base)["queued"] == 0
        assert "nmt_requests_in_flight 1.0" in metrics()  # this scrape alone
        s.close()


def test_streams_from_search_processes_equal_the_threads(models, sources):
    body = {"text": [sources[2], sources[6]], "beam": 2, "attention": True}
    with serving(models, BASE) as (base, _):
        one = [(name, data) for _, name, data in timed(base, body)]
    checkpoints = {m.name: m.checkpoint for m in models}
    with serving(models, replace(BASE, workers=2), checkpoints=checkpoints) as (base, _):
        two = [(name, data) for _, name, data in timed(base, body)]
    assert [name for name, _ in one] == [name for name, _ in two] and len(one) > 4
    for (_, mine), (_, theirs) in zip(one, two):
        if "tokens" in mine:  # a step: the same hypothesis, its attention to the last bits of another process
            assert {k: v for k, v in mine.items() if k != "attention"} == {
                k: v for k, v in theirs.items() if k != "attention"
            }
            np.testing.assert_allclose(mine["attention"], theirs["attention"], atol=2e-4)
        elif "result" in mine:
            assert mine["result"]["text"] == theirs["result"]["text"]
