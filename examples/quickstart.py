"""A scripted session: an agent keeps answering while one of its services hangs.

python examples/quickstart.py
"""

from __future__ import annotations

import json
from typing import Any

import anyio

from toolrelay import (
    AuthContext,
    BreakerOptions,
    Dispatcher,
    DispatcherOptions,
    KeyPolicy,
    Profile,
    RetryOptions,
    ToolCall,
    ToolError,
    ToolRegistry,
)

registry = ToolRegistry()
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 80}},
    "required": ["city"],
    "additionalProperties": False,
}
search_is_down = True


@registry.tool(
    name="get_weather",
    description="Current weather for a city, as measurements.",
    parameters=CITY,
    timeout_s=2.0,
    breaker_key="open-meteo",
)
async def get_weather(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
    if args["city"].lower() == "atlantis":
        raise ToolError("no place named Atlantis", counts_as_failure=False)
    return {"city": args["city"], "temperature_c": 4.5, "wind_kmh": 12}


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
async def web_search(args: dict[str, Any], ctx: AuthContext) -> list[dict[str, str]]:
    if search_is_down:
        await anyio.sleep(3600)  # the upstream hangs
    return [{"title": "toolrelay", "url": "https://example.org/toolrelay"}]


@registry.tool(
    name="delete_account",
    description="Delete the user's account.",
    parameters={"type": "object", "properties": {}, "additionalProperties": False},
    risk="dangerous",
)
async def delete_account(args: dict[str, Any], ctx: AuthContext) -> str:
    return "deleted"


def show(turn: str, call: ToolCall, answer: dict[str, Any]) -> None:
    print(f"{turn:<8} {call.name}({call.arguments}) → {json.dumps(answer)}")


async def main() -> None:
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(
            profiles={"support": Profile(allow={"get_weather", "web_search", "delete_account"})},
            keys={
                "searxng": KeyPolicy(
                    breaker=BreakerOptions(fail_max=2, reset_timeout_s=1.0),
                    retry=RetryOptions(max_attempts=1),
                )
            },
            telemetry=False,
        ),
    )
    ctx = AuthContext(user_id="u1", tenant_id="t1")
    slot = dispatcher.model_slot(budget_s=5)
    weather, search = "get_weather", "web_search"
    turns = [
        [ToolCall(weather, '{"city": "Oslo"}', "c1"), ToolCall(search, '{"query": "oslo"}', "c2")],
        [ToolCall(search, '{"query": "bergen"}', "c3")],
        [ToolCall(search, '{"query": "tromsø"}', "c4")],
        [ToolCall(weather, '{"city": 42}', "c5"), ToolCall(weather, '{"city": "Atlantis"}', "c6")],
        [ToolCall("delete_account", "{}", "c7"), ToolCall("send_email", "{}", "c8")],
    ]
    for number, calls in enumerate(turns, 1):
        async with slot.hold() as lease:
            results = await dispatcher.dispatch_many(calls, ctx, profile="support", slot=lease)
        for call, result in zip(calls, results, strict=True):
            show(f"turn {number}", call, result.to_model())
        print(f"         breaker searxng: {dispatcher.breakers.state('searxng')}")
    global search_is_down
    search_is_down = False
    await anyio.sleep(1.1)  # the reset timeout passes; the next call is a trial
    async with slot.hold() as lease:
        call = ToolCall("web_search", '{"query": "recovered?"}', "c9")
        result = await dispatcher.dispatch(call.name, call.arguments, ctx, slot=lease)
    show("turn 6", call, result.to_model())
    print(f"         breaker searxng: {dispatcher.breakers.state('searxng')}")
    offered = [spec["function"]["name"] for spec in dispatcher.specs("support")]
    print(f"tools the model is offered now: {offered}")


if __name__ == "__main__":
    anyio.run(main)
