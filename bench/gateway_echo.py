"""The trivial ``echo`` tool of ``bench/gateway.py``, as an MCP server and as a plugin.

    python bench/gateway_echo.py                      # an MCP server over stdio
    python bench/gateway_echo.py --http PORT [--json] # streamable HTTP on 127.0.0.1:PORT/mcp

As a toolrelay plugin (``[plugins.echo] module = "gateway_echo"`` with ``bench/`` on the
path), :func:`register` adds the same tool, answering with the same text.

The server is the MCP SDK's low-level ``Server`` (what an SDK server costs, nothing more),
with the SDK's defaults for HTTP unless ``--json`` (``json_response=True``). For the rows
beyond ``tools/call`` it also serves one resource (``echo://text``, read as "hello") and a
``progress`` tool that reports progress ``steps`` times before it answers.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

import anyio
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server

from toolrelay import AuthContext, ToolRegistry

NAME = "echo"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 1000}},
    "required": ["text"],
    "additionalProperties": False,
}
TOOL = types.Tool(
    name=NAME,
    description="Answers with the text it is given.",
    input_schema=SCHEMA,
    annotations=types.ToolAnnotations(read_only_hint=True, idempotent_hint=True),
)
PROGRESS = types.Tool(
    name="progress",
    description="Reports progress `steps` times (to a caller that asked), then answers.",
    input_schema={
        "type": "object",
        "properties": {"steps": {"type": "integer", "minimum": 0, "maximum": 1000}},
        "required": ["steps"],
    },
    annotations=types.ToolAnnotations(read_only_hint=True, idempotent_hint=True),
)
RESOURCE = types.Resource(uri="echo://text", name="text", mime_type="text/plain")
RESOURCE_TEXT = "hello"


# -- as a toolrelay plugin ------------------------------------------------------------------
async def echo(args: dict[str, Any], ctx: AuthContext) -> str:
    text: str = args["text"]
    return text


def register(registry: ToolRegistry, config: Mapping[str, Any]) -> None:
    registry.tool(
        name=NAME,
        description=TOOL.description,
        parameters=SCHEMA,
        risk="read",
        idempotent=True,
        breaker_key="echo",
    )(echo)


# -- as an MCP server -----------------------------------------------------------------------
async def list_tools(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[TOOL, PROGRESS])


async def call_tool(
    ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    if params.name == PROGRESS.name:
        steps = int((params.arguments or {}).get("steps", 0))
        for step in range(1, steps + 1):
            await ctx.session.report_progress(step, steps)
        return types.CallToolResult(content=[types.TextContent(type="text", text="done")])
    text = str((params.arguments or {}).get("text", ""))
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def list_resources(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[RESOURCE])


async def read_resource(
    ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
) -> types.ReadResourceResult:
    text = types.TextResourceContents(uri=str(params.uri), mime_type="text/plain", text="hello")
    return types.ReadResourceResult(contents=[text])


SERVER = Server(
    "echo",
    version="1",
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_list_resources=list_resources,
    on_read_resource=read_resource,
)


async def serve_stdio() -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        await SERVER.run(read_stream, write_stream, SERVER.create_initialization_options())


async def serve_http(port: int, json_response: bool) -> None:
    import uvicorn

    app = SERVER.streamable_http_app(json_response=json_response)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    await uvicorn.Server(config).serve()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve HTTP on this port")
    parser.add_argument("--json", action="store_true", help="json_response=True (HTTP)")
    options = parser.parse_args()
    if options.http is None:
        anyio.run(serve_stdio)
    else:
        anyio.run(serve_http, options.http, options.json)


if __name__ == "__main__":
    main()
