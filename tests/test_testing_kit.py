"""The testing kit (``toolrelay.testing``, docs/testing.md), through its public API."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from toolrelay import (
    AuthContext,
    BreakerOptions,
    Dispatcher,
    DispatcherOptions,
    ErrorType,
    KeyPolicy,
    RetryOptions,
    ToolDeclaration,
    ToolError,
    ToolRegistry,
)
from toolrelay.events import AttemptEnded, BreakerTransition, RetryScheduled
from toolrelay.testing import (
    FrozenClock,
    ScriptedPlugin,
    StandInUpstream,
    SyncScriptedPlugin,
    capture_events,
    error,
    force_state,
    hang,
    ok,
    slow,
)

pytestmark = pytest.mark.anyio


def dispatcher_for(
    plugin: ScriptedPlugin, clock: FrozenClock | None = None, **breaker: Any
) -> Dispatcher:
    registry = ToolRegistry()
    registry.register(plugin)
    policy = KeyPolicy(breaker=BreakerOptions(**breaker), retry=RetryOptions(max_attempts=1))
    options = DispatcherOptions(default_key=policy, telemetry=False)
    live: dict[str, Any] = {"audit": None} if clock is None else {"audit": None, "clock": clock}
    return Dispatcher(registry, options, **live)


@pytest.mark.parametrize("kind", [ScriptedPlugin, SyncScriptedPlugin])
async def test_steps_answer_in_order_and_the_last_repeats(kind: type[ScriptedPlugin]) -> None:
    plugin = kind()
    plugin.script("t", error("down", retryable=True), ok({"n": 1}))
    async with dispatcher_for(plugin, fail_max=100) as dispatcher:
        ctx = AuthContext(user_id="ada")
        first = await dispatcher.dispatch("t", {"q": 1}, ctx)
        assert not first.ok and first.error_type == ErrorType.TOOL_ERROR
        assert first.message == "down" and first.retryable
        for _ in range(2):
            assert (await dispatcher.dispatch("t", {"q": 2})).data == {"n": 1}
    calls = plugin.calls_to("t")
    assert [c.args for c in calls] == [{"q": 1}, {"q": 2}, {"q": 2}]
    assert calls[0].ctx == ctx and calls[1].ctx == AuthContext()
    assert [c.attempt for c in calls] == [1, 1, 1]
    assert [c.step.kind for c in plugin.calls] == ["error", "ok", "ok"]


async def test_cycle_starts_the_script_again_and_calls_are_kept_per_tool() -> None:
    plugin = ScriptedPlugin()
    plugin.script("a", ok(1), ok(2), then="cycle")
    plugin.script("b", ok("b"))
    async with dispatcher_for(plugin) as dispatcher:
        got = [(await dispatcher.dispatch("a")).data for _ in range(5)]
        await dispatcher.dispatch("b")
    assert got == [1, 2, 1, 2, 1]
    assert [c.tool for c in plugin.calls] == ["a"] * 5 + ["b"]
    assert len(plugin.calls_to("b")) == 1


async def test_retries_are_recorded_with_their_attempt() -> None:
    plugin = ScriptedPlugin()
    plugin.script("t", error("503", retryable=True), ok("fine"))
    registry = ToolRegistry()
    registry.register(plugin)
    retry = RetryOptions(max_attempts=3, backoff_initial_s=0.001, backoff_max_s=0.001)
    options = DispatcherOptions(default_key=KeyPolicy(retry=retry), telemetry=False)
    async with Dispatcher(registry, options, audit=None) as dispatcher:
        with capture_events(dispatcher) as log:
            result = await dispatcher.dispatch("t")
    assert result.ok and result.attempts == 2
    assert [c.attempt for c in plugin.calls] == [1, 2]
    assert [e.result for e in log.events(AttemptEnded)] == ["tool_error", "ok"]
    assert len(log.events(RetryScheduled, tool="t")) == 1
    assert log.events(tool="other") == []


@pytest.mark.parametrize("kind", [ScriptedPlugin, SyncScriptedPlugin])
async def test_hang_ends_at_the_deadline_and_slow_answers_late(kind: type[ScriptedPlugin]) -> None:
    plugin = kind()
    plugin.script("stuck", hang(), timeout_s=0.05, idempotent=False)
    plugin.script("late", slow(0.02, "done"))
    async with dispatcher_for(plugin) as dispatcher:
        result = await dispatcher.dispatch("stuck")
        assert result.error_type == ErrorType.TIMEOUT and result.effect_unknown
        started = time.perf_counter()
        late = await dispatcher.dispatch("late")
        assert late.data == "done" and time.perf_counter() - started >= 0.02


async def test_script_errors_and_declarations() -> None:
    plugin = ScriptedPlugin()
    with pytest.raises(ValueError, match="at least one step"):
        plugin.script("t")
    with pytest.raises(ValueError, match="repeat"):
        plugin.script("t", ok(), then="loop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 0"):
        slow(-1)
    decl = plugin.script("t", ok(), breaker_key="svc", timeout_s=2)
    assert (decl.key, decl.timeout_s, decl.parameters) == ("svc", 2, {"type": "object"})
    given = plugin.script(ToolDeclaration("u", "mine"), ok(), risk="write")
    assert (given.description, given.risk) == ("mine", "write")
    assert [d.name for d in plugin.describe()] == ["t", "u"]


async def test_unscripted_tool_raises_a_tool_error() -> None:
    with pytest.raises(ToolError, match="no script"):
        await ScriptedPlugin().execute("nope", {}, AuthContext())


async def test_error_fields_reach_the_answer() -> None:
    plugin = ScriptedPlugin()
    plugin.script("t", error("later", retryable=True, counts_as_failure=False, retry_after_s=3))
    async with dispatcher_for(plugin, fail_max=1) as dispatcher:
        result = await dispatcher.dispatch("t")
        assert result.retry_after_s == 3
        assert dispatcher.breakers.state("t") == "closed"  # not counted as a failure


async def test_frozen_clock_open_then_half_open_trial_without_sleeping() -> None:
    clock = FrozenClock(100.0)
    plugin = ScriptedPlugin()
    plugin.script("t", error("down", retryable=True), error("down", retryable=True), ok("up"))
    async with dispatcher_for(plugin, clock, fail_max=2, reset_timeout_s=30) as dispatcher:
        moves: list[tuple[str, str]] = []
        dispatcher.breakers.add_listener(lambda key, old, new: moves.append((old, new)))
        with capture_events(dispatcher) as log:
            await dispatcher.dispatch("t")
            await dispatcher.dispatch("t")
            assert dispatcher.breakers.state("t") == "open"
            refused = await dispatcher.dispatch("t")
            assert refused.error_type == ErrorType.CIRCUIT_OPEN
            assert refused.retry_after_s == pytest.approx(30)
            clock.advance(29.5)
            assert (await dispatcher.dispatch("t")).error_type == ErrorType.CIRCUIT_OPEN
            clock.advance(0.5)
            trial = await dispatcher.dispatch("t")
        assert trial.ok and dispatcher.breakers.state("t") == "closed"
    assert moves == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
    seen = [(e.from_state, e.to_state) for e in log.events(BreakerTransition)]
    assert seen == [("closed", "open"), ("half_open", "closed")]  # a call's last transition
    assert len(plugin.calls) == 3  # the refused calls never reached the tool
    with pytest.raises(ValueError, match="does not go back"):
        clock.advance(-1)


async def test_force_state_every_state() -> None:
    clock = FrozenClock()
    plugin = ScriptedPlugin()
    plugin.script("t", ok("up"))
    async with dispatcher_for(plugin, clock, fail_max=3, reset_timeout_s=10) as dispatcher:
        breakers = dispatcher.breakers
        force_state(dispatcher, "t", "open")
        assert breakers.state("t") == "open" and not breakers.get("t").pinned_open
        assert (await dispatcher.dispatch("t")).error_type == ErrorType.CIRCUIT_OPEN
        clock.advance(10)  # tripped, not pinned: a trial is due after the break
        assert (await dispatcher.dispatch("t")).ok and breakers.state("t") == "closed"

        force_state(dispatcher, "t", "open", pinned=True)
        clock.advance(1000)
        assert (await dispatcher.dispatch("t")).error_type == ErrorType.CIRCUIT_OPEN

        force_state(dispatcher, "t", "half_open")
        assert breakers.state("t") == "half_open"
        assert (await dispatcher.dispatch("t")).ok and breakers.state("t") == "closed"

        force_state(dispatcher, "t", "open")
        force_state(dispatcher, "t", "closed")
        assert breakers.state("t") == "closed"
        with pytest.raises(ValueError, match="state must be"):
            force_state(dispatcher, "t", "ajar")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="pinned"):
            force_state(dispatcher, "t", "closed", pinned=True)


async def test_force_state_open_trips_a_count_window() -> None:
    plugin = ScriptedPlugin()
    plugin.script("t", ok())
    window = {"window": "count", "window_size": 10, "minimum_calls": 5, "failure_rate": 0.5}
    async with dispatcher_for(plugin, **window) as dispatcher:
        force_state(dispatcher, "t", "open")
        assert dispatcher.breakers.state("t") == "open"


async def test_capture_events_stops_recording_after_the_block() -> None:
    plugin = ScriptedPlugin()
    plugin.script("t", error("x", retryable=True))
    async with dispatcher_for(plugin, fail_max=1) as dispatcher:
        with capture_events(dispatcher) as log:
            await dispatcher.dispatch("t")
        seen = len(log)
        assert seen and all(c.tool == "t" for c in log)
        assert log.events(BreakerTransition)[0].to_state == "open"
        await dispatcher.dispatch("t")
        assert len(log) == seen


async def test_stand_in_upstream_is_the_chaos_one() -> None:
    from toolrelay.chaos.upstream import StandInUpstream as Chaos

    assert StandInUpstream is Chaos
    async with StandInUpstream() as up, httpx.AsyncClient() as client:
        up.set_fault("/v1/forecast", "status", status=503)
        reply = await client.get(f"{up.url}/v1/forecast?latitude=1&longitude=2")
        assert reply.status_code == 503


def test_without_h11_the_stand_in_names_the_extra() -> None:
    """``import toolrelay.testing`` works without h11; the stand-in says which extra it needs
    (in a fresh interpreter where ``import h11`` fails)."""
    script = """
import sys
sys.modules["h11"] = None  # import h11 -> ModuleNotFoundError
import toolrelay.testing as kit
assert kit.ScriptedPlugin is not None
try:
    kit.StandInUpstream
except ImportError as exc:
    print(exc)
try:
    kit.nothing
except AttributeError:
    print("no attribute")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install 'toolrelay[chaos]'" in done.stdout and "'h11'" in done.stdout
    assert done.stdout.endswith("no attribute\n")


DOC = Path(__file__).resolve().parent.parent / "docs" / "testing.md"


@pytest.mark.parametrize("index", [0, 1])
def test_the_docs_examples_run(index: int) -> None:
    """docs/testing.md, Usage: each Python example runs as written."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 2
    exec(compile(blocks[index], f"docs/testing.md example {index + 1}", "exec"), {})


async def test_each_error_is_a_new_exception() -> None:
    plugin = ScriptedPlugin()
    plugin.script("t", error("down", retryable=True, retry_after_s=2))
    raised = []
    for _ in range(2):
        with pytest.raises(ToolError) as info:
            await plugin.execute("t", {}, AuthContext())
        raised.append(info.value)
    assert raised[0] is not raised[1]
    assert (raised[1].message, raised[1].retryable, raised[1].retry_after_s) == ("down", True, 2)
    assert raised[1].counts_as_failure and raised[1].error_type == ErrorType.TOOL_ERROR
