"""An MCP upstream whose tools talk back to the client during a call (2025-era protocol).

    python mcp_relay_server.py --record FILE               # over stdio
    python mcp_relay_server.py --record FILE --http PORT   # streamable HTTP, 127.0.0.1:PORT/mcp

Its tools log (``notifications/message``), report progress, ask the client to sample or to
elicit, list the client's roots, hang until cancelled, echo the ``_meta`` they got, and are
annotated (or not) in ways the gateway must pass on as stated. Every call, every
``logging/setLevel``, every cancellation and every answer to a request it sent the client
is appended to FILE as one JSON line (``tests/test_gateway_relay.py``).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import anyio
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

RECORD = ""
OBJECT: dict[str, Any] = {"type": "object", "properties": {}}
INSTRUCTIONS = "Relay upstream: call log before progress."


def record(**event: Any) -> None:
    with open(RECORD, "a") as file:
        file.write(json.dumps(event) + "\n")


def text(*texts: str) -> list[types.ContentBlock]:
    return [types.TextContent(type="text", text=t) for t in texts]


TOOLS = [
    types.Tool(name="plain", input_schema=OBJECT),  # no annotations: may be destructive
    types.Tool(
        name="reader",
        input_schema=OBJECT,
        annotations=types.ToolAnnotations(read_only_hint=True),  # no idempotency claimed
    ),
    types.Tool(
        name="titled",
        title="A titled tool",
        description="Has a title, an execution and an openWorldHint.",
        input_schema=OBJECT,
        annotations=types.ToolAnnotations(title="Annotated title", open_world_hint=False),
        execution=types.ToolExecution(task_support="forbidden"),
    ),
    types.Tool(name="annotated_text", input_schema=OBJECT),
    types.Tool(name="log", input_schema=OBJECT),
    types.Tool(name="progress", input_schema=OBJECT),
    types.Tool(name="sample", input_schema=OBJECT),
    types.Tool(name="elicit", input_schema=OBJECT),
    types.Tool(name="roots", input_schema=OBJECT),
    types.Tool(name="hang", input_schema=OBJECT),
    types.Tool(name="ping", input_schema=OBJECT),
    types.Tool(name="ask_2026", input_schema=OBJECT),  # asks the 2026 way: input required
    types.Tool(  # retried by toolrelay's policy if it were not for the client it asked
        name="elicit_then_fail",
        input_schema=OBJECT,
        annotations=types.ToolAnnotations(read_only_hint=True, idempotent_hint=True),
    ),
]


async def list_tools(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def set_level(
    ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams
) -> types.EmptyResult:
    record(event="set_level", level=params.level)
    return types.EmptyResult()


async def call_tool(
    ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    name = params.name
    meta = dict(ctx.meta or {})
    record(event="call", tool=name, meta={k: v for k, v in meta.items() if k != "traceparent"})
    session, related = ctx.session, ctx.request_id
    if name == "annotated_text":
        block = types.TextContent(
            type="text", text="for you", annotations=types.Annotations(audience=["user"])
        )
        return types.CallToolResult(content=[block])
    if name == "log":
        await session.send_log_message("info", "hello from upstream", "relay", related)
        await session.send_log_message("debug", "a detail", "relay", related)
        return types.CallToolResult(content=text("logged"))
    if name == "ask_2026":
        return ask_2026(params)
    if name == "progress":
        token = meta.get("progress_token")  # as the SDK parsed it
        if token is not None:
            for step in (1, 2, 3):
                await session.send_progress_notification(token, step, 3, f"step {step}", related)
        return types.CallToolResult(content=text(f"done ({token is not None})"))
    try:
        if name == "sample":
            message = types.SamplingMessage(
                role="user", content=types.TextContent(type="text", text="2+2?")
            )
            sampled = await session.create_message(
                [message], max_tokens=10, related_request_id=related
            )
            answer = sampled.content.text if isinstance(sampled.content, types.TextContent) else "?"
            return types.CallToolResult(content=text(f"sampled: {answer}"))
        if name == "elicit_then_fail":
            await session.elicit_form("Sure?", OBJECT, related)
            return types.CallToolResult(content=text("service unavailable"), is_error=True)
        if name == "elicit":
            schema = {
                "type": "object",
                "properties": {"color": {"type": "string", "default": "red"}},
            }
            elicited = await session.elicit_form("Favourite colour?", schema, related)
            record(event="elicited", action=elicited.action, content=elicited.content)
            return types.CallToolResult(content=text(f"{elicited.action}: {elicited.content}"))
        if name == "roots":
            roots = await session.list_roots()
            return types.CallToolResult(content=text(" ".join(str(r.uri) for r in roots.roots)))
    except MCPError as exc:
        record(event="refused", tool=name, code=exc.code, message=exc.message)
        return types.CallToolResult(
            content=text(f"refused {exc.code}: {exc.message}"), is_error=True
        )
    except anyio.get_cancelled_exc_class():
        record(event="cancelled", tool=name)
        raise
    if name == "ping":
        await session.send_ping()
        return types.CallToolResult(content=text("pong"))
    if name == "hang":
        try:
            await anyio.sleep(30)
        except anyio.get_cancelled_exc_class():
            record(event="cancelled", tool=name)
            raise
    return types.CallToolResult(content=text(f"{name} works"))


def ask_2026(
    params: types.CallToolRequestParams,
) -> types.CallToolResult | types.InputRequiredResult:
    """Sampling and elicitation as a 2026-era server asks: an ``InputRequiredResult``, and
    the call made again with the answers (and the state it was given)."""
    answers = params.input_responses or {}
    if params.request_state != "asked" or set(answers) != {"sample", "elicit"}:
        message = types.SamplingMessage(
            role="user", content=types.TextContent(type="text", text="2+2?")
        )
        schema = {"type": "object", "properties": {"color": {"type": "string", "default": "red"}}}
        asks: dict[str, Any] = {
            "sample": types.CreateMessageRequest(
                params=types.CreateMessageRequestParams(messages=[message], max_tokens=10)
            ),
            "elicit": types.ElicitRequest(
                params=types.ElicitRequestFormParams(
                    message="Favourite colour?", requested_schema=schema
                )
            ),
        }
        return types.InputRequiredResult(input_requests=asks, request_state="asked")
    sampled, elicited = answers["sample"], answers["elicit"]
    assert isinstance(sampled, types.CreateMessageResult) and isinstance(
        elicited, types.ElicitResult
    )
    said = sampled.content.text if isinstance(sampled.content, types.TextContent) else "?"
    return types.CallToolResult(
        content=text(f"sampled: {said}; {elicited.action}: {elicited.content}")
    )


SERVER = Server(
    "toolrelay-relay-test",
    version="1",
    instructions=INSTRUCTIONS,
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_set_logging_level=set_level,
)


async def serve_stdio() -> None:
    async with stdio_server() as (read_stream, write_stream):
        await SERVER.run(read_stream, write_stream, SERVER.create_initialization_options())


async def serve_http(port: int) -> None:
    import uvicorn

    app = SERVER.streamable_http_app()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    await uvicorn.Server(config).serve()


def main() -> None:
    global RECORD
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", required=True)
    parser.add_argument("--http", type=int, metavar="PORT")
    options = parser.parse_args()
    RECORD = options.record
    if options.http is None:
        anyio.run(serve_stdio)
    else:
        anyio.run(serve_http, options.http)


if __name__ == "__main__":
    main()
