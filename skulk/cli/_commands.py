"""The client commands: a request (two for ``rm``: it resolves a prefix) and a table or JSON.

Exit status: 0 done; 1 the server refused (its envelope's ``code`` and ``message`` on stderr
as ``skulk: CODE: MESSAGE``), its answer was not understood, an ``rm`` prefix matched several
instances, or the instance ``place --wait`` follows failed; 2 no answer from the API (and, from
argparse, a bad command line); 3 ``place --wait`` timed out; 130 interrupted (Ctrl-C; ``top``
exits 0 on it, its usual way out). A placement interrupted while waiting may still be
committed: ``ps`` tells.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping

import attrs
import httpx

from skulk.cli._args import (
    DEFAULT_PULL_TIMEOUT,
    DEFAULT_TIMEOUT,
    DEFAULT_WAIT_TIMEOUT,
    flatten,
)
from skulk.cli._http import (
    DEFAULT_API,
    ApiClient,
    BadResponse,
    ClientError,
    quote_segment,
)
from skulk.cli._tables import (
    JsonObject,
    instances_table,
    nodes_table,
    plan_table,
    runner_failures,
    shards_of,
    shards_table,
    text,
)
from skulk.cli._wait import follow, poll_instance
from skulk.clock import wall

#: How many candidates an ambiguous ``rm`` prefix lists before "...".
MAX_CANDIDATES_SHOWN = 8


@attrs.define(eq=False)
class AmbiguousInstance(ClientError):
    """``prefix`` is the start of several instance ids (``candidates``, sorted)."""

    prefix: str
    candidates: tuple[str, ...]

    def describe(self) -> str:
        shown = ", ".join(self.candidates[:MAX_CANDIDATES_SHOWN])
        more = ", ..." if len(self.candidates) > MAX_CANDIDATES_SHOWN else ""
        return (
            f"ambiguous_instance: {self.prefix!r} is the start of "
            f"{len(self.candidates)} instance ids: {shown}{more}"
        )


def run_client_command(
    args: argparse.Namespace,
    *,
    transport: httpx.BaseTransport | None = None,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Run the client command ``args.command`` (parsed by :func:`add_client_commands`); return
    the exit status. Output goes to ``sys.stdout``, errors to ``sys.stderr`` as one line each.
    ``transport`` replaces the network, ``env`` the environment, ``clock`` and ``sleep`` time
    (``place --wait`` and ``top``'s loop) (tests)."""
    environ = os.environ if env is None else env
    api = args.api or environ.get("SKULK_API") or DEFAULT_API
    # SKULK_API_KEY may list the node's keys (comma-separated): any one of them will do.
    key = args.api_key or environ.get("SKULK_API_KEY", "").split(",")[0].strip() or None
    timeout = request_timeout(args)
    with ApiClient(api, timeout=timeout, transport=transport, api_key=key) as client:
        try:
            return _COMMANDS[args.command](client, args, _Env(environ, clock, sleep))
        except ClientError as exc:
            print(f"skulk: {exc.describe()}", file=sys.stderr)
            return exc.exit_status
        except KeyboardInterrupt:  # Ctrl-C while waiting: the shell's convention, no traceback
            print("skulk: interrupted", file=sys.stderr)
            return 130


def request_timeout(args: argparse.Namespace) -> float:
    """One request's deadline: ``--timeout``, else :data:`DEFAULT_TIMEOUT` (for ``pull``, each
    read: :data:`DEFAULT_PULL_TIMEOUT`); under ``place --wait`` (where ``--timeout`` bounds the
    whole wait) at most :data:`DEFAULT_TIMEOUT`."""
    if getattr(args, "wait", False):
        return min(wait_timeout(args), DEFAULT_TIMEOUT)
    if args.timeout is None and args.command == "pull":
        return DEFAULT_PULL_TIMEOUT
    return DEFAULT_TIMEOUT if args.timeout is None else float(args.timeout)


def wait_timeout(args: argparse.Namespace) -> float:
    """How long ``place --wait`` waits for ready: ``--timeout``, else the wait default."""
    return DEFAULT_WAIT_TIMEOUT if args.timeout is None else float(args.timeout)


@attrs.frozen
class _Env:
    environ: Mapping[str, str]
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    wall: Callable[[], float] = wall


def place_body(args: argparse.Namespace) -> dict[str, object]:
    """The ``POST /v1/placements`` body for ``place``'s arguments (only the options given)."""
    body: dict[str, object] = {"model": args.model}
    if args.sharding is not None:
        body["sharding"] = args.sharding
    if nodes := flatten(args.nodes):
        body["nodes"] = nodes
    if excluded := flatten(args.exclude):
        body["excluded_nodes"] = excluded
    if args.min_nodes is not None:
        body["min_nodes"] = args.min_nodes
    if args.max_nodes is not None:
        body["max_nodes"] = args.max_nodes
    if args.dry_run:
        body["dry_run"] = True
    return body


def resolve_instance(given: str, ids: list[str]) -> str:
    """The instance id ``given`` names among ``ids``: itself if it is one, else the one id it
    is a prefix of. With no match it stays as given (the server answers ``unknown_instance``);
    :class:`AmbiguousInstance` when several ids start with it."""
    if given in ids:
        return given
    matches = sorted({i for i in ids if i.startswith(given)})
    if len(matches) > 1:
        raise AmbiguousInstance(given, tuple(matches))
    return matches[0] if matches else given


def _place(client: ApiClient, args: argparse.Namespace, env: _Env) -> int:
    answer = client.post("/v1/placements", place_body(args))
    if args.wait and not args.dry_run:
        instance = _object(answer, "instance", client.api + "/v1/placements")
        return _wait_ready(client, args, env, text(instance.get("id")))
    if args.json:
        _print_json(answer)
        return 0
    if args.dry_run:
        plan = _object(answer, "plan", client.api + "/v1/placements")
        count = len({text(s.get("node")) for s in shards_of(plan)})
        print(
            f"dry run: {text(plan.get('model'))} ({text(plan.get('sharding'))}) would go on "
            f"{count} node{'' if count == 1 else 's'}; nothing was placed"
        )
        print(plan_table(plan))
        return 0
    instance = _object(answer, "instance", client.api + "/v1/placements")
    if "model" in instance:
        print(
            f"placed {text(instance.get('id'))}: {text(instance.get('model'))} "
            f"({text(instance.get('sharding'))})"
        )
        print(shards_table(instance))
    else:  # committed, but not yet applied on the node that answered
        print(f"placed {text(instance.get('id'))}")
    return 0


def _ps(client: ApiClient, args: argparse.Namespace, env: _Env) -> int:
    answer = client.get("/v1/instances")
    if args.json:
        _print_json(answer)
        return 0
    instances = _objects(answer, "instances", client.api + "/v1/instances")
    if args.quiet:
        for instance in instances:
            print(text(instance.get("id")))
        return 0
    print(instances_table(instances))
    if failures := runner_failures(instances):
        print()
        print("\n".join(failures))
    return 0


def _nodes(client: ApiClient, args: argparse.Namespace, env: _Env) -> int:
    answer = client.get("/v1/cluster/nodes")
    if args.json:
        _print_json(answer)
        return 0
    print(nodes_table(_objects(answer, "nodes", client.api + "/v1/cluster/nodes")))
    return 0


def _rm(client: ApiClient, args: argparse.Namespace, env: _Env) -> int:
    listed = _objects(client.get("/v1/instances"), "instances", client.api + "/v1/instances")
    ids = [i for i in (instance.get("id") for instance in listed) if isinstance(i, str)]
    instance_id = resolve_instance(args.instance, ids)
    answer = client.delete(f"/v1/instances/{quote_segment(instance_id)}")
    if args.json:
        _print_json(answer)
    else:
        print(f"deleted {text(answer.get('deleted', instance_id))}")
    return 0


def _wait_ready(client: ApiClient, args: argparse.Namespace, env: _Env, instance: str) -> int:
    """``place --wait``: the bar (or lines) on stderr, then on stdout ``ready ID: ...`` and
    its shards (with ``--json``, ``{"instance": ...}`` as ``GET /v1/instances/{id}`` answers)."""
    from skulk.cli._wait_report import wait_reporter

    print(f"placed {instance}; waiting for it to be ready", file=sys.stderr, flush=True)
    polled: list[JsonObject | None] = [None]

    def poll() -> JsonObject | None:
        polled[0] = poll_instance(client, instance)
        return polled[0]

    with wait_reporter(sys.stderr, instance) as report:
        follow(
            poll,
            instance,
            timeout=wait_timeout(args),
            report=report,
            clock=env.clock,
            sleep=env.sleep,
        )
    answer = polled[0]  # the instance as it was when ready
    if args.json:
        _print_json({"instance": answer if answer is not None else {"id": instance}})
    elif answer is not None and "model" in answer:
        print(f"ready {instance}: {text(answer.get('model'))} ({text(answer.get('sharding'))})")
        print(shards_table(answer))
    else:
        print(f"ready {instance}")
    return 0


def _pull(client: ApiClient, args: argparse.Namespace, env: _Env) -> int:
    from skulk.cli._models import done_line, follow_pull, pull_reporter

    if args.json:  # the status lines as the server sends them
        follow_pull(client, args.model, _print_line)
        return 0
    with pull_reporter(sys.stderr, args.model) as report:
        last = follow_pull(client, args.model, report)
    print(done_line(last))
    return 0


def _models(client: ApiClient, args: argparse.Namespace, env: _Env) -> int:
    from skulk.cli._models import models_table

    answer = client.get("/v1/store")
    if args.json:
        _print_json(answer)
        return 0
    print(models_table(answer, env.wall()))
    return 0


def _rm_model(client: ApiClient, args: argparse.Namespace, env: _Env) -> int:
    answer = client.delete(f"/v1/store/{quote_segment(args.model)}")
    if args.json:
        _print_json(answer)
        return 0
    removed = answer.get("removed")
    sha = text(removed.get("sha256"))[:16] if isinstance(removed, Mapping) else "-"
    print(f"removed {args.model} ({sha}) from the store of {text(answer.get('node'))}")
    return 0


def _top(client: ApiClient, args: argparse.Namespace, env: _Env) -> int:
    from skulk.cli._top_loop import run_top

    return run_top(client, once=args.once, as_json=args.json, environ=env.environ, sleep=env.sleep)


_COMMANDS: dict[str, Callable[[ApiClient, argparse.Namespace, _Env], int]] = {
    "place": _place,
    "ps": _ps,
    "nodes": _nodes,
    "rm": _rm,
    "top": _top,
    "pull": _pull,
    "models": _models,
    "rm-model": _rm_model,
}


def _print_json(answer: JsonObject) -> None:
    print(json.dumps(answer, indent=2, ensure_ascii=False))


def _print_line(answer: JsonObject) -> None:
    print(json.dumps(answer, ensure_ascii=False), flush=True)


def _object(answer: JsonObject, key: str, url: str) -> JsonObject:
    value = answer.get(key)
    if not isinstance(value, Mapping):
        raise BadResponse(url, f"no {key!r} object in the answer")
    return value


def _objects(answer: JsonObject, key: str, url: str) -> list[JsonObject]:
    value = answer.get(key)
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise BadResponse(url, f"no {key!r} list of objects in the answer")
    return value
