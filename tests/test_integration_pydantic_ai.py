"""toolrelay's Pydantic AI toolset, run by real Pydantic AI agents with scripted models.

Pydantic AI runs on asyncio only (its tool execution calls ``asyncio.create_task``; an
agent run under trio fails with "no running event loop"), so these tests run on asyncio.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from pydantic_ai import (
    Agent,
    CancellationToken,
    DeferredToolRequests,
    DeferredToolResults,
    InstrumentationSettings,
    ToolDenied,
)
from pydantic_ai.capabilities import Instrumentation
from pydantic_ai.exceptions import RunCancelled
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from helpers import dispatcher_with
from toolrelay import (
    AuthContext,
    BreakerOptions,
    Dispatcher,
    KeyPolicy,
    Profile,
    RetryOptions,
    ToolCall,
    ToolDeclaration,
    ToolError,
    ToolRegistry,
)
from toolrelay.integrations.pydantic_ai import ToolrelayToolset, deferred_approver

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parent.parent

N = {
    "type": "object",
    "properties": {"n": {"type": "integer", "maximum": 100}},
    "required": ["n"],
    "additionalProperties": False,
}
EMPTY = {"type": "object", "properties": {}, "additionalProperties": False}
ANN = AuthContext(user_id="ann", tenant_id="acme")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # see the module docstring


Step = Callable[[list[ModelMessage], AgentInfo], ModelResponse]


class Script:
    """A FunctionModel's function: one scripted response per step, ending in text; records
    the tools the model was shown at each step."""

    def __init__(self, *steps: Sequence[ToolCallPart] | str) -> None:
        self.steps = list(steps)
        self.shown: list[dict[str, str]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.shown.append({t.name: t.kind for t in info.function_tools})
        step = self.steps.pop(0) if self.steps else "done"
        if isinstance(step, str):
            return ModelResponse(parts=[TextPart(step)])
        return ModelResponse(parts=list(step))


def call(name: str, args: str = "{}", call_id: str = "") -> ToolCallPart:
    return ToolCallPart(name, args, tool_call_id=call_id or f"call-{name}")


def answers(messages: list[ModelMessage]) -> dict[str, Any]:
    """What the model was told for each tool call id (envelopes, or Pydantic AI's own)."""
    out: dict[str, Any] = {}
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, ToolReturnPart):
                    out[part.tool_call_id] = part.content
                elif isinstance(part, RetryPromptPart) and part.tool_call_id:
                    out[part.tool_call_id] = ("retry", part.model_response())
    return out


def agent(script: Script, toolset: ToolrelayToolset[Any], **kwargs: Any) -> Agent[Any, Any]:
    return Agent(FunctionModel(script), toolsets=[toolset], **kwargs)


def dispatcher(registry: ToolRegistry, **kwargs: Any) -> Dispatcher:
    return dispatcher_with(registry, metrics_registry=CollectorRegistry(), **kwargs)


# -- answers ----------------------------------------------------------------------------
async def test_ok_timeout_and_open_breaker_are_answers_and_the_run_goes_on() -> None:
    registry = ToolRegistry()
    seen: list[tuple[dict[str, Any], AuthContext]] = []

    @registry.tool(name="double", parameters=N)
    async def double(args: dict[str, Any], ctx: AuthContext) -> int:
        seen.append((args, ctx))
        return int(args["n"]) * 2

    @registry.tool(name="search", parameters=EMPTY, timeout_s=0.1, breaker_key="searxng")
    async def search(args: dict[str, Any], ctx: AuthContext) -> str:
        await anyio.sleep(3600)  # the upstream hangs
        return "never"

    d = dispatcher(
        registry,
        keys={
            "searxng": KeyPolicy(
                breaker=BreakerOptions(fail_max=1, reset_timeout_s=3600),
                retry=RetryOptions(max_attempts=1),
            )
        },
    )
    script = Script(
        [call("double", '{"n": 21}'), call("search")],
        [call("search", call_id="again")],
        "the search service is down; 21 doubled is 42",
    )
    toolset = ToolrelayToolset(d, auth=lambda ctx: ctx.deps, unavailable="mark")
    result = await agent(script, toolset, deps_type=AuthContext).run("go", deps=ANN)

    told = answers(result.all_messages())
    assert told["call-double"] == {"ok": True, "data": 42}
    assert told["call-search"]["error_type"] == "timeout"
    assert told["call-search"]["retryable"] is True
    assert told["again"]["error_type"] == "circuit_open"
    assert told["again"]["retry_after_s"] > 0
    assert result.output == "the search service is down; 21 doubled is 42"
    assert seen == [({"n": 21}, ANN)]  # the AuthContext came from the run's deps
    assert script.shown[1]["search"] == "function"  # "mark": still listed while open


async def test_arguments_are_toolrelays_to_validate() -> None:
    """Pydantic AI neither refuses nor reshapes arguments: toolrelay answers them."""
    registry = ToolRegistry()
    calls: list[dict[str, Any]] = []

    @registry.tool(name="double", parameters=N)
    async def double(args: dict[str, Any], ctx: AuthContext) -> int:
        calls.append(args)
        return int(args["n"]) * 2

    script = Script(
        [
            call("double", '{"n": "many"}', "wrong-type"),
            call("double", '{"n": 500}', "too-big"),
            call("double", "n=1", "not-json"),
            call("double", "[1]", "not-object"),
            call("double", '{"n": 1, "extra": true}', "extra"),
        ]
    )
    result = await agent(script, ToolrelayToolset(dispatcher(registry))).run("go")
    told = answers(result.all_messages())
    assert {key: value["error_type"] for key, value in told.items()} == {
        "wrong-type": "validation_error",
        "too-big": "validation_error",
        "not-json": "invalid_arguments",
        "not-object": "invalid_arguments",
        "extra": "validation_error",
    }
    assert "not valid JSON" in told["not-json"]["message"]
    assert calls == []
    assert result.output == "done"


async def test_a_blocking_sync_tool_is_answered_at_its_deadline() -> None:
    registry = ToolRegistry()
    release = threading.Event()

    @registry.tool(name="legacy", parameters=EMPTY, timeout_s=0.2)
    def legacy(args: dict[str, Any], ctx: AuthContext) -> str:
        release.wait(30)  # a blocking client with no timeout of its own
        return "late"

    try:
        script = Script([call("legacy")], "legacy timed out")
        result = await agent(script, ToolrelayToolset(dispatcher(registry))).run("go")
        # the run finished while the thread still blocks: the deadline held
        assert not release.is_set()
        assert answers(result.all_messages())["call-legacy"]["error_type"] == "timeout"
        assert result.output == "legacy timed out"
    finally:
        release.set()


# -- which tools the model sees ---------------------------------------------------------
def mixed_registry() -> ToolRegistry:
    registry = ToolRegistry()
    registry.tool(name="read_a", parameters=EMPTY, risk="read")(_echo_name)
    registry.tool(name="write_b", parameters=EMPTY, risk="write")(_echo_name)
    registry.tool(name="wipe_c", parameters=EMPTY, risk="dangerous")(_echo_name)
    return registry


async def _echo_name(args: dict[str, Any], ctx: AuthContext) -> str:
    return "done"


async def test_profile_chooses_the_tools() -> None:
    d = dispatcher(
        mixed_registry(),
        profiles={
            "reader": Profile(max_risk="read"),
            "writer": Profile(deny=["wipe_c"], require_approval=()),
        },
    )
    shown = {}
    for profile in ("reader", "writer", "nobody", None):
        script = Script("hi")
        await agent(script, ToolrelayToolset(d, profile=profile)).run("go")
        shown[profile] = script.shown[0]
    assert shown["reader"] == {"read_a": "function"}
    assert shown["writer"] == {"read_a": "function", "write_b": "function"}
    assert shown["nobody"] == {}  # an unknown profile permits nothing
    assert shown[None] == {"read_a": "function", "write_b": "unapproved", "wipe_c": "unapproved"}


async def test_breaker_health_hides_and_shows_the_tool_step_by_step() -> None:
    registry = ToolRegistry()

    @registry.tool(name="flaky", parameters=EMPTY, breaker_key="svc")
    async def flaky(args: dict[str, Any], ctx: AuthContext) -> str:
        raise ToolError("upstream said 503", retryable=True)

    @registry.tool(name="steady", parameters=EMPTY)
    async def steady(args: dict[str, Any], ctx: AuthContext) -> str:
        return "fine"

    d = dispatcher(
        registry,
        keys={
            "svc": KeyPolicy(
                breaker=BreakerOptions(fail_max=1, reset_timeout_s=0.05),
                retry=RetryOptions(max_attempts=1),
            )
        },
    )

    class Waiting(Script):
        async def wait(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            response = self(messages, info)
            if len(self.shown) == 2:
                await anyio.sleep(0.1)  # past reset_timeout_s: the breaker is due a trial
            return response

    script = Waiting([call("flaky")], [call("steady")], "flaky is back")
    toolset = ToolrelayToolset(d, unavailable="hide")
    await Agent(FunctionModel(script.wait), toolsets=[toolset]).run("go")
    assert ["flaky" in tools for tools in script.shown] == [True, False, True]
    assert script.shown[1] == {"steady": "function"}


async def test_by_default_a_tool_paused_mid_run_stays_callable_and_the_run_completes() -> None:
    """The breaker opens on the first call; the model calls the paused tool twice more. With
    the old default ("hide") the run ended: UnexpectedModelBehavior, max retries exceeded."""
    registry = ToolRegistry()

    @registry.tool(name="flaky", parameters=EMPTY, breaker_key="svc")
    async def flaky(args: dict[str, Any], ctx: AuthContext) -> str:
        raise ToolError("upstream said 503", retryable=True)

    one_strike = KeyPolicy(breaker=BreakerOptions(fail_max=1), retry=RetryOptions(max_attempts=1))
    d = dispatcher(registry, keys={"svc": one_strike})
    script = Script(*([call("flaky", call_id=f"c{n}")] for n in (1, 2, 3)), "done")
    result = await agent(script, ToolrelayToolset(d)).run("go")
    told = answers(result.all_messages())
    assert told["c1"]["error_type"] == "tool_error"
    for call_id in ("c2", "c3"):
        assert told[call_id]["error_type"] == "circuit_open"
        assert told[call_id]["retry_after_s"] > 0
    assert result.output == "done"
    assert all("flaky" in shown for shown in script.shown)


@pytest.mark.parametrize("value", ["hdie", "Mark", None])
def test_an_unknown_unavailable_value_is_refused_by_name(value: Any) -> None:
    d = dispatcher(ToolRegistry())
    with pytest.raises(ValueError, match=r"unavailable must be 'hide', 'mark' or 'show'"):
        ToolrelayToolset(d, unavailable=value)


# -- approvals --------------------------------------------------------------------------
async def test_approval_defers_then_runs_with_toolrelays_approval() -> None:
    registry = ToolRegistry()
    audit: list[dict[str, Any]] = []
    deleted: list[Any] = []

    @registry.tool(name="delete_file", parameters=EMPTY, risk="dangerous")
    async def delete_file(args: dict[str, Any], ctx: AuthContext) -> str:
        # the approval was for this call only: a nested risky call is not approved by it
        nested = await d.dispatch("wipe_disk", "{}", ctx, call_id="nested")
        deleted.append((ctx, nested.error_type))
        return "deleted"

    @registry.tool(name="wipe_disk", parameters=EMPTY, risk="dangerous")
    async def wipe_disk(args: dict[str, Any], ctx: AuthContext) -> str:
        return "wiped"

    d = dispatcher(registry, approver=deferred_approver(), audit=audit.append)
    script = Script([call("delete_file", call_id="del-1"), call("wipe_disk", call_id="wipe-1")])
    a = agent(
        script,
        ToolrelayToolset(d, auth=lambda ctx: ctx.deps),
        deps_type=AuthContext,
        output_type=[str, DeferredToolRequests],
    )
    first = await a.run("clean up", deps=ANN)
    assert isinstance(first.output, DeferredToolRequests)
    assert sorted(c.tool_call_id for c in first.output.approvals) == ["del-1", "wipe-1"]
    assert deleted == [] and audit == []  # nothing ran, nothing was dispatched yet

    results = DeferredToolResults(approvals={"del-1": True, "wipe-1": ToolDenied("not today")})
    second = await a.run(
        message_history=first.all_messages(), deferred_tool_results=results, deps=ANN
    )
    told = answers(second.all_messages())
    assert told["del-1"] == {"ok": True, "data": "deleted"}
    assert told["wipe-1"] == "not today"  # Pydantic AI answers a denial itself
    assert deleted == [(ANN, "denied")]
    assert [
        (r["tool"], r["call_id"], r["user_id"], r["decision"], r["outcome"]) for r in audit
    ] == [
        ("wipe_disk", "nested", "ann", "denied", "denied"),
        ("delete_file", "del-1", "ann", "approved", "ok"),
    ]
    assert second.output == "done"


async def test_deferred_approver_approves_only_host_approved_calls() -> None:
    registry = mixed_registry()
    asked: list[tuple[str, str | None]] = []

    def fallback(call: ToolCall, decl: ToolDeclaration, ctx: AuthContext) -> bool:
        asked.append((call.name, call.call_id))
        return call.name == "write_b"

    strict = dispatcher(registry, approver=deferred_approver())
    lenient = dispatcher(registry, approver=deferred_approver(fallback))
    assert (await strict.dispatch("write_b", "{}", call_id="x")).error_type == "denied"
    assert (await lenient.dispatch("write_b", "{}", call_id="y")).ok
    assert (await lenient.dispatch("wipe_c", "{}", call_id="z")).error_type == "denied"
    assert asked == [("write_b", "y"), ("wipe_c", "z")]


async def test_without_deferral_needs_approval_is_the_models_answer() -> None:
    script = Script([call("write_b")])
    toolset = ToolrelayToolset(dispatcher(mixed_registry()), defer_approval=False)
    result = await agent(script, toolset).run("go")
    assert script.shown[0]["write_b"] == "function"
    told = answers(result.all_messages())
    assert told["call-write_b"]["error_type"] == "needs_approval"


async def test_an_approval_the_dispatcher_cannot_honour_is_answered_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    a = agent(
        Script([call("write_b", call_id="w-1")]),
        ToolrelayToolset(dispatcher(mixed_registry())),  # no deferred_approver()
        output_type=[str, DeferredToolRequests],
    )
    first = await a.run("go")
    assert isinstance(first.output, DeferredToolRequests)
    with caplog.at_level(logging.WARNING, logger="toolrelay"):
        second = await a.run(
            message_history=first.all_messages(),
            deferred_tool_results=DeferredToolResults(approvals={"w-1": True}),
        )
    assert answers(second.all_messages())["w-1"]["error_type"] == "needs_approval"
    assert "deferred_approver()" in caplog.text


# -- the host's cancellation, call ids and spans ----------------------------------------
@pytest.mark.parametrize("how", ["task.cancel", "CancellationToken"])
async def test_host_cancellation_propagates_and_is_never_an_answer(how: str) -> None:
    registry = ToolRegistry()
    audit: list[dict[str, Any]] = []
    started = anyio.Event()
    stopped: list[str] = []

    @registry.tool(name="slow_write", parameters=EMPTY, risk="write", breaker_key="svc")
    async def slow_write(args: dict[str, Any], ctx: AuthContext) -> str:
        started.set()
        try:
            await anyio.sleep(3600)
        except BaseException as exc:
            stopped.append(type(exc).__name__)
            raise
        return "written"

    d = dispatcher(
        registry,
        profiles={"ops": Profile(require_approval=())},
        keys={"svc": KeyPolicy(breaker=BreakerOptions(fail_max=1))},
        audit=audit.append,
    )
    script = Script([call("slow_write")], "went on after an answer")
    a = agent(script, ToolrelayToolset(d, profile="ops"))
    token = CancellationToken()
    # task.cancel: a web framework whose client went away; CancellationToken: Pydantic
    # AI's own, which keeps the results of tools that finished in the run's history
    task = asyncio.create_task(a.run("go", cancellation_token=token))
    with anyio.fail_after(10):
        await started.wait()
    if how == "task.cancel":
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        token.cancel()
        with pytest.raises(RunCancelled) as stopped_run:
            await task
        told = answers(stopped_run.value.all_messages())
        assert "call-slow_write" not in told  # no answer was recorded for the call
    assert len(script.shown) == 1  # the model was not asked again
    assert stopped == ["CancelledError"]
    assert [r["outcome"] for r in audit] == ["cancelled"]
    assert d.breakers.state("svc") == "closed"  # not counted as a failure (fail_max=1)


async def test_call_id_and_span_nest_under_pydantic_ais_tool_span() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = ToolRegistry()
    registry.tool(name="read_a", parameters=EMPTY)(_echo_name)
    d = dispatcher(registry, tracer_provider=provider)
    a = Agent(
        FunctionModel(Script([call("read_a", call_id="call_XyZ")])),
        toolsets=[ToolrelayToolset(d)],
        capabilities=[Instrumentation(settings=InstrumentationSettings(tracer_provider=provider))],
    )
    await a.run("go")
    spans = exporter.get_finished_spans()

    def attr(span: ReadableSpan, key: str) -> Any:
        return (span.attributes or {}).get(key)

    ours = [s for s in spans if attr(s, "toolrelay.breaker_key") is not None]
    theirs = [
        s
        for s in spans
        if attr(s, "gen_ai.tool.call.id") == "call_XyZ" and attr(s, "toolrelay.outcome") is None
    ]
    assert len(ours) == 1 and len(theirs) == 1
    (mine,), (parent,) = ours, theirs
    assert attr(mine, "gen_ai.tool.call.id") == "call_XyZ"  # call_id is the model's id
    assert attr(mine, "toolrelay.outcome") == "ok"
    assert mine.parent is not None
    assert mine.parent.span_id == parent.context.span_id
    assert mine.context.trace_id == parent.context.trace_id


# -- the example ------------------------------------------------------------------------
def test_example_runs_offline() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "pydantic_ai.py")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    steps = done.stdout.split("step ")[1:]
    assert len(steps) == 3
    assert '"error_type": "timeout"' in steps[1]  # the model read a timeout answer
    assert "searxng: closed" in steps[1] and "searxng: open" in steps[2]
    assert "sees tools: get_weather, web_search" in steps[1]
    assert "sees tools: get_weather\n" in steps[2]  # hidden while its breaker is open
    assert "run finished: 'It is 4.5 °C in Oslo." in steps[2]


async def test_an_auth_function_that_raises_propagates_and_runs_nothing() -> None:
    """A host bug in ``auth`` fails closed: the run raises it, the tool does not run as
    anyone, and the model is not called again."""
    registry = ToolRegistry()
    ran: list[Any] = []

    @registry.tool(name="double", parameters=N, breaker_key="svc")
    async def double(args: dict[str, Any], ctx: AuthContext) -> int:
        ran.append(ctx)
        return 2 * int(args["n"])

    def auth(ctx: Any) -> AuthContext:
        raise KeyError("session")

    d = dispatcher(registry)
    script = Script([call("double", '{"n": 2}')], "unreachable")
    with pytest.raises(KeyError):
        await agent(script, ToolrelayToolset(d, auth=auth)).run("go")
    assert ran == [] and len(script.shown) == 1
    assert d.breakers.snapshot().get("svc", {"failures": 0})["failures"] == 0
