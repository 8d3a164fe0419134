"""Request/reply actors: callers of a dead or stopped actor fail at once, restarts recover."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from skulk.actors import (
    Actor,
    ActorDied,
    ActorState,
    ActorStopped,
    Mailbox,
    MailboxFull,
    Request,
    RestartPolicy,
    Supervisor,
)

CALLER_TIMEOUT = 100.0


class Calculator(Actor[str, int]):
    """``"n"`` → n * 2; ``"gate"`` waits for ``self.gate`` then crashes; ``"boom"`` crashes."""

    def __init__(self, capacity: int = 2) -> None:
        super().__init__(name="calc", capacity=capacity)
        self.gate = trio.Event()
        self.served: list[str] = []

    async def handle(self, payload: str) -> int:
        self.served.append(payload)
        if payload == "gate":
            await self.gate.wait()
            raise ValueError("crashed on purpose")
        if payload == "boom":
            raise ValueError("boom")
        return int(payload) * 2


class Outcomes:
    """Collects what each caller got and when (MockClock time)."""

    def __init__(self) -> None:
        self.results: dict[str, object] = {}
        self.times: dict[str, float] = {}

    async def call(self, actor: Actor[str, int], key: str, payload: str) -> None:
        with trio.fail_after(CALLER_TIMEOUT):
            try:
                self.results[key] = await actor.call(payload)
            except (ActorDied, ActorStopped) as exc:
                self.results[key] = exc
        self.times[key] = trio.current_time()

    async def tell(self, actor: Actor[str, int], key: str, payload: str) -> None:
        with trio.fail_after(CALLER_TIMEOUT):
            try:
                await actor.tell(payload)
                self.results[key] = "queued"
            except (ActorDied, ActorStopped) as exc:
                self.results[key] = exc
        self.times[key] = trio.current_time()


async def run_expecting_crash(
    actor: Actor[str, int], *, task_status: trio.TaskStatus[None]
) -> None:
    with pytest.raises(ValueError):
        await actor.run(task_status=task_status)


async def test_call_replies(autojump_clock: trio.testing.MockClock) -> None:
    actor = Calculator()
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        assert await actor.call("21") == 42
        assert [await actor.call(str(i)) for i in range(5)] == [0, 2, 4, 6, 8]
        stats = actor.statistics()
        assert (stats.state, stats.incarnations, stats.total_calls) == (ActorState.RUNNING, 1, 6)
        assert stats.calls_waiting == 0
        assert stats.mailbox.total_received == 6
        actor.close()
    assert actor.state is ActorState.STOPPED


async def test_crash_fails_every_caller_at_once(autojump_clock: trio.testing.MockClock) -> None:
    actor = Calculator(capacity=2)
    out = Outcomes()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_expecting_crash, actor)
        nursery.start_soon(out.call, actor, "in-progress", "gate")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(out.call, actor, "queued-1", "1")
        nursery.start_soon(out.call, actor, "queued-2", "2")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(out.call, actor, "blocked", "3")
        nursery.start_soon(out.tell, actor, "blocked-tell", "4")
        await trio.testing.wait_all_tasks_blocked()
        stats = actor.statistics()
        assert (stats.calls_waiting, stats.senders_blocked) == (4, 2)
        assert (stats.mailbox.queued, stats.mailbox.senders_waiting) == (2, 2)
        await trio.sleep(7)  # time passes while everyone waits
        crashed_at = trio.current_time()
        actor.gate.set()
    assert set(out.results) == {"in-progress", "queued-1", "queued-2", "blocked", "blocked-tell"}
    for key, result in out.results.items():
        assert isinstance(result, ActorDied), key
        assert isinstance(result.cause, ValueError)
        assert result.__cause__ is result.cause
        assert result.actor == "calc"
        assert out.times[key] == crashed_at, key  # not at crashed_at + timeout
    assert trio.current_time() == crashed_at
    assert actor.served == ["gate"]  # queued requests were failed, never served
    stats = actor.statistics()
    assert stats.state is ActorState.DEAD
    assert (stats.calls_waiting, stats.senders_blocked, stats.mailbox.queued) == (0, 0, 0)
    assert stats.total_failed_by_death == 5
    # While dead, new callers fail immediately too.
    with pytest.raises(ActorDied):
        await actor.call("5")
    with pytest.raises(ActorDied):
        actor.tell_nowait("5")
    # Running it again (what a supervisor does) makes calls work again.
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        assert await actor.call("5") == 10
        actor.close()
    assert actor.statistics().incarnations == 2


async def test_supervised_actor_restarts_and_serves_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    actor = Calculator()
    policy = RestartPolicy(initial_backoff=3.0, jitter=0.0)
    supervisor = Supervisor(policy=policy, rng=random.Random(0))
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await supervisor.start(actor.run, name="calc")
        with pytest.raises(ActorDied) as info:
            with trio.fail_after(CALLER_TIMEOUT):
                await actor.call("boom")
        assert str(info.value.cause) == "boom"
        assert trio.current_time() == 0.0
        # During the 3 s backoff the actor is dead: callers fail fast, no waiting.
        await trio.sleep(1)
        with pytest.raises(ActorDied):
            await actor.call("1")
        assert trio.current_time() == 1.0
        await trio.sleep(2.5)
        assert await actor.call("8") == 16
        stats = supervisor.statistics().child("calc")
        assert (stats.restarts, stats.crashes) == (1, 1)
        # Clean shutdown: close the mailbox, the actor drains and returns, no restart.
        actor.close()
        await trio.testing.wait_all_tasks_blocked()
        assert supervisor.statistics().child("calc").restarts == 1
        assert actor.state is ActorState.STOPPED
        supervisor.stop()


async def test_close_drains_queued_requests_then_stops(
    autojump_clock: trio.testing.MockClock,
) -> None:
    actor = Calculator(capacity=4)
    out = Outcomes()
    async with trio.open_nursery() as nursery:
        for i in range(3):  # queued while IDLE: served once it runs
            nursery.start_soon(out.call, actor, f"c{i}", str(i))
        await trio.testing.wait_all_tasks_blocked()
        assert actor.statistics().mailbox.queued == 3
        actor.close()
        with pytest.raises(ActorStopped):
            await actor.call("9")
        with pytest.raises(ActorStopped):
            actor.tell_nowait("9")
        await actor.run()  # drains the three, then returns
    assert out.results == {"c0": 0, "c1": 2, "c2": 4}
    assert actor.state is ActorState.STOPPED
    with pytest.raises(ActorStopped):
        await actor.call("1")


async def test_close_fails_callers_blocked_on_a_full_mailbox(
    autojump_clock: trio.testing.MockClock,
) -> None:
    actor = Calculator(capacity=1)
    out = Outcomes()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(out.call, actor, "queued", "1")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(out.call, actor, "blocked", "2")
        await trio.testing.wait_all_tasks_blocked()
        actor.close()
        await trio.testing.wait_all_tasks_blocked()
        assert isinstance(out.results["blocked"], ActorStopped)
        await actor.run()
    assert out.results["queued"] == 2


async def test_outside_cancellation_fails_callers_with_actor_stopped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    actor = Calculator()
    out = Outcomes()
    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as actor_nursery:
            await actor_nursery.start(actor.run)
            nursery.start_soon(out.call, actor, "waiting", "gate")
            await trio.testing.wait_all_tasks_blocked()
            await trio.sleep(4)
            actor_nursery.cancel_scope.cancel()
    result = out.results["waiting"]
    assert isinstance(result, ActorStopped)
    assert isinstance(result.cause, trio.Cancelled)
    assert out.times["waiting"] == 4.0
    assert actor.state is ActorState.STOPPED


async def test_main_returning_fails_queued_callers(autojump_clock: trio.testing.MockClock) -> None:
    class Quitter(Actor[str, str]):
        async def main(self, inbox: Mailbox[Request[str, str]]) -> None:
            request = await inbox.receive()
            request.reply("bye")

    actor = Quitter(name="quitter", capacity=4)
    results: dict[str, object] = {}

    async def caller(payload: str) -> None:
        try:
            results[payload] = await actor.call(payload)
        except ActorStopped as exc:
            results[payload] = exc

    async with trio.open_nursery() as nursery:
        for p in "abc":
            nursery.start_soon(caller, p)
            await trio.testing.wait_all_tasks_blocked()  # queue them in order a, b, c
        await actor.run()
    assert results["a"] == "bye"
    for p in "bc":
        result = results[p]
        assert isinstance(result, ActorStopped) and result.cause is None


async def test_caller_timeout_and_late_reply(autojump_clock: trio.testing.MockClock) -> None:
    held: list[Request[str, str]] = []
    release = trio.Event()

    class Slow(Actor[str, str]):
        async def main(self, inbox: Mailbox[Request[str, str]]) -> None:
            async for request in inbox:
                held.append(request)
                if len(held) == 2:
                    await release.wait()
                    # reply out of order, later than asked; one caller already gave up
                    assert held[1].reply("second")
                    assert held[0].abandoned
                    assert not held[0].reply("first")
                    assert not held[1].reply("twice")

    actor = Slow(name="slow")
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        with trio.move_on_after(2) as scope:
            await actor.call("one")
        assert scope.cancelled_caught and trio.current_time() == 2.0
        assert actor.statistics().calls_waiting == 0

        async def second() -> None:
            assert await actor.call("two") == "second"

        nursery.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        release.set()
        await trio.testing.wait_all_tasks_blocked()
        actor.close()


async def test_request_fail_delivers_a_typed_error(autojump_clock: trio.testing.MockClock) -> None:
    class Refuser(Actor[int, int]):
        async def main(self, inbox: Mailbox[Request[int, int]]) -> None:
            async for request in inbox:
                if request.payload < 0:
                    request.fail(LookupError(request.payload))
                else:
                    request.reply(request.payload)

    actor = Refuser(name="refuser")
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        with pytest.raises(LookupError):
            await actor.call(-1)
        assert await actor.call(1) == 1  # the actor is unaffected
        actor.close()


async def test_tell_nowait_full_and_tells_dropped_on_death(
    autojump_clock: trio.testing.MockClock,
) -> None:
    actor = Calculator(capacity=2)
    actor.tell_nowait("boom")
    actor.tell_nowait("1")
    with pytest.raises(MailboxFull):
        actor.tell_nowait("2")
    async with trio.open_nursery() as nursery:
        await nursery.start(run_expecting_crash, actor)
    assert actor.served == ["boom"]  # "1" was dropped with the dead incarnation
    assert actor.statistics().mailbox.total_drained == 1


async def test_run_twice_at_once_is_refused(autojump_clock: trio.testing.MockClock) -> None:
    actor = Calculator()
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        with pytest.raises(RuntimeError, match="already running"):
            await actor.run()
        actor.close()


async def test_handle_must_be_overridden(autojump_clock: trio.testing.MockClock) -> None:
    actor: Actor[int, int] = Actor(name="bare")
    async with trio.open_nursery() as nursery:

        async def run_bare() -> None:
            with pytest.raises(NotImplementedError):
                await actor.run()

        nursery.start_soon(run_bare)
        with pytest.raises(ActorDied) as info:
            await actor.call(1)
        assert isinstance(info.value.cause, NotImplementedError)
