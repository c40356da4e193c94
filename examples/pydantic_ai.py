"""A Pydantic AI agent whose search service hangs: toolrelay answers, the agent goes on.

python examples/pydantic_ai.py     (offline: the model is Pydantic AI's FunctionModel)
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file's name would shadow the pydantic_ai package when run as a script.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

import json
from typing import Any

import anyio
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from toolrelay import (
    AuthContext,
    BreakerOptions,
    Dispatcher,
    DispatcherOptions,
    KeyPolicy,
    RetryOptions,
    ToolRegistry,
)
from toolrelay.integrations.pydantic_ai import ToolrelayToolset

registry = ToolRegistry()


@registry.tool(
    name="get_weather",
    description="Current weather for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 80}},
        "required": ["city"],
        "additionalProperties": False,
    },
    breaker_key="open-meteo",
)
async def get_weather(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
    return {"city": args["city"], "temperature_c": 4.5}


@registry.tool(
    name="web_search",
    description="Search the web.",
    parameters={
        "type": "object",
        "properties": {"query": {"type": "string", "maxLength": 300}},
        "required": ["query"],
        "additionalProperties": False,
    },
    timeout_s=0.3,
    breaker_key="searxng",
)
async def web_search(args: dict[str, Any], ctx: AuthContext) -> list[str]:
    await anyio.sleep(3600)  # the upstream hangs
    return []


dispatcher = Dispatcher(
    registry,
    DispatcherOptions(
        keys={
            "searxng": KeyPolicy(
                breaker=BreakerOptions(fail_max=2, reset_timeout_s=60),
                retry=RetryOptions(max_attempts=1),
            )
        },
        telemetry=False,
    ),
    audit=None,
)


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A scripted model that reads toolrelay's answers and decides what to do next."""
    step = sum(isinstance(m, ModelResponse) for m in messages) + 1
    print(f"step {step}  breaker searxng: {dispatcher.breakers.state('searxng')}")
    print(f"        model sees tools: {', '.join(t.name for t in info.function_tools)}")
    answers = {}
    for part in messages[-1].parts if isinstance(messages[-1], ModelRequest) else ():
        if isinstance(part, ToolReturnPart):
            answers[part.tool_name] = part.content
            print(f"        {part.tool_name} answered {json.dumps(part.content)}")
    search = answers.get("web_search")
    if step == 1:
        calls = [
            ToolCallPart("get_weather", '{"city": "Oslo"}', tool_call_id="call_1"),
            ToolCallPart("web_search", '{"query": "oslo events"}', tool_call_id="call_2"),
        ]
    elif step == 2 and search["error_type"] == "timeout" and search["retryable"]:
        print("        model: search timed out and says it is retryable; trying once more")
        calls = [ToolCallPart("web_search", '{"query": "oslo events"}', tool_call_id="call_3")]
    else:
        searchable = any(t.name == "web_search" for t in info.function_tools)
        text = "It is 4.5 °C in Oslo. " + (
            "" if searchable else "Search is unavailable right now; I will not wait for it."
        )
        print(f"model: {text}")
        return ModelResponse(parts=[TextPart(text)])
    names = ", ".join(f"{c.tool_name}({c.args}) [{c.tool_call_id}]" for c in calls)
    print(f"        model calls {names}")
    return ModelResponse(parts=list(calls))


async def main() -> None:
    # "hide": the paused search is left out of what the model sees (the default, "show",
    # lists it and answers a call circuit_open).
    agent = Agent(FunctionModel(model), toolsets=[ToolrelayToolset(dispatcher, unavailable="hide")])
    result = await agent.run("What's on in Oslo, and how cold is it?")
    print(f"run finished: {result.output!r}")


if __name__ == "__main__":
    anyio.run(main)
