"""SyncDispatcher: the dispatcher for threads, on one event loop behind a BlockingPortal.

Every test drives it from real threads (16 at once where it matters) on both backends; joins
are bounded, so a hang fails the test instead of freezing the run.
"""

from __future__ import annotations

import gc
import http.client
import importlib.util
import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import sniffio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from toolrelay import (
    AuthContext,
    BreakerOptions,
    CallCancelled,
    Dispatcher,
    DispatcherClosed,
    DispatcherOptions,
    ErrorType,
    KeyPolicy,
    ToolCall,
    ToolDeclaration,
    ToolError,
    ToolRegistry,
    ToolResult,
)
from toolrelay.sync import SyncDispatcher

ROOT = Path(__file__).resolve().parent.parent
THREADS = 16
JOIN_S = 10.0
"""Bound on every join: far above what any test needs, far below a hang."""
OBJ = {"type": "object", "properties": {}, "additionalProperties": False}
ECHO = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}


@pytest.fixture(params=["asyncio", "trio"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Tools:
    """The tools every test uses, and what they saw."""

    def __init__(self) -> None:
        self.registry = ToolRegistry()
        self.release = threading.Event()
        """Ends every blocked or shielded handler (set at teardown)."""
        self.lock = threading.Lock()
        self.entered = 0
        self.cancelled = 0
        self.failures = 0
        self.closed = 0
        self.closed_on = ""
        reg = self.registry

        @reg.tool(name="echo", parameters=ECHO, breaker_key="echo")
        async def echo(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
            await anyio.lowlevel.checkpoint()
            return {"n": args["n"], "user": ctx.user_id}

        @reg.tool(name="echo_sync", parameters=ECHO, breaker_key="echo-sync")
        def echo_sync(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
            return {"n": args["n"], "user": ctx.user_id}

        @reg.tool(name="library", parameters=OBJ)
        async def library(args: dict[str, Any], ctx: AuthContext) -> str:
            return sniffio.current_async_library()

        @reg.tool(name="flaky", parameters=OBJ, breaker_key="flaky", max_attempts=1)
        async def flaky(args: dict[str, Any], ctx: AuthContext) -> None:
            with self.lock:
                self.failures += 1
            raise ToolError("the service is down", counts_as_failure=True)

        @reg.tool(name="slow", parameters=OBJ, timeout_s=0.5, breaker_key="slow")
        async def slow(args: dict[str, Any], ctx: AuthContext) -> None:
            await anyio.sleep(30)

        @reg.tool(name="slow_sync", parameters=OBJ, timeout_s=0.5, breaker_key="slow-sync")
        def slow_sync(args: dict[str, Any], ctx: AuthContext) -> None:
            self.release.wait(30)

        @reg.tool(name="hang", parameters=OBJ, timeout_s=60, breaker_key="hang")
        async def hang(args: dict[str, Any], ctx: AuthContext) -> None:
            self._enter()
            try:
                await anyio.sleep(60)
            except anyio.get_cancelled_exc_class():
                with self.lock:
                    self.cancelled += 1
                raise

        @reg.tool(name="hang_sync", parameters=OBJ, timeout_s=60, breaker_key="hang-sync")
        def hang_sync(args: dict[str, Any], ctx: AuthContext) -> None:
            self._enter()
            self.release.wait(60)

        @reg.tool(name="stubborn", parameters=OBJ, timeout_s=60, breaker_key="stubborn")
        async def stubborn(args: dict[str, Any], ctx: AuthContext) -> None:
            self._enter()
            with anyio.CancelScope(shield=True):
                while not self.release.is_set():  # noqa: ASYNC110 (a threading.Event)
                    await anyio.sleep(0.01)

        self.registry.register(_Closing(self))

    def _enter(self) -> None:
        with self.lock:
            self.entered += 1

    def wait_entered(self, count: int) -> None:
        deadline = time.monotonic() + JOIN_S
        while self.entered < count:
            assert time.monotonic() < deadline, f"only {self.entered} of {count} calls started"
            time.sleep(0.005)


class _Closing:
    """A plugin with ``aclose()``: the dispatcher's close must reach it, on the loop."""

    def __init__(self, tools: Tools) -> None:
        self.tools = tools

    def describe(self) -> list[ToolDeclaration]:
        return [ToolDeclaration(name="noop", description="Nothing.", parameters=OBJ)]

    async def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> str:
        return "ok"

    async def aclose(self) -> None:
        await anyio.lowlevel.checkpoint()
        self.tools.closed_on = threading.current_thread().name
        self.tools.closed += 1


@pytest.fixture
def tools() -> Iterator[Tools]:
    t = Tools()
    yield t
    t.release.set()


@pytest.fixture
def relay(tools: Tools, backend: str) -> Iterator[SyncDispatcher]:
    sd = SyncDispatcher(
        Dispatcher(
            tools.registry,
            DispatcherOptions(
                telemetry=False,
                keys={"flaky": KeyPolicy(breaker=BreakerOptions(fail_max=5, reset_timeout_s=60))},
            ),
            audit=None,
        ),
        backend=backend,
    )
    yield sd
    tools.release.set()
    sd.close()


def in_threads(count: int, work: Callable[[int], Any]) -> list[Any]:
    """Run ``work(i)`` in ``count`` threads started together; each one's return value or
    exception, in order. Fails if any thread is still running after ``JOIN_S``."""
    out: list[Any] = [None] * count
    start = threading.Barrier(count)

    def run(i: int) -> None:
        start.wait(JOIN_S)
        try:
            out[i] = work(i)
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return out


# -- answers --------------------------------------------------------------------------------


def test_answers_are_the_async_dispatchers(tools: Tools, relay: SyncDispatcher) -> None:
    """The same ToolResults (envelopes) as awaiting Dispatcher.dispatch, errors included."""
    reference = Dispatcher(tools.registry, DispatcherOptions(telemetry=False), audit=None)
    cases: list[tuple[str, Any]] = [
        ("echo", '{"n": 7}'),
        ("echo_sync", {"n": 8}),
        ("nope", "{}"),
        ("echo", '{"n": '),
        ("echo", '{"n": "seven"}'),
        ("flaky", None),
    ]
    ctx = AuthContext(user_id="u1")
    for name, raw in cases:
        got = relay.dispatch(name, raw, ctx, call_id="c1")
        want = anyio.run(reference.dispatch, name, raw, ctx)
        assert isinstance(got, ToolResult)
        assert got.to_model() == want.to_model()
        assert got.call_id == "c1"
    assert relay.dispatch("nope").error_type is ErrorType.UNKNOWN_TOOL
    assert relay.dispatch("echo", "{bad json").error_type is ErrorType.INVALID_ARGUMENTS


def test_runs_on_the_chosen_backend(tools: Tools, backend: str) -> None:
    """asyncio by default; trio when asked."""
    with SyncDispatcher(Dispatcher(tools.registry, DispatcherOptions(telemetry=False))) as default:
        assert default.dispatch("library").data == "asyncio"
    with SyncDispatcher(
        Dispatcher(tools.registry, DispatcherOptions(telemetry=False)), backend=backend
    ) as sd:
        assert sd.dispatch("library").data == backend


def test_unknown_backend_fails_at_construction(tools: Tools) -> None:
    before = threading.active_count()
    with pytest.raises(LookupError):
        SyncDispatcher(
            Dispatcher(tools.registry, DispatcherOptions(telemetry=False)), backend="nope"
        )
    deadline = time.monotonic() + JOIN_S
    while threading.active_count() > before:  # the loop thread ended with the error
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_sixteen_threads_each_get_their_own_answer(relay: SyncDispatcher) -> None:
    """Sync and async tools and error answers, interleaved from 16 threads."""

    def work(i: int) -> list[tuple[str, Any]]:
        ctx = AuthContext(user_id=f"user-{i}")
        seen = []
        for j in range(25):
            n = i * 1000 + j
            tool = "echo" if j % 2 else "echo_sync"
            result = relay.dispatch(tool, {"n": n}, ctx, call_id=f"{i}-{j}")
            assert result.call_id == f"{i}-{j}"
            seen.append(("ok", result.data))
            bad = relay.dispatch("echo", '{"n": ' if j % 3 else '{"n": "x"}', ctx)
            seen.append(("bad", bad.to_model()["error_type"]))
            seen.append(("unknown", relay.dispatch(f"missing_{i}", "{}", ctx).error_type))
        return seen

    for i, seen in enumerate(in_threads(THREADS, work)):
        assert not isinstance(seen, Exception), seen
        oks = [data for kind, data in seen if kind == "ok"]
        assert oks == [{"n": i * 1000 + j, "user": f"user-{i}"} for j in range(25)]
        bad = [data for kind, data in seen if kind == "bad"]
        assert set(bad) == {"invalid_arguments", "validation_error"}
        assert {data for kind, data in seen if kind == "unknown"} == {ErrorType.UNKNOWN_TOOL}


def test_a_breaker_opens_for_every_thread(tools: Tools, relay: SyncDispatcher) -> None:
    """16 threads share one breaker per key: it opens after fail_max failures, and from
    then on every thread is answered circuit_open without the tool running."""

    def work(i: int) -> list[ToolResult]:
        return [relay.dispatch("flaky") for _ in range(10)]

    answers = in_threads(THREADS, work)
    flat = [r for per_thread in answers for r in per_thread]
    errors = [r for r in flat if r.error_type is ErrorType.TOOL_ERROR]
    opened = [r for r in flat if r.error_type is ErrorType.CIRCUIT_OPEN]
    assert len(errors) + len(opened) == THREADS * 10
    assert len(errors) == tools.failures  # an open breaker never ran the tool
    # fail_max failures open it; at most the other 15 threads' calls were already admitted
    assert 5 <= len(errors) <= 5 + THREADS - 1
    assert all(per_thread[-1].error_type is ErrorType.CIRCUIT_OPEN for per_thread in answers)
    assert all(r.retryable and r.retry_after_s is not None for r in opened)
    assert relay.dispatcher.breakers.state("flaky") == "open"
    assert relay.dispatcher.breakers.blocked_for("flaky") is not None
    assert "flaky" not in {s["function"]["name"] for s in relay.specs()}
    assert "flaky" in {s["function"]["name"] for s in relay.specs(unavailable="show")}


def test_deadlines_of_sync_and_async_tools_from_threads(relay: SyncDispatcher) -> None:
    """Blocking sync handlers and sleeping async ones are answered timeout at their 0.5 s
    deadline, for 16 threads at once (the slack only absorbs a loaded machine)."""

    def work(i: int) -> tuple[ToolResult, float]:
        started = time.monotonic()
        result = relay.dispatch("slow_sync" if i % 2 else "slow")
        return result, time.monotonic() - started

    for i, answer in enumerate(in_threads(THREADS, work)):
        assert not isinstance(answer, Exception), answer
        result, took = answer
        assert result.error_type is ErrorType.TIMEOUT, (i, result)
        assert result.retryable
        assert 0.45 <= took < 0.5 + 3.0, took


def test_dispatch_many_from_threads(relay: SyncDispatcher) -> None:
    """Results in input order; on_result runs in the calling thread, once per call, and a
    callback that raises does not lose the other answers."""

    def work(i: int) -> tuple[list[ToolResult], list[int], set[int]]:
        me = threading.get_ident()
        indices: list[int] = []
        callers: set[int] = set()

        def on_result(index: int, result: ToolResult) -> None:
            indices.append(index)
            callers.add(threading.get_ident())
            if i == 3 and index == 0:
                raise ValueError("a host bug")

        calls = [
            ToolCall("echo", {"n": i}, call_id="a"),
            ToolCall("nope", "{}", call_id="b"),
            ToolCall("echo_sync", '{"n": ', call_id="c"),
            ToolCall("slow", "{}", call_id="d"),
            ToolCall("echo_sync", {"n": -i}, call_id="e"),
        ]
        results = relay.dispatch_many(calls, on_result=on_result)
        assert callers == {me}
        return results, indices, callers

    for i, answer in enumerate(in_threads(THREADS, work)):
        assert not isinstance(answer, Exception), answer
        results, indices, _ = answer
        assert [r.call_id for r in results] == ["a", "b", "c", "d", "e"]
        assert [r.error_type for r in results] == [
            None,
            ErrorType.UNKNOWN_TOOL,
            ErrorType.INVALID_ARGUMENTS,
            ErrorType.TIMEOUT,
            None,
        ]
        assert results[0].data == {"n": i, "user": None}
        assert results[4].data == {"n": -i, "user": None}
        assert sorted(indices) == [0, 1, 2, 3, 4]
        assert indices[-1] == 3  # the slow one is answered last: callbacks come as answered
    assert relay.dispatch_many([]) == []


def test_specs_from_threads(relay: SyncDispatcher) -> None:
    names = in_threads(THREADS, lambda i: {s["name"] for s in relay.specs(format="mcp")})
    assert all(n == names[0] for n in names)
    assert {"echo", "echo_sync", "noop"} <= names[0]
    with pytest.raises(ValueError, match="unknown format"):
        relay.specs(format="nope")


def test_spans_nest_under_the_calling_threads_span(tools: Tools, backend: str) -> None:
    """The calling thread's context (OpenTelemetry's current span) travels with the call,
    for async and sync handlers, from 16 threads."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("host")
    dispatcher = Dispatcher(
        tools.registry, metrics_registry=CollectorRegistry(), tracer_provider=provider
    )
    with SyncDispatcher(dispatcher, backend=backend) as sd:

        def work(i: int) -> int:
            with tracer.start_as_current_span(f"request {i}") as span:
                assert sd.dispatch("echo" if i % 2 else "echo_sync", {"n": i}).ok
                return span.get_span_context().span_id

        parents = in_threads(THREADS, work)
    spans = exporter.get_finished_spans()
    tool_spans = [s for s in spans if s.name.startswith("execute_tool")]
    assert len(tool_spans) == THREADS
    assert sorted(s.parent.span_id for s in tool_spans if s.parent) == sorted(parents)


# -- the model slot ---------------------------------------------------------------------------


def test_model_slot_caps_deadlines_and_serialises_threads(relay: SyncDispatcher) -> None:
    slot = relay.model_slot(budget_s=0.4)
    assert slot.budget_s == 0.4
    with slot.hold() as lease:
        started = time.monotonic()
        result = relay.dispatch("hang", slot=lease)  # its own timeout is 60 s
        took = time.monotonic() - started
    assert result.error_type is ErrorType.TIMEOUT
    assert "budget" in result.message
    assert took < 0.4 + 3.0

    order: list[tuple[int, str]] = []

    def work(i: int) -> None:
        with slot.hold(budget_s=5) as lease:
            order.append((i, "in"))
            assert relay.dispatch("echo", {"n": i}, slot=lease).ok
            time.sleep(0.01)
            order.append((i, "out"))

    in_threads(8, work)
    assert len(order) == 16
    for k in range(0, 16, 2):  # capacity one: every hold ends before the next begins
        assert order[k][0] == order[k + 1][0]
        assert (order[k][1], order[k + 1][1]) == ("in", "out")


def test_close_ends_a_wait_for_the_slot(relay: SyncDispatcher) -> None:
    slot = relay.model_slot()
    held = threading.Event()
    done = threading.Event()

    def holder() -> None:
        with slot.hold():
            held.set()
            done.wait(JOIN_S)

    keeper = threading.Thread(target=holder, daemon=True)
    keeper.start()
    assert held.wait(JOIN_S)

    def waiter(i: int) -> str:
        with slot.hold():
            return "held"

    closer = threading.Timer(0.3, relay.close)
    closer.start()
    (outcome,) = in_threads(1, waiter)  # returns: close() ended the wait
    # CallCancelled, or DispatcherClosed on a machine too loaded to start waiting in 0.3 s
    assert isinstance(outcome, DispatcherClosed), outcome
    done.set()
    keeper.join(JOIN_S)
    closer.join(JOIN_S)
    with pytest.raises(DispatcherClosed):
        relay.model_slot()


# -- shutdown ---------------------------------------------------------------------------------


def test_close_with_calls_in_flight(tools: Tools, relay: SyncDispatcher) -> None:
    """close() from another thread: calls in flight get CallCancelled (never an answer),
    dispatch_many included; quick calls got answers until then, later calls
    DispatcherClosed; nothing hangs; the dispatcher's plugins are closed on the loop."""
    early: list[tuple[int, bool]] = []

    def work(i: int) -> list[Any]:
        if i < 6:
            return [relay.dispatch("hang")]
        if i < 12:
            return [relay.dispatch("hang_sync")]
        if i == 12:
            calls = [ToolCall("echo", {"n": 12}), ToolCall("hang")]
            return [relay.dispatch_many(calls, on_result=lambda k, r: early.append((k, r.ok)))]
        seen: list[Any] = []
        # until refused: a caller told to stop once close() returned could have been
        # descheduled between its last answer and that check, and never called again
        refused_by = time.monotonic() + 3 * JOIN_S
        while time.monotonic() < refused_by:
            try:
                seen.append(relay.dispatch("echo", {"n": i}).to_model())
            except DispatcherClosed as exc:
                seen.append(exc)
                break
        return seen

    def close_later() -> None:
        tools.wait_entered(13)
        deadline = time.monotonic() + JOIN_S
        while not early and time.monotonic() < deadline:
            time.sleep(0.005)
        relay.close()

    closer = threading.Thread(target=close_later, daemon=True)
    closer.start()
    outcomes = in_threads(THREADS, work)
    closer.join(JOIN_S)
    assert not closer.is_alive()

    for i, outcome in enumerate(outcomes):
        if i <= 12:
            assert isinstance(outcome, CallCancelled), (i, outcome)
        else:
            assert not isinstance(outcome, Exception), outcome
            *answers, last = outcome
            assert answers, "a quick caller got no answer before close"
            assert all(a == {"ok": True, "data": {"n": i, "user": None}} for a in answers)
            assert isinstance(last, DispatcherClosed)
    assert early == [(0, True)]  # dispatch_many: the quick answer came, the rest was cancelled
    assert tools.cancelled == 7  # the async handlers saw the cancellation
    assert tools.closed == 1
    assert tools.closed_on == "toolrelay-sync-loop"  # plugins are closed on their loop
    assert relay.closed

    with pytest.raises(DispatcherClosed, match="closed"):
        relay.dispatch("echo", {"n": 1})
    with pytest.raises(DispatcherClosed):
        relay.dispatch_many([ToolCall("echo", {"n": 1})])
    with pytest.raises(DispatcherClosed):
        relay.specs()
    relay.close()  # idempotent
    relay.close(timeout_s=0.1)
    assert tools.closed == 1


def test_close_is_bounded_when_a_tool_ignores_cancellation(
    tools: Tools, relay: SyncDispatcher
) -> None:
    """A handler shielding itself cannot hold close() or its caller past close's timeout."""
    caller = threading.Thread(target=lambda: outcome.append(_attempt(relay, "stubborn")))
    outcome: list[Any] = []
    caller.start()
    tools.wait_entered(1)
    started = time.monotonic()
    relay.close(timeout_s=0.5)
    assert time.monotonic() - started < 0.5 + 3.0
    caller.join(JOIN_S)
    assert not caller.is_alive()
    assert isinstance(outcome[0], CallCancelled)
    assert tools.closed == 0  # the loop is still held by the shielded handler
    tools.release.set()  # once it lets go, the loop ends and closes the dispatcher
    deadline = time.monotonic() + JOIN_S
    while tools.closed == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _attempt(relay: SyncDispatcher, name: str) -> Any:
    try:
        return relay.dispatch(name)
    except DispatcherClosed as exc:
        return exc


def test_an_interrupted_caller_cancels_its_call(tools: Tools, relay: SyncDispatcher) -> None:
    """KeyboardInterrupt in the waiting thread propagates there, and the call is cancelled
    on the loop (not left running, not answered)."""
    assert threading.current_thread() is threading.main_thread()

    def interrupt() -> None:
        tools.wait_entered(1)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    # A shell starts background jobs with SIGINT ignored, and Python keeps that: Ctrl-C's
    # own handler here, whoever started the tests.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        helper = threading.Thread(target=interrupt, daemon=True)
        helper.start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            relay.dispatch("hang")  # its deadline is 60 s away
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < JOIN_S
    helper.join(JOIN_S)
    deadline = time.monotonic() + JOIN_S
    while tools.cancelled == 0:
        assert time.monotonic() < deadline, "the interrupted call kept running"
        time.sleep(0.01)
    assert relay.dispatch("echo", {"n": 1}).ok  # the dispatcher itself is fine


def test_an_interrupt_while_the_call_starts_cancels_it(tools: Tools, relay: SyncDispatcher) -> None:
    """Ctrl-C may land while the portal still waits for the loop to take the call, after its
    task started: the call is cancelled all the same (it once ran on to its deadline)."""
    main = threading.main_thread().ident or 0
    entered: list[int] = []
    cancelled: list[int] = []

    @tools.registry.tool(name="interrupting", parameters=OBJ, timeout_s=60)
    async def interrupting(args: dict[str, Any], ctx: AuthContext) -> None:
        entered.append(1)
        signal.pthread_kill(main, signal.SIGINT)  # at once, from the loop's thread
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            cancelled.append(1)
            raise

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for _ in range(20):
            with pytest.raises(KeyboardInterrupt):
                relay.dispatch("interrupting")
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + JOIN_S
    while len(cancelled) < len(entered):
        assert time.monotonic() < deadline, f"{len(entered) - len(cancelled)} calls ran on"
        time.sleep(0.01)
    assert len(entered) == 20


def test_calls_from_the_loop_itself_are_refused(tools: Tools, relay: SyncDispatcher) -> None:
    """An async handler calling the SyncDispatcher it runs under would wait for itself: it
    is refused (answered tool_error), nothing hangs; a sync handler (worker thread) may."""
    refused: list[str] = []

    @tools.registry.tool(name="reentrant", parameters=OBJ)
    async def reentrant(args: dict[str, Any], ctx: AuthContext) -> None:
        for attempt in (lambda: relay.dispatch("noop"), relay.close, relay.specs):
            try:
                attempt()
            except RuntimeError as exc:
                refused.append(type(exc).__name__)

    @tools.registry.tool(name="nested_sync", parameters=OBJ)
    def nested_sync(args: dict[str, Any], ctx: AuthContext) -> Any:
        return relay.dispatch("echo", {"n": 5}).data

    assert relay.dispatch("reentrant").ok
    assert refused == ["RuntimeError"] * 3  # not DispatcherClosed: it is not closed
    assert not relay.closed
    assert relay.dispatch("nested_sync").data == {"n": 5, "user": None}


def test_close_stops_idle_worker_threads(backend: str) -> None:
    """Nine sync calls at once leave nine idle worker threads; close() stops them (they
    stayed for their 30 s idle timeout)."""
    registry = ToolRegistry()
    together = threading.Barrier(9)

    @registry.tool(name="gate", parameters=OBJ, breaker_key="gate")
    def gate(args: dict[str, Any], ctx: AuthContext) -> str:
        together.wait(JOIN_S)  # nine calls in nine threads at once
        return "ok"

    def workers() -> int:
        return sum(t.name == "toolrelay-worker[gate]" for t in threading.enumerate())

    sd = SyncDispatcher(Dispatcher(registry, DispatcherOptions(telemetry=False)), backend=backend)
    assert all(r.ok for r in in_threads(9, lambda i: sd.dispatch("gate")))
    assert workers() == 9
    sd.close()
    deadline = time.monotonic() + JOIN_S
    while workers():
        assert time.monotonic() < deadline, f"{workers()} worker threads left after close()"
        time.sleep(0.01)


def test_a_worker_thread_busy_at_close_ends_when_its_handler_returns(
    tools: Tools, relay: SyncDispatcher
) -> None:
    def workers() -> int:
        return sum(t.name == "toolrelay-worker[hang-sync]" for t in threading.enumerate())

    raised: list[BaseException] = []

    def call() -> None:
        try:
            relay.dispatch("hang_sync")
        except CallCancelled as exc:
            raised.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    tools.wait_entered(1)
    relay.close()
    caller.join(JOIN_S)
    assert len(raised) == 1
    assert workers() == 1  # still in its handler: a thread cannot be stopped from outside
    tools.release.set()
    deadline = time.monotonic() + JOIN_S
    while workers():
        assert time.monotonic() < deadline, "the busy worker thread outlived its handler"
        time.sleep(0.01)


def test_garbage_collection_closes_it(tools: Tools, backend: str) -> None:
    sd = SyncDispatcher(
        Dispatcher(tools.registry, DispatcherOptions(telemetry=False)), backend=backend
    )
    assert sd.dispatch("noop").ok
    del sd
    gc.collect()
    deadline = time.monotonic() + JOIN_S
    while tools.closed == 0:
        assert time.monotonic() < deadline, "the dropped SyncDispatcher was not closed"
        time.sleep(0.01)


SCRIPT = """
import sys, threading, anyio
from typing import Any
from toolrelay import AuthContext, Dispatcher, DispatcherOptions, SyncDispatcher, ToolDeclaration
from toolrelay import ToolRegistry

class Plugin:
    def describe(self):
        return [ToolDeclaration(name="hang", description="", timeout_s=600)]
    async def execute(self, name: str, args: Any, ctx: AuthContext) -> None:
        print("started", flush=True)
        await anyio.sleep(600)
    async def aclose(self) -> None:
        print("closed", flush=True)

registry = ToolRegistry()
registry.register(Plugin())
relay = SyncDispatcher(
    Dispatcher(registry, DispatcherOptions(telemetry=False)), backend=sys.argv[1]
)
threading.Thread(target=relay.dispatch, args=("hang",), daemon=True).start()
"""


def test_interpreter_exit_without_close(tmp_path: Path, backend: str) -> None:
    """A script that never calls close(), with a call hanging in a daemon thread, still
    exits (the loop thread is a daemon) and closes the dispatcher's plugins on the way."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT) + "import time; time.sleep(0.5)\n")
    done = subprocess.run(
        [sys.executable, str(script), backend], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["started", "closed"]


# -- from_config ------------------------------------------------------------------------------


def test_from_config(tools: Tools, tmp_path: Path, backend: str) -> None:
    config = tmp_path / "toolrelay.toml"
    config.write_text(
        '[keys.flaky.breaker]\nfail_max = 2\n\n[profiles.readers]\nallow = ["echo", "flaky"]\n'
    )
    with SyncDispatcher.from_config(
        config, overrides={"telemetry": False}, registry=tools.registry, backend=backend
    ) as sd:
        assert {s["function"]["name"] for s in sd.specs("readers")} == {"echo", "flaky"}
        assert sd.dispatch("echo_sync", {"n": 1}, profile="readers").error_type is (
            ErrorType.TOOL_POLICY
        )
        kinds = [sd.dispatch("flaky", profile="readers").error_type for _ in range(3)]
        assert kinds == [ErrorType.TOOL_ERROR, ErrorType.TOOL_ERROR, ErrorType.CIRCUIT_OPEN]


# -- the WSGI example -------------------------------------------------------------------------


def _load_example() -> Any:
    spec = importlib.util.spec_from_file_location("wsgi_app", ROOT / "examples" / "wsgi_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _request(port: int, method: str, path: str, body: str | None = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=JOIN_S)
    try:
        conn.request(method, path, body=body, headers={"X-Call-Id": "http-1"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_wsgi_example_serves_tool_calls_over_http(backend: str) -> None:
    from wsgiref.simple_server import make_server

    example = _load_example()
    release = threading.Event()
    relay = SyncDispatcher(Dispatcher(example.demo_registry(release)), backend=backend)
    server = make_server("127.0.0.1", 0, example.make_app(relay), example.ThreadingWSGIServer)
    port = server.server_port
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        status, specs = _request(port, "GET", "/tools")
        assert status == 200
        assert {s["function"]["name"] for s in specs} == {"get_weather", "slow_report"}

        cities = [f"City{i}" for i in range(12)]
        with ThreadPoolExecutor(max_workers=12) as pool:
            slow = pool.submit(_request, port, "POST", "/tools/slow_report", "{}")
            answers = list(
                pool.map(
                    lambda c: _request(port, "POST", "/tools/get_weather", json.dumps({"city": c})),
                    cities,
                )
            )
            slow_status, slow_answer = slow.result(timeout=JOIN_S)
        for city, (status, answer) in zip(cities, answers, strict=True):
            assert status == 200
            assert answer == {
                "ok": True,
                "data": {"city": city, "temperature_c": 4.5, "asked_by": None},
            }
        assert slow_status == 200
        assert slow_answer["error_type"] == "timeout" and slow_answer["retryable"] is True

        assert _request(port, "POST", "/tools/nope", "{}")[1]["error_type"] == "unknown_tool"
        status, bad = _request(port, "POST", "/tools/get_weather", "{not json")
        assert (status, bad["error_type"], bad["ok"]) == (200, "invalid_arguments", False)
        status, atlantis = _request(port, "POST", "/tools/get_weather", '{"city": "Atlantis"}')
        assert atlantis == {
            "ok": False,
            "error_type": "tool_error",
            "message": "no place named Atlantis",
            "retryable": False,
        }
        assert _request(port, "GET", "/elsewhere")[0] == 404

        relay.close()
        status, closed = _request(port, "POST", "/tools/get_weather", '{"city": "Oslo"}')
        assert (status, closed) == (503, {"error": "shutting down"})
    finally:
        release.set()
        relay.close()
        server.shutdown()
        server.server_close()
        serving.join(JOIN_S)
    assert not serving.is_alive()
