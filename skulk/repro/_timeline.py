"""Reading runners' flight recorders out of ``/v1/diagnostics/node`` and printing a timeline.

Pure functions over decoded JSON: :func:`parse_runners` checks the shape the node promises
(raising :class:`DiagnosticsError` with a ``$.path`` for anything else) and
:func:`format_timeline` renders events, one line each, with runs of heartbeats folded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs


class DiagnosticsError(ValueError):
    """The diagnostics document does not have the promised shape."""


@attrs.frozen
class Event:
    """One flight-recorder entry of one runner."""

    #: Which node of the scenario (1 = the first one it started).
    node: int
    incarnation: int
    #: Unix time.
    at: float
    since_spawn: float
    kind: str
    detail: str
    request_id: str | None = None
    #: For a runner of a cluster (the cluster timeline): its instance and rank.
    instance: str | None = None
    rank: int | None = None

    @property
    def label(self) -> str:
        if self.instance is None:
            return runner_label(self.node, self.incarnation)
        return f"n{self.node}:{self.instance[:4]}/r{self.rank}#{self.incarnation}"


@attrs.frozen
class Failure:
    reason: str
    message: str
    tail: tuple[str, ...] = ()


@attrs.frozen
class RunnerView:
    """One runner as diagnostics last showed it."""

    node: int
    incarnation: int
    pid: int | None
    phase: str
    exit_code: int | None
    failure: Failure | None
    active_requests: int
    events: tuple[Event, ...]

    def first(self, kind: str, contains: str = "") -> Event | None:
        """The earliest event of ``kind`` whose detail contains ``contains``."""
        return next((e for e in self.events if e.kind == kind and contains in e.detail), None)


def _field(obj: Mapping[str, object], key: str, path: str) -> object:
    if key not in obj:
        raise DiagnosticsError(f"missing {key!r} @ {path}")
    return obj[key]


def _fail(path: str, what: str, value: object) -> DiagnosticsError:
    return DiagnosticsError(f"expected {what} @ {path}, got {value!r}")


def _obj(value: object, path: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise _fail(path, "an object", value)
    return value


def _list(value: object, path: str) -> list[object]:
    if not isinstance(value, list):
        raise _fail(path, "a list", value)
    return value


def _int(value: object, path: str) -> int:
    # bool is an int subclass; a JSON true where a number belongs is still wrong.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(path, "an integer", value)
    return value


def _opt_int(value: object, path: str) -> int | None:
    return None if value is None else _int(value, path)


def _number(value: object, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(path, "a number", value)
    return float(value)


def _str(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise _fail(path, "a string", value)
    return value


def _event(raw: object, node: int, incarnation: int, path: str) -> Event:
    e = _obj(raw, path)
    rid = _field(e, "request_id", path) if "request_id" in e else None
    return Event(
        node=node,
        incarnation=incarnation,
        at=_number(_field(e, "at", path), path + ".at"),
        since_spawn=_number(_field(e, "since_spawn", path), path + ".since_spawn"),
        kind=_str(_field(e, "kind", path), path + ".kind"),
        detail=_str(_field(e, "detail", path), path + ".detail"),
        request_id=None if rid is None else _str(rid, path + ".request_id"),
    )


def _failure(raw: object, path: str) -> Failure | None:
    if raw is None:
        return None
    f = _obj(raw, path)
    tail = _list(f.get("tail", []), path + ".tail")
    return Failure(
        reason=_str(_field(f, "reason", path), path + ".reason"),
        message=_str(_field(f, "message", path), path + ".message"),
        tail=tuple(_str(t, f"{path}.tail[{i}]") for i, t in enumerate(tail)),
    )


def parse_runners(diagnostics: object, node: int = 1) -> list[RunnerView]:
    """The ``runners`` of a ``/v1/diagnostics/node`` document, oldest first."""
    doc = _obj(diagnostics, "$")
    runners = _list(_field(doc, "runners", "$"), "$.runners")
    views = []
    for i, raw in enumerate(runners):
        path = f"$.runners[{i}]"
        r = _obj(raw, path)
        inc = _int(_field(r, "incarnation", path), path + ".incarnation")
        events = _list(_field(r, "events", path), path + ".events")
        views.append(
            RunnerView(
                node=node,
                incarnation=inc,
                pid=_opt_int(_field(r, "pid", path), path + ".pid"),
                phase=_str(_field(r, "phase", path), path + ".phase"),
                exit_code=_opt_int(_field(r, "exit_code", path), path + ".exit_code"),
                failure=_failure(_field(r, "failure", path), path + ".failure"),
                active_requests=_int(_field(r, "active_requests", path), path + ".active_requests"),
                events=tuple(
                    _event(e, node, inc, f"{path}.events[{j}]") for j, e in enumerate(events)
                ),
            )
        )
    return views


def runner_label(node: int, incarnation: int) -> str:
    """``#2`` for the first node's second runner, ``n2#1`` for a later node's first runner."""
    return f"#{incarnation}" if node == 1 else f"n{node}#{incarnation}"


HEADER = f"{'t':>9}  {'runner':<12} {'since spawn':>11}  {'event':<20} detail"
LEGEND = "   (runner: nK:IIII/rR#N = rank R of instance IIII… on node K, its Nth runner)"


def _line(e: Event, t0: float, detail: str) -> str:
    rid = f"  [{e.request_id[-12:]}]" if e.request_id else ""
    return f"{e.at - t0:8.3f}s  {e.label:<12} {e.since_spawn:10.3f}s  {e.kind:<20} {detail}{rid}"


def format_timeline(events: Iterable[Event], t0: float) -> list[str]:
    """One line per event in time order (``t`` counts from ``t0``, a unix time).

    Consecutive heartbeats of one runner fold into a single line that says how many there
    were and when the last one came, so the lines that matter stay readable.
    """
    ordered = sorted(events, key=lambda e: (e.at, e.node, e.incarnation))
    lines: list[str] = []
    run: list[Event] = []

    def flush() -> None:
        if not run:
            return
        if len(run) == 1:
            lines.append(_line(run[0], t0, run[0].detail))
        else:
            last = run[-1]
            lines.append(
                _line(run[0], t0, f"x{len(run)}, the last at {last.since_spawn:.3f}s after spawn")
            )
        run.clear()

    for e in ordered:
        if e.kind == "heartbeat" and (not run or _same_runner(run[-1], e)):
            run.append(e)
            continue
        flush()
        if e.kind == "heartbeat":
            run.append(e)
        else:
            lines.append(_line(e, t0, e.detail))
    flush()
    return lines


def _same_runner(a: Event, b: Event) -> bool:
    return a.label == b.label and a.instance == b.instance


def merge_events(*groups: Sequence[Event]) -> list[Event]:
    """All distinct events of several snapshots, in time order (a recorder seen twice
    contributes its events once)."""
    seen: dict[tuple[object, ...], Event] = {}
    for group in groups:
        for e in group:
            seen.setdefault(attrs.astuple(e), e)
    return sorted(seen.values(), key=lambda e: (e.at, e.node, e.incarnation))
