"""Breaker semantics: trial generations, queueing vs slow calls, failure windows, growing breaks.

Through the public API (``Dispatcher.dispatch``) wherever the behaviour shows there, with
``async def`` and plain ``def`` handlers; the windows' arithmetic also on a
:class:`KeyBreaker` driven by hand on a fake clock.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import anyio
import pytest

from helpers import wait_until
from toolrelay import (
    AuthContext,
    BreakerOptions,
    BulkheadOptions,
    Dispatcher,
    DispatcherOptions,
    ErrorType,
    KeyPolicy,
    RetryOptions,
    ToolError,
    ToolRegistry,
    ToolResult,
)
from toolrelay.breakers import REJECT, Breakers, KeyBreaker
from toolrelay.outcome import Verdict
from toolrelay.testing import FrozenClock

pytestmark = pytest.mark.anyio

ANY = {"type": "object"}
KEY = "up"


# -- the service ---------------------------------------------------------------------------------
class Upstream:
    """The service behind :data:`KEY`, as an ``async def`` or a plain ``def`` handler.

    Each call says in its arguments what to do: ``{"id": ..., "do": "ok" | "fail" |
    "business", "sleep": seconds}``. A call whose id has a gate (:meth:`gate`) waits for it
    first. ``seen`` keeps, for every entry, the ids then inside the handler.
    """

    def __init__(self, sync: bool) -> None:
        self.sync = sync
        self.gates: dict[str, Any] = {}
        self.inside: list[str] = []
        self.entered: list[str] = []
        self.seen: list[tuple[str, ...]] = []

    def gate(self, id_: str) -> None:
        self.gates[id_] = threading.Event() if self.sync else anyio.Event()

    def open(self, id_: str) -> None:
        self.gates[id_].set()

    def open_all(self) -> None:
        for gate in self.gates.values():
            gate.set()

    def peak(self, ids: Iterable[str]) -> int:
        """The most calls among ``ids`` that were inside the handler at once."""
        group = set(ids)
        return max((sum(i in group for i in inside) for inside in self.seen), default=0)

    def _enter(self, args: dict[str, Any]) -> str:
        id_ = str(args.get("id", ""))
        self.entered.append(id_)
        self.inside.append(id_)
        self.seen.append(tuple(self.inside))
        return id_

    @staticmethod
    def _answer(args: dict[str, Any]) -> Any:
        do = args.get("do", "ok")
        if do == "fail":
            raise ToolError("upstream 503", retryable=True)
        if do == "business":
            raise ToolError("no such city", counts_as_failure=False)
        return {"id": args.get("id")}

    async def run_async(self, args: dict[str, Any], ctx: AuthContext) -> Any:
        id_ = self._enter(args)
        try:
            gate = self.gates.get(id_)
            if gate is not None:
                await gate.wait()
            if args.get("sleep"):
                await anyio.sleep(args["sleep"])
            return self._answer(args)
        finally:
            self.inside.remove(id_)

    def run_sync(self, args: dict[str, Any], ctx: AuthContext) -> Any:
        id_ = self._enter(args)
        try:
            gate = self.gates.get(id_)
            if gate is not None:
                gate.wait(30)
            if args.get("sleep"):
                time.sleep(args["sleep"])
            return self._answer(args)
        finally:
            self.inside.remove(id_)


@pytest.fixture(params=["async", "sync"])
def sync(request: pytest.FixtureRequest) -> bool:
    """Run the test with an ``async def`` handler and with a plain ``def`` one."""
    return bool(request.param == "sync")


def relay(
    config: KeyPolicy, sync: bool = False, clock: FrozenClock | None = None
) -> tuple[Dispatcher, Upstream]:
    upstream = Upstream(sync)
    registry = ToolRegistry()
    handler = upstream.run_sync if sync else upstream.run_async
    registry.tool(name="svc", parameters=ANY, breaker_key=KEY, timeout_s=10)(handler)
    live = {} if clock is None else {"clock": clock}
    return Dispatcher(registry, DispatcherOptions(keys={KEY: config}), **live), upstream


async def call(
    dispatcher: Dispatcher, id_: str = "", do: str = "ok", sleep: float = 0.0
) -> ToolResult:
    return await dispatcher.dispatch("svc", {"id": id_, "do": do, "sleep": sleep})


async def calls(dispatcher: Dispatcher, *steps: str) -> list[ToolResult]:
    """One call per step, one after the other."""
    return [await call(dispatcher, f"s{i}", step) for i, step in enumerate(steps)]


async def concurrently(dispatcher: Dispatcher, n: int, sleep: float) -> list[ToolResult]:
    results: list[ToolResult] = []

    async def one(i: int) -> None:
        results.append(await call(dispatcher, f"c{i}", sleep=sleep))

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return results


async def break_over(dispatcher: Dispatcher) -> None:
    """Wait until the open breaker's break is over: the next call is a trial."""
    await wait_until(lambda: dispatcher.breakers.blocked_for(KEY) is None)


class Background:
    """Gated calls running in a task group, each finished (or cancelled) when the test says."""

    def __init__(self, tg: Any, dispatcher: Dispatcher, upstream: Upstream) -> None:
        self.tg = tg
        self.dispatcher = dispatcher
        self.upstream = upstream
        self.results: dict[str, ToolResult] = {}
        self.scopes: dict[str, anyio.CancelScope] = {}
        self.ended: set[str] = set()

    async def start(self, id_: str, do: str = "ok") -> None:
        """Start call ``id_`` and return once it is inside the handler, waiting at its gate."""
        self.upstream.gate(id_)
        self.tg.start_soon(self._run, id_, do)
        await wait_until(lambda: id_ in self.upstream.inside)

    async def _run(self, id_: str, do: str) -> None:
        with anyio.CancelScope() as scope:
            self.scopes[id_] = scope
            self.results[id_] = await call(self.dispatcher, id_, do)
        self.ended.add(id_)

    async def finish(self, id_: str) -> ToolResult:
        self.upstream.open(id_)
        await wait_until(lambda: id_ in self.ended)
        return self.results[id_]

    async def cancel(self, id_: str) -> None:
        self.scopes[id_].cancel()
        await wait_until(lambda: id_ in self.ended)
        self.upstream.open(id_)  # an abandoned sync thread may end now
        await wait_until(lambda: id_ not in self.upstream.inside)


@contextlib.asynccontextmanager
async def background(dispatcher: Dispatcher, upstream: Upstream) -> AsyncIterator[Background]:
    async with anyio.create_task_group() as tg:
        try:
            yield Background(tg, dispatcher, upstream)
        finally:
            upstream.open_all()  # no thread is left waiting if the test failed


# -- 1. half-open trials have a generation ------------------------------------------------------
@pytest.mark.parametrize("ending", ["ok", "fail", "cancelled"])
async def test_a_trial_counts_only_in_the_half_open_period_that_admitted_it(
    sync: bool, ending: str
) -> None:
    """Trial A of one half-open period ends after the breaker re-opened and half-opened
    again: however it ends, it neither frees a place of the new period nor helps close it
    (nor re-opens it)."""
    config = KeyPolicy(
        breaker=BreakerOptions(
            fail_max=1, reset_timeout_s=0.05, half_open_max_calls=2, success_threshold=2
        ),
        retry=RetryOptions(max_attempts=1),
    )
    dispatcher, upstream = relay(config, sync)
    breaker = dispatcher.breakers.get(KEY)
    assert (await call(dispatcher, "trip", "fail")).error_type is ErrorType.TOOL_ERROR
    await break_over(dispatcher)
    async with background(dispatcher, upstream) as bg:
        # Period 1: trials A (slow) and B; a third call finds both places taken.
        await bg.start("A", "fail" if ending == "fail" else "ok")
        await bg.start("B", "fail")
        assert (await call(dispatcher, "X")).error_type is ErrorType.CIRCUIT_OPEN
        assert (await bg.finish("B")).error_type is ErrorType.TOOL_ERROR
        assert dispatcher.breakers.state(KEY) == "open"  # B re-opened it; A still runs
        # Period 2: trials C and D, while A is still inside the handler.
        await break_over(dispatcher)
        await bg.start("C")
        await bg.start("D")
        assert sorted(upstream.inside) == ["A", "C", "D"]
        # The stale trial A ends.
        if ending == "cancelled":
            await bg.cancel("A")
        else:
            assert (await bg.finish("A")).ok is (ending == "ok")
        assert dispatcher.breakers.state(KEY) == "half_open"
        assert breaker.trials == 2  # A did not free a place of period 2...
        assert (await call(dispatcher, "E")).error_type is ErrorType.CIRCUIT_OPEN
        assert (await bg.finish("C")).ok
        assert dispatcher.breakers.state(KEY) == "half_open"  # ...nor count: 1 success of 2
        assert (await bg.finish("D")).ok
        assert dispatcher.breakers.state(KEY) == "closed"
    assert "X" not in upstream.entered and "E" not in upstream.entered
    assert upstream.peak("ABX") == 2
    assert upstream.peak("CDE") == 2  # never more than half_open_max_calls of one period


# -- 2. queueing does not open the breaker ------------------------------------------------------
# slow_call_s leaves a call of 0.06 s the slack a loaded machine needs (a thread to start,
# a stall): at 0.1 s a sync call of 0.03 s was once counted slow there
QUEUED = KeyPolicy(
    breaker=BreakerOptions(slow_call_s=0.25, fail_max=3),
    retry=RetryOptions(max_attempts=1),
    bulkhead=BulkheadOptions(max_concurrent=1, wait_s=5),
)


async def test_waiting_for_a_bulkhead_place_is_not_a_slow_call(sync: bool) -> None:
    """Six calls of 0.06 s queue for one place: the last waits ~0.3 s, but the slow-call
    clock starts when a call has its place, so none is slow."""
    dispatcher, upstream = relay(QUEUED, sync)
    results = await concurrently(dispatcher, 6, sleep=0.06)
    assert len(results) == 6 and all(r.ok for r in results)
    assert upstream.peak(upstream.entered) == 1  # they did queue
    assert dispatcher.breakers.state(KEY) == "closed"
    breaker = dispatcher.breakers.get(KEY)
    assert breaker.snapshot()["failures"] == 0
    assert breaker.failures_recorded == 0


async def test_a_really_slow_call_still_counts_after_queueing(sync: bool) -> None:
    """Positive control: calls slower than ``slow_call_s`` once running do count."""
    dispatcher, upstream = relay(QUEUED, sync)
    results = await concurrently(dispatcher, 3, sleep=0.3)
    assert all(r.ok for r in results)  # a slow success is still a success for the caller
    assert upstream.peak(upstream.entered) == 1
    assert dispatcher.breakers.state(KEY) == "open"
    assert dispatcher.breakers.get(KEY).failures_recorded == 3


# -- 3. count window ----------------------------------------------------------------------------
def count_window() -> KeyPolicy:
    """The last 10 calls; open at 50 % failed once 5 calls are in the window."""
    return KeyPolicy(
        breaker=BreakerOptions(
            window="count", window_size=10, minimum_calls=5, failure_rate=0.5, reset_timeout_s=30
        ),
        retry=RetryOptions(max_attempts=1),
        bulkhead=BulkheadOptions(max_concurrent=1),
    )


async def test_count_window_waits_for_minimum_calls(sync: bool) -> None:
    dispatcher, _ = relay(count_window(), sync)
    await calls(dispatcher, *["fail"] * 4)
    assert dispatcher.breakers.state(KEY) == "closed"  # 100 % failed, but only 4 calls
    assert dispatcher.breakers.get(KEY).snapshot()["failure_rate"] == 1.0
    (fifth,) = await calls(dispatcher, "fail")
    assert fifth.error_type is ErrorType.TOOL_ERROR  # the tripping call answers for itself
    assert dispatcher.breakers.state(KEY) == "open"
    assert (await call(dispatcher)).error_type is ErrorType.CIRCUIT_OPEN


async def test_a_consecutive_breaker_reports_no_rate(sync: bool) -> None:
    """It counts failures in a row: its snapshot (what /breakers shows) has no share of
    calls to report, so the rates are None rather than a 0 beside two failures."""
    config = KeyPolicy(
        breaker=BreakerOptions(fail_max=3, reset_timeout_s=30), retry=RetryOptions(max_attempts=1)
    )
    dispatcher, _ = relay(config, sync)
    await calls(dispatcher, "ok", "fail", "fail")
    snapshot = dispatcher.breakers.get(KEY).snapshot()
    assert snapshot["failures"] == 2 and snapshot["state"] == "closed"
    assert snapshot["failure_rate"] is None and snapshot["slow_call_rate"] is None
    windowed = relay(count_window(), sync)[0]
    await calls(windowed, "ok", "fail")
    assert windowed.breakers.get(KEY).snapshot()["failure_rate"] == 0.5


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param(["ok"] * 3 + ["fail"] * 3, id="3-of-6"),
        pytest.param(["ok"] * 5 + ["fail"] * 5, id="5-of-10"),
        pytest.param(["fail", "ok"] * 2 + ["ok", "fail"], id="3-of-6-mixed"),
    ],
)
async def test_count_window_opens_at_exactly_the_failure_rate(sync: bool, steps: list[str]) -> None:
    """Closed one call before (2 of 5, 4 of 9: below 50 %), open at exactly 50 %."""
    dispatcher, _ = relay(count_window(), sync)
    await calls(dispatcher, *steps[:-1])
    assert dispatcher.breakers.state(KEY) == "closed"
    await calls(dispatcher, steps[-1])
    assert dispatcher.breakers.state(KEY) == "open"


async def test_count_window_forgets_old_outcomes(sync: bool) -> None:
    """Four failures among ten calls, then ten successes push them out; then it takes five
    new failures (5 of 10) to open, where a growing count would need far more."""
    dispatcher, _ = relay(count_window(), sync)
    await calls(dispatcher, *["ok"] * 6 + ["fail"] * 4)
    assert dispatcher.breakers.state(KEY) == "closed"  # 4 of 10
    await calls(dispatcher, *["ok"] * 10)
    assert dispatcher.breakers.get(KEY).snapshot()["failure_rate"] == 0.0
    await calls(dispatcher, *["fail"] * 4)
    assert dispatcher.breakers.state(KEY) == "closed"  # 4 of 10
    assert dispatcher.breakers.get(KEY).snapshot()["failure_rate"] == 0.4
    await calls(dispatcher, "fail")
    assert dispatcher.breakers.state(KEY) == "open"  # 5 of 10 (a growing count: 9 of 19)


async def test_count_window_does_not_record_ignored_outcomes(sync: bool) -> None:
    """Business errors, load shedding and cancellations are neither successes (they would
    dilute the rate) nor failures, and they do not count toward ``minimum_calls``."""
    dispatcher, upstream = relay(count_window(), sync)
    await calls(dispatcher, *["fail"] * 4)
    business = await calls(dispatcher, *["business"] * 3)
    assert all(r.error_type is ErrorType.TOOL_ERROR and not r.retryable for r in business)
    async with background(dispatcher, upstream) as bg:
        await bg.start("holder")  # holds the only bulkhead place
        for _ in range(2):
            assert (await call(dispatcher)).error_type is ErrorType.OVERLOADED
        await bg.cancel("holder")
    await wait_until(lambda: dispatcher.workers.live().get(KEY, 0) == 0)
    assert dispatcher.breakers.state(KEY) == "closed"
    assert dispatcher.breakers.get(KEY).snapshot()["failure_rate"] == 1.0  # still 4 of 4
    await calls(dispatcher, "fail")
    assert dispatcher.breakers.state(KEY) == "open"  # 5 of 5


# -- a KeyBreaker on a fake clock ----------------------------------------------------------------
OUTCOMES = {
    "F": (Verdict.FAILURE, 0.0),
    "S": (Verdict.SUCCESS, 0.0),
    "slow": (Verdict.SUCCESS, 1.0),
}


def key_breaker(clock: FrozenClock, **settings: Any) -> KeyBreaker:
    options = BreakerOptions(reset_timeout_s=30, **settings)
    return Breakers(lambda key: options, clock=clock).get(KEY)


def feed(breaker: KeyBreaker, *outcomes: str) -> list[bool]:
    """Admit and record one call per outcome; whether each record opened the breaker."""
    opened = []
    for outcome in outcomes:
        token = breaker.admit()
        assert token != REJECT
        verdict, duration_s = OUTCOMES[outcome]
        opened.append(breaker.record(verdict, token, duration_s))
    return opened


def time_breaker(clock: FrozenClock) -> KeyBreaker:
    return key_breaker(clock, window="time", window_size=10, minimum_calls=5, failure_rate=0.5)


def test_a_count_window_smaller_than_minimum_calls_still_opens() -> None:
    """``window_size=5`` with the default ``minimum_calls=10``: the window never holds 10
    calls, so the minimum is capped at the window's size (as resilience4j does)."""
    breaker = key_breaker(FrozenClock(1000.0), window="count", window_size=5)
    assert feed(breaker, *"FFFF") == [False] * 4
    assert feed(breaker, "F") == [True]
    assert breaker.state == "open"


def test_a_success_that_fills_the_window_to_its_minimum_opens_it() -> None:
    """The rates are checked after every recorded call, as resilience4j does: four failures
    and then a success reach ``minimum_calls=5`` at an 80 % failure rate."""
    breaker = key_breaker(
        FrozenClock(1000.0), window="count", window_size=10, minimum_calls=5, failure_rate=0.5
    )
    assert feed(breaker, *"FFFF") == [False] * 4
    assert feed(breaker, "S") == [True]
    assert breaker.state == "open"


# -- 4. time window -------------------------------------------------------------------------------
@pytest.mark.parametrize(("later_s", "opens"), [(9.5, True), (10.5, False)])
def test_time_window_forgets_failures_older_than_the_window(later_s: float, opens: bool) -> None:
    clock = FrozenClock(1000.0)
    breaker = time_breaker(clock)
    assert feed(breaker, *"FFFF") == [False] * 4  # below minimum_calls
    clock.advance(later_s)
    assert breaker.rates() == ((1.0, 0.0) if opens else (0.0, 0.0))
    assert feed(breaker, "F") == [opens]  # 5 of 5, or 1 call in the window
    assert breaker.state == ("open" if opens else "closed")


def test_time_window_minimum_calls_counts_only_calls_inside_the_window() -> None:
    clock = FrozenClock(1000.0)
    breaker = time_breaker(clock)
    feed(breaker, *"SSS")
    clock.advance(11)
    assert feed(breaker, *"FFFF") == [False] * 4  # 4 calls inside (7 with the old ones: 57 %)
    assert breaker.state == "closed"
    assert feed(breaker, "F") == [True]


@pytest.mark.parametrize("jump_s", [11.0, 25.0, 1e6])
def test_time_window_a_clock_jump_longer_than_the_window_empties_it(jump_s: float) -> None:
    clock = FrozenClock(1000.0)
    breaker = time_breaker(clock)
    feed(breaker, *"SSSF")
    clock.advance(4)
    assert feed(breaker, *"SFSF") == [False] * 4  # 3 of 8
    clock.advance(jump_s)
    assert breaker.rates() == (0.0, 0.0)
    assert feed(breaker, *"FFFF") == [False] * 4  # would be 5 of 10 with the old calls
    assert feed(breaker, "F") == [True]


def test_time_window_a_shorter_jump_keeps_the_recent_seconds() -> None:
    clock = FrozenClock(1000.0)
    breaker = time_breaker(clock)
    feed(breaker, *"FF")
    clock.advance(6)
    assert feed(breaker, *"SSS") == [False] * 3  # 2 of 5
    clock.advance(6)  # the failures are 12 s old, the successes 6 s
    assert breaker.rates() == (0.0, 0.0)
    assert feed(breaker, *"FF") == [False] * 2  # 2 of 5
    assert feed(breaker, "F") == [True]  # 3 of 6


def test_a_verdict_counts_only_in_the_window_of_its_period() -> None:
    """A failure admitted before the breaker opened and closed again is not put into the
    new period's window."""
    clock = FrozenClock(1000.0)
    for window in ("count", "time"):
        breaker = key_breaker(
            clock, window=window, window_size=10, minimum_calls=2, failure_rate=0.5
        )
        stale = breaker.admit()
        assert feed(breaker, "F", "F") == [False, True]
        clock.advance(31)
        assert feed(breaker, "S") == [False]  # the trial closes it
        assert breaker.state == "closed"
        assert breaker.record(Verdict.FAILURE, stale, 0.0) is False
        assert breaker.rates() == (0.0, 0.0)
        assert feed(breaker, "S", "F") == [False, True]  # 1 of 2: the stale one is not there


# -- 5. slow-call rate ----------------------------------------------------------------------------
def slow_breaker(clock: FrozenClock, slow_call_rate: float) -> KeyBreaker:
    return key_breaker(
        clock,
        window="count",
        window_size=10,
        minimum_calls=5,
        failure_rate=0.5,
        slow_call_s=0.05,
        slow_call_rate=slow_call_rate,
    )


def test_slow_successes_open_on_their_own_rate() -> None:
    breaker = slow_breaker(FrozenClock(1000.0), 0.5)
    assert not any(feed(breaker, *["S"] * 5 + ["slow"] * 4))  # 4 of 9 slow
    assert breaker.rates() == pytest.approx((0.0, 4 / 9))
    assert breaker.snapshot()["failure_rate"] == 0.0
    assert feed(breaker, "slow") == [True]  # 5 of 10 slow, none failed
    assert breaker.state == "open"


def test_slow_calls_do_not_count_toward_the_failure_rate() -> None:
    breaker = slow_breaker(FrozenClock(1000.0), 0.8)
    assert not any(feed(breaker, "slow", "slow", "slow", "F", "F"))  # 2 of 5 failed, 3 slow
    assert breaker.rates() == pytest.approx((0.4, 0.6))
    assert feed(breaker, "F") == [True]  # 3 of 6 failed


async def test_slow_call_rate_through_the_dispatcher(sync: bool) -> None:
    """Slow successes answer ok and open the breaker on the slow-call rate alone."""
    config = KeyPolicy(
        breaker=BreakerOptions(
            window="count", window_size=10, minimum_calls=4, slow_call_s=0.05, slow_call_rate=0.5
        ),
        retry=RetryOptions(max_attempts=1),
    )
    dispatcher, _ = relay(config, sync)
    first = [await call(dispatcher), await call(dispatcher), await call(dispatcher, sleep=0.1)]
    assert dispatcher.breakers.state(KEY) == "closed"  # 3 calls: below minimum_calls
    assert dispatcher.breakers.get(KEY).snapshot()["failure_rate"] == 0.0
    last = await call(dispatcher, sleep=0.1)  # 2 of 4 slow
    assert all(r.ok for r in [*first, last])
    assert dispatcher.breakers.state(KEY) == "open"
    assert dispatcher.breakers.get(KEY).snapshot()["failure_rate"] == 0.0


# -- 6. growing break -----------------------------------------------------------------------------
async def test_failed_trials_double_the_break_up_to_its_maximum() -> None:
    config = KeyPolicy(
        breaker=BreakerOptions(fail_max=1, reset_timeout_s=0.05, reset_timeout_max_s=0.2),
        retry=RetryOptions(max_attempts=1),
    )
    # the breaker's clock stands still between calls: the answer's ``retry_after_s`` is the
    # whole break (on real time a loaded machine's stall ate into it)
    clock = FrozenClock(1000.0)
    dispatcher, _ = relay(config, clock=clock)
    breaker = dispatcher.breakers.get(KEY)

    async def paused_for(break_s: float) -> None:
        """The break now, and the answer's ``retry_after_s``."""
        assert breaker.break_s == pytest.approx(break_s)
        assert breaker.snapshot()["break_s"] == pytest.approx(break_s)
        answer = await call(dispatcher)
        assert answer.error_type is ErrorType.CIRCUIT_OPEN
        assert answer.retry_after_s == pytest.approx(break_s)
        clock.advance(break_s / 2)  # it counts down
        assert dispatcher.breakers.blocked_for(KEY) == pytest.approx(break_s / 2)

    assert (await call(dispatcher, do="fail")).error_type is ErrorType.TOOL_ERROR
    await paused_for(0.05)
    for break_s in (0.1, 0.2, 0.2):
        clock.advance(0.2)  # the break is over (at most 0.2 s): the next call is a trial
        assert (await call(dispatcher, do="fail")).error_type is ErrorType.TOOL_ERROR
        await paused_for(break_s)
    clock.advance(0.2)
    assert (await call(dispatcher)).ok
    assert dispatcher.breakers.state(KEY) == "closed"
    assert breaker.break_s == pytest.approx(0.05)  # closing resets the break
    assert (await call(dispatcher, do="fail")).error_type is ErrorType.TOOL_ERROR
    await paused_for(0.05)


# -- 7. a stale failure from an earlier closed period ---------------------------------------------
async def test_a_failure_admitted_before_a_recovery_does_not_count_after_it(sync: bool) -> None:
    """Call A is admitted while closed and fails only after the breaker opened and closed
    again: the new closed period starts from zero failures."""
    config = KeyPolicy(
        breaker=BreakerOptions(fail_max=2, reset_timeout_s=0.05), retry=RetryOptions(max_attempts=1)
    )
    dispatcher, upstream = relay(config, sync)
    async with background(dispatcher, upstream) as bg:
        await bg.start("A", "fail")
        await calls(dispatcher, "fail", "fail")
        assert dispatcher.breakers.state(KEY) == "open"
        await break_over(dispatcher)
        assert (await call(dispatcher, "trial")).ok
        assert dispatcher.breakers.state(KEY) == "closed"
        assert (await bg.finish("A")).error_type is ErrorType.TOOL_ERROR
    assert dispatcher.breakers.state(KEY) == "closed"
    assert dispatcher.breakers.get(KEY).snapshot()["failures"] == 0
    await calls(dispatcher, "fail")
    assert dispatcher.breakers.state(KEY) == "closed"  # 1 failure of this period, not 2
    assert dispatcher.breakers.get(KEY).snapshot()["failures"] == 1


# -- 8. configuration -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"window": "sliding"}, "window"),
        ({"failure_rate": 0}, "failure_rate"),
        ({"failure_rate": 1.5}, "failure_rate"),
        ({"failure_rate": math.nan}, "failure_rate"),
        ({"failure_rate": True}, "failure_rate"),
        ({"slow_call_rate": 0.5}, "slow_call_rate"),
        ({"slow_call_rate": 0, "slow_call_s": 1}, "slow_call_rate"),
        ({"slow_call_rate": 2, "slow_call_s": 1}, "slow_call_rate"),
        ({"reset_timeout_s": 1, "reset_timeout_max_s": 0.5}, "reset_timeout_max_s"),
        ({"reset_timeout_max_s": math.inf}, "reset_timeout_max_s"),
        ({"window_size": 0}, "window_size"),
        ({"window_size": 2.5}, "window_size"),
        ({"minimum_calls": 0}, "minimum_calls"),
    ],
)
def test_new_breaker_settings_are_checked(bad: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=f"BreakerOptions.{field} "):
        BreakerOptions(**bad)


def test_new_breaker_settings_accept_their_limits() -> None:
    config = BreakerOptions(
        window="time",
        window_size=1,
        minimum_calls=1,
        failure_rate=1,
        slow_call_s=0.5,
        slow_call_rate=1.0,
        reset_timeout_s=2,
        reset_timeout_max_s=2,
    )
    assert config.window == "time" and config.reset_timeout_max_s == 2


# -- 9. a pinned breaker says an operator paused it -----------------------------------------------
PINNED = "svc is paused: an operator paused up; calls are refused until it is released"
PINNED_MARK = "[unavailable: paused by an operator] "


def description(dispatcher: Dispatcher) -> str:
    (spec,) = dispatcher.specs(unavailable="mark")
    return str(spec["function"]["description"])


async def test_a_pinned_breaker_says_an_operator_paused_it() -> None:
    """``force_open`` pins the breaker: no trial ever comes while it is pinned, so the answer
    does not promise one "in 0.2 s" and the specs mark gives no "about N s". ``retry_after_s``
    stays set (hosts rely on it): the break, as an interval to ask again."""
    config = KeyPolicy(
        breaker=BreakerOptions(fail_max=1, reset_timeout_s=0.2), retry=RetryOptions(max_attempts=1)
    )
    dispatcher, upstream = relay(config)
    dispatcher.breakers.force_open(KEY)
    for _ in range(2):  # the same answer however long it has been pinned
        answer = await call(dispatcher)
        assert answer.error_type is ErrorType.CIRCUIT_OPEN and answer.retryable
        assert answer.retry_after_s == pytest.approx(0.2)
        assert answer.message == PINNED
        assert description(dispatcher).startswith(PINNED_MARK)
        assert "about" not in description(dispatcher)
    assert upstream.entered == []
    dispatcher.breakers.force_close(KEY)
    assert (await call(dispatcher)).ok
    # A breaker opened by failures still counts down to its trial.
    assert (await call(dispatcher, do="fail")).error_type is ErrorType.TOOL_ERROR
    answer = await call(dispatcher)
    assert answer.error_type is ErrorType.CIRCUIT_OPEN
    assert answer.message.startswith("svc is paused because up is failing; try again in ")
    assert description(dispatcher).startswith("[unavailable for about ")


async def test_a_breaker_pinned_between_attempts_says_an_operator_paused_it() -> None:
    """The pin lands while the first attempt runs: the retry is refused by the breaker stage
    itself (not the fast-fail check before it), with the same honest answer."""
    registry = ToolRegistry()
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(
            keys={
                KEY: KeyPolicy(
                    breaker=BreakerOptions(reset_timeout_s=0.2),
                    retry=RetryOptions(backoff_initial_s=0.001),
                )
            }
        ),
    )
    attempts = []

    @registry.tool(name="svc", parameters=ANY, breaker_key=KEY, timeout_s=10)
    async def svc(args: dict[str, Any], ctx: AuthContext) -> Any:
        attempts.append(1)
        dispatcher.breakers.force_open(KEY)
        raise ToolError("upstream 503", retryable=True)

    answer = await dispatcher.dispatch("svc", {})
    assert len(attempts) == 1
    assert answer.error_type is ErrorType.CIRCUIT_OPEN
    assert answer.retry_after_s == pytest.approx(0.2)
    assert answer.message == PINNED
