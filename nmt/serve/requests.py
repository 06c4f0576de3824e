"""The body of POST /v1/translate (and /v1/translate/stream), checked field by field before anything is queued.

    {"text": ["line", ...], "beam": 5, "nbest": 1, "attention": false, "model": "a",
     "prefix": ["...", ...], "alignments": false}

Only `text` is required; beam and nbest default to the server's decode settings, model to "a"; attention is
true, false, or the list of line numbers (from 0) that want it (a page asks only for the lines it draws); prefix is
one string for every line or a list with one string (or null) per line, the target text each output starts with;
alignments asks for each line's word alignment (Pharaoh `i-j` links, nmt.alignments). Each
mistake is a `RequestError` with an HTTP status and a one-line message that names the field: 400 for a
body that is not a JSON object (including JSON nested too deep or numbers too long to read) or text that is not
Unicode (a lone surrogate such as "\\ud800"), 413 for too many lines or characters, 415 for a body not sent as
application/json, 422 for a missing, unknown, wrong-typed or out-of-range field, or an unknown model. A stream takes
the same body and `finished_only` (true: beam search shows only finished hypotheses, nmt.streaming), and refuses
with 422 what does not stream: nbest > 1, constraints, avoid.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from nmt.config import ServeSettings

FIELDS = ("text", "beam", "nbest", "attention", "model", "prefix", "alignments", "constraints", "avoid")
STREAM_FIELDS = (*FIELDS, "finished_only")
JSON_TYPES = {
    dict: "object",
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


class RequestError(Exception):
    """A client mistake: the HTTP status, the field at fault (None for the body as a whole) and a message."""

    def __init__(self, status: int, field: str | None, message: str):
        super().__init__(message)
        self.status, self.field, self.message = status, field, message

    def body(self) -> dict[str, Any]:
        return {"error": self.message, "field": self.field}


@dataclass(frozen=True)
class TranslateRequest:
    """A checked request: what the worker thread decodes."""

    lines: tuple[str, ...]
    beam: int
    nbest: int
    attention: frozenset[int]  # the lines whose attention goes in the response
    model: str
    prefixes: tuple[str | None, ...] | None = None  # per line, the target text its output starts with
    alignments: bool = False
    constraints: tuple[tuple[str, ...], ...] | None = None  # per line, phrases its output must contain
    avoid: tuple[tuple[str, ...], ...] | None = None  # per line, phrases its output must not contain
    finished_only: bool = False  # a stream: beam search shows only finished hypotheses


MAX_DEPTH = 32  # JSON nesting a valid request never comes near (it has depth 2)


def nesting(body: bytes) -> int:
    """The deepest [ / { nesting of a JSON text, brackets inside strings not counted (a cheap scan before parsing,
    so that a body of 100,000 "[" is refused without recursing)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # "
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                return deepest
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def parse_json(body: bytes) -> dict[str, Any]:
    """The body as a JSON object (400 otherwise)."""
    if nesting(body) > MAX_DEPTH:
        raise RequestError(400, None, f"the body is JSON nested more than {MAX_DEPTH} deep; expected a flat object")
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RequestError(
            400, None, f'the body is not valid JSON ({err}); expected an object such as {{"text": ["a sentence"]}}'
        ) from None
    except (ValueError, RecursionError):  # e.g. an integer of more than 4,300 digits
        raise RequestError(400, None, "the body holds a number too long to read; expected small integers") from None
    if not isinstance(value, dict):
        raise RequestError(
            400,
            None,
            f'the body is a JSON {JSON_TYPES[type(value)]}; expected an object such as {{"text": ["a sentence"]}}',
        )
    return value


def integer(body: dict[str, Any], name: str, default: int, low: int, high: int, why: str) -> int:
    """body[name] as an int in [low, high] (a bool is not an int here); `why` says where `high` comes from."""
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(422, name, f"{name}={json.dumps(value)}: expected an integer")
    if not low <= value <= high:
        raise RequestError(422, name, f"{name}={value}: expected an integer in [{low}, {high}] ({why})")
    return value


def text_lines(body: dict[str, Any], settings: ServeSettings) -> tuple[str, ...]:
    """body["text"]: a list of at most max_lines strings, max_chars characters in all."""
    if "text" not in body:
        raise RequestError(422, "text", "text: missing; expected a list of strings, one sentence each")
    lines = body["text"]
    if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
        raise RequestError(
            422, "text", f"text: expected a list of strings, one sentence each; got {json.dumps(lines)[:80]}"
        )
    if len(lines) > settings.max_lines:
        raise RequestError(
            413, "text", f"text: {len(lines)} lines; at most serve.max_lines={settings.max_lines} per request"
        )
    chars = sum(len(line) for line in lines)
    if chars > settings.max_chars:
        raise RequestError(
            413, "text", f"text: {chars} characters; at most serve.max_chars={settings.max_chars} per request"
        )
    for i, line in enumerate(lines):
        if SURROGATE.search(line):
            raise RequestError(
                400, "text", f"text[{i}]: holds a lone surrogate (\\ud800-\\udfff), which is not Unicode text"
            )
    return tuple(lines)


SURROGATE = re.compile("[\ud800-\udfff]")


def attention_lines(body: dict[str, Any], count: int) -> frozenset[int]:
    """body["attention"]: true (every line), false, or a list of line numbers from 0."""
    value = body.get("attention", False)
    if isinstance(value, bool):
        return frozenset(range(count)) if value else frozenset()
    if isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        wrong = [i for i in value if not 0 <= i < count]
        if not wrong:
            return frozenset(value)
        raise RequestError(
            422, "attention", f"attention: line {wrong[0]} is not a line of text (expected 0 to {count - 1})"
        )
    raise RequestError(
        422,
        "attention",
        f"attention={json.dumps(value)[:80]}: expected true, false or a list of line numbers (from 0)",
    )


def parse_request(
    body: bytes,
    settings: ServeSettings,
    beams: dict[str, int],
    default_beam: int,
    default_nbest: int,
    stream: bool = False,
) -> TranslateRequest:
    """Check a request body; `beams` maps each model name to the widest beam it accepts; stream: the body of
    POST /v1/translate/stream."""
    fields = parse_json(body)
    known = STREAM_FIELDS if stream else FIELDS
    for name in fields:
        if name not in known:
            raise RequestError(422, name, f"{name}: unknown field; expected {', '.join(known)}")
    if stream:
        default_nbest = 1
        for name in ("constraints", "avoid"):
            if fields.get(name) is not None:
                raise RequestError(
                    422, name, f"{name}: lexically constrained search does not stream; use POST /v1/translate"
                )
    lines = text_lines(fields, settings)
    model = fields.get("model", "a")
    if not isinstance(model, str) or model not in beams:
        raise RequestError(422, "model", f"model={json.dumps(model)}: unknown; expected one of {', '.join(beams)}")
    beam = integer(
        fields, "beam", min(default_beam, beams[model]), 1, beams[model], f"the widest beam model {model} accepts"
    )
    nbest = integer(fields, "nbest", min(default_nbest, beam), 1, beam, f"at most beam={beam}")
    if stream and nbest > 1:
        raise RequestError(
            422, "nbest", f"nbest={nbest}: a stream shows one hypothesis; expected 1 (POST /v1/translate gives n-best)"
        )
    finished_only = fields.get("finished_only", False)
    if not isinstance(finished_only, bool):
        raise RequestError(
            422, "finished_only", f"finished_only={json.dumps(finished_only)[:80]}: expected true or false"
        )
    alignments = fields.get("alignments", False)
    if not isinstance(alignments, bool):
        raise RequestError(422, "alignments", f"alignments={json.dumps(alignments)[:80]}: expected true or false")
    attention = attention_lines(fields, len(lines))
    prefixes = prefix_lines(fields, len(lines))
    needs, avoids = phrase_lines(fields, "constraints", len(lines)), phrase_lines(fields, "avoid", len(lines))
    return TranslateRequest(lines, beam, nbest, attention, model, prefixes, alignments, needs, avoids, finished_only)


def phrase_lines(body: dict[str, Any], name: str, count: int) -> tuple[tuple[str, ...], ...] | None:
    """body[name]: a list of target phrases for every line, or one list per line."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(p, str) for p in value):
        value = [value] * count
    if (
        not isinstance(value, list)
        or len(value) != count
        or not all(isinstance(line, list) and all(isinstance(p, str) for p in line) for line in value)
    ):
        raise RequestError(
            422, name, f"{name}={json.dumps(value)[:80]}: expected a list of strings, or one list per line ({count})"
        )
    for i, line in enumerate(value):
        if any(SURROGATE.search(p) for p in line):
            raise RequestError(400, name, f"{name}[{i}]: holds a lone surrogate, which is not Unicode text")
    return tuple(tuple(line) for line in value)


def prefix_lines(body: dict[str, Any], count: int) -> tuple[str | None, ...] | None:
    """body["prefix"]: a string for every line, or a list of strings (or nulls), one per line."""
    value = body.get("prefix")
    if value is None:
        return None
    if isinstance(value, str):
        value = [value] * count
    if not isinstance(value, list) or not all(p is None or isinstance(p, str) for p in value):
        raise RequestError(
            422, "prefix", f"prefix={json.dumps(value)[:80]}: expected a string or a list of strings (or null)"
        )
    if len(value) != count:
        raise RequestError(422, "prefix", f"prefix: {len(value)} prefixes for {count} lines; expected one per line")
    for i, p in enumerate(value):
        if p is not None and SURROGATE.search(p):
            raise RequestError(400, "prefix", f"prefix[{i}]: holds a lone surrogate, which is not Unicode text")
    return tuple(value)


def check_content_type(value: str | None) -> None:
    """POST bodies must be declared application/json: a browser sends no such request across sites without asking
    first (a CORS preflight this server never grants), so a page elsewhere cannot post to a server on loopback."""
    kind = (value or "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise RequestError(415, "content-type", f"content-type: {value or 'missing'}; expected application/json")
