"""Breakers, retries and bulkheads per breaker_key, through the public API."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest

from helpers import OBJ, key_policy, wait_until
from toolrelay import (
    AuthContext,
    BreakerOptions,
    BulkheadOptions,
    Dispatcher,
    DispatcherOptions,
    ErrorType,
    KeyPolicy,
    ModelSlot,
    RetryOptions,
    ToolError,
    ToolRegistry,
    ToolResult,
)
from toolrelay.events import AttemptEnded, BreakerTransition, RetryScheduled
from toolrelay.testing import EventLog, FrozenClock

pytestmark = pytest.mark.anyio

ANY = {"type": "object"}


class Service:
    """A scripted upstream: each call pops the next behaviour (default: succeed)."""

    def __init__(self) -> None:
        self.script: list[str] = []
        self.calls = 0
        self.gate: anyio.Event | None = None
        self.inside = 0

    async def __call__(self, args: dict[str, Any], ctx: AuthContext) -> Any:
        self.calls += 1
        self.inside += 1
        try:
            step = self.script.pop(0) if self.script else "ok"
            if self.gate is not None:
                await self.gate.wait()
            if step == "hang":
                await anyio.sleep(60)
            if step == "crash":
                raise RuntimeError("boom")
            if step == "retryable":
                raise ToolError("upstream 503", retryable=True)
            if step == "retry_after":
                raise ToolError("upstream 429", retryable=True, retry_after_s=0.2)
            if step == "not_found":
                raise ToolError("no such city", counts_as_failure=False)
            if step == "slow":
                await anyio.sleep(0.15)
            return {"n": self.calls}
        finally:
            self.inside -= 1


def setup(
    config: KeyPolicy | None = None,
    *,
    risk: str = "read",
    timeout_s: float = 2.0,
    clock: FrozenClock | None = None,
    **kw: Any,
) -> tuple[Dispatcher, Service]:
    registry = ToolRegistry()
    service = Service()
    registry.tool(
        name="svc", parameters=ANY, breaker_key="up", risk=risk, timeout_s=timeout_s, **kw
    )(service)  # type: ignore[arg-type]
    registry.tool(name="svc2", parameters=ANY, breaker_key="up", timeout_s=timeout_s)(service)  # type: ignore[arg-type]
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(
            keys={
                "up": config
                or KeyPolicy(
                    breaker=BreakerOptions(fail_max=2, reset_timeout_s=30),
                    retry=RetryOptions(max_attempts=1),
                )
            },
            profiles={},
        ),
        **({} if clock is None else {"clock": clock}),
    )
    return dispatcher, service


async def call(dispatcher: Dispatcher, name: str = "svc", **kw: Any) -> ToolResult:
    return await dispatcher.dispatch(name, "{}", **kw)


# -- what counts ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("step", "first_error"),
    [
        ("crash", ErrorType.TOOL_ERROR),
        ("retryable", ErrorType.TOOL_ERROR),
        ("hang", ErrorType.TIMEOUT),
    ],
)
async def test_failures_open_the_breaker(step: str, first_error: ErrorType) -> None:
    # only the hang needs a short deadline: a crash answered after a loaded machine's
    # stall past 0.05 s would be a timeout
    dispatcher, service = setup(timeout_s=0.05 if step == "hang" else 2.0)
    service.script = [step, step]
    first = await call(dispatcher)
    tripping = await call(dispatcher)
    assert first.error_type is first_error
    assert tripping.error_type is first_error  # the tripping call answers with its own failure
    assert dispatcher.breakers.state("up") == "open"
    rejected = await call(dispatcher, "svc2")  # every tool on the key is cut off
    assert rejected.error_type is ErrorType.CIRCUIT_OPEN
    assert rejected.retryable and rejected.retry_after_s is not None
    assert 25 < rejected.retry_after_s <= 30
    assert rejected.to_model()["retry_after_s"] == round(rejected.retry_after_s, 3)
    assert service.calls == 2  # the handler was not called


async def test_business_answers_are_ignored_not_successes() -> None:
    dispatcher, service = setup()
    service.script = ["crash", "not_found", "not_found", "crash"]
    results = [await call(dispatcher) for _ in range(4)]
    assert results[1].error_type is ErrorType.TOOL_ERROR and not results[1].retryable
    # a success in between would have reset the count; ignored answers do not
    assert dispatcher.breakers.state("up") == "open"


async def test_success_resets_consecutive_failures() -> None:
    dispatcher, service = setup()
    service.script = ["crash", "ok", "crash", "ok"]
    for _ in range(4):
        await call(dispatcher)
    assert dispatcher.breakers.state("up") == "closed"


async def test_slow_successes_count_when_configured() -> None:
    dispatcher, service = setup(
        KeyPolicy(
            breaker=BreakerOptions(fail_max=2, slow_call_s=0.05), retry=RetryOptions(max_attempts=1)
        )
    )
    service.script = ["slow", "slow"]
    assert (await call(dispatcher)).ok
    assert (await call(dispatcher)).ok
    assert dispatcher.breakers.state("up") == "open"


async def test_caller_mistakes_never_reach_the_breaker() -> None:
    registry = ToolRegistry()
    strict = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

    @registry.tool(name="t", parameters=strict, breaker_key="k", risk="write")
    async def t(args: dict[str, Any], ctx: AuthContext) -> int:
        return 1

    dispatcher = Dispatcher(
        registry, DispatcherOptions(keys={"k": KeyPolicy(breaker=BreakerOptions(fail_max=1))})
    )
    for raw in ("{", '{"n": "x"}', "[]"):
        await dispatcher.dispatch("t", raw)
    assert (await dispatcher.dispatch("t", '{"n": 1}')).error_type is ErrorType.NEEDS_APPROVAL
    await dispatcher.dispatch("t", '{"n": 1}', profile="unknown-profile")
    assert dispatcher.breakers.state("k") == "closed"
    assert dispatcher.breakers.get("k").storage.counter == 0


async def test_slot_budget_timeout_does_not_count() -> None:
    dispatcher, service = setup(
        KeyPolicy(breaker=BreakerOptions(fail_max=1), retry=RetryOptions(max_attempts=1)),
        timeout_s=30,
    )
    service.script = ["hang", "hang"]
    for _ in range(2):
        async with ModelSlot(budget_s=0.05).hold() as slot:
            result = await call(dispatcher, slot=slot)
        assert result.error_type is ErrorType.TIMEOUT
    assert dispatcher.breakers.state("up") == "closed"


async def test_cancellation_is_neither_success_nor_failure() -> None:
    dispatcher, service = setup(
        KeyPolicy(
            breaker=BreakerOptions(fail_max=1, reset_timeout_s=0.05),
            retry=RetryOptions(max_attempts=1),
        )
    )

    async def cancelled_inside() -> bool:
        """A call cancelled by its host once it is inside the handler (not before)."""
        service.script = ["hang"]
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, dispatcher)
                await wait_until(lambda: service.inside == 1)
                scope.cancel()
        return scope.cancelled_caught

    assert await cancelled_inside()  # the cancellation propagated
    assert dispatcher.breakers.state("up") == "closed"
    # In half-open, a cancelled trial frees its place for the next trial.
    service.script = ["crash"]
    await call(dispatcher)
    assert dispatcher.breakers.state("up") == "open"
    await wait_until(lambda: dispatcher.breakers.blocked_for("up") is None)
    assert await cancelled_inside()
    assert dispatcher.breakers.get("up").trials == 0
    assert (await call(dispatcher)).ok
    assert dispatcher.breakers.state("up") == "closed"


# -- open and half-open -------------------------------------------------------------------------
async def test_open_fails_fast_without_waiting_the_deadline() -> None:
    dispatcher, service = setup(timeout_s=5)
    dispatcher.breakers.force_open("up")
    start = anyio.current_time()
    result = await call(dispatcher)
    assert result.error_type is ErrorType.CIRCUIT_OPEN
    assert anyio.current_time() - start < 2.5  # far below the 5 s deadline
    assert service.calls == 0
    assert result.attempts == 1


async def test_half_open_admits_limited_trials() -> None:
    config = KeyPolicy(
        breaker=BreakerOptions(fail_max=1, reset_timeout_s=0.05, half_open_max_calls=2),
        retry=RetryOptions(max_attempts=1),
    )
    clock = FrozenClock()
    dispatcher, service = setup(config, clock=clock)
    service.script = ["crash"]
    await call(dispatcher)
    assert dispatcher.breakers.state("up") == "open"
    clock.advance(0.05)
    service.gate = anyio.Event()
    results: list[ToolResult] = []

    async def one() -> None:
        results.append(await call(dispatcher))

    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(one)
        await wait_until(lambda: len(results) >= 4)
        assert service.inside == 2  # exactly two trials reached the service
        assert dispatcher.breakers.state("up") == "half_open"
        service.gate.set()
    rejected = [r for r in results if r.error_type is ErrorType.CIRCUIT_OPEN]
    assert len(rejected) == 4 and sum(r.ok for r in results) == 2
    assert dispatcher.breakers.state("up") == "closed"


async def test_success_threshold_and_reopen() -> None:
    config = KeyPolicy(
        breaker=BreakerOptions(fail_max=1, reset_timeout_s=0.05, success_threshold=2),
        retry=RetryOptions(max_attempts=1),
    )
    clock = FrozenClock()
    dispatcher, service = setup(config, clock=clock)
    service.script = ["crash"]
    await call(dispatcher)
    clock.advance(0.05)
    assert (await call(dispatcher)).ok
    assert dispatcher.breakers.state("up") == "half_open"
    assert (await call(dispatcher)).ok
    assert dispatcher.breakers.state("up") == "closed"
    service.script = ["crash"]
    await call(dispatcher)
    clock.advance(0.05)
    service.script = ["ok", "crash"]
    assert (await call(dispatcher)).ok
    failed = await call(dispatcher)
    assert failed.error_type is ErrorType.TOOL_ERROR  # one failure in half-open re-opens
    assert dispatcher.breakers.state("up") == "open"


async def test_concurrent_calls_on_one_key_are_not_serialised() -> None:
    dispatcher, service = setup(
        KeyPolicy(retry=RetryOptions(max_attempts=1), bulkhead=BulkheadOptions(max_concurrent=64))
    )
    service.gate = anyio.Event()
    results: list[ToolResult] = []

    async def one() -> None:
        results.append(await call(dispatcher))

    async with anyio.create_task_group() as tg:
        for _ in range(50):
            tg.start_soon(one)
        await wait_until(lambda: service.inside >= 50)
        service.gate.set()  # all 50 were inside the handler at the same time
    assert len(results) == 50 and all(r.ok for r in results)


# -- specs follow health --------------------------------------------------------------------
async def test_specs_follow_breaker_health() -> None:
    dispatcher, service = setup(
        KeyPolicy(
            breaker=BreakerOptions(fail_max=1, reset_timeout_s=0.1),
            retry=RetryOptions(max_attempts=1),
        ),
        clock=(clock := FrozenClock()),
    )
    assert {s["function"]["name"] for s in dispatcher.specs()} == {"svc", "svc2"}
    service.script = ["crash"]
    await call(dispatcher)
    assert dispatcher.specs() == []
    marked = dispatcher.specs(unavailable="mark")
    assert all(s["function"]["description"].startswith("[unavailable") for s in marked)
    assert len(dispatcher.specs(unavailable="show")) == 2
    clock.advance(0.1)  # reset timeout passed: offered again so a trial can close it
    assert len(dispatcher.specs()) == 2
    assert (await call(dispatcher)).ok
    assert dispatcher.breakers.state("up") == "closed"


# -- retries -------------------------------------------------------------------------------------
def retrying(max_attempts: int = 3, **kw: Any) -> tuple[Dispatcher, Service, EventLog]:
    registry = ToolRegistry()
    service = Service()
    for name, risk in (("read", "read"), ("write", "write")):
        registry.tool(name=name, parameters=ANY, breaker_key="up", risk=risk)(service)  # type: ignore[arg-type]
    registry.tool(name="once", parameters=ANY, breaker_key="up", max_attempts=1)(service)  # type: ignore[arg-type]
    recorder = EventLog()
    config = key_policy(fail_max=kw.pop("fail_max", 10), max_attempts=max_attempts, **kw)
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(keys={"up": config}),
        observers=[recorder],
        approver=lambda *a: True,
    )
    return dispatcher, service, recorder


async def test_idempotent_tools_retry_retryable_failures() -> None:
    dispatcher, service, recorder = retrying(backoff_initial_s=0.01)
    service.script = ["retryable", "retryable", "ok"]
    result = await call(dispatcher, "read")
    assert result.ok and result.attempts == 3 and service.calls == 3
    sleeps = recorder.events(RetryScheduled)
    assert [s.attempt for s in sleeps] == [1, 2]
    assert 0.01 <= sleeps[0].delay_s <= 0.016 and 0.02 <= sleeps[1].delay_s <= 0.026
    attempts = recorder.events(AttemptEnded)
    assert [(a.attempt, a.result) for a in attempts] == [
        (1, "tool_error"),
        (2, "tool_error"),
        (3, "ok"),
    ]


async def test_retries_give_up_with_the_last_real_outcome() -> None:
    dispatcher, service, _ = retrying(backoff_initial_s=0.01)
    service.script = ["retryable"] * 5
    result = await call(dispatcher, "read")
    assert result.error_type is ErrorType.TOOL_ERROR and result.attempts == 3
    assert service.calls == 3


@pytest.mark.parametrize(
    ("tool", "step"),
    [("write", "retryable"), ("read", "crash"), ("read", "not_found"), ("once", "retryable")],
)
async def test_what_is_never_retried(tool: str, step: str) -> None:
    dispatcher, service, _ = retrying(backoff_initial_s=0.01)
    service.script = [step, "ok"]
    result = await call(dispatcher, tool)
    assert not result.ok and result.attempts == 1 and service.calls == 1


async def test_retry_never_sleeps_past_the_deadline() -> None:
    registry = ToolRegistry()
    service = Service()
    registry.tool(name="read", parameters=ANY, breaker_key="up", timeout_s=3)(service)  # type: ignore[arg-type]
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(
            keys={"up": KeyPolicy(retry=RetryOptions(max_attempts=5, backoff_initial_s=10.0))}
        ),
    )
    service.script = ["retryable"] * 5
    start = anyio.current_time()
    result = await call(dispatcher, "read")
    assert result.error_type is ErrorType.TOOL_ERROR and result.attempts == 1
    assert anyio.current_time() - start < 3  # answered without sleeping into the deadline


async def test_no_retry_after_the_breaker_opened() -> None:
    dispatcher, service, recorder = retrying(max_attempts=5, fail_max=2, backoff_initial_s=0.01)
    service.script = ["retryable"] * 5
    result = await call(dispatcher, "read")
    assert result.error_type is ErrorType.TOOL_ERROR  # the tripping failure, not circuit_open
    assert result.attempts == 2 and service.calls == 2
    transitions = recorder.events(BreakerTransition)
    assert transitions == [BreakerTransition("up", "closed", "open")]


async def test_retry_after_hint_is_honoured() -> None:
    dispatcher, service, recorder = retrying(backoff_initial_s=0.01)
    service.script = ["retry_after", "ok"]
    assert (await call(dispatcher, "read")).ok
    (sleep,) = recorder.events(RetryScheduled)
    assert sleep.delay_s >= 0.2


async def test_cancellation_between_retries_propagates() -> None:
    dispatcher, service, recorder = retrying(backoff_initial_s=5)
    service.script = ["retryable", "ok"]
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(call, dispatcher, "read")
            await wait_until(lambda: bool(recorder.events(RetryScheduled)))  # in its back-off
            scope.cancel()
    assert scope.cancelled_caught and service.calls == 1
    assert dispatcher.breakers.get("up").storage.counter == 1  # only the real failure counted


# -- bulkheads -----------------------------------------------------------------------------------
async def test_bulkhead_sheds_load_at_once() -> None:
    dispatcher, service = setup(
        KeyPolicy(
            breaker=BreakerOptions(fail_max=1),
            retry=RetryOptions(max_attempts=1),
            bulkhead=BulkheadOptions(max_concurrent=2),
        )
    )
    service.gate = anyio.Event()
    results: list[ToolResult] = []

    async def one() -> None:
        results.append(await call(dispatcher))

    async with anyio.create_task_group() as tg:
        tg.start_soon(one)
        tg.start_soon(one)
        await wait_until(lambda: service.inside >= 2)
        shed = await call(dispatcher)
        assert shed.error_type is ErrorType.OVERLOADED and shed.retryable
        assert dispatcher.bulkhead.in_flight() == {"up": 2}
        service.gate.set()
    assert all(r.ok for r in results)
    assert dispatcher.breakers.state("up") == "closed"  # shedding is not a failure
    assert dispatcher.bulkhead.in_flight() == {"up": 0}


async def test_bulkhead_bounded_wait() -> None:
    config = KeyPolicy(
        retry=RetryOptions(max_attempts=1), bulkhead=BulkheadOptions(max_concurrent=1, wait_s=2.0)
    )
    dispatcher, service = setup(config)
    service.gate = anyio.Event()
    results: list[ToolResult] = []

    async def one() -> None:
        results.append(await call(dispatcher))

    async with anyio.create_task_group() as tg:
        tg.start_soon(one)
        tg.start_soon(one)
        await wait_until(lambda: service.inside >= 1)
        await anyio.sleep(0.05)  # time for the second call to (wrongly) get in too
        assert service.inside == 1
        service.gate.set()
    assert len(results) == 2 and all(r.ok for r in results)


async def test_hung_sync_threads_are_bounded_per_key() -> None:
    registry = ToolRegistry()
    release = threading.Event()
    entered: list[int] = []

    # The deadline leaves a loaded machine time to start the five threads; a job whose
    # thread starts after its deadline is skipped, never run late (and not "abandoned").
    @registry.tool(name="legacy", parameters=OBJ, breaker_key="A", timeout_s=0.5)
    def legacy(args: dict[str, Any], ctx: AuthContext) -> str:
        entered.append(1)
        release.wait(30)
        return "late"

    @registry.tool(name="other", parameters=OBJ, breaker_key="B", timeout_s=2)
    def other(args: dict[str, Any], ctx: AuthContext) -> str:
        return "fine"

    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(
            keys={
                "A": KeyPolicy(
                    breaker=BreakerOptions(fail_max=1000),
                    retry=RetryOptions(max_attempts=1),
                    bulkhead=BulkheadOptions(max_concurrent=5),
                )
            }
        ),
    )
    try:
        results = await dispatcher.dispatch_many(
            [_call("legacy") for _ in range(8)] + [_call("other")]
        )
        kinds = [r.error_type for r in results[:8]]
        assert kinds.count(ErrorType.TIMEOUT) == 5  # five places taken, five deadlines
        assert kinds.count(ErrorType.OVERLOADED) == 3
        assert results[8].ok and results[8].data == "fine"  # key B is untouched
        # Every handler that started is abandoned and still holds its place; a job whose
        # thread came too late was skipped and gave its place back.
        await wait_until(lambda: dispatcher.workers.live()["A"] == len(entered))
        assert entered  # at least one handler started within its deadline
        assert dispatcher.workers.abandoned()["A"] == len(entered)
        # The abandoned threads still hold their places: once all five are taken by hung
        # handlers, more calls are shed and none is started.
        for _ in range(10):
            if dispatcher.workers.live()["A"] == 5:
                break
            await dispatcher.dispatch("legacy", "{}")
        assert dispatcher.workers.abandoned()["A"] == len(entered) == 5
        shed = await dispatcher.dispatch("legacy", "{}")
        assert shed.error_type is ErrorType.OVERLOADED
        assert dispatcher.workers.live()["A"] == 5
    finally:
        release.set()
    await wait_until(lambda: not dispatcher.workers.live()["A"])
    assert dispatcher.workers.abandoned()["A"] == 0
    assert (await dispatcher.dispatch("legacy", "{}")).data == "late"  # places freed again


def _call(name: str) -> Any:
    from toolrelay import ToolCall

    return ToolCall(name, "{}")


# -- operator controls and listeners -------------------------------------------------------------
async def test_force_open_close_reset_and_listeners() -> None:
    dispatcher, service = setup(
        KeyPolicy(
            breaker=BreakerOptions(fail_max=1, reset_timeout_s=0.01),
            retry=RetryOptions(max_attempts=1),
        )
    )
    seen: list[tuple[str, str, str]] = []
    dispatcher.breakers.add_listener(lambda key, old, new: seen.append((key, old, new)))
    dispatcher.breakers.force_open("up")
    await anyio.sleep(0.02)
    assert (await call(dispatcher)).error_type is ErrorType.CIRCUIT_OPEN  # pinned: no trial
    assert dispatcher.breakers.snapshot()["up"]["pinned_open"] is True
    dispatcher.breakers.force_close("up")
    assert dispatcher.breakers.state("up") == "closed"
    assert (await call(dispatcher)).ok
    service.script = ["crash"]
    await call(dispatcher)
    dispatcher.breakers.reset("up")
    assert dispatcher.breakers.snapshot()["up"] == {
        "state": "closed",
        "failures": 0,
        "trials_in_flight": 0,
        "retry_after_s": None,
        "pinned_open": False,
        "failure_rate": None,  # a consecutive-failures breaker keeps no rate
        "slow_call_rate": None,
        "break_s": 0.01,
    }
    assert seen == [
        ("up", "closed", "open"),
        ("up", "open", "closed"),
        ("up", "closed", "open"),
        ("up", "open", "closed"),
    ]


@pytest.mark.parametrize(
    "bad",
    [
        {"fail_max": 0},
        {"max_concurrent": 0},
        {"max_attempts": 0},
        {"reset_timeout_s": -1},
        {"slow_call_s": 0},
        {"half_open_max_calls": 1.5},
    ],
)
def test_breaker_config_is_checked(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"(Breaker|Bulkhead|Retry)Options\."):
        key_policy(**bad)


async def test_sync_handler_failures_and_timeouts_open_the_breaker() -> None:
    registry = ToolRegistry()
    release = threading.Event()
    script = ["fail", "hang"]

    # The deadline leaves a loaded machine time to start the thread that fails: a job whose
    # thread starts after its deadline is skipped (answered timeout, its step never taken).
    @registry.tool(name="legacy", parameters=OBJ, breaker_key="crm", timeout_s=1.0)
    def legacy(args: dict[str, Any], ctx: AuthContext) -> str:
        step = script.pop(0) if script else "ok"
        if step == "fail":
            raise ToolError("crm 503", retryable=True)
        if step == "hang":
            release.wait(10)
        return "ok"

    config = KeyPolicy(
        breaker=BreakerOptions(fail_max=2, reset_timeout_s=30), retry=RetryOptions(max_attempts=1)
    )
    dispatcher = Dispatcher(registry, DispatcherOptions(keys={"crm": config}))
    try:
        first = await dispatcher.dispatch("legacy", "{}")
        second = await dispatcher.dispatch("legacy", "{}")
        third = await dispatcher.dispatch("legacy", "{}")
    finally:
        release.set()
    assert (first.error_type, second.error_type) == (ErrorType.TOOL_ERROR, ErrorType.TIMEOUT)
    assert third.error_type is ErrorType.CIRCUIT_OPEN and script == []


async def test_sync_places_are_given_back_even_when_the_deadline_beats_the_thread() -> None:
    registry = ToolRegistry()

    @registry.tool(name="quick", parameters=OBJ, breaker_key="q", timeout_s=0.002)
    def quick(args: dict[str, Any], ctx: AuthContext) -> str:
        threading.Event().wait(0.01)
        return "ok"

    config = KeyPolicy(
        breaker=BreakerOptions(fail_max=1_000_000),
        retry=RetryOptions(max_attempts=1),
        bulkhead=BulkheadOptions(max_concurrent=200),
    )
    dispatcher = Dispatcher(registry, DispatcherOptions(keys={"q": config}, telemetry=False))
    results = await dispatcher.dispatch_many([_call("quick") for _ in range(200)])
    assert {r.error_type for r in results} <= {ErrorType.TIMEOUT, None}
    await wait_until(lambda: dispatcher.workers.live()["q"] == 0)
    assert dispatcher.workers.abandoned()["q"] == 0
    again = await dispatcher.dispatch_many([_call("quick") for _ in range(200)])
    assert all(r.error_type is not ErrorType.OVERLOADED for r in again)  # no place leaked


async def test_an_open_breaker_answers_before_arguments_or_approval() -> None:
    registry = ToolRegistry()
    asked: list[str] = []

    @registry.tool(name="edit", parameters=OBJ, breaker_key="crm", risk="write")
    async def edit(args: dict[str, Any], ctx: AuthContext) -> str:
        return "edited"

    async def approver(call: Any, decl: Any, ctx: AuthContext) -> bool:
        asked.append(call.name)
        return True

    dispatcher = Dispatcher(registry, approver=approver)
    dispatcher.breakers.force_open("crm")
    for raw in ("{}", "{not json"):
        result = await dispatcher.dispatch("edit", raw)
        assert result.error_type is ErrorType.CIRCUIT_OPEN and result.attempts == 1
    assert asked == []  # nobody was asked to approve a call that fails fast
    assert (await dispatcher.dispatch("nope", "{not json")).error_type is ErrorType.UNKNOWN_TOOL
    dispatcher.breakers.force_close("crm")
    assert (await dispatcher.dispatch("edit", "{not json")).error_type is (
        ErrorType.INVALID_ARGUMENTS
    )
    assert (await dispatcher.dispatch("edit", "{}")).ok and asked == ["edit"]
