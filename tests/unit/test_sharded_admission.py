"""Rank 0's admission in a sharded instance (``_Leader``): the KV budget every rank agreed on,
the slots, the bounded queue, and what a cancel or a close gives back. No collectives: the
leader is plain bookkeeping driven here step by step."""

from __future__ import annotations

from pathlib import Path

import pytest

from skulk.engine._batch import KvBudget
from skulk.engine._engine import Engine
from skulk.engine._prepare import Prepared
from skulk.engine._sharded_loop import _Leader
from skulk.engine.faults import Faults
from skulk.models import ensure_demo_model
from skulk.wire.runner import Cancel, Finished, Generate, RequestFailed, SamplingParams, TextPrompt
from tests.unit.test_engine_batch import FakeLink

TOKENS = list(range(10, 20))  # a 10-token prompt
PARAMS = SamplingParams(temperature=0.0, max_tokens=10)  # each request: 20 tokens of KV


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    path = ensure_demo_model(tmp_path_factory.mktemp("home"))
    return Engine.load(Path(path), lambda n, total: None)


class Rank0:
    def __init__(self, engine: Engine, most: int = 8, waiting: int = 2) -> None:
        self.link = FakeLink()
        self.leader = _Leader(self.link, engine, Faults(), most, waiting)  # type: ignore[arg-type]
        self.step = 0
        self._job = 0

    def submit(self, rid: str, max_tokens: int = 10) -> None:
        self._job += 1
        self.leader.waiting[rid] = self._job
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        request = Generate(rid, TextPrompt("unused"), params)
        self.leader.handle(Prepared(self._job, request, tuple(TOKENS)))

    def opened(self) -> list[int]:
        """Run one block (no tokens sampled): the slot it opens, if any."""
        control, _ = self.leader.compose(self.step)
        self.leader.applied(control)
        self.step += 1
        return [] if control.opening is None else [control.opening.slot]

    def ends(self) -> dict[str, str]:
        out = {}
        for f in self.link.sent:
            if isinstance(f, RequestFailed):
                out[f.request_id] = f.reason
            elif isinstance(f, Finished):
                out[f.request_id] = f.end.finish_reason
        return out


def test_before_the_budget_is_agreed_requests_wait_then_fit_in_order(engine: Engine) -> None:
    r = Rank0(engine, waiting=4)
    for rid in ("a", "b", "c"):
        r.submit(rid)
    r.submit("never", max_tokens=500)  # cannot fit the budget to come: refused when it does
    r.submit("d")
    assert r.ends() == {"d": "kv_cache_full"}  # the queue holds 4
    assert r.opened() == []  # no budget yet: nothing opens
    r.leader.open_budget(KvBudget(capacity=40 * 2, bytes_per_token=2, context_length=4096))
    ends = r.ends()
    assert ends["never"] == "max_tokens_too_large"
    assert r.opened() == [0] and r.opened() == [1] and r.opened() == []  # two fit
    assert r.leader.budget is not None and r.leader.budget.used == 80
    stats = r.leader.stats()
    assert stats is not None and (stats.running, stats.queued) == (2, 1)
    assert stats.kv_capacity_bytes == stats.kv_reserved_bytes == 80
    assert r.leader.stats() is None  # unchanged: nothing to send


def test_a_cancel_or_close_gives_the_room_to_the_next_in_line(engine: Engine) -> None:
    r = Rank0(engine, waiting=4)
    r.leader.open_budget(KvBudget(capacity=40, bytes_per_token=1, context_length=4096))
    for rid in ("a", "b", "c", "d"):
        r.submit(rid)
    assert r.opened() == [0] and r.opened() == [1] and r.opened() == []
    r.leader.handle(Cancel("a"))  # open: its slot is freed by the next block
    assert r.ends() == {"a": "cancelled"}
    assert r.opened() == [2]  # "c" got a's room (slot 0 is freed by this same block)
    r.leader.handle(Cancel("d"))  # still queued: nothing reserved for it
    assert r.ends()["d"] == "cancelled"
    r.leader._close(1)  # "b" ends (as when its last token is handed out)
    assert r.leader.budget is not None and r.leader.budget.used == 20  # "c" alone
    r.submit("e")
    assert r.opened() == [0]
    assert r.leader.budget.used == 40


def test_at_most_most_requests_are_admitted(engine: Engine) -> None:
    r = Rank0(engine, most=2, waiting=1)
    r.leader.open_budget(KvBudget(capacity=1 << 20, bytes_per_token=1, context_length=4096))
    for rid in ("a", "b", "c", "d"):
        r.submit(rid)
    assert r.ends() == {"d": "kv_cache_full"}  # "c" waits for a slot, "d" finds no place
    assert r.opened() == [0] and r.opened() == [1] and r.opened() == []
    r.leader._close(0)
    assert r.opened() == [2]  # "c" takes a's place
    assert r.opened() == []
