"""Seeded hostile HTTP requests and WebSocket messages for ``test_fuzz.py`` (pure: no I/O).

Everything is drawn from one ``random.Random``, so a seed reproduces a whole run. A case carries
what docs/api.md promises for it (:class:`Expect`) where the promise is specific; every case is
also held to the general rules in ``test_fuzz.py`` (no 5xx, no redirect, no hang, the JSON
error envelope, keep-alive after every answer).
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, replace
from typing import Any

MODEL = "skulk-demo"
MiB = 1024 * 1024
#: Largest body the server reads (docs/api.md): beyond it, 413.
MAX_BODY = 8 * MiB
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"

# The tables below are data: kept dense on purpose.
# fmt: off
GET_ROUTES = ["/health", "/v1/models", f"/v1/models/{MODEL}", "/v1/diagnostics/node",
              "/v1/cluster/links", "/v1/cluster/raft", "/v1/cluster/nodes", "/v1/instances",
              "/v1/cluster/state"]
POST_ROUTES = [CHAT, COMPLETIONS, "/v1/responses", "/v1/diagnostics/node/retry", "/v1/placements"]
UNKNOWN_PATHS = [
    "/v1", "/v1/", "/v2/chat/completions", "/v1//chat/completions", "//health", "/health/",
    "/v1/chat/completions/", "/v1/models/", "/v1/cluster", "/v1/cluster/", "/v1/cluster/x",
    "/v1/diagnostics", "/v1/diagnostics/node/", "/index.html", "/favicon.ico", "/v1/message",
    "/api", "/v1/api/chat", "/v1/embedding", "/v1/ws/", "/v1//ws", "/.env",
    "/v1/chat/completions/x", "/health;x", "/" + "a" * 4000,
]
#: Paths whose meaning depends on percent-decoding (or Quart's default /static route): only the
#: general rules apply.
ODD_PATHS = ["/%2e%2e/%2e%2e/etc/passwd", "/v1/chat%2Fcompletions", "/health%00", "/%ED%A0%80",
             "/%FF", "/v1/models%2F", "/v1/%63hat/completions", "/../../health", "/static/app.js"]
MODEL_IDS = ["nope", "org/name", "skulk-demo/", "SKULK-DEMO", "a" * 3000, "..", "skulk-demo.gguf"]
ODD_MODEL_IDS = ["%ED%A0%80", "%00", "skulk-demo%2F", "%FF%FE", "%uD800"]
QUERIES = ["", "", "", "?x=1", "?%ff=%fe", "?a=" + "b" * 3000, "?&&&", "?model=%00", "?q=\\udc00"]
LONE = ["\udc00", "\ud800", "\udfff", "\udbff", "\ude00\ud83d"]
#: Invalid UTF-8; the ED A0..BF ones are surrogates (invalid_unicode, not invalid_json).
BAD_UTF8 = [b"\xff", b"\xfe\xff", b"\xc0\xaf", b"\xe2\x82", b"\xf8\x88\x80\x80\x80", b"\x80",
            b"\xf4\x90\x80\x80", b"\xe9t\xe9", b"\xc3", b"\xed\xa0\x80", b"\xed\xbf\xbf"]
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1E999", "-0.1e99999"]
NUMBERS = [str(2**70), str(-(2**70)), str(2**63), str(2**63 - 1), str(-(2**63)),
           str(-(2**63) - 1), str(2**64), "1" + "0" * 4000, "-1", "0", "1e-400", "-0.0",
           "5e-324", "1.7976931348623157e308", "1E2", "2.0", "0.5", "3", "1.0000000000000002",
           "9" * 5000]
OTHER_TYPES: list[Any] = [None, True, False, 0, -1, 1.5, "", "text", [], ["x"], {}, {"a": 1},
                          [[[[]]]], {"role": "user"}]
UNKNOWN_KEYS = ["foo", "", " ", "model ", "Model", "MESSAGES", "__proto__", "constructor",
                "k" * 300, "x.y", "messages[0]", "\u00e9t\u00e9", "\U0001f600", "\x00"]
NOOP = {
    CHAT: [("presence_penalty", 0.5), ("frequency_penalty", -1),
           ("logit_bias", {"1": 5}), ("store", True),
           ("audio", {"voice": "x"}),
           ("modalities", ["text", "audio"]), ("reasoning_effort", "high")],
    COMPLETIONS: [("echo", True), ("best_of", 2), ("suffix", "end"),
                  ("logit_bias", {"50256": -100}), ("presence_penalty", 1)],
}
NUMERIC = {
    CHAT: ["max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "n",
           "presence_penalty", "top_logprobs"],
    COMPLETIONS: ["max_tokens", "temperature", "top_p", "top_k", "seed", "best_of", "logprobs"],
}
_IMAGE = {"type": "image_url", "image_url": {"url": "http://x"}}
SHAPES: dict[str, list[tuple[str, Any]]] = {
    CHAT: [("messages", v) for v in [
        [], {}, "hi", [{}], [None], [{"role": "user"}], [{"role": "user", "content": []}],
        [{"role": "tool", "content": "x", "tool_call_id": "1"}], [{"role": "USER", "content": "x"}],
        [{"role": "", "content": "x"}], [{"role": "assistant", "content": None}],
        [{"role": "user", "content": [_IMAGE]}], [{"role": "user", "content": [{"text": "x"}]}],
        [{"role": "user", "content": None}], [{"role": "function", "name": "f", "content": "x"}],
        [{"role": "user", "content": "x"}] * 300,
    ]],
    COMPLETIONS: [("prompt", v) for v in [
        "", [], [""], ["a", "b"], [1, 2, 3], [[1, 2]], None, {"text": "x"}, 123, True, ["x"] * 50,
    ]],
}
SHAPES_ANY: list[tuple[str, Any]] = [
    *[("stop", v) for v in ["", [""], ["a"] * 5, [None], [1], {}, ["\n"] * 4, [], "s" * 20000]],
    *[("stream_options", v) for v in [{"include_usage": "yes"}, {"foo": 1}, [], "x"]],
    ("stream", "true"), ("stream", 1), ("model", ""), ("model", None),
]
VALID_TEXT = ["\U0001f600 (one escape pair)", "\u00e9\u00e8 caf\u00e9", "\u4f60\u597d",
              "\u05e9\u05dc\u05d5\u05dd", "zero\u200bwidth", "nul\u0000char",
              "nonchar\uffff\U0010ffff", "\ufeffbom", "tab\tnl\n"]
#: (Content-Type, what docs/api.md promises: 200, 415, or 0 for nothing specific)
CONTENT_TYPES = [
    ("application/json", 200), ("application/json; charset=utf-8", 200), ("APPLICATION/JSON", 200),
    ("application/vnd.skulk+json", 200), (None, 200), ("text/plain", 200),
    ("application/x-www-form-urlencoded", 200), ("text/html", 415), ("application/xml", 415),
    ("multipart/form-data; boundary=x", 415), ("image/png", 415), ("*/*", 415),
    ("application/jsonx", 415), ("", 0), (";;;", 0), ("application/json; charset=utf-16", 0),
]
# fmt: on


@dataclass(frozen=True)
class Expect:
    """What docs/api.md promises for a case; ``None`` fields are not checked."""

    status: int | None = None
    code: str | None = None
    param: str | None = None
    check_param: bool = False
    allow: bool = False  # a 405 names the allowed methods
    close: bool = False  # the answer carries Connection: close


# fmt: off
#: Bodies for POST /v1/placements that must be refused (and place nothing), with the answer.
PLACEMENT_BODIES = [
    (b'{"x": 1}', Expect(400, "unknown_parameter")), (b"garbage\xff\xfe", Expect(400)),
    (b"{" * 50, Expect(400)), (b'{"model": "x"}', Expect(404, "unknown_model")),
    (b'{"model": 7}', Expect(400, "invalid_type")), (b"[]", Expect(400, "invalid_body")),
    (b'{"model": "skulk-demo", "sharding": "ring"}', Expect(400, "invalid_value")),
    (b'{"model": "skulk-demo", "nodes": "all"}', Expect(400, "invalid_type")),
    (b'{"model": "skulk-demo", "min_nodes": 0}', Expect(400, "invalid_value")),
    (b'{"model": "skulk-demo", "max_nodes": 1e400}', Expect(400, "invalid_value")),
    (b'{"model": "skulk-demo", "dry_run": "yes"}', Expect(400, "invalid_type")),
    (b'{"model": "\\ud800"}', Expect(400, "invalid_unicode")),
    (b'{"model": "skulk-demo", "nodes": ["nobody"]}', Expect(409, "no_candidate_nodes")),
]
# fmt: on


@dataclass(frozen=True)
class HttpCase:
    """One request. ``send`` is how it goes on the wire (see :func:`wire`)."""

    n: int
    kind: str
    label: str
    method: str
    target: bytes
    body: bytes = b""
    headers: tuple[tuple[bytes, bytes], ...] = ()
    send: str = "length"
    chunks: tuple[int, ...] = ()
    expect: Expect | None = None
    abort_stream: bool = False  # a 200 stream: read its first event, then hang up

    @property
    def replies(self) -> bool:
        return self.send not in ("short_close", "short_leave")

    def repro(self) -> str:
        head = " ".join(f"{k.decode()}: {v.decode('latin-1')[:60]!r}" for k, v in self.headers)
        body = f"{self.body[:160]!r}"
        if len(self.body) > 160:
            body += f"... ({len(self.body)} bytes)"
        return f"{self.method} {self.target[:120]!r} [{self.send}] {head} body={body}"


@dataclass(frozen=True)
class WsCase:
    """One WebSocket message. ``reply``: ``"error"`` (one error for ``rid``, or with id null
    when ``rid`` is ``None``), ``"error?"`` (an error for ``rid`` or with id null), ``"done"``
    (chunks then done), ``"any"`` (done or error) or ``"none"`` (no reply: a probe follows)."""

    n: int
    kind: str
    label: str
    payload: str | bytes
    rid: str | None
    reply: str
    expect: Expect | None = None
    cancel_after_first: bool = False

    def repro(self) -> str:
        p = self.payload
        tail = f"... ({len(p)} long)" if len(p) > 160 else ""
        return f"{'binary' if isinstance(p, bytes) else 'text'} frame {p[:160]!r}{tail}"


class _Lits:
    """Literal JSON text spliced into a serialized body (NaN, 1e400, invalid UTF-8, depth)."""

    def __init__(self) -> None:
        self.items: list[bytes] = []

    def __call__(self, text: bytes) -> str:
        self.items.append(text)
        return f"\x00LIT{len(self.items) - 1}\x00"

    def encode(self, value: object, *, raw: bool) -> bytes:
        """``raw``: non-ASCII as UTF-8 bytes (lone surrogates as ED xx xx); else JSON escapes."""
        text = json.dumps(value, ensure_ascii=not raw).encode("utf-8", "surrogatepass")
        for i, lit in enumerate(self.items):
            text = text.replace(f'"\\u0000LIT{i}\\u0000"'.encode(), lit)
        return text


def _spots(value: Any, path: str = "") -> list[tuple[str, Any, Any, bool]]:
    """Every (path, container, key, is_key) below ``value``, in the server's ``param`` syntax
    (a key's path is its object's)."""
    out: list[tuple[str, Any, Any, bool]] = []
    is_dict = isinstance(value, dict)
    for key, child in list(value.items() if is_dict else enumerate(value)):
        where = (f"{path}.{key}" if path else key) if is_dict else f"{path}[{key}]"
        if is_dict:
            out.append((path, value, key, True))
        out.append((where, value, key, False))
        if isinstance(child, dict | list):
            out.extend(_spots(child, where))
    return out


def _insert(rng: random.Random, text: str, piece: str) -> str:
    at = rng.choice([0, len(text) // 2, len(text)])
    return text[:at] + piece + text[at:]


_OPTIONAL: list[tuple[str, float, list[Any]]] = [
    ("temperature", 0.4, [0, 0.5, 1.0, 2]),
    ("seed", 0.3, [1, 7, 2**31]),
    ("stop", 0.3, ["\n\n", ["zz", "qq"], "END"]),
    ("top_k", 0.2, [0, 1, 40]),
    ("top_p", 0.2, [1.0, 0.9]),
    ("user", 0.3, ["fuzz-user"]),
]


def base_body(rng: random.Random, route: str, *, stream: bool | None = None) -> dict[str, Any]:
    """A valid, cheap request (a few tokens) for ``route``."""
    body: dict[str, Any] = {"model": MODEL}
    if route == CHAT:
        messages: list[dict[str, Any]] = []
        if rng.random() < 0.4:
            messages.append({"role": rng.choice(["system", "developer"]), "content": "Be terse."})
        if rng.random() < 0.3:
            messages += [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
        user: dict[str, Any] = {"role": "user", "content": rng.choice(["Tell me", "Once", "Hi"])}
        if rng.random() < 0.3:
            user["content"] = [{"type": "text", "text": "say"}, {"type": "text", "text": " more"}]
        if rng.random() < 0.3:
            user["name"] = "fuzzer"
        body["messages"] = [*messages, user]
        if rng.random() < 0.2:
            body["metadata"] = {"k": "v"}
        if rng.random() < 0.1:
            body["safety_identifier"] = "s"
    else:
        body["prompt"] = rng.choice(["Once upon", ["Once upon"], "The"])
    body["max_tokens"] = rng.randint(1, 6)
    if stream if stream is not None else rng.random() < 0.4:
        body["stream"] = True
        if rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
    for key, p, values in _OPTIONAL:
        if rng.random() < p:
            body[key] = copy.deepcopy(rng.choice(values))  # mutations change it in place
    return body


def _long(body: dict[str, Any]) -> bool:
    """May this (valid) body generate for long? Then a case streams it and hangs up early."""
    for key in ("max_completion_tokens", "max_tokens"):
        if key in body:
            value = body[key]
            return not (isinstance(value, int) and not isinstance(value, bool) and value <= 64)
    return True


@dataclass
class Body:
    """A mutated request body: its bytes, what is promised for it, and a label."""

    data: bytes
    kind: str
    label: str
    expect: Expect | None = None
    abort: bool = False


def _structure(rng: random.Random, body: dict[str, Any]) -> tuple[bytes, Expect | None]:
    good = json.dumps(body).encode()
    bad = Expect(400, "invalid_json")
    return rng.choice([
        (b"", bad), (b"   \r\n", bad), (b"{", bad), (good[: rng.randrange(1, len(good))], bad),
        (good + b"x", bad), (good + good, bad),
        (b"null", Expect(400)), (b"[]", Expect(400)), (b"1", Expect(400)), (b'"x"', Expect(400)),
        (b"{}", Expect(400)), (b"\x00" * 10, Expect(400)),
        (bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))), Expect(400)),
        (b"NaN", Expect(400, "invalid_value")),
        (b"\xef\xbb\xbf" + good, None), (json.dumps(body).encode("utf-16"), None),
        (b'{"model": "skulk-demo", "model": 1, "prompt": "x"}', None),
    ])  # fmt: skip


def _huge(rng: random.Random, route: str, body: dict[str, Any], max_huge: int, raw: bool) -> Body:
    size = rng.choice([s for s in (64 * 1024, 512 * 1024, MiB, 3 * MiB) if s <= max_huge])
    filler = rng.choice(["lorem ipsum ", "\u00e9", "\U0001f600", "\u4f60\u597d"])
    if filler == "\U0001f600":  # 12 bytes as a JSON escape: keep the body under 32 MiB
        size = min(size, max_huge // 4)
    text = (filler * (size // len(filler) + 1))[:size]
    target = rng.choice(["content", "content", "model", "user", "stop", "unknown"])
    if target == "content":
        body["stream"] = rng.random() < 0.5
        body.pop("stream_options", None)
        if route == CHAT:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
    else:
        body[text[:1000] if target == "unknown" else target] = text
    data = _Lits().encode(body, raw=raw)
    expect = {
        "content": Expect(400, "prompt_too_long"),
        "model": Expect(404, "model_not_found"),
        "unknown": Expect(400, "unknown_parameter"),
    }.get(target)
    if len(data) > MAX_BODY:
        expect = Expect(413, "request_entity_too_large")
    return Body(data, "huge", f"{size} chars of {filler!r} in {target}", expect)


def mutated_body(rng: random.Random, route: str, *, max_huge: int = 3 * MiB) -> Body:
    """A body for ``route`` with one hostile change (or none: ``kind == "valid"``); a huge
    string has at most ``max_huge`` characters (``0``: none)."""
    body = base_body(rng, route)
    lits = _Lits()
    raw = rng.random() < 0.5
    kinds = ["surrogate"] * 22 + ["bad_utf8"] * 8 + ["number"] * 14 + ["wrong_type"] * 12
    kinds += ["deep"] * 4 + ["structure"] * 8 + ["unknown"] * 5 + ["noop"] * 4 + ["shape"] * 9
    kinds += ["valid"] * 6 + ["huge"] * (3 if max_huge else 0)
    kind = rng.choice(kinds)
    expect: Expect | None = None
    strings = [s for s in _spots(body) if not s[3] and isinstance(s[1][s[2]], str)]
    if kind == "surrogate":
        path, parent, key, is_key = rng.choice(strings + [s for s in _spots(body) if s[3]])
        lone = rng.choice(LONE)
        if is_key:
            parent[_insert(rng, key, lone)] = parent.pop(key)
        else:
            parent[key] = _insert(rng, parent[key], lone)
        where = f"{'a key of ' if is_key else ''}{path or 'body'}"
        label = f"lone surrogate {lone!r} ({'raw bytes' if raw else 'JSON escape'}) in {where}"
        expect = Expect(400, "invalid_unicode", path or None, check_param=True)
    elif kind == "bad_utf8":
        path, parent, key, _ = rng.choice(strings)
        bad = rng.choice(BAD_UTF8)
        inner = json.dumps(parent[key])[1:-1].encode()
        half = len(inner) // 2
        parent[key] = lits(b'"' + inner[:half] + bad + inner[half:] + b'"')
        label = f"invalid UTF-8 {bad!r} in {path}"
        if bad.startswith(b"\xed"):
            expect = Expect(400, "invalid_unicode", path, check_param=True)
        else:
            expect = Expect(400, "invalid_json", None, check_param=True)
    elif kind == "number":
        field = rng.choice([*NUMERIC[route], "stream_options.include_usage"])
        text = rng.choice(NON_FINITE + NUMBERS)
        if field == "stream_options.include_usage":
            body["stream"] = True
            body.setdefault("stream_options", {})["include_usage"] = lits(text.encode())
        else:
            body[field] = lits(text.encode())
        label = f"{field} = {text[:30]}"
        if text in NON_FINITE:
            expect = Expect(400, "invalid_value", field, check_param=True)
        elif len(text) > 4300:
            expect = Expect(400, "invalid_json")
    elif kind == "wrong_type":
        path, parent, key, _ = rng.choice([s for s in _spots(body) if not s[3]])
        parent[key] = rng.choice([v for v in OTHER_TYPES if type(v) is not type(parent[key])])
        label = f"{path} = {json.dumps(parent[key])}"
    elif kind == "deep":
        depth = rng.choice([10, 200, 900, 2000, 100_000])
        opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
        nest = opener * depth + (b"1" if opener != b"[" else b"") + closer * depth
        places = ["body", "body-unclosed", "messages", "metadata", "stop", "prompt", "user"]
        where = rng.choice(places)
        label = f"{depth} levels of {opener.decode()} in {where}"
        expect = Expect(400, "invalid_json") if depth >= 2000 or where == "body-unclosed" else None
        if where.startswith("body"):
            return Body(nest if where == "body" else opener * depth, kind, label, expect)
        body[where] = lits(nest)
    elif kind == "structure":
        data, expect = _structure(rng, body)
        return Body(data, kind, f"body {data[:40]!r}", expect)
    elif kind == "unknown":
        key = rng.choice(UNKNOWN_KEYS)
        spot = rng.choice(["top", "message", "part"] if route == CHAT else ["top"])
        if spot == "message":
            body["messages"][-1][key] = rng.choice(OTHER_TYPES)
        elif spot == "part":
            body["messages"][-1]["content"] = [{"type": "text", "text": "x", key: 1}]
        else:
            body[key] = rng.choice(OTHER_TYPES)
        label = f"unknown field {key[:20]!r} ({spot})"
        expect = Expect(400, "unknown_parameter")
    elif kind == "noop":
        field, value = rng.choice(NOOP[route])
        body[field] = copy.deepcopy(value)
        label = f"{field} = {json.dumps(value)}"
        expect = Expect(400, "unsupported_parameter", field, check_param=True)
    elif kind == "shape":
        field, value = rng.choice(SHAPES[route] + SHAPES_ANY)
        body[field] = copy.deepcopy(value)
        label = f"{field} = {json.dumps(value)[:60]}"
    elif kind == "valid":
        text = rng.choice(VALID_TEXT)
        if route == CHAT:
            body["messages"][-1]["content"] = text
        else:
            body["prompt"] = text
        label, expect = f"valid text {text!r}", Expect(200)
    else:
        return _huge(rng, route, body, max_huge, raw)
    abort = kind != "valid" and _long(body)
    if abort:  # a valid body could generate up to the whole context: stream it, hang up early
        body["stream"] = True
    return Body(lits.encode(body, raw=raw), kind, label, expect, abort)


def _framing(rng: random.Random, body: bytes) -> tuple[str, tuple[int, ...]]:
    if len(body) > MiB:
        modes = ["length"] * 4 + ["chunked"]
    elif body:
        modes = ["length"] * 62 + ["chunked"] * 14 + ["late"] * 10 + ["late_chunked"] * 3
        modes += ["expect100"] * 2 + ["pipelined"] * 5 + ["short_close"] * 3 + ["short_leave"]
    else:
        modes = ["length"] * 9 + ["pipelined"]
    send = rng.choice(modes)
    chunks: tuple[int, ...] = ()
    if "chunked" in send and len(body) > 1:
        cuts = sorted(rng.sample(range(1, len(body)), min(4, len(body) - 1)))
        chunks = tuple(b - a for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True))
    return send, chunks


JSON_CT = ((b"Content-Type", b"application/json"),)


def _ctype(value: str | None) -> tuple[tuple[bytes, bytes], ...]:
    return () if value is None else ((b"Content-Type", value.encode("latin-1")),)


def _route_case(rng: random.Random) -> HttpCase:
    query = rng.choice(QUERIES).encode()
    body = b""
    if rng.random() < 0.25:
        body = rng.choice([b'{"x": 1}', b"garbage\xff\xfe", b"{" * 50, b'{"model": "x"}'])
    r = rng.random()
    if r < 0.25:
        path = rng.choice(GET_ROUTES)
        case = HttpCase(0, "route", f"GET {path}", "GET", path.encode() + query, body,
                        expect=Expect(200))  # fmt: skip
    elif r < 0.45:
        path = rng.choice(GET_ROUTES + POST_ROUTES)
        allowed = {"GET", "HEAD", "OPTIONS"} if path in GET_ROUTES else {"POST", "OPTIONS"}
        methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "TRACE", "FOO", "HEAD"]
        method = rng.choice([m for m in methods if m not in allowed])
        case = HttpCase(0, "method", f"{method} {path}", method, path.encode(), body,
                        expect=Expect(405, "method_not_allowed", allow=True))  # fmt: skip
    elif r < 0.75:
        method = rng.choice(["GET", "POST", "PUT", "DELETE", "HEAD", "PATCH"])
        odd = rng.random() < 0.25
        path = rng.choice(ODD_PATHS if odd else UNKNOWN_PATHS)
        expect = None if odd else Expect(404, "not_found")
        case = HttpCase(0, "unknown_path", f"{method} {path[:40]}", method, path.encode() + query,
                        body, JSON_CT, expect=expect)  # fmt: skip
    elif r < 0.9:
        odd = rng.random() < 0.3
        mid = rng.choice(ODD_MODEL_IDS if odd else MODEL_IDS)
        expect = None if odd else Expect(404, "model_not_found")
        case = HttpCase(0, "model_id", f"GET /v1/models/{mid[:40]}", "GET",
                        f"/v1/models/{mid}".encode(), body, expect=expect)  # fmt: skip
    elif r < 0.95:
        case = HttpCase(0, "ws_route", "GET /v1/ws without an upgrade", "GET", b"/v1/ws", body,
                        expect=Expect(400))  # fmt: skip
    elif r < 0.975:
        case = HttpCase(0, "retry", "POST retry while ready", "POST",
                        b"/v1/diagnostics/node/retry", body, JSON_CT)  # fmt: skip
    else:
        body, expect = rng.choice(PLACEMENT_BODIES)
        case = HttpCase(0, "placement", f"POST /v1/placements {body[:30]!r}", "POST",
                        b"/v1/placements", body, JSON_CT, expect=expect)  # fmt: skip
    send, chunks = _framing(rng, case.body)
    if case.method == "HEAD" and send == "pipelined":
        send = "length"
    return replace(case, send=send, chunks=chunks)


def _body_case(rng: random.Random) -> HttpCase:
    route = rng.choice([CHAT, CHAT, COMPLETIONS])
    b = mutated_body(rng, route)
    headers = _ctype(rng.choice(["application/json"] * 6 + [None]))
    target = route.encode() + (rng.choice(QUERIES).encode() if rng.random() < 0.1 else b"")
    if rng.random() < 0.1:  # a client that prefers HTML must still get JSON errors
        headers += ((b"Accept", b"text/html"),)
    if rng.random() < 0.05:
        headers += ((b"User-Agent", b"\xff\xfe fuzz \xed\xa0\x80"),)
    send, chunks = _framing(rng, b.data)
    return HttpCase(0, b.kind, f"{route} {b.label}", "POST", target, b.data, headers, send,
                    chunks, b.expect, b.abort)  # fmt: skip


def _ctype_case(rng: random.Random) -> HttpCase:
    route = rng.choice([CHAT, COMPLETIONS])
    ctype, status = rng.choice(CONTENT_TYPES)
    body = json.dumps(base_body(rng, route)).encode()
    expect = {200: Expect(200), 415: Expect(415, "unsupported_media_type")}.get(status)
    send, chunks = _framing(rng, body)
    return HttpCase(0, "content_type", f"{route} Content-Type {ctype!r}", "POST", route.encode(),
                    body, _ctype(ctype), send, chunks, expect)  # fmt: skip


def _chat(content: bytes, *extra: bytes) -> bytes:
    head = b'{"model": "skulk-demo", "max_tokens": 2, ' + b"".join(extra)
    return head + b'"messages": [{"role": "user", "content": "' + content + b'"}]}'


def _pinned() -> list[HttpCase]:
    """Cases every seed includes: one of each failure class known when this test was written."""
    long_prompt = " ".join(f"word{i}" for i in range(100_000)).encode()
    ok = _chat(b"hi")
    surrogate = Expect(400, "invalid_unicode", "messages[0].content", check_param=True)

    def pin(label: str, method: str, target: str, body: bytes = b"", send: str = "length",
            chunks: tuple[int, ...] = (), *, expect: Expect) -> HttpCase:  # fmt: skip
        return HttpCase(0, "pinned", label, method, target.encode(), body,
                        JSON_CT if body else (), send, chunks, expect)  # fmt: skip

    return [
        pin("double slash", "POST", "/v1//chat/completions", ok, expect=Expect(404, "not_found")),
        pin("//health", "GET", "//health", expect=Expect(404, "not_found")),
        pin("/health/", "GET", "/health/", expect=Expect(404, "not_found")),
        pin("surrogate escape", "POST", CHAT, _chat(b"a\\udc00b"), expect=surrogate),
        pin("surrogate raw bytes, stream", "POST", CHAT,
            _chat(b"a\xed\xa0\x80b", b'"stream": true, '), expect=surrogate),
        pin("stop surrogate", "POST", CHAT, _chat(b"x", b'"stop": ["ok", "\\udc00"], '),
            expect=Expect(400, "invalid_unicode", "stop[1]", check_param=True)),
        pin("prompt surrogate", "POST", COMPLETIONS,
            b'{"model": "skulk-demo", "prompt": "x\\udc00", "max_tokens": 2}',
            expect=Expect(400, "invalid_unicode", "prompt", check_param=True)),
        pin("late body on a 404 route", "POST", "/v1/message", ok, "late",
            expect=Expect(404, "not_found")),
        pin("late body on /v1/messages", "POST", "/v1/messages", ok, "late",
            expect=Expect(200)),
        pin("late body on GET /v1/models", "GET", "/v1/models", b'{"a": 1}', "late",
            expect=Expect(200)),
        pin("late body, invalid chat", "POST", CHAT, b"{", "late",
            expect=Expect(400, "invalid_json")),
        pin("stream, prompt too long", "POST", CHAT, _chat(long_prompt, b'"stream": true, '),
            expect=Expect(400, "prompt_too_long")),
        pin("declared 40 MiB", "POST", CHAT, ok + b" " * 2000, "declared_huge",
            expect=Expect(413, "request_entity_too_large", close=True)),
        pin("9 MiB body", "POST", CHAT, _chat(b"a" * (9 * MiB)),
            expect=Expect(413, "request_entity_too_large")),
        pin("NaN temperature", "POST", CHAT, _chat(b"x", b'"temperature": NaN, '),
            expect=Expect(400, "invalid_value", "temperature", check_param=True)),
        pin("max_tokens 1e400", "POST", COMPLETIONS,
            b'{"model": "skulk-demo", "prompt": "x", "max_tokens": 1e400}',
            expect=Expect(400, "invalid_value", "max_tokens", check_param=True)),
        pin("chunked chat", "POST", CHAT, ok, "chunked", (5, 20, len(ok) - 25),
            expect=Expect(200)),
        pin("org/name model", "GET", "/v1/models/org/name", expect=Expect(404, "model_not_found")),
        pin("wrong method", "DELETE", CHAT, expect=Expect(405, "method_not_allowed", allow=True)),
    ]  # fmt: skip


def http_cases(rng: random.Random, count: int) -> list[HttpCase]:
    """``count`` seeded cases plus the pinned ones, in a seeded order, numbered."""
    makers = [_route_case] * 25 + [_body_case] * 65 + [_ctype_case] * 10
    cases = [rng.choice(makers)(rng) for _ in range(count)]
    leave = [i for i, c in enumerate(cases) if c.send == "short_leave"]
    for i in leave[4:]:  # connections left open are bounded too
        cases[i] = replace(cases[i], send="short_close")
    for pinned in _pinned():
        cases.insert(rng.randrange(len(cases) + 1), pinned)
    return [replace(c, n=i) for i, c in enumerate(cases)]


def _chunked(body: bytes, sizes: tuple[int, ...]) -> bytes:
    out, at = bytearray(), 0
    for i, size in enumerate(sizes or (len(body),)):
        ext = b";x=y" if i == 1 else b""
        out += b"%x%s\r\n%s\r\n" % (size, ext, body[at : at + size])
        at += size
    return bytes(out + b"0\r\nX-Trailer: 1\r\n\r\n")


PROBE = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def wire(case: HttpCase) -> list[bytes | float]:
    """The bytes to send, with pauses (floats, in seconds) between them."""
    lines = [b"%s %s HTTP/1.1" % (case.method.encode(), case.target), b"Host: 127.0.0.1"]
    lines += [k + b": " + v for k, v in case.headers]
    body = case.body
    if "chunked" in case.send:
        lines.append(b"Transfer-Encoding: chunked")
        body = _chunked(body, case.chunks)
    elif case.send == "declared_huge":
        lines.append(b"Content-Length: %d" % (40 * MiB))
    elif case.send in ("short_close", "short_leave"):
        lines.append(b"Content-Length: %d" % (len(body) + 100))
    elif body or case.method in ("POST", "PUT", "PATCH"):
        lines.append(b"Content-Length: %d" % len(body))
    if case.send == "expect100":
        lines.append(b"Expect: 100-continue")
    head = b"\r\n".join(lines) + b"\r\n\r\n"
    if case.send in ("late", "late_chunked", "expect100"):
        return [head, 0.05, body]
    if case.send in ("short_close", "short_leave"):
        return [head + body[: len(body) // 2]]
    if case.send == "declared_huge":
        return [head + body[:1000]]
    if case.send == "pipelined":
        return [head + body + PROBE]
    return [head + body]


# ---- WebSocket ------------------------------------------------------------------------------


def _ws_message(rid: str, body: bytes) -> str | bytes:
    head = b'{"id": ' + json.dumps(rid).encode() + b', "type": "chat.completions", "body": '
    try:
        return (head + body + b"}").decode("utf-8")  # a text frame when it can be one
    except UnicodeDecodeError:
        return head + body + b"}"  # raw surrogates / invalid UTF-8 only fit a binary frame


def _ws_body_case(rng: random.Random, n: int, rid: str) -> WsCase:
    b = mutated_body(rng, CHAT, max_huge=512 * 1024 if rng.random() < 0.3 else 0)
    msg = _ws_message(rid, b.data)
    e = b.expect
    if e is not None and e.code == "invalid_json":  # the whole message is no JSON: no id
        return WsCase(n, b.kind, b.label, msg, None, "error", Expect(code="invalid_message"))
    if b.kind in ("structure", "deep"):  # the message may or may not parse
        return WsCase(n, b.kind, b.label, msg, rid, "error?")
    if e is not None and e.status == 200:
        return WsCase(n, b.kind, b.label, msg, rid, "done")
    if e is None:
        return WsCase(n, b.kind, b.label, msg, rid, "any", None, b.abort)
    ws_e = Expect(code=e.code, param=e.param, check_param=e.check_param)
    return WsCase(n, b.kind, b.label, msg, rid, "error", ws_e, b.abort)


def _ws_other_case(rng: random.Random, n: int, rid: str) -> WsCase:
    r = rng.random()
    bad_message = Expect(code="invalid_message")
    if r < 0.2:
        text = rng.choice(["", "{", "nope", "\x00", '{"id": "x"', "[" * 100_000, "\xed\xa0\x80"])
        return WsCase(n, "not_json", f"text {text[:20]!r}", text, None, "error", bad_message)
    if r < 0.32:
        value = rng.choice([[], 1, "x", None, True, [{"id": rid}]])
        return WsCase(n, "not_object", f"message {value!r}", json.dumps(value), None, "error",
                      bad_message)  # fmt: skip
    if r < 0.46:
        bad_id = rng.choice([None, 1, "", [], {}, "\udc00", "a\ud800b", True])
        lone = isinstance(bad_id, str) and bool(bad_id) and not bad_id.isascii()
        kind = rng.choice(["chat.completions", "cancel"])
        msg = json.dumps({"id": bad_id, "type": kind, "body": {}})
        code = "invalid_unicode" if lone else "invalid_message"
        return WsCase(n, "bad_id", f"id {bad_id!r}", msg, None, "error",
                      Expect(code=code, param="id", check_param=True))  # fmt: skip
    if r < 0.56:
        kind = rng.choice([None, "", "CHAT.COMPLETIONS", 1, "\ud800", "chat.completion", ["x"]])
        msg = json.dumps({"id": rid, "type": kind, "body": base_body(rng, CHAT)})
        return WsCase(n, "bad_type", f"type {kind!r}", msg, rid, "error",
                      Expect(param="type", check_param=True))  # fmt: skip
    if r < 0.64:
        body = rng.choice(["missing", None, 1, "x", [], True])
        msg: dict[str, Any] = {"id": rid, "type": "chat.completions"}
        if body != "missing":
            msg["body"] = body
        return WsCase(n, "bad_body", f"body {body!r}", json.dumps(msg), rid, "error")
    if r < 0.76:
        target = rng.choice([f"unknown{n}", "", "x" * 10_000])
        extra = rng.choice(["", ', "z": NaN', ', "z": 1e400', ', "body": {"model": "\\udc00"}'])
        msg = '{"id": ' + json.dumps(target) + ', "type": "cancel"' + extra + "}"
        if not target:
            return WsCase(n, "cancel", "cancel id ''", msg, None, "error",
                          Expect(param="id", check_param=True))  # fmt: skip
        return WsCase(n, "cancel", f"cancel an unknown id{extra}", msg, rid, "none")
    if r < 0.84:
        data = rng.choice([b"\xff\xfe\xfd", b"\x00\x01", b"\xed\xa0\x80",
                           bytes(rng.randrange(256) for _ in range(64)),
                           json.dumps({"id": rid, "type": "nope"}).encode("utf-16")])  # fmt: skip
        if data.startswith(b"\xff\xfe{"):  # UTF-16 JSON: Python reads it
            return WsCase(n, "binary", "binary UTF-16 JSON", data, rid, "error",
                          Expect(param="type", check_param=True))  # fmt: skip
        return WsCase(n, "binary", f"binary {data[:16]!r}", data, None, "error")
    body = base_body(rng, CHAT, stream=False)
    long = rng.random() < 0.3
    if long:
        body["max_tokens"] = 2000
    if rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    raw = json.dumps({"id": rid, "type": "chat.completions", "body": body})
    payload: str | bytes = raw.encode() if rng.random() < 0.2 else raw
    label = "valid request" + (" (cancelled)" if long else "")
    return WsCase(n, "valid", label, payload, rid, "any" if long else "done",
                  cancel_after_first=long)  # fmt: skip


def ws_cases(rng: random.Random, count: int) -> list[WsCase]:
    """``count`` seeded WebSocket messages (request ids are unique per case)."""
    return [
        (_ws_body_case if rng.random() < 0.45 else _ws_other_case)(rng, n, f"r{n}")
        for n in range(count)
    ]


# ---- below HTTP and WebSocket semantics: framing -------------------------------------------

_H = b"Host: 127.0.0.1\r\n"
_CHUNKED = b"Transfer-Encoding: chunked\r\n"
_UPGRADE = b"GET /v1/ws HTTP/1.1\r\n" + _H + b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
WS_HANDSHAKE = _UPGRADE + (
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def framing_cases(rng: random.Random) -> list[tuple[str, bytes]]:
    """Requests h11 itself refuses (or barely accepts), each on a new connection."""
    post = b"POST /v1/chat/completions HTTP/1.1\r\n" + _H
    get = b"GET /health HTTP/1.1\r\n" + _H
    cases = [
        ("garbage request line", b"GARBAGE\r\n\r\n"),
        ("no Host", b"GET /health HTTP/1.1\r\n\r\n"),
        ("Content-Length abc", post + b"Content-Length: abc\r\n\r\n{}"),
        ("Content-Length -1", post + b"Content-Length: -1\r\n\r\n"),
        ("two Content-Lengths", post + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}"),
        ("Content-Length and chunked", post + b"Content-Length: 2\r\n" + _CHUNKED
         + b"\r\n2\r\n{}\r\n0\r\n\r\n"),
        ("Transfer-Encoding gzip", post + b"Transfer-Encoding: gzip\r\n\r\n{}"),
        ("bad chunk size", post + _CHUNKED + b"\r\nzz\r\n{}\r\n0\r\n\r\n"),
        ("header without colon", get + b"NoColonHere\r\n\r\n"),
        ("space in header name", get + b"Bad Header: x\r\n\r\n"),
        ("NUL in header value", get + b"X-A: a\x00b\r\n\r\n"),
        ("20 KiB header", get + b"X-Big: " + b"a" * 20_000 + b"\r\n\r\n"),
        ("HTTP/9.9", b"GET /health HTTP/9.9\r\n" + _H + b"\r\n"),
        ("HTTP/1.0 without Host", b"GET /health HTTP/1.0\r\n\r\n"),
        ("bare LF line ends", b"GET /health HTTP/1.1\nHost: 127.0.0.1\n\n"),
        ("obsolete line folding", get + b"X-A: a\r\n b\r\n\r\n"),
        ("raw 0xFF in the path", b"GET /health\xff HTTP/1.1\r\n" + _H + b"\r\n"),
        ("raw surrogate bytes in the path", b"GET /v1/models/\xed\xa0\x80 HTTP/1.1\r\n" + _H
         + b"\r\n"),
        ("absolute-form target", b"GET http://127.0.0.1/health HTTP/1.1\r\n" + _H + b"\r\n"),
        ("OPTIONS *", b"OPTIONS * HTTP/1.1\r\n" + _H + b"\r\n"),
        ("WebSocket upgrade without a key", _UPGRADE + b"Sec-WebSocket-Version: 13\r\n\r\n"),
        ("WebSocket upgrade, version 12", _UPGRADE
         + b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 12\r\n\r\n"),
    ]  # fmt: skip
    for _ in range(6):  # a complete head of random bytes
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 200)))
        cases.append((f"random head {junk[:16]!r}", junk.replace(b"\r\n\r\n", b"") + b"\r\n\r\n"))
    rng.shuffle(cases)
    return cases


def ws_frame(opcode: int, payload: bytes, *, fin: bool = True, rsv: int = 0, mask: bool = True,
             length: int | None = None, wide: bool = False) -> bytes:  # fmt: skip
    """One client frame, masked unless told (``length``: a declared length that lies)."""
    n = len(payload) if length is None else length
    head = bytes([(0x80 if fin else 0) | rsv << 4 | opcode])
    bit = 0x80 if mask else 0
    if n < 126 and not wide:
        head += bytes([bit | n])
    elif n < 65536 and not wide:
        head += bytes([bit | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([bit | 127]) + n.to_bytes(8, "big")
    if not mask:
        return head + payload
    key = b"\x11\x22\x33\x44"
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def ws_frame_cases() -> list[tuple[str, bytes, str]]:
    """(label, frames, what the server must do): ``close`` the socket (a close frame that is not
    1011, or EOF), ``reply`` with an error message and stay open, ``either`` of them, or ``any``
    (it may also wait for more)."""
    text = b'{"id": "f", "type": "x"}'
    split = ws_frame(1, text[:8] + b"\xc3", fin=False) + ws_frame(0, b"\xa9" + text[8:])
    return [
        ("unmasked text frame", ws_frame(1, text, mask=False), "close"),
        ("RSV1 set", ws_frame(1, text, rsv=4), "close"),
        ("reserved opcode 3", ws_frame(3, text), "close"),
        ("text frame with surrogate bytes", ws_frame(1, b'"\xed\xa0\x80"'), "close"),
        ("text frame with invalid UTF-8", ws_frame(1, b'{"id": "\xff"}'), "close"),
        ("ping of 126 bytes", ws_frame(9, b"p" * 126), "close"),
        ("continuation without a start", ws_frame(0, text), "close"),
        ("fragmented ping", ws_frame(9, b"p", fin=False), "close"),
        ("close code 999", ws_frame(8, (999).to_bytes(2, "big")), "close"),
        ("close with a 1-byte payload", ws_frame(8, b"\x03"), "close"),
        ("close reason not UTF-8", ws_frame(8, (1000).to_bytes(2, "big") + b"\xff"), "close"),
        ("declares 2**62 bytes", ws_frame(2, b"abc", length=2**62), "any"),
        ("text split inside a character", split, "reply"),
        ("binary surrogate bytes", ws_frame(2, b'{"id": "\xed\xa0\x80"}'), "reply"),
        ("non-minimal length", ws_frame(1, text, wide=True), "either"),
    ]
