"""toolrelay.integrations.langchain with the real langchain-core and langgraph, offline.

asyncio only: LangChain runs every async tool call in an asyncio task of its own and
``ToolNode`` gathers them with ``asyncio.gather``; neither runs under trio.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.from_thread import start_blocking_portal
from langchain.agents import create_agent
from langchain.agents.middleware import ModelRequest, ModelResponse, wrap_model_call
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, create_react_agent
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from helpers import CITY, OBJ, dispatcher_with, load_script
from toolrelay import (
    AuthContext,
    BreakerOptions,
    Dispatcher,
    DispatcherOptions,
    KeyPolicy,
    Profile,
    RetryOptions,
    ToolError,
    ToolRegistry,
    ToolResult,
)
from toolrelay.integrations.langchain import RelayTool, langchain_tools
from toolrelay.sync import SyncDispatcher

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore::langgraph.warnings.LangGraphDeprecatedSinceV10"),
]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- a real dispatcher with tools that answer, hang, block and fail ---------------------
class Service:
    def __init__(self) -> None:
        self.stall_started = anyio.Event()
        self.stall_cancelled = False
        self.block_started = threading.Event()
        self.release = threading.Event()
        self.block_finished = threading.Event()
        self.users: list[str | None] = []


def build(**kw: Any) -> tuple[Dispatcher, Service]:
    registry = ToolRegistry()
    svc = Service()

    @registry.tool(description="Current weather for a city.", parameters=CITY)
    async def get_weather(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
        svc.users.append(ctx.user_id)
        return {"city": args["city"], "temperature_c": 4.5, "user": ctx.user_id}

    @registry.tool(description="Echo the arguments.", parameters={"type": "object"})
    async def echo(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
        return args

    @registry.tool(description="Hangs until its deadline.", parameters=OBJ, timeout_s=0.2)
    async def hang(args: dict[str, Any], ctx: AuthContext) -> None:
        await anyio.sleep_forever()

    @registry.tool(description="Slow to answer.", parameters=OBJ, timeout_s=60)
    async def stall(args: dict[str, Any], ctx: AuthContext) -> None:
        svc.stall_started.set()
        try:
            await anyio.sleep_forever()
        except BaseException:
            svc.stall_cancelled = True
            raise

    # The deadline leaves a loaded machine time to start the thread (a job whose thread
    # starts after its deadline is skipped, never run): the tests see it blocked.
    @registry.tool(description="A blocking client.", parameters=OBJ, timeout_s=0.5)
    def blocking(args: dict[str, Any], ctx: AuthContext) -> str:
        svc.block_started.set()
        svc.release.wait(30)
        svc.block_finished.set()
        return "late"

    @registry.tool(description="A service that is down.", parameters=OBJ, breaker_key="down")
    async def flaky(args: dict[str, Any], ctx: AuthContext) -> None:
        raise ToolError("the service answered 503", retryable=True)

    @registry.tool(description="Delete the account.", parameters=OBJ, risk="dangerous")
    async def delete_account(args: dict[str, Any], ctx: AuthContext) -> str:
        return "deleted"

    kw.setdefault("audit", None)
    kw.setdefault("telemetry", False)
    one_strike = KeyPolicy(
        breaker=BreakerOptions(fail_max=1, reset_timeout_s=60), retry=RetryOptions(max_attempts=1)
    )
    dispatcher = dispatcher_with(
        registry,
        profiles={"reader": Profile(max_risk="read")},
        keys={"down": one_strike, "stall": one_strike, "blocking": one_strike},
        **kw,
    )
    return dispatcher, svc


def recording() -> tuple[InMemorySpanExporter, TracerProvider]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider


def call(name: str, call_id: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


def tool_graph(tools: Sequence[BaseTool], **node_options: Any) -> CompiledStateGraph[Any]:
    """The smallest graph running a ToolNode: START → tools → END."""
    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode(tools, **node_options))
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    return graph.compile()


def answers(messages: Sequence[BaseMessage]) -> dict[str, dict[str, Any]]:
    """The envelope of each ToolMessage, by tool call id."""
    return {
        m.tool_call_id: json.loads(str(m.content)) for m in messages if isinstance(m, ToolMessage)
    }


# -- a chat model whose next message is a function of the conversation: the example's ---
ScriptedChatModel = load_script(
    ROOT / "examples" / "langgraph.py", "example_langgraph"
).ScriptedModel


def last_answers(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    """The envelopes of the tool messages since the model last spoke."""
    found = []
    for message in reversed(messages):
        if not isinstance(message, ToolMessage):
            break
        found.append(json.loads(str(message.content)))
    return found[::-1]


# -- ToolNode ----------------------------------------------------------------------------
async def test_a_tool_node_answers_every_call_with_the_envelope() -> None:
    d, _ = build()
    d.breakers.force_open("down")
    graph = tool_graph(langchain_tools(d))
    calls = [
        call("get_weather", "c-ok", city="Oslo"),
        call("hang", "c-timeout"),
        call("flaky", "c-open"),
        call("get_weather", "c-bad", city=42),
    ]
    out = await graph.ainvoke({"messages": [AIMessage("", tool_calls=calls)]})

    tool_messages = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in tool_messages] == ["c-ok", "c-timeout", "c-open", "c-bad"]
    got = answers(tool_messages)
    assert got["c-ok"] == {
        "ok": True,
        "data": {"city": "Oslo", "temperature_c": 4.5, "user": None},
    }
    assert got["c-timeout"]["error_type"] == "timeout" and got["c-timeout"]["retryable"]
    assert got["c-open"]["error_type"] == "circuit_open" and got["c-open"]["retry_after_s"] > 0
    assert got["c-bad"]["error_type"] == "validation_error"  # toolrelay's validator, not pydantic
    for message in tool_messages:
        envelope = json.loads(str(message.content))
        assert message.status == ("success" if envelope["ok"] else "error")
        result = ToolResult(**message.artifact)  # the whole result, for the host
        assert result.to_model() == envelope
        assert result.call_id == message.tool_call_id
        assert message.name == result.tool
        # plain data: a checkpointer stores and loads it without registering our types
        stored = JsonPlusSerializer().loads_typed(JsonPlusSerializer().dumps_typed(message))
        assert stored.artifact == message.artifact and stored.status == message.status


async def test_model_arguments_named_like_langchain_parameters_reach_the_tool() -> None:
    """LangChain fills ``config``/``run_manager`` parameters of ``_arun``: ours has none."""
    d, _ = build()
    (echo,) = [t for t in langchain_tools(d) if t.name == "echo"]
    args = {"config": "c", "run_manager": 1, "callbacks": [2], "self": 3, "tool_call_id": "x"}

    message = await echo.ainvoke(call("echo", "c-1", **args))
    assert json.loads(message.content) == {"ok": True, "data": args}
    # invoked with bare arguments (no tool call), LangChain hands back the content alone
    assert json.loads(await echo.ainvoke(args)) == {"ok": True, "data": args}


# -- a prebuilt agent ----------------------------------------------------------------------
async def test_an_agent_reads_a_timeout_and_an_open_breaker_and_carries_on() -> None:
    d, _ = build()
    d.breakers.force_open("down")

    def script(messages: list[BaseMessage], tools: list[str]) -> AIMessage:
        if isinstance(messages[-1], HumanMessage):
            return AIMessage("", tool_calls=[call("hang", "t-1"), call("flaky", "t-2")])
        kinds = sorted(a["error_type"] for a in last_answers(messages) if not a["ok"])
        return AIMessage("read: " + ",".join(kinds))

    model = ScriptedChatModel(script=script)
    agent = create_agent(model, langchain_tools(d))
    out = await agent.ainvoke({"messages": [HumanMessage("go")]})

    assert out["messages"][-1].content == "read: circuit_open,timeout"
    assert len(model.bound) == 2  # the model spoke again after the failures
    assert set(answers(out["messages"])) == {"t-1", "t-2"}


async def test_a_model_bound_per_step_stops_seeing_a_tool_whose_breaker_opened() -> None:
    d, _ = build()

    def script(messages: list[BaseMessage], tools: list[str]) -> AIMessage:
        if "flaky" in tools and isinstance(messages[-1], HumanMessage):
            return AIMessage("", tool_calls=[call("flaky", "f-1")])
        return AIMessage("done")

    model = ScriptedChatModel(script=script)

    @wrap_model_call
    async def healthy_tools_only(
        request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
    ) -> ModelResponse:
        shown = {tool.name for tool in langchain_tools(d, unavailable="hide")}
        tools = [t for t in request.tools if isinstance(t, dict) or t.name in shown]
        return await handler(request.override(tools=tools))

    agent = create_agent(model, langchain_tools(d), middleware=[healthy_tools_only])
    out = await agent.ainvoke({"messages": [HumanMessage("go")]})

    assert answers(out["messages"])["f-1"]["error_type"] == "tool_error"
    assert d.breakers.state("down") == "open"
    assert "flaky" in model.bound[0]
    assert model.bound[1] == [name for name in model.bound[0] if name != "flaky"]
    (marked,) = [t for t in langchain_tools(d, unavailable="mark") if t.name == "flaky"]
    assert marked.description.startswith("[unavailable for about ")


async def test_by_default_a_tool_paused_mid_run_stays_callable_and_the_run_completes() -> None:
    d, _ = build()
    calls = iter(["f-1", "f-2", "f-3"])

    def script(messages: list[BaseMessage], tools: list[str]) -> AIMessage:
        call_id = next(calls, None)
        return (
            AIMessage("done")
            if call_id is None
            else AIMessage("", tool_calls=[call("flaky", call_id)])
        )

    model = ScriptedChatModel(script=script)
    out = await create_agent(model, langchain_tools(d)).ainvoke({"messages": [HumanMessage("go")]})
    told = answers(out["messages"])
    assert told["f-1"]["error_type"] == "tool_error"
    for call_id in ("f-2", "f-3"):
        assert told[call_id]["error_type"] == "circuit_open" and told[call_id]["retry_after_s"] > 0
    assert out["messages"][-1].content == "done"
    assert all("flaky" in names for names in model.bound)


@pytest.mark.parametrize("value", ["hdie", "Show", None])
def test_an_unknown_unavailable_value_is_refused_by_name(value: Any) -> None:
    d, _ = build()
    with pytest.raises(ValueError, match=r"unavailable must be 'hide', 'mark' or 'show'"):
        langchain_tools(d, unavailable=value)


# -- profile, schema, identity, call id, span ---------------------------------------------
async def test_the_tools_are_the_profiles_with_the_declared_schemas() -> None:
    d, _ = build()
    tools = langchain_tools(d, profile="reader")
    specs = d.specs("reader")
    for spec in specs:  # toolrelay marks a strict-ready schema; LangChain leaves it to bind_tools
        spec["function"].pop("strict", None)
    assert [convert_to_openai_tool(t) for t in tools] == specs
    assert "delete_account" not in {t.name for t in tools}
    assert "delete_account" in {t.name for t in langchain_tools(d)}
    assert langchain_tools(d, profile="nobody") == []

    # a tool built by hand for a profile that may not call it is still refused
    sneaky = RelayTool(
        name="delete_account", description="", args_schema=OBJ, dispatcher=d, profile="reader"
    )
    message = await sneaky.ainvoke(call("delete_account", "s-1"))
    assert json.loads(message.content)["error_type"] == "tool_policy"


async def test_identity_comes_from_the_config_and_the_call_id_from_the_tool_call() -> None:
    exporter, provider = recording()
    d, svc = build(telemetry=True, tracer_provider=provider)
    seen: list[RunnableConfig] = []

    def auth(config: RunnableConfig) -> AuthContext:
        seen.append(config)
        return AuthContext(user_id=config["configurable"]["user_id"], tenant_id="t-1")

    graph = tool_graph(langchain_tools(d, auth=auth))
    tracer = provider.get_tracer("host")
    with tracer.start_as_current_span("host request") as host:
        out = await graph.ainvoke(
            {"messages": [AIMessage("", tool_calls=[call("get_weather", "call-7", city="Oslo")])]},
            {"configurable": {"user_id": "u-7"}},
        )

    assert answers(out["messages"])["call-7"]["data"]["user"] == "u-7"
    assert svc.users == ["u-7"] and len(seen) == 1
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "execute_tool get_weather"]
    assert span.attributes is not None
    assert span.attributes["gen_ai.tool.call.id"] == "call-7"
    assert span.parent is not None
    assert span.parent.span_id == host.get_span_context().span_id


# -- deadlines of blocking tools, sync hosts ---------------------------------------------
async def test_a_blocking_sync_tool_is_answered_at_its_deadline() -> None:
    d, svc = build()
    graph = tool_graph(langchain_tools(d))
    try:
        out = await graph.ainvoke({"messages": [AIMessage("", tool_calls=[call("blocking", "b")])]})
        assert answers(out["messages"])["b"]["error_type"] == "timeout"
        # answered while the handler's thread is still blocked
        assert svc.block_started.is_set() and not svc.block_finished.is_set()
    finally:
        svc.release.set()


def test_a_sync_graph_calls_through_a_portal_and_keeps_deadlines() -> None:
    exporter, provider = recording()
    d, svc = build(telemetry=True, tracer_provider=provider)
    message = AIMessage("", tool_calls=[call("blocking", "b"), call("get_weather", "w", city="X")])
    try:
        with (
            start_blocking_portal() as portal,
            provider.get_tracer("host").start_as_current_span("host request") as host,
        ):
            graph = tool_graph(langchain_tools(d, portal=portal))
            out = graph.invoke({"messages": [message]})
            got = answers(out["messages"])
            assert got["b"]["error_type"] == "timeout" and not svc.block_finished.is_set()
            assert got["w"]["ok"] is True
    finally:
        svc.release.set()
    assert d.breakers.state("blocking") == "open"  # a timeout is a failure of the service
    # the portal runs the call in the caller's context: the span still nests under the host's
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "execute_tool get_weather"]
    assert span.parent is not None
    assert span.parent.span_id == host.get_span_context().span_id

    # without a portal a sync run fails loudly (the model is not told about a host's bug),
    # and says how to get one that works
    with pytest.raises(RuntimeError, match="without a portal") as raised:
        tool_graph(langchain_tools(d)).invoke({"messages": [message]})
    assert "portal=relay.portal" in str(raised.value)
    assert "with anyio.from_thread.start_blocking_portal() as portal:" in str(raised.value)


def test_a_sync_graph_shares_a_sync_dispatchers_breakers_through_its_portal() -> None:
    d, _ = build()
    with SyncDispatcher(d) as relay:
        graph = tool_graph(langchain_tools(relay.dispatcher, portal=relay.portal))
        out = graph.invoke({"messages": [AIMessage("", tool_calls=[call("flaky", "f-1")])]})
        assert answers(out["messages"])["f-1"]["error_type"] == "tool_error"
        # the graph's failure opened the breaker the host's own calls go through
        assert relay.dispatch("flaky").error_type == "circuit_open"
        out = graph.invoke(
            {"messages": [AIMessage("", tool_calls=[call("get_weather", "w", city="X")])]}
        )
        assert answers(out["messages"])["w"]["ok"] is True


def test_a_portal_that_is_not_a_blocking_portal_is_refused_at_once() -> None:
    d, _ = build()
    with pytest.raises(
        ValueError, match=r"portal\n  Input should be an instance of BlockingPortal"
    ):
        langchain_tools(d, portal=start_blocking_portal())  # type: ignore[arg-type]


# -- cancellation ----------------------------------------------------------------------------
async def test_cancelling_a_tool_call_propagates_and_answers_nothing() -> None:
    """At the tool itself: an answer here would be taken as the result by the caller."""
    d, svc = build()
    (stall,) = [t for t in langchain_tools(d) if t.name == "stall"]
    task = asyncio.ensure_future(stall.ainvoke(call("stall", "s-1")))
    with anyio.fail_after(30):  # the tool's own deadline is 60 s
        await svc.stall_started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert svc.stall_cancelled
    assert d.breakers.get("stall").failures_recorded == 0


@pytest.mark.parametrize("handle_tool_errors", [True, False])
async def test_cancelling_the_graph_run_propagates_and_answers_nothing(
    handle_tool_errors: bool,
) -> None:
    """Even ``handle_tool_errors=True`` (catch every ``Exception``) lets it through."""
    d, svc = build()

    def script(messages: list[BaseMessage], tools: list[str]) -> AIMessage:
        if isinstance(messages[-1], HumanMessage):
            return AIMessage("", tool_calls=[call("stall", "s-1")])
        return AIMessage("should never be reached")

    model = ScriptedChatModel(script=script)
    node = ToolNode(langchain_tools(d), handle_tool_errors=handle_tool_errors)
    agent = create_react_agent(model, node, checkpointer=InMemorySaver())
    config: RunnableConfig = {"configurable": {"thread_id": "t"}}
    task = asyncio.ensure_future(agent.ainvoke({"messages": [HumanMessage("go")]}, config))
    with anyio.fail_after(30):  # the tool's own deadline is 60 s
        await svc.stall_started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert svc.stall_cancelled
    state = await agent.aget_state(config)
    assert not [m for m in state.values["messages"] if isinstance(m, ToolMessage)]
    assert len(model.bound) == 1
    assert d.breakers.state("stall") == "closed"
    assert d.breakers.get("stall").failures_recorded == 0


# -- the example -----------------------------------------------------------------------------
async def test_the_example_shows_a_timeout_read_and_a_breaker_opening() -> None:
    done = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [sys.executable, str(ROOT / "examples" / "langgraph.py")],
            capture_output=True,
            text=True,
            timeout=120,
        )
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert '"error_type":"timeout"' in out
    assert "breaker searxng: closed → open" in out
    assert "(offered: get_weather)\n" in out  # the next step no longer offers web_search
    assert out.rstrip().splitlines()[-1].startswith("assistant: ")
    assert "timed out" in out.rstrip().splitlines()[-1]


async def test_the_content_is_compact_json_keeping_text_and_escaping_lone_surrogates() -> None:
    """Non-ASCII text is kept as is; a lone surrogate (a file name decoded with
    ``surrogateescape``) is escaped, so the next model request can be encoded."""
    registry = ToolRegistry()

    @registry.tool(name="city")
    async def city(args: dict[str, Any], ctx: AuthContext) -> str:
        return "Zürich"

    @registry.tool(name="files")
    async def files(args: dict[str, Any], ctx: AuthContext) -> list[str]:
        return [b"caf\xe9.txt".decode("utf-8", "surrogateescape")]

    graph = tool_graph(
        langchain_tools(Dispatcher(registry, DispatcherOptions(telemetry=False), audit=None))
    )
    calls = [call("city", "c1"), call("files", "c2")]
    out = await graph.ainvoke({"messages": [AIMessage("", tool_calls=calls)]})
    texts = {m.tool_call_id: m.content for m in out["messages"] if isinstance(m, ToolMessage)}
    assert texts["c1"] == '{"ok":true,"data":"Zürich"}'
    assert texts["c2"] == '{"ok":true,"data":["caf\\udce9.txt"]}'
    for text in texts.values():
        str(text).encode("utf-8")  # a request body can carry it


async def test_an_auth_function_that_raises_propagates_and_runs_nothing() -> None:
    """A host bug in ``auth`` fails closed: with the ToolNode's default error handling the
    graph raises it; the tool does not run as anyone and no ToolMessage is made."""
    d, svc = build()

    def auth(config: Any) -> AuthContext:
        raise KeyError("user_id")

    graph = tool_graph(langchain_tools(d, auth=auth))
    with pytest.raises(KeyError):
        await graph.ainvoke(
            {"messages": [AIMessage("", tool_calls=[call("get_weather", "c1", city="Oslo")])]}
        )
    assert svc.users == []
