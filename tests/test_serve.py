"""nmt-serve: every endpoint and error case through the test client, the batching path, the command's settings."""

import asyncio
import json
import threading
import time
from dataclasses import fields
from pathlib import Path

import pytest
import torch

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from starlette.testclient import TestClient  # noqa: E402

from nmt.api import load_translator  # noqa: E402
from nmt.cli import serve as serve_cli  # noqa: E402
from nmt.cli import train  # noqa: E402
from nmt.cli.common import run  # noqa: E402
from nmt.config import DecodeConfig, ServeConfig, ServeSettings  # noqa: E402
from nmt.errors import NmtError  # noqa: E402
from nmt.serve.app import create_app  # noqa: E402
from nmt.serve.models import load_model  # noqa: E402
from nmt.serve.scheduler import Cancelled, Overloaded, Scheduler  # noqa: E402
from nmt.training.checkpoint import load_checkpoint  # noqa: E402
from tests.test_cli import TINY, cli, toy_overrides  # noqa: E402
from tests.test_config_checks import ruled_keys  # noqa: E402
from tests.test_errors import one_error_line  # noqa: E402

DECODE = DecodeConfig(max_len_a=1.0, max_len_b=4)  # short outputs keep a barely trained model fast
SETTINGS = ServeSettings(max_lines=8, max_chars=400, max_beam=6, max_wait_ms=0, access_log=False)
_RUNS: dict[str, dict[str, str]] = {}
LOCAL = "http://localhost"  # the Host the test client sends: a loopback name, as serve.allowed_hosts wants


def trained_pair(tmp_path_factory, toy_dir) -> dict[str, str]:
    """Two run dirs trained a few steps on the toy corpus: a tiny Transformer ("a") and a tiny Luong model ("b").

    Shared by this file and test_serve_browser.py (trained once per session).
    """
    key = str(tmp_path_factory.getbasetemp())
    if key not in _RUNS:
        work = tmp_path_factory.mktemp("serve")
        common = toy_overrides(toy_dir) + [
            f"data.cache_dir={work}/cache",
            "train.max_steps=4",
            "train.valid_every=4",
            "train.valid_bleu_sentences=4",
            "decode.max_len_a=0",
            "decode.max_len_b=4",
        ]
        arch = {"a": TINY, "b": ["model=luong", "model.dim=32", "model.layers=1", "train.progress=false"]}
        for name, model in arch.items():
            with pytest.raises(SystemExit) as exit_info:
                run(train.main, common + model + [f"run_dir={work}/{name}"])
            assert exit_info.value.code == 0
        _RUNS[key] = {name: str(work / name) for name in arch}
    return _RUNS[key]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, toy_dir):
    return trained_pair(tmp_path_factory, toy_dir)


@pytest.fixture(scope="module")
def models(runs):
    return [load_model(name, path, DECODE, torch.device("cpu")) for name, path in runs.items()]


@pytest.fixture(scope="module")
def client(models):
    with TestClient(create_app(models, SETTINGS, DECODE), base_url=LOCAL) as c:
        yield c


@pytest.fixture(scope="module")
def sources(toy_dir):
    return (toy_dir / "test.src").read_text().splitlines()[:12]


def translate(client, body, status=200):
    response = client.post("/v1/translate", json=body)
    assert response.status_code == status, response.text
    return response.json()


def test_models_and_health(client, runs):
    listed = client.get("/v1/models").json()
    by_name = {m["name"]: m for m in listed["models"]}
    assert list(by_name) == ["a", "b"]
    a, b = by_name["a"], by_name["b"]
    assert (a["arch"], a["variant"], a["attention"]) == (
        "transformer",
        {"heads": 2, "scale": True},
        "scaled dot-product, 2 heads",
    )
    assert (b["arch"], b["variant"]["score"], b["variant"]["window"]) == ("luong", "general", "global")
    for name, m in by_name.items():
        payload = load_checkpoint(runs[name])
        assert m["steps"] == payload["step"] and m["label"] == Path(runs[name]).name and "checkpoint" not in m
        weights = {
            v.data_ptr(): v.numel() for v in payload["model"].values() if v.is_floating_point()
        }  # tied weights once
        assert m["parameters"] == sum(weights.values())
        assert m["src_vocab_size"] > 8 and m["tgt_vocab_size"] > 8 and m["max_beam"] == SETTINGS.max_beam
    assert listed["limits"] == {"max_lines": SETTINGS.max_lines, "max_chars": SETTINGS.max_chars}
    assert listed["decode"]["beam"] == 1 and "beam=1" in listed["decode"]["settings"]
    assert str(Path(runs["a"]).parent) not in json.dumps(listed)  # no path of this host in what clients see
    health = client.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok" and health.json()["models"] == ["a", "b"]


def test_page_and_its_files_are_served(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for name in ("style.css", "app.js"):
        assert f"/static/{name}" in page.text
        assert client.get(f"/static/{name}").status_code == 200
    assert "http" not in client.get("/static/app.js").text.replace("HTTP ", "")  # nothing fetched from elsewhere
    assert "//" not in page.text.replace("<!doctype html>", "").split("<body>")[0]  # no CDN link in the head


def test_every_line_gets_a_result_in_order(client, runs, sources):
    lines = [sources[0], "", sources[1], "   ", sources[2], ""]
    got = translate(client, {"text": lines})["translations"]
    assert len(got) == len(lines)
    for line, result in zip(lines, got):
        assert bool(result["nbest"]) == bool(line.strip())
        if not line.strip():
            assert result["text"] == "" and result["score"] is None
    translator, _ = load_translator(runs["a"], DECODE, "cpu")  # the server says what nmt-translate says
    assert [r["text"] for r in got] == translator.translate(lines)
    assert translate(client, {"text": []})["translations"] == []


def test_nbest_scores_and_attention(client, sources):
    reply = translate(client, {"text": [sources[3], ""], "beam": 4, "nbest": 3, "attention": True})
    assert "beam=4" in reply["decode"] and reply["model"]["name"] == "a"
    first, blank = reply["translations"]
    scores = [h["score"] for h in first["nbest"]]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True) and first["score"] == scores[0]
    assert first["text"] == first["nbest"][0]["text"] and all(h["log_prob"] <= 0 for h in first["nbest"])
    att = first["attention"]
    assert att["src"][-1] == "</s>" and len(att["weights"]) == len(att["tgt"]) >= 1
    for row in att["weights"]:
        assert len(row) == len(att["src"]) and abs(sum(row) - 1) < 1e-3
    assert blank["attention"] == {"src": [], "tgt": [], "weights": []} and blank["nbest"] == []
    assert "attention" not in translate(client, {"text": [sources[3]]})["translations"][0]


def test_the_compared_model_answers_by_name(client, sources):
    reply = translate(client, {"text": [sources[4]], "model": "b", "attention": True})
    assert reply["model"]["arch"] == "luong" and reply["model"]["title"].startswith("Luong: general score")
    assert reply["translations"][0]["attention"]["src"][-1] == "</s>"


@pytest.mark.parametrize(
    "body, status, field, message",
    [
        (b"{not json", 400, None, "not valid JSON"),
        (b"\xff\xfe", 400, None, "not valid JSON"),
        (b'["a sentence"]', 400, None, "the body is a JSON array; expected an object"),
        (b"{}", 422, "text", "text: missing"),
        (b'{"text": "one string"}', 422, "text", "expected a list of strings"),
        (b'{"text": ["ok", 3]}', 422, "text", "expected a list of strings"),
        (
            b'{"text": ["x"], "beams": 2}',
            422,
            "beams",
            "beams: unknown field; expected text, beam, nbest, attention, model, prefix, alignments, constraints, "
            "avoid",
        ),
        (b'{"text": ["x"], "beam": "5"}', 422, "beam", 'beam="5": expected an integer'),
        (b'{"text": ["x"], "beam": true}', 422, "beam", "beam=true: expected an integer"),
        (b'{"text": ["x"], "beam": 0}', 422, "beam", "beam=0: expected an integer in [1, 6]"),
        (b'{"text": ["x"], "beam": 7}', 422, "beam", "beam=7: expected an integer in [1, 6]"),
        (
            b'{"text": ["x"], "beam": 2, "nbest": 3}',
            422,
            "nbest",
            "nbest=3: expected an integer in [1, 2] (at most beam=2)",
        ),
        (b'{"text": ["x"], "nbest": 1.5}', 422, "nbest", "nbest=1.5: expected an integer"),
        (
            b'{"text": ["x"], "attention": "yes"}',
            422,
            "attention",
            'attention="yes": expected true, false or a list of line numbers',
        ),
        (b'{"text": ["x"], "attention": [1]}', 422, "attention", "attention: line 1 is not a line of text"),
        (b'{"text": ["x", "\\ud800"]}', 400, "text", "text[1]: holds a lone surrogate"),
        (b"[" * 3000 + b"]" * 3000, 400, None, "nested more than 32 deep"),
        (b'{"text": ["x"], "beam": ' + b"9" * 5000 + b"}", 400, None, "a number too long to read"),
        (b'{"text": ["x"], "model": "c"}', 422, "model", 'model="c": unknown; expected one of a, b'),
        (json.dumps({"text": ["x"] * 9}).encode(), 413, "text", "text: 9 lines; at most serve.max_lines=8"),
        (
            json.dumps({"text": ["x" * 300, "y" * 101]}).encode(),
            413,
            "text",
            "text: 401 characters; at most serve.max_chars=400",
        ),
        (json.dumps({"text": ["x"], "pad": " " * 10000}).encode(), 413, "text", "bytes"),
    ],
)
def test_mistakes_are_json_errors_naming_the_field(client, body, status, field, message):
    response = client.post("/v1/translate", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()
    assert error["field"] == field and message in error["error"], error


def test_unknown_routes_and_methods_are_json_errors(client):
    for method, path, status in [
        ("GET", "/v2/translate", 404),
        ("GET", "/v1/translate", 405),
        ("POST", "/v1/models", 405),
    ]:
        response = client.request(method, path)
        assert response.status_code == status and path in response.json()["error"]


def test_a_decoding_failure_is_a_500_and_the_server_goes_on(client, models, sources, monkeypatch):
    from nmt.serve import lanes

    real = lanes.search

    def broken(translator, *args):
        if translator is models[0].translator:
            raise RuntimeError("out of memory at /secret/host/path (simulated)")
        return real(translator, *args)

    monkeypatch.setattr(lanes, "search", broken)
    error = translate(client, {"text": [sources[0]]}, status=500)
    assert error == {"error": "decoding failed (the server's log has the details)", "field": None}
    assert translate(client, {"text": [sources[0]], "model": "b"})["translations"][0][
        "nbest"
    ]  # the other model is unaffected
    monkeypatch.undo()
    assert translate(client, {"text": [sources[0]]})["translations"][0]["nbest"]
    assert client.get("/health").json()["status"] == "ok"


def test_concurrent_requests_are_batched_and_match_one_at_a_time(client, models, sources):
    """Eight requests sent at once (mixed models, beams and blank lines) give what each gives alone."""
    bodies = [
        {
            "text": [sources[i], "", sources[i + 1]] if i % 3 == 0 else [sources[i]],
            "beam": 1 + i % 3,
            "model": "ab"[i % 2],
            "attention": i % 4 == 0,
        }
        for i in range(8)
    ]
    alone = [translate(client, body) for body in bodies]  # max_wait_ms=0 and one at a time: one request per batch
    lines = sum(len(body["text"]) for body in bodies)
    batched_settings = ServeSettings(
        max_lines=8, max_chars=400, max_beam=6, max_wait_ms=20000, max_batch_lines=lines, access_log=False
    )
    batched_settings.max_batch_lines = sum(1 for body in bodies for line in body["text"] if line.strip())
    with TestClient(create_app(models, batched_settings, DECODE), base_url=LOCAL) as batched:
        together: list = [None] * len(bodies)

        def send(i):
            together[i] = translate(batched, bodies[i])

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        health = batched.get("/health").json()
    keys = {(body["model"], body["beam"]) for body in bodies}
    assert health["batches"] == len(keys) and health["requests"] == len(bodies)  # one batch per (model, beam)
    assert health["lines"] == batched_settings.max_batch_lines
    for one, both in zip(alone, together):
        assert [r["text"] for r in both["translations"]] == [r["text"] for r in one["translations"]]
        assert both["model"]["name"] == one["model"]["name"] and both["decode"] == one["decode"]
        for r1, r2 in zip(one["translations"], both["translations"]):
            assert (r1["score"] is None) == (r2["score"] is None)
            assert r1["score"] is None or abs(r1["score"] - r2["score"]) <= 1e-3  # 4 decimals, padding-level noise
            assert ("attention" in r1) == ("attention" in r2)


def test_long_sources_are_cut_with_a_warning_naming_the_line(models, sources):
    decode = DecodeConfig(max_len_a=0, max_len_b=3, max_src_len=5)
    app = create_app([load_model("a", models[0].checkpoint, decode, torch.device("cpu"))], SETTINGS, decode)
    with TestClient(app, base_url=LOCAL) as c:
        reply = translate(c, {"text": ["ze", " ".join(sources[:3])]})
    assert len(reply["translations"]) == 2
    assert (
        len(reply["warnings"]) == 1
        and reply["warnings"][0].startswith("line 2: ")
        and "decode.max_src_len=5" in reply["warnings"][0]
    )


# --- the scheduler on its own (no model) ---


def schedule(work, requests, lanes=1, max_wait=0.05, max_lines=100, max_cost=10**6, long_cost=10**6, queue=1000):
    """Submit every request (a list of (payload, cost)) at once; (results or exception per request, the scheduler,
    the (lane, payloads) that work saw, in order)."""
    seen = []

    def recording(lane, key, payloads, cancel):
        seen.append((lane, list(payloads)))
        return work(payloads, cancel)

    async def main():
        scheduler = Scheduler(recording, lanes, max_wait, max_lines, max_cost, long_cost, queue)
        scheduler.start()
        tickets = [scheduler.submit("k", [p for p, _ in r], [c for _, c in r]) for r in requests]
        outcomes = await asyncio.gather(*(t.future for t in tickets), return_exceptions=True)
        await scheduler.stop()
        return outcomes, scheduler

    outcomes, scheduler = asyncio.run(main())
    return outcomes, scheduler, seen


def test_scheduler_gathers_keeps_order_and_caps_lines():
    outcomes, scheduler, seen = schedule(lambda ps, c: [p * 10 for p in ps], [[(1, 1), (2, 1)], [(3, 1)]])
    assert outcomes == [[10, 20], [30]] and scheduler.batches == 1
    started = time.monotonic()
    outcomes, _, seen = schedule(lambda ps, c: list(ps), [[(i, 1)] for i in range(5)], max_wait=10, max_lines=2)
    assert outcomes == [[0], [1], [2], [3], [4]] and [p for _, p in seen] == [[0, 1], [2, 3], [4]]
    assert time.monotonic() - started < 5  # closed on reaching 2 lines, the rest went without waiting out max_wait


def test_scheduler_is_fair_to_a_small_request_behind_a_large_one():
    big = [(f"big{i}", 1) for i in range(6)]
    outcomes, _, seen = schedule(lambda ps, c: list(ps), [big, [("small", 1)]], max_lines=2)
    assert [p for _, p in seen][0] == ["big0", "small"]  # one line of each request in turn
    assert outcomes[0] == [p for p, _ in big] and outcomes[1] == ["small"]


def test_scheduler_batches_long_lines_apart_and_keeps_a_lane_for_short_ones():
    order = []

    def work(payloads, cancel):
        if payloads[0].startswith("long"):
            time.sleep(0.5)
        order.append(payloads[0])
        return list(payloads)

    requests = [[("long1", 100), ("long2", 100)], [("short1", 1)], [("short2", 1)]]
    outcomes, _, seen = schedule(work, requests, lanes=1, long_cost=50, max_cost=150)
    assert outcomes == [["long1", "long2"], ["short1"], ["short2"]]
    assert all(not any(p.startswith("long") for p in ps) or all(p.startswith("long") for p in ps) for _, ps in seen)
    assert seen[0] == (0, ["long1"])  # cost cap: one long line a batch
    assert (1, ["short1", "short2"]) in seen  # the reserved lane took the short ones while lane 0 ran long
    assert order.index("short1") < order.index("long1")  # and answered them before the long line was done


def test_scheduler_overload_cancel_and_isolation():
    async def overload():
        scheduler = Scheduler(lambda *a: [], 1, 10, 100, 100, 100, queue := 3)
        scheduler.start()
        scheduler.submit("k", [1, 2], [1, 1])
        with pytest.raises(Overloaded) as info:
            scheduler.submit("k", [3, 4], [1, 1])
        assert info.value.retry_after >= 1 and f"serve.max_queue_lines={queue}" in str(info.value)
        await scheduler.stop()

    asyncio.run(overload())

    steps = []

    def slow(payloads, cancel):  # a search that checks its cancel event each step, as lanes.Stoppable does
        for _ in range(200):
            if cancel.is_set():
                raise Cancelled()
            steps.append(1)
            time.sleep(0.01)
        return list(payloads)

    async def cancelling():
        scheduler = Scheduler(lambda lane, key, ps, cancel: slow(ps, cancel), 1, 0, 100, 100, 100, 100)
        scheduler.start()
        running, waiting = scheduler.submit("k", [1], [1]), None
        await asyncio.sleep(0.2)
        waiting = scheduler.submit("k", [2], [1])
        scheduler.cancel(waiting)
        assert scheduler.waiting_lines == 0
        scheduler.cancel(running)
        await asyncio.sleep(0.3)
        assert not scheduler.running  # the running search stopped at its next step
        await scheduler.stop()

    asyncio.run(cancelling())
    assert len(steps) < 100

    def picky(payloads, cancel):
        if "bad" in payloads:
            raise ValueError("cannot decode 'bad'")
        return list(payloads)

    outcomes, _, seen = schedule(picky, [[("good", 1)], [("bad", 1), ("also", 1)], [("fine", 1)]])
    assert outcomes[0] == ["good"] and outcomes[2] == ["fine"]  # decoded again without the failing request
    assert isinstance(outcomes[1], ValueError)


# --- the command ---


def test_every_serve_key_with_a_bad_value(capsys):
    cases = (
        ruled_keys(ServeConfig) + [(f"serve.{n}", b) for n, b in ruled_keys(ServeSettings)] + [("decode.beam", 0)]
    )  # decode.*: test_config_checks
    for schema in (ServeConfig, ServeSettings):
        for f in fields(schema):
            if f.type in ("int", "float", "Optional[int]", "Optional[float]"):
                assert "rule" in f.metadata, f"{schema.__name__}.{f.name} has no rule"
    for name, bad in cases:
        code, _, err = cli(serve_cli.main, ["checkpoint=/nonexistent.pt", f"{name}={bad}"], capsys)
        one_error_line(code, err, f"error: {name}=")
    code, _, err = cli(serve_cli.main, ["checkpoint=/nonexistent.pt", "decode=sampling"], capsys)
    one_error_line(code, err, "error: decode.sampling=true: nmt-serve decodes by search only")
    code, _, err = cli(serve_cli.main, ["checkpoint=/nonexistent.pt", "decode.beam=20"], capsys)
    one_error_line(code, err, "error: decode.beam=20: above serve.max_beam=16")
    code, _, err = cli(serve_cli.main, ["checkpoint=/nonexistent.pt"], capsys)
    one_error_line(code, err, "/nonexistent.pt: checkpoint not found")


def test_the_command_loads_both_models_and_listens_on_loopback(runs, capsys, monkeypatch):
    import uvicorn

    served = {}

    def fake_run(server, sockets):
        served["address"] = sockets[0].getsockname()
        served["app"] = server.config.app
        sockets[0].close()

    monkeypatch.setattr(uvicorn.Server, "run", fake_run)
    code, out, err = cli(
        serve_cli.main, [f"checkpoint={runs['a']}", f"compare={runs['b']}", "port=0", "serve.access_log=false"], capsys
    )
    assert code == 0, err
    host, port = served["address"]
    assert host == "127.0.0.1" and port > 0 and f"serving http://127.0.0.1:{port}/" in out
    assert (
        "model a: " in out
        and "Transformer: scaled dot-product" in out
        and "model b: " in out
        and "Luong: general score" in out
    )
    with TestClient(served["app"], base_url=LOCAL) as c:
        assert [m["name"] for m in c.get("/v1/models").json()["models"]] == ["a", "b"]


def test_a_port_in_use_is_a_one_line_error(capsys):
    taken = serve_cli.listen("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        with pytest.raises(NmtError) as info:
            serve_cli.listen("127.0.0.1", port)
        assert f"host=127.0.0.1 port={port}: cannot listen there" in str(info.value)
    finally:
        taken.close()


def test_help_lists_the_endpoints(capsys):
    code, out, _ = cli(serve_cli.main, ["--help"], capsys)
    assert code == 0 and "usage: nmt-serve checkpoint=PATH [compare=PATH]" in out and "POST /v1/translate" in out
