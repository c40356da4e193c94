"""The integration adapters (LangChain, OpenAI Agents SDK, Pydantic AI) against each
framework's own plain tool, invoked the way the framework does."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
from typing import Any

from .harness import (
    ARGS,
    CTX,
    PARSED,
    Case,
    Row,
    Settings,
    dispatch_case,
    dispatcher,
    interleave,
    medians,
    noop_registry,
    paired_difference,
    paired_ratio,
    sanity,
    us,
)


async def bench_adapter_langchain(s: Settings) -> list[Row]:
    try:
        from typing import Annotated

        from langchain_core.messages import ToolMessage
        from langchain_core.tools import tool
        from pydantic import Field

        from toolrelay.integrations.langchain import langchain_tools
    except ImportError:
        name = "toolrelay LangChain adapter / plain LangChain @tool"
        return [Row("adapter-langchain", name, status="skipped (pip install '.[langchain]')")]

    async def city_noop(city: Annotated[str, Field(max_length=64)]) -> dict[str, Any]:
        """Echo the city."""
        return {"city": city}

    # the same constraint as SCHEMA, set as objects: this module's annotations are strings
    city_noop.__annotations__ = {
        "city": Annotated[str, Field(max_length=64)],
        "return": dict[str, Any],
    }
    plain = tool("noop", parse_docstring=False)(city_noop)
    d = dispatcher(noop_registry())
    (relay,) = langchain_tools(d)
    call = {"type": "tool_call", "id": "call_1", "name": "noop", "args": PARSED}

    async def adapter() -> Any:
        return await relay.ainvoke(call)

    async def langchain() -> Any:
        return await plain.ainvoke(call)

    cases = {"toolrelay": dispatch_case(d), "adapter": adapter, "plain": langchain}
    await sanity(cases)
    for fn in (adapter, langchain):
        got = await fn()
        if not isinstance(got, ToolMessage) or got.status != "success":
            raise RuntimeError(f"the LangChain tool answered {got!r}")
    samples = await interleave(cases, s.rounds, s.calls, s.warmup)
    m = medians(samples)
    ratio = paired_ratio(samples["adapter"], samples["plain"])
    version = importlib.metadata.version("langchain-core")
    return [
        Row(
            "adapter-langchain",
            "toolrelay LangChain adapter / plain LangChain @tool (ainvoke with a ToolCall)",
            ratio,
            target="≤ 1.5×",
            passed=ratio <= 1.5,
            context=f"adapter {us(m['adapter'])}, langchain-core {version} @tool {us(m['plain'])}",
        ),
        Row(
            "adapter-langchain",
            "LangChain adapter over Dispatcher.dispatch alone",
            paired_difference(samples["adapter"], samples["toolrelay"]) * 1e6,
            unit="+µs",
            context=f"dispatch {us(m['toolrelay'])}: BaseTool.ainvoke's callbacks, task, message",
        ),
    ]


# -- the OpenAI Agents SDK adapter ----------------------------------------------------------
async def bench_adapter_openai_agents(s: Settings) -> list[Row]:
    """A tool call through ``toolrelay.integrations.openai_agents`` against the SDK's own
    ``@function_tool``, both invoked the way its Runner does (``invoke_function_tool``)."""
    try:
        from typing import Annotated

        from agents import function_tool, set_tracing_disabled
        from agents.tool import invoke_function_tool
        from agents.tool_context import ToolContext
        from pydantic import Field

        from toolrelay.integrations.openai_agents import function_tools
    except ImportError:
        name = "toolrelay Agents SDK adapter / plain @function_tool"
        skip = "skipped (pip install '.[openai-agents]')"
        return [Row("adapter-openai-agents", name, status=skip)]
    set_tracing_disabled(True)

    async def city_noop(city: str) -> dict[str, Any]:
        """Echo the city."""
        return {"city": city}

    # the same constraint as SCHEMA, set as objects: this module's annotations are strings
    city_noop.__annotations__ = {
        "city": Annotated[str, Field(max_length=64)],
        "return": dict[str, Any],
    }
    plain = function_tool(city_noop, name_override="noop")
    timed = function_tool(city_noop, name_override="noop", timeout=10.0)
    d = dispatcher(noop_registry())
    (relay,) = function_tools(d)

    def case(tool: Any) -> Case:
        async def run() -> Any:
            context = ToolContext(CTX, tool_name="noop", tool_call_id="call_1", tool_arguments=ARGS)
            return await invoke_function_tool(function_tool=tool, context=context, arguments=ARGS)

        return run

    cases = {
        "toolrelay": dispatch_case(d),
        "adapter": case(relay),
        "plain": case(plain),
        "timed": case(timed),
    }
    await sanity(cases)
    envelope = json.dumps({"ok": True, "data": PARSED}, separators=(",", ":"))
    for name in ("adapter", "plain", "timed"):
        got = await cases[name]()
        if got != (envelope if name == "adapter" else PARSED):
            raise RuntimeError(f"the {name} tool answered {got!r}")
    samples = await interleave(cases, s.rounds, s.calls, s.warmup)
    m = medians(samples)
    versus_timed = paired_ratio(samples["adapter"], samples["timed"])
    version = importlib.metadata.version("openai-agents")
    return [
        Row(
            "adapter-openai-agents",
            "toolrelay Agents SDK adapter / plain @function_tool (invoke_function_tool)",
            paired_ratio(samples["adapter"], samples["plain"]),
            context=f"adapter {us(m['adapter'])}, openai-agents {version} @function_tool "
            f"{us(m['plain'])}: no deadline, no breaker, no envelope",
        ),
        Row(
            "adapter-openai-agents",
            "toolrelay Agents SDK adapter / @function_tool(timeout=…) (both with a deadline)",
            versus_timed,
            target="≤ 2×",
            passed=versus_timed <= 2,
            context=f"@function_tool(timeout=10) {us(m['timed'])}: asyncio.wait_for on a task",
        ),
        Row(
            "adapter-openai-agents",
            "Agents SDK adapter over Dispatcher.dispatch alone",
            paired_difference(samples["adapter"], samples["toolrelay"]) * 1e6,
            unit="+µs",
            context=f"dispatch {us(m['toolrelay'])}: ToolContext, SDK invocation, envelope JSON",
        ),
    ]


# -- the Pydantic AI adapter --------------------------------------------------------------
async def bench_adapter_pydantic_ai(s: Settings) -> list[Row]:
    """A tool call through ``toolrelay.integrations.pydantic_ai`` against Pydantic AI's own
    function tool, both at the toolset level (the model loop left out): the tool's argument
    validator on the model's JSON, then ``call_tool``, as Pydantic AI's ToolManager does."""
    try:
        from typing import Annotated

        from pydantic import Field
        from pydantic_ai import RunContext
        from pydantic_ai.models.test import TestModel
        from pydantic_ai.toolsets import AbstractToolset, FunctionToolset
        from pydantic_ai.usage import RunUsage

        from toolrelay.integrations.pydantic_ai import ToolrelayToolset
    except ImportError:
        name = "toolrelay Pydantic AI toolset / plain function tool"
        skip = "skipped (pip install '.[pydantic-ai]')"
        return [Row("adapter-pydantic-ai", name, status=skip)]

    async def noop_tool(city: str) -> dict[str, Any]:
        """Echo the city."""
        return {"city": city}

    noop_tool.__name__ = "noop"  # the tool's name
    # the same constraint as SCHEMA, set as objects: this module's annotations are strings
    noop_tool.__annotations__ = {
        "city": Annotated[str, Field(max_length=64)],
        "return": dict[str, Any],
    }
    ctx: RunContext[None] = RunContext(
        deps=None, model=TestModel(), usage=RunUsage(), tool_name="noop", tool_call_id="call_1"
    )
    d = dispatcher(noop_registry())

    async def case(toolset: AbstractToolset[None]) -> Case:
        tool = (await toolset.get_tools(ctx))["noop"]
        validator = tool.args_validator

        async def run() -> Any:
            return await toolset.call_tool("noop", validator.validate_json(ARGS), ctx, tool)

        return run

    cases = {
        "toolrelay": dispatch_case(d),
        "adapter": await case(ToolrelayToolset(d, auth=lambda ctx: CTX)),
        "plain": await case(FunctionToolset([noop_tool], timeout=None)),
        "timed": await case(FunctionToolset([noop_tool], timeout=10.0)),
    }
    await sanity(cases)
    for name in ("adapter", "plain", "timed"):
        got = await cases[name]()
        if got != ({"ok": True, "data": PARSED} if name == "adapter" else PARSED):
            raise RuntimeError(f"the {name} tool answered {got!r}")
    samples = await interleave(cases, s.rounds, s.calls, s.warmup)
    m = medians(samples)
    version = importlib.metadata.version("pydantic-ai-slim")
    return [
        Row(
            "adapter-pydantic-ai",
            "toolrelay Pydantic AI toolset / plain function tool (validate + call_tool)",
            paired_ratio(samples["adapter"], samples["plain"]),
            context=f"adapter {us(m['adapter'])}, pydantic-ai-slim {version} FunctionToolset "
            f"{us(m['plain'])}: no deadline, no breaker, no envelope",
        ),
        Row(
            "adapter-pydantic-ai",
            "toolrelay Pydantic AI toolset / FunctionToolset(timeout=…) (both with a deadline)",
            paired_ratio(samples["adapter"], samples["timed"]),
            context=f"FunctionToolset(timeout=10) {us(m['timed'])}: anyio.fail_after",
        ),
        Row(
            "adapter-pydantic-ai",
            "Pydantic AI toolset over Dispatcher.dispatch alone",
            paired_difference(samples["adapter"], samples["toolrelay"]) * 1e6,
            unit="+µs",
            context=f"dispatch {us(m['toolrelay'])}: argument parse, auth(ctx), envelope",
        ),
    ]
