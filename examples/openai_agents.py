"""An OpenAI Agents SDK agent whose tools run through toolrelay, offline.

python examples/openai_agents.py

A scripted model (no API key, no network) asks for the weather and a web search; the search
service hangs. The model reads a ``timeout`` answer, tries again, the search breaker opens
and the tool disappears from what the model is offered; the run still finishes.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents import Agent, AgentHooks, Model, ModelResponse, Runner, Usage, set_tracing_disabled
from agents.testing import assistant_message, function_call

from toolrelay import (
    AuthContext,
    BreakerOptions,
    Dispatcher,
    DispatcherOptions,
    KeyPolicy,
    ToolRegistry,
)
from toolrelay.integrations.openai_agents import function_tools

set_tracing_disabled(True)  # the SDK's own traces would go to OpenAI's servers

registry = ToolRegistry()
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 80}},
    "required": ["city"],
    "additionalProperties": False,
}
QUERY = {
    "type": "object",
    "properties": {"q": {"type": "string", "minLength": 1}},
    "required": ["q"],
    "additionalProperties": False,
}


@registry.tool(name="get_weather", description="Current weather for a city.", parameters=CITY)
async def get_weather(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
    return {"city": args["city"], "temperature_c": 4.5, "for_user": ctx.user_id}


@registry.tool(
    name="web_search",
    description="Search the web.",
    parameters=QUERY,
    timeout_s=0.2,
    breaker_key="search",
)
async def web_search(args: dict[str, Any], ctx: AuthContext) -> Any:
    await asyncio.sleep(3600)  # the search service hangs


class ScriptedModel(Model):
    """Reads the tool outputs it is given and decides, like a (very small) model would."""

    def __init__(self) -> None:
        self.turn = 0

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
        self.turn += 1
        offered = [tool.name for tool in tools]
        print(f"turn {self.turn}: tools offered {offered}")
        answers = {
            item["call_id"]: json.loads(item["output"])
            for item in input
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        }
        last = answers.get(f"search_{self.turn - 1}")
        if self.turn == 1:
            output = [
                function_call("get_weather", {"city": "Oslo"}, call_id="weather_1"),
                function_call("web_search", {"q": "Oslo events"}, call_id="search_1"),
            ]
        elif "web_search" in offered and last is not None and last["retryable"]:
            output = [
                function_call("web_search", {"q": "Oslo events"}, call_id=f"search_{self.turn}")
            ]
        else:
            weather = answers["weather_1"]["data"]
            output = [
                assistant_message(
                    f"It is {weather['temperature_c']} °C in {weather['city']}; "
                    "the web search is unavailable right now."
                )
            ]
        for item in output:
            if item.type == "function_call":
                print(f"  model → {item.name}({item.arguments}) [{item.call_id}]")
        return ModelResponse(output=output, usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


class PrintToolOutputs(AgentHooks[Any]):
    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: str) -> None:
        print(f"  tool ← {tool.name}: {result}")


def breaker_moved(key: str, old: str, new: str) -> None:
    print(f"  breaker {key}: {new}")


async def main() -> None:
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(
            keys={"search": KeyPolicy(breaker=BreakerOptions(fail_max=2, reset_timeout_s=60))}
        ),
        audit=None,
    )
    dispatcher.breakers.add_listener(breaker_moved)
    agent = Agent(
        name="assistant",
        model=ScriptedModel(),
        # "hide": the model is not shown the paused search (it never calls a tool it is not
        # shown; with the default "show" it would be answered circuit_open).
        tools=function_tools(dispatcher, unavailable="hide"),
        hooks=PrintToolOutputs(),
    )
    result = await Runner.run(agent, "What's on in Oslo today?", context=AuthContext(user_id="u1"))
    print(f"final: {result.final_output}")


if __name__ == "__main__":
    asyncio.run(main())
