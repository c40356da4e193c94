"""Each agent framework's own tool handling next to toolrelay's, measured.

Four things a tool meets — it hangs, it raises, the model sends invalid arguments, its
service stays down — each played in one agent run per framework (OpenAI Agents SDK, Pydantic
AI, LangChain's ``create_agent``) with an offline scripted model, once with the framework's
native tool and once with the toolrelay adapter. A cell says what the model read (or that
the run failed, or hung) and how long the run took. docs/integrations/*.md print the table;
tests/test_bench_frameworks.py checks what it shows.

    python bench/frameworks.py [--framework openai-agents|pydantic-ai|langchain]

The native tools get the framework's own timeout where it has one (``DEADLINE_S``); a run
still going after ``HANG_BOUND_S`` is reported as hanging and cancelled. toolrelay's tool
has ``timeout_s=DEADLINE_S`` and a breaker that opens after 2 failures, and no retries (so
"service hits" counts the breaker's work alone).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from toolrelay import (
    BreakerOptions,
    Dispatcher,
    DispatcherOptions,
    KeyPolicy,
    RetryOptions,
    ToolRegistry,
)

DEADLINE_S = 0.5
HANG_BOUND_S = 3.0
DOWN_CALLS = 5
SCENARIOS = ["hang (async)", "hang (sync)", "exception", "invalid arguments", "service down"]
CITY = {"city": "Oslo"}


@dataclass
class Service:
    """The tool's service: what each scenario makes it do, and how often it was reached."""

    scenario: str
    hits: int = 0
    release: threading.Event = field(default_factory=threading.Event)

    async def answer(self, city: str) -> str:
        self.hits += 1
        if self.scenario == "hang (async)":
            await asyncio.sleep(60)
        if self.scenario in ("exception", "service down"):
            raise ConnectionError("upstream answered 503")
        return f"4.5 °C in {city}"

    def answer_sync(self, city: str) -> str:
        self.hits += 1
        self.release.wait(30)
        return f"4.5 °C in {city}"

    def calls(self) -> list[dict[str, Any]]:
        """The arguments of the model's calls, one a turn."""
        if self.scenario == "invalid arguments":
            return [{"city": 5}]
        return [CITY] * (DOWN_CALLS if self.scenario == "service down" else 1)


@dataclass
class Cell:
    outcome: str
    seconds: float
    hits: int

    def text(self) -> str:
        hits = f"; service reached {self.hits}×" if self.hits > 1 else ""
        return f"{self.outcome} ({self.seconds:.2f} s{hits})"


def _short(text: str, limit: int = 72) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def toolrelay_dispatcher(service: Service) -> Dispatcher:
    registry = ToolRegistry()
    opts = {"name": "weather", "timeout_s": DEADLINE_S, "breaker_key": "weather-api"}
    if service.scenario == "hang (sync)":

        def weather_sync(city: str) -> str:
            """Current weather for a city."""
            return service.answer_sync(city)

        registry.tool(**opts)(weather_sync)
    else:

        async def weather(city: str) -> str:
            """Current weather for a city."""
            return await service.answer(city)

        registry.tool(**opts)(weather)
    policy = KeyPolicy(
        breaker=BreakerOptions(fail_max=2, reset_timeout_s=30), retry=RetryOptions(max_attempts=1)
    )
    options = DispatcherOptions(keys={"weather-api": policy}, telemetry=False, audit=False)
    return Dispatcher(registry, options)


async def measure(run: Callable[[], Awaitable[list[str]]], service: Service) -> Cell:
    """One agent run: what the model read from its calls (the first, and for "service down"
    the last), or how the run failed."""
    started = time.perf_counter()
    try:
        read = await asyncio.wait_for(run(), HANG_BOUND_S)
    except TimeoutError:
        outcome = f"hangs: no answer after {HANG_BOUND_S:.0f} s (run cancelled)"
    except Exception as exc:
        outcome = f"run fails: {type(exc).__name__}: {_short(str(exc), 70)}"
    else:
        shown = read[:1] if service.scenario != "service down" else read[:1] + read[-1:]
        outcome = "model reads " + " … then ".join(f"`{_short(r)}`" for r in shown)
    finally:
        service.release.set()
    return Cell(outcome, time.perf_counter() - started, service.hits)


# -- OpenAI Agents SDK --------------------------------------------------------------------
async def agents_run(service: Service, relay: bool) -> list[str]:
    from agents import Agent, Model, ModelResponse, Runner, Usage, function_tool
    from agents.testing import assistant_message, function_call

    from toolrelay.integrations.openai_agents import function_tools

    calls, read = service.calls(), []

    class Scripted(Model):
        async def get_response(
            self, system_instructions: Any, input: Any, *a: Any, **k: Any
        ) -> Any:
            items = input if isinstance(input, list) else []
            read[:] = [i["output"] for i in items if isinstance(i, dict) and "output" in i]
            turn = len(read)
            out = (
                [function_call("weather", calls[turn], call_id=f"c{turn}")]
                if turn < len(calls)
                else [assistant_message("done")]
            )
            return ModelResponse(output=out, usage=Usage(requests=1), response_id=None)

        def stream_response(self, *a: Any, **k: Any) -> Any:
            raise NotImplementedError

    if relay:
        tools: list[Any] = function_tools(toolrelay_dispatcher(service))
    elif service.scenario == "hang (sync)":  # the SDK refuses timeout= for a sync tool

        def weather_sync(city: str) -> str:
            """Current weather for a city."""
            return service.answer_sync(city)

        tools = [function_tool(weather_sync, name_override="weather")]
    else:

        async def weather(city: str) -> str:
            """Current weather for a city."""
            return await service.answer(city)

        tools = [function_tool(weather, timeout=DEADLINE_S)]
    await Runner.run(Agent(name="a", model=Scripted(), tools=tools), "go", max_turns=20)
    return read


# -- Pydantic AI ----------------------------------------------------------------------------
async def pydantic_ai_run(service: Service, relay: bool) -> list[str]:
    from pydantic_ai import Agent, Tool
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        RetryPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import FunctionModel

    from toolrelay.integrations.pydantic_ai import ToolrelayToolset

    calls, read = service.calls(), []

    def scripted(messages: list[Any], info: Any) -> ModelResponse:
        parts = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts]
        read[:] = [
            json.dumps(p.content, ensure_ascii=False)
            if isinstance(p, ToolReturnPart)
            else p.model_response()
            for p in parts
            if isinstance(p, ToolReturnPart | RetryPromptPart)
        ]
        turn = len(read)
        if turn < len(calls):
            return ModelResponse(
                parts=[ToolCallPart("weather", json.dumps(calls[turn]), f"c{turn}")]
            )
        return ModelResponse(parts=[TextPart("done")])

    if relay:
        agent = Agent(
            FunctionModel(scripted), toolsets=[ToolrelayToolset(toolrelay_dispatcher(service))]
        )
    else:
        if service.scenario == "hang (sync)":

            def weather_sync(city: str) -> str:
                """Current weather for a city."""
                return service.answer_sync(city)

            tool = Tool(weather_sync, name="weather", timeout=DEADLINE_S)
        else:

            async def weather(city: str) -> str:
                """Current weather for a city."""
                return await service.answer(city)

            tool = Tool(weather, timeout=DEADLINE_S)
        agent = Agent(FunctionModel(scripted), tools=[tool])
    await agent.run("go")
    return read


# -- LangChain create_agent -----------------------------------------------------------------
async def langchain_run(service: Service, relay: bool) -> list[str]:
    from langchain.agents import create_agent
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import StructuredTool

    from toolrelay.integrations.langchain import langchain_tools

    calls, read = service.calls(), []

    class Scripted(BaseChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(
            self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kw: Any
        ) -> ChatResult:
            read[:] = [str(m.content) for m in messages if isinstance(m, ToolMessage)]
            turn = len(read)
            if turn < len(calls):
                call = {
                    "name": "weather",
                    "args": calls[turn],
                    "id": f"c{turn}",
                    "type": "tool_call",
                }
                message = AIMessage("", tool_calls=[call])
            else:
                message = AIMessage("done")
            return ChatResult(generations=[ChatGeneration(message=message)])

        @property
        def _llm_type(self) -> str:
            return "scripted"

    if relay:
        tools: list[Any] = langchain_tools(toolrelay_dispatcher(service))
    elif service.scenario == "hang (sync)":

        def weather_sync(city: str) -> str:
            """Current weather for a city."""
            return service.answer_sync(city)

        tools = [StructuredTool.from_function(weather_sync, name="weather")]
    else:

        async def weather(city: str) -> str:
            """Current weather for a city."""
            return await service.answer(city)

        tools = [StructuredTool.from_function(coroutine=weather, name="weather")]
    await create_agent(Scripted(), tools).ainvoke({"messages": [("user", "go")]})
    return read


FRAMEWORKS: dict[str, tuple[str, Callable[[Service, bool], Awaitable[list[str]]]]] = {
    "openai-agents": ("Agents SDK `@function_tool`", agents_run),
    "pydantic-ai": ("Pydantic AI `Tool(timeout=…)`", pydantic_ai_run),
    "langchain": ("LangChain `@tool` in `create_agent`", langchain_run),
}


async def table(framework: str) -> dict[str, tuple[Cell, Cell]]:
    """Scenario → (native cell, toolrelay cell)."""
    _, run = FRAMEWORKS[framework]
    for relay in (False, True):  # warm up: a framework's first run imports and builds a lot
        await run(Service("ok"), relay)
    rows = {}
    for scenario in SCENARIOS:
        cells = []
        for relay in (False, True):
            service = Service(scenario)
            cells.append(await measure(lambda s=service, r=relay: run(s, r), service))
        rows[scenario] = (cells[0], cells[1])
    return rows


def markdown(framework: str, rows: dict[str, tuple[Cell, Cell]]) -> str:
    native = FRAMEWORKS[framework][0]
    lines = [f"| the tool… | {native} | toolrelay |", "|---|---|---|"]
    lines += [f"| {name} | {a.text()} | {b.text()} |" for name, (a, b) in rows.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=sorted(FRAMEWORKS), action="append")
    args = parser.parse_args()
    from agents import set_tracing_disabled

    set_tracing_disabled(True)
    logging.getLogger("toolrelay").setLevel(logging.CRITICAL)  # "tool weather raised …" lines
    for framework in args.framework or list(FRAMEWORKS):
        print(f"\n{framework} (deadline {DEADLINE_S} s, hang bound {HANG_BOUND_S} s)\n")
        print(markdown(framework, asyncio.run(table(framework))))


if __name__ == "__main__":
    main()
