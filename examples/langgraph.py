"""A LangGraph agent whose search service hangs: the model reads the timeouts, the breaker
opens, and the next step no longer offers the tool. Runs offline with a scripted chat model.

python examples/langgraph.py
"""

# ruff: noqa: E402
from __future__ import annotations

import sys
from pathlib import Path

# This file is named like the package it shows: keep its folder off the import path.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
from langchain.agents import create_agent
from langchain.agents.middleware import ModelRequest, ModelResponse, wrap_model_call
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field

from toolrelay import (
    AuthContext,
    BreakerOptions,
    Dispatcher,
    DispatcherOptions,
    KeyPolicy,
    RetryOptions,
    ToolRegistry,
)
from toolrelay.integrations.langchain import langchain_tools

registry = ToolRegistry()


@registry.tool(
    description="Current weather for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
async def get_weather(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
    return {"city": args["city"], "temperature_c": 4.5}


@registry.tool(
    description="Search the web.",
    parameters={
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
        "additionalProperties": False,
    },
    timeout_s=0.3,
    breaker_key="searxng",
)
async def web_search(args: dict[str, Any], ctx: AuthContext) -> list[str]:
    await anyio.sleep(3600)  # the upstream hangs
    return []


Script = Callable[[list[BaseMessage], list[str]], AIMessage]


class ScriptedModel(BaseChatModel):
    """A stand-in for a real chat model: ``script(messages, offered)`` reads the answers and
    decides what to do next; ``bound`` records the tool names offered at each turn (the tests
    use this model too)."""

    script: Script
    bound: list[list[str]] = Field(default_factory=list)

    def bind_tools(
        self, tools: Sequence[Any], **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        offered = [spec["function"]["name"] for spec in kw.get("tools", [])]
        self.bound.append(offered)
        return ChatResult(generations=[ChatGeneration(message=self.script(messages, offered))])

    @property
    def _llm_type(self) -> str:
        return "scripted"


def decide(messages: list[BaseMessage], offered: list[str]) -> AIMessage:
    print(f"  (offered: {', '.join(offered)})")
    step = sum(isinstance(m, AIMessage) for m in messages) + 1
    if step == 1:
        return AIMessage(
            "",
            tool_calls=[
                {"name": "get_weather", "args": {"city": "Oslo"}, "id": "call-1"},
                {"name": "web_search", "args": {"query": "Oslo news"}, "id": "call-2"},
            ],
        )
    search = [m for m in messages if isinstance(m, ToolMessage) and m.name == "web_search"]
    last = json.loads(str(search[-1].content))
    if "web_search" in offered and last.get("retryable"):  # "retryable": ask once more
        return AIMessage(
            "", tool_calls=[{"name": "web_search", "args": {"query": "Oslo"}, "id": f"call-{step}"}]
        )
    reason = "timed out" if last["error_type"] == "timeout" else "failed"
    return AIMessage(f"It is 4.5 °C in Oslo. The news search {reason} twice; no headlines for now.")


def show(message: BaseMessage) -> None:
    if isinstance(message, ToolMessage):
        print(f"tool {message.name} → {message.content}")
    elif isinstance(message, AIMessage) and message.tool_calls:
        calls = ", ".join(f"{c['name']}({json.dumps(c['args'])})" for c in message.tool_calls)
        print(f"model calls {calls}")
    elif isinstance(message, AIMessage):
        print(f"assistant: {message.content}")


async def main() -> None:
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(
            keys={
                "searxng": KeyPolicy(
                    breaker=BreakerOptions(fail_max=2, reset_timeout_s=30),
                    retry=RetryOptions(max_attempts=1),
                )
            },
            telemetry=False,
        ),
        audit=None,
    )
    dispatcher.breakers.add_listener(lambda key, old, new: print(f"  breaker {key}: {old} → {new}"))
    model = ScriptedModel(script=decide)

    @wrap_model_call
    async def healthy_tools_only(
        request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
    ) -> ModelResponse:
        # each step offers the model only the tools whose breaker lets calls through; the
        # agent's tool node keeps them all, so a call to a paused one is answered circuit_open
        shown = {tool.name for tool in langchain_tools(dispatcher, unavailable="hide")}
        tools = [t for t in request.tools if isinstance(t, dict) or t.name in shown]
        return await handler(request.override(tools=tools))

    agent = create_agent(model, langchain_tools(dispatcher), middleware=[healthy_tools_only])
    question = "What's the weather in Oslo, and any news?"
    print(f"user: {question}")
    async for update in agent.astream(
        {"messages": [HumanMessage(question)]}, stream_mode="updates"
    ):
        for node in update.values():
            for message in node["messages"]:
                show(message)


if __name__ == "__main__":
    anyio.run(main)
