"""toolrelay inside the OpenAI Agents SDK: an ``Agent`` run by ``Runner.run`` with a scripted
model of our own (below) that emits tool calls, reads the tool outputs and finishes.

Offline: no OpenAI client is built, and the SDK's tracing is disabled (or, in the tracing
tests, sent to an in-memory processor of a provider installed for the test only).

asyncio only: the Agents SDK's ``Runner`` is built on asyncio (tasks, ``asyncio.shield``,
``asyncio.wait_for``) and does not run under trio, so the trio backend does not apply here.
"""

from __future__ import annotations

import asyncio
import json
import runpy
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

agents = pytest.importorskip("agents")

from agents import (  # noqa: E402
    Agent,
    Model,
    ModelResponse,
    Runner,
    TracingProcessor,
    Usage,
    set_tracing_disabled,
)
from agents.testing import assistant_message, function_call  # noqa: E402
from agents.tracing import get_trace_provider, set_trace_provider  # noqa: E402
from agents.tracing.provider import DefaultTraceProvider  # noqa: E402
from opentelemetry import context as otel_context  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from prometheus_client import CollectorRegistry  # noqa: E402

from helpers import CITY, dispatcher_with  # noqa: E402
from toolrelay import (  # noqa: E402
    AuthContext,
    BreakerOptions,
    Dispatcher,
    KeyPolicy,
    Profile,
    RetryOptions,
    ToolError,
    ToolRegistry,
)
from toolrelay.integrations.openai_agents import function_tools  # noqa: E402

pytestmark = pytest.mark.anyio
set_tracing_disabled(True)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the Agents SDK's Runner runs on asyncio only (module docstring)


# -- a scripted model of our own ---------------------------------------------------------
Turn = Callable[["Seen"], list[Any]]


@dataclass
class Seen:
    """What the model was given on one turn."""

    tools: list[str]
    outputs: dict[str, dict[str, Any]]
    """call id → the tool output the model reads (the envelope, parsed)"""


def outputs_in(items: str | list[Any]) -> dict[str, dict[str, Any]]:
    if isinstance(items, str):
        return {}
    return {
        item["call_id"]: json.loads(item["output"])
        for item in items
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }


class Brain(Model):
    """Runs one function per turn: it sees the tools offered and the tool outputs so far,
    and returns the turn's output items (tool calls or a final message)."""

    def __init__(self, *turns: Turn) -> None:
        self.turns = list(turns)
        self.seen: list[Seen] = []

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[Any],
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        seen = Seen([tool.name for tool in tools], outputs_in(input))
        self.seen.append(seen)
        output = self.turns.pop(0)(seen)
        return ModelResponse(output=output, usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the tests run Runner.run")


def call(name: str, call_id: str, args: dict[str, Any] | None = None) -> Turn:
    return lambda seen: [function_call(name, args or {}, call_id=call_id)]


def finish(seen: Seen) -> list[Any]:
    """The final answer: the outputs the model read, as text."""
    return [assistant_message(json.dumps(seen.outputs, sort_keys=True))]


async def run(dispatcher: Dispatcher, brain: Brain, context: Any = None, **options: Any) -> Any:
    agent = Agent(name="host", model=brain, tools=function_tools(dispatcher, **options))
    return await Runner.run(agent, "go", context=context)


def new_dispatcher(registry: ToolRegistry, **kwargs: Any) -> Dispatcher:
    return dispatcher_with(registry, metrics_registry=CollectorRegistry(), audit=None, **kwargs)


def echo_registry() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(name="weather", parameters=CITY, breaker_key="meteo")
    async def weather(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
        return {"city": args["city"], "user": ctx.user_id, "tenant": ctx.tenant_id}

    return registry


# -- answers ---------------------------------------------------------------------------
async def test_an_ok_call_answers_the_envelope_and_the_run_finishes() -> None:
    d = new_dispatcher(echo_registry())
    brain = Brain(call("weather", "call_1", {"city": "Oslo"}), finish)
    result = await run(d, brain, context=AuthContext(user_id="u1", tenant_id="t1"))
    answer = {"ok": True, "data": {"city": "Oslo", "user": "u1", "tenant": "t1"}}
    assert brain.seen[1].outputs == {"call_1": answer}
    assert json.loads(result.final_output) == {"call_1": answer}
    assert brain.seen[0].tools == ["weather"]


async def test_invalid_arguments_are_validated_by_toolrelay_and_answered() -> None:
    d = new_dispatcher(echo_registry())
    brain = Brain(call("weather", "c1", {"city": ""}), call("weather", "c2", {"town": "x"}), finish)
    await run(d, brain)
    assert brain.seen[1].outputs["c1"]["error_type"] == "validation_error"
    assert brain.seen[2].outputs["c2"]["error_type"] == "validation_error"
    # a caller's mistake: the breaker never counts it
    assert d.breakers.snapshot().get("meteo", {"failures": 0})["failures"] == 0


async def test_the_hosts_auth_function_gives_the_handler_its_auth_context() -> None:
    @dataclass
    class Session:
        user: str
        org: str

    seen_contexts: list[Any] = []

    def auth(ctx: Any) -> AuthContext:
        seen_contexts.append(ctx)
        return AuthContext(user_id=ctx.context.user, tenant_id=ctx.context.org)

    d = new_dispatcher(echo_registry())
    brain = Brain(call("weather", "call_9", {"city": "Bergen"}), finish)
    await run(d, brain, context=Session("ada", "acme"), auth=auth)
    assert brain.seen[1].outputs["call_9"]["data"] == {
        "city": "Bergen",
        "user": "ada",
        "tenant": "acme",
    }
    assert [c.tool_call_id for c in seen_contexts] == ["call_9"]


async def test_without_an_auth_function_a_context_that_is_not_an_auth_context_is_anonymous() -> (
    None
):
    d = new_dispatcher(echo_registry())
    brain = Brain(call("weather", "c1", {"city": "Oslo"}), finish)
    await run(d, brain, context={"user_id": "from-a-dict"})
    assert brain.seen[1].outputs["c1"]["data"]["user"] is None


async def test_a_timeout_and_an_open_breaker_come_back_as_answers_and_the_run_continues() -> None:
    registry = ToolRegistry()
    never = asyncio.Event()

    @registry.tool(name="search", timeout_s=0.05, breaker_key="searxng")
    async def search(args: dict[str, Any], ctx: AuthContext) -> Any:
        await never.wait()

    d = new_dispatcher(
        registry,
        keys={
            "searxng": KeyPolicy(
                breaker=BreakerOptions(fail_max=1), retry=RetryOptions(max_attempts=1)
            )
        },
    )
    brain = Brain(call("search", "c1"), call("search", "c2"), finish)
    result = await run(d, brain, unavailable="show")
    timeout, paused = brain.seen[1].outputs["c1"], brain.seen[2].outputs["c2"]
    assert timeout["error_type"] == "timeout" and timeout["retryable"] is True
    assert paused["error_type"] == "circuit_open" and paused["retry_after_s"] > 0
    assert set(json.loads(result.final_output)) == {"c1", "c2"}  # the run went on


async def test_a_blocking_sync_tool_is_answered_at_its_deadline() -> None:
    registry = ToolRegistry()
    release = threading.Event()

    @registry.tool(name="legacy", timeout_s=0.1)
    def legacy(args: dict[str, Any], ctx: AuthContext) -> Any:
        release.wait(30)  # blocks its thread far longer than the deadline
        return {"late": True}

    d = new_dispatcher(registry)
    brain = Brain(call("legacy", "c1"), finish)
    try:
        result = await asyncio.wait_for(run(d, brain), 10)
        assert brain.seen[1].outputs["c1"]["error_type"] == "timeout"
        assert not release.is_set()  # answered while the tool was still blocked
        assert json.loads(result.final_output)["c1"]["ok"] is False
    finally:
        release.set()


# -- which tools the model is shown --------------------------------------------------------
def three_tools() -> ToolRegistry:
    registry = ToolRegistry()
    for name, risk in (("lookup", "read"), ("update", "write"), ("wipe", "dangerous")):
        registry.tool(name=name, risk=risk)(lambda args, ctx: {"done": True})
    return registry


async def test_a_profile_chooses_the_tools() -> None:
    profiles = {"reader": Profile(max_risk="read"), "ops": Profile(deny=["wipe"])}
    d = new_dispatcher(three_tools(), profiles=profiles)
    assert [t.name for t in function_tools(d, profile="reader")] == ["lookup"]
    assert [t.name for t in function_tools(d, profile="ops")] == ["lookup", "update"]
    assert function_tools(d, profile="nobody") == []  # an unknown profile offers nothing
    brain = Brain(finish)
    await run(d, brain, profile="reader")
    assert brain.seen[0].tools == ["lookup"]


async def test_an_open_breaker_hides_its_tools_and_a_closed_one_shows_them_again() -> None:
    registry = echo_registry()
    registry.tool(name="ping")(lambda args, ctx: "pong")
    d = new_dispatcher(registry)
    d.breakers.force_open("meteo")

    def close_then_ping(seen: Seen) -> list[Any]:
        d.breakers.force_close("meteo")
        return [function_call("ping", {}, call_id="p1")]

    brain = Brain(close_then_ping, call("weather", "w1", {"city": "Oslo"}), finish)
    await run(d, brain, unavailable="hide")
    assert [s.tools for s in brain.seen] == [["ping"], ["weather", "ping"], ["weather", "ping"]]
    assert brain.seen[2].outputs["w1"]["ok"] is True


async def test_a_breaker_opening_while_the_model_thinks_is_answered_then_hidden() -> None:
    """The SDK checks is_enabled again before it runs the calls; a tool disabled in between
    would fail the whole run (ModelBehaviorError). It is answered circuit_open instead."""
    registry = echo_registry()
    registry.tool(name="ping")(lambda args, ctx: "pong")
    d = new_dispatcher(registry)

    def open_then_call(seen: Seen) -> list[Any]:
        d.breakers.force_open("meteo")  # the weather service fails while the model thinks
        return [function_call("weather", {"city": "Oslo"}, call_id="w1")]

    brain = Brain(open_then_call, finish)
    await run(d, brain, unavailable="hide")
    assert brain.seen[1].outputs["w1"]["error_type"] == "circuit_open"
    assert [s.tools for s in brain.seen] == [["weather", "ping"], ["ping"]]


async def test_unavailable_show_keeps_a_paused_tool_listed() -> None:
    d = new_dispatcher(echo_registry())
    d.breakers.force_open("meteo")
    brain = Brain(call("weather", "w1", {"city": "Oslo"}), finish)
    await run(d, brain, unavailable="show")
    assert brain.seen[0].tools == ["weather"]
    assert brain.seen[1].outputs["w1"]["error_type"] == "circuit_open"


async def test_by_default_a_tool_paused_mid_run_stays_callable_and_the_run_completes() -> None:
    """The breaker opens on the first call; the model calls the paused tool twice more (it
    is in the conversation). With the old default ("hide") the SDK failed the run:
    ModelBehaviorError "Tool search not found in agent host"."""
    registry = ToolRegistry()

    @registry.tool(name="search", breaker_key="searxng")
    async def search(args: dict[str, Any], ctx: AuthContext) -> Any:
        raise ToolError("upstream said 503", retryable=True)

    one_strike = KeyPolicy(breaker=BreakerOptions(fail_max=1), retry=RetryOptions(max_attempts=1))
    d = new_dispatcher(registry, keys={"searxng": one_strike})
    brain = Brain(call("search", "c1"), call("search", "c2"), call("search", "c3"), finish)
    result = await run(d, brain)
    assert brain.seen[1].outputs["c1"]["error_type"] == "tool_error"
    for seen, call_id in ((brain.seen[2], "c2"), (brain.seen[3], "c3")):
        assert seen.tools == ["search"]
        assert seen.outputs[call_id]["error_type"] == "circuit_open"
        assert seen.outputs[call_id]["retry_after_s"] > 0
    assert set(json.loads(result.final_output)) == {"c1", "c2", "c3"}  # the run completed


async def test_unavailable_mark_keeps_a_paused_tool_listed_with_a_marked_description() -> None:
    d = new_dispatcher(echo_registry())
    tools = function_tools(d, unavailable="mark")
    described: list[str] = []

    def look(seen: Seen) -> list[Any]:
        described.append(tools[0].description)
        return [function_call("weather", {"city": "Oslo"}, call_id=f"w{len(described)}")]

    def look_then_close(seen: Seen) -> list[Any]:
        output = look(seen)
        d.breakers.force_close("meteo")  # the service is back while the model thinks
        return output

    d.breakers.force_open("meteo")
    brain = Brain(look, look_then_close, look, finish)
    await Runner.run(Agent(name="host", model=brain, tools=tools), "go")
    plain = d.registry.resolve("weather").decl.description  # type: ignore[union-attr]
    assert described[:2] == [f"[unavailable: paused by an operator] {plain}"] * 2
    assert brain.seen[1].tools == ["weather"]
    assert brain.seen[1].outputs["w1"]["error_type"] == "circuit_open"
    assert brain.seen[2].outputs["w2"]["ok"] is True  # closed by the time it ran
    assert described[2] == plain  # the next turn: unmarked


@pytest.mark.parametrize("value", ["hdie", "HIDE", None, ""])
def test_an_unknown_unavailable_value_is_refused_by_name(value: Any) -> None:
    d = new_dispatcher(echo_registry())
    with pytest.raises(ValueError, match=r"unavailable must be 'hide', 'mark' or 'show'"):
        function_tools(d, unavailable=value)
    with pytest.raises(ValueError, match=r"unavailable must be"):
        d.specs(unavailable=value)


def test_strict_only_when_the_schema_is_strict_already() -> None:
    registry = echo_registry()  # CITY: closed, every property required
    optional = {"type": "object", "properties": {"q": {"type": "string"}}}
    registry.tool(name="loose", parameters=optional)(lambda args, ctx: None)
    d = new_dispatcher(registry)
    tools = {t.name: t for t in function_tools(d)}
    assert tools["weather"].strict_json_schema is True
    assert tools["weather"].params_json_schema == CITY
    assert tools["loose"].strict_json_schema is False
    assert tools["loose"].params_json_schema == optional  # what toolrelay validates
    assert all(not t.strict_json_schema for t in function_tools(d, strict=False))


def test_a_typed_tool_with_a_default_is_strict_and_null_means_the_default() -> None:
    registry = ToolRegistry()

    @registry.tool(name="forecast")
    def forecast(city: str, days: int = 3) -> dict[str, Any]:
        return {"city": city, "days": days}

    tool = function_tools(new_dispatcher(registry))[0]
    assert tool.strict_json_schema is True
    schema = tool.params_json_schema
    assert sorted(schema["required"]) == ["city", "days"] and not schema["additionalProperties"]


# -- cancellation --------------------------------------------------------------------------
def hanging_registry(started: asyncio.Event, stopped: list[BaseException]) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(name="hang", timeout_s=30, breaker_key="slow")
    async def hang(args: dict[str, Any], ctx: AuthContext) -> Any:
        started.set()
        try:
            await asyncio.sleep(60)
        except BaseException as exc:
            stopped.append(exc)
            raise

    return registry


def calls_counted(metrics: CollectorRegistry) -> float:
    return sum(
        sample.value
        for metric in metrics.collect()
        for sample in metric.samples
        if sample.name == "toolrelay_tool_calls_total"
    )


async def test_cancelling_the_run_propagates_and_is_neither_an_answer_nor_a_failure() -> None:
    started, stopped = asyncio.Event(), []
    metrics = CollectorRegistry()
    d = Dispatcher(hanging_registry(started, stopped), metrics_registry=metrics, audit=None)
    brain = Brain(call("hang", "h1"), finish)
    task = asyncio.ensure_future(run(d, brain))
    await asyncio.wait_for(started.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(brain.seen) == 1  # the model never read an answer for h1
    assert [type(e) for e in stopped] == [asyncio.CancelledError]  # the handler was cancelled
    assert d.breakers.snapshot()["slow"]["failures"] == 0
    assert calls_counted(metrics) == 0  # no outcome recorded for a cancelled call


async def test_a_cancellation_inside_the_tool_call_is_not_turned_into_text() -> None:
    """By default the SDK hands a tool task's CancelledError to its failure formatter and
    the model reads "An error occurred…"; the adapter's tools have no formatter."""
    registry = ToolRegistry()

    @registry.tool(name="cancelled", timeout_s=30)
    async def cancelled(args: dict[str, Any], ctx: AuthContext) -> Any:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(60)

    d = new_dispatcher(registry)
    brain = Brain(call("cancelled", "c1"), finish)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(run(d, brain), 10)
    assert len(brain.seen) == 1
    assert d.breakers.snapshot()["cancelled"]["failures"] == 0


# -- tracing ----------------------------------------------------------------------------
@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def tool_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool")]


async def test_the_call_id_is_the_models_and_the_span_nests_under_the_hosts(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    d = new_dispatcher(echo_registry(), tracer_provider=provider)
    brain = Brain(
        lambda seen: [
            function_call("weather", {"city": "Oslo"}, call_id="call_A"),
            function_call("weather", {"city": "Rome"}, call_id="call_B"),
        ],
        finish,
    )
    with provider.get_tracer("host").start_as_current_span("host turn") as host:
        await run(d, brain)
    assert set(brain.seen[1].outputs) == {"call_A", "call_B"}
    ours = tool_spans(exporter)
    assert sorted(s.attributes["gen_ai.tool.call.id"] for s in ours) == ["call_A", "call_B"]  # type: ignore[index]
    host_id = host.get_span_context().span_id
    assert all(s.parent is not None and s.parent.span_id == host_id for s in ours)


class OtelBridge(TracingProcessor):
    """A minimal Agents SDK → OpenTelemetry bridge (what Logfire or OpenInference do):
    each SDK function span becomes an OTel span, current while the SDK runs the tool."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer
        self.open: dict[str, tuple[trace.Span, object]] = {}
        self.outputs: list[Any] = []

    def on_span_start(self, span: Any) -> None:
        if span.span_data.type == "function":
            otel = self.tracer.start_span(f"sdk function {span.span_data.name}")
            self.open[span.span_id] = (otel, otel_context.attach(trace.set_span_in_context(otel)))

    def on_span_end(self, span: Any) -> None:
        if span.span_id in self.open:
            otel, token = self.open.pop(span.span_id)
            otel_context.detach(token)  # type: ignore[arg-type]
            otel.end()
            self.outputs.append(span.span_data.output)

    def on_trace_start(self, trace: Any) -> None:
        pass

    def on_trace_end(self, trace: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass


async def test_with_an_sdk_to_otel_bridge_our_span_nests_under_the_sdk_function_span(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    bridge = OtelBridge(provider.get_tracer("bridge"))
    sdk_tracing = DefaultTraceProvider()  # no exporter: nothing leaves the process
    sdk_tracing.set_processors([bridge])
    sdk_tracing.set_disabled(False)
    previous = get_trace_provider()
    set_trace_provider(sdk_tracing)
    try:
        d = new_dispatcher(echo_registry(), tracer_provider=provider)
        brain = Brain(call("weather", "call_T", {"city": "Oslo"}), finish)
        await run(d, brain)
    finally:
        set_trace_provider(previous)
    (sdk,) = [s for s in exporter.get_finished_spans() if s.name == "sdk function weather"]
    (ours,) = tool_spans(exporter)
    assert ours.parent is not None and ours.parent.span_id == sdk.context.span_id  # type: ignore[union-attr]
    assert ours.attributes["gen_ai.tool.call.id"] == "call_T"  # type: ignore[index]
    # the SDK's own span records the envelope as the tool's output
    assert [json.loads(o) for o in bridge.outputs] == [brain.seen[1].outputs["call_T"]]


# -- the example ----------------------------------------------------------------------------
def test_the_example_shows_a_timeout_answer_and_a_breaker_opening(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Run as ``python examples/openai_agents.py`` would, in this process: the SDK's import
    # alone costs a fresh interpreter seconds on a loaded machine. (Its tracing is off here
    # already, as the example turns it off.)
    runpy.run_path(str(ROOT / "examples" / "openai_agents.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert out.count('tool ← web_search: {"ok":false,"error_type":"timeout"') == 2
    assert "breaker search: open" in out
    assert "turn 3: tools offered ['get_weather']" in out  # the open breaker hides the search
    assert out.rstrip().splitlines()[-1].startswith("final: It is 4.5 °C in Oslo")


async def test_a_streamed_run_reads_the_same_answers() -> None:
    """Runner.run_streamed takes the same tool path (the SDK's own scripted model streams)."""
    from agents.testing import ScriptedModel

    d = new_dispatcher(echo_registry())
    model = ScriptedModel(
        [[function_call("weather", {"city": "Oslo"}, call_id="s1")], [assistant_message("ok")]]
    )
    agent = Agent(name="host", model=model, tools=function_tools(d))
    streamed = Runner.run_streamed(agent, "go", context=AuthContext(user_id="u2"))
    outputs = [
        event.item.output
        async for event in streamed.stream_events()
        if event.type == "run_item_stream_event" and event.name == "tool_output"
    ]
    assert [json.loads(o) for o in outputs] == [
        {"ok": True, "data": {"city": "Oslo", "user": "u2", "tenant": None}}
    ]
    assert streamed.final_output == "ok"


async def test_the_output_is_compact_json_keeping_text_and_escaping_lone_surrogates() -> None:
    """The model reads compact JSON with non-ASCII text as is; a lone surrogate (a file name
    decoded with ``surrogateescape``) is escaped, so the next model request can be encoded."""
    from agents.items import ToolCallOutputItem

    registry = ToolRegistry()

    @registry.tool(name="city")
    async def city(args: dict[str, Any], ctx: AuthContext) -> str:
        return "Zürich"

    @registry.tool(name="files")
    async def files(args: dict[str, Any], ctx: AuthContext) -> list[str]:
        return [b"caf\xe9.txt".decode("utf-8", "surrogateescape")]

    brain = Brain(
        lambda seen: [
            function_call("city", {}, call_id="c1"),
            function_call("files", {}, call_id="c2"),
        ],
        finish,
    )
    result = await run(new_dispatcher(registry), brain)
    texts = {
        dict(item.raw_item)["call_id"]: item.output
        for item in result.new_items
        if isinstance(item, ToolCallOutputItem)
    }
    assert texts["c1"] == '{"ok":true,"data":"Zürich"}'
    assert texts["c2"] == '{"ok":true,"data":["caf\\udce9.txt"]}'
    for text in texts.values():
        text.encode("utf-8")  # a request body can carry it
    assert json.loads(texts["c2"])["data"] == ["caf\udce9.txt"]


async def test_an_auth_function_that_raises_fails_the_run_and_runs_nothing() -> None:
    """A host bug in ``auth`` fails closed: the run raises, the tool does not run as anyone,
    and the model is not called again (nothing it could read was made)."""
    from agents.exceptions import UserError

    ran: list[Any] = []
    registry = ToolRegistry()

    @registry.tool(name="weather", parameters=CITY, breaker_key="meteo")
    async def weather(args: dict[str, Any], ctx: AuthContext) -> str:
        ran.append(ctx)
        return "sunny"

    def auth(ctx: Any) -> AuthContext:
        raise KeyError("session")

    d = new_dispatcher(registry)
    brain = Brain(call("weather", "c1", {"city": "Oslo"}), finish)
    with pytest.raises(UserError) as raised:
        await run(d, brain, auth=auth)
    assert isinstance(raised.value.__cause__, KeyError)
    assert ran == [] and len(brain.seen) == 1
    assert d.breakers.snapshot().get("meteo", {"failures": 0})["failures"] == 0
