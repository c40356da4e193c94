"""An MCP server for toolrelay's tests, on the MCP Python SDK 2.x low-level ``Server``.

    python mcp_test_server.py --record FILE               # over stdio
    python mcp_test_server.py --record FILE --http PORT   # streamable HTTP, 127.0.0.1:PORT/mcp
    python mcp_test_server.py --record FILE --content     # also the CONTENT tools
    python mcp_test_server.py --record FILE --modern-only # refuses the 2025 handshake
    python mcp_test_server.py --record FILE --lists TAG   # also resources, prompts, completions

It serves both protocol eras (the client's first request decides). Every ``tools/call`` it
receives, and every call cancelled under it, is appended to FILE as one JSON line, so a
test can prove what did (and did not) reach the server. (Servers written without the SDK,
as servers in other languages are: ``hand_written_server.py``.) The low-level server is used (not
``MCPServer``) so the test controls the exact listing and results: annotations, odd names,
odd schemas, ``structuredContent`` next to different text, ``isError``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
from typing import Any

import anyio
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourceUpdated,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPError
from mcp.types.version import MODERN_PROTOCOL_VERSIONS

READ = types.ToolAnnotations(read_only_hint=True, idempotent_hint=True)
OBJECT: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def _schema(properties: dict[str, Any], *required: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


TOOLS: dict[str, types.Tool] = {
    tool.name: tool
    for tool in [
        types.Tool(
            name="structured",
            description="Doubles n; answers with text and with structured content.",
            input_schema=_schema({"n": {"type": "integer"}}, "n"),
            output_schema={
                "type": "object",
                "properties": {"n": {"type": "integer"}, "doubled": {"type": "integer"}},
                "required": ["n", "doubled"],
            },
            annotations=READ,
        ),
        types.Tool(
            name="text",
            description="Echoes a message as one text item.",
            input_schema=_schema({"message": {"type": "string", "maxLength": 50}}, "message"),
            annotations=READ,
        ),
        types.Tool(
            name="multi", description="Two text items.", input_schema=OBJECT, annotations=READ
        ),
        types.Tool(
            name="fail", description="Always isError.", input_schema=OBJECT, annotations=READ
        ),
        types.Tool(
            name="hang",
            description="Sleeps; records a cancellation.",
            input_schema=_schema({"seconds": {"type": "number"}, "tag": {"type": "string"}}, "tag"),
            annotations=READ,
        ),
        types.Tool(
            name="big",
            description="Answers with mib MiB of text.",
            input_schema=_schema({"mib": {"type": "number"}}, "mib"),
            annotations=READ,
        ),
        types.Tool(
            name="pid",
            description="The server's process id.",
            input_schema=OBJECT,
            annotations=READ,
        ),
        types.Tool(
            name="add_tool",
            description="Adds a tool (or gives one a new input_schema) and announces the change.",
            input_schema=_schema(
                {"name": {"type": "string"}, "input_schema": {"type": "object"}}, "name"
            ),
        ),
        types.Tool(name="crash", description="Ends the server process.", input_schema=OBJECT),
        types.Tool(
            name="redos",
            description="Declares a backtracking-hostile output pattern, answers against it.",
            input_schema=OBJECT,
            output_schema=_schema({"word": {"type": "string", "pattern": "^(a+)+$"}}, "word"),
            annotations=READ,
        ),
        # Listed for the mapping rules.
        types.Tool(name="dotted.name", description="A name with a dot.", input_schema=OBJECT),
        types.Tool(
            name="wipe",
            input_schema=OBJECT,
            annotations=types.ToolAnnotations(title="Wipe everything", destructive_hint=True),
        ),
        types.Tool(
            name="careful",
            description="Writes, idempotently.",
            input_schema=OBJECT,
            annotations=types.ToolAnnotations(
                read_only_hint=False, destructive_hint=False, idempotent_hint=True
            ),
        ),
        types.Tool(
            name="who",
            description="Declares an identity property: toolrelay must skip it.",
            input_schema=_schema({"user_id": {"type": "string"}}),
        ),
        types.Tool(name="n" * 70, description="Too long for toolrelay.", input_schema=OBJECT),
        types.Tool(
            name="bad_schema",
            description="Not a valid JSON Schema.",
            input_schema={"type": "object", "properties": {"x": {"type": "nope"}}},
        ),
    ]
}

_PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256))).decode()
_WAV = base64.b64encode(b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(64)).decode()
_LINK = types.ResourceLink(
    type="resource_link",
    uri="file:///srv/report.txt",
    name="report",
    title="Q3 report",
    description="The quarterly report.",
    mime_type="text/plain",
    size=1234,
    annotations=types.Annotations(audience=["user"], priority=0.3),
)
CONTENT: dict[str, types.CallToolResult] = {
    "text_and_structured": types.CallToolResult(
        content=[types.TextContent(type="text", text="hello")],
        structured_content={"result": "hello"},
    ),
    "image": types.CallToolResult(
        content=[
            types.ImageContent(
                type="image",
                data=_PNG,
                mime_type="image/png",
                annotations=types.Annotations(audience=["user", "assistant"], priority=0.7),
            )
        ]
    ),
    "audio": types.CallToolResult(
        content=[types.AudioContent(type="audio", data=_WAV, mime_type="audio/wav")]
    ),
    "resource_link": types.CallToolResult(content=[_LINK]),
    "embedded": types.CallToolResult(
        content=[
            types.EmbeddedResource(
                type="resource",
                resource=types.TextResourceContents(
                    uri="file:///srv/notes.md", mime_type="text/markdown", text="# Notes\n"
                ),
            ),
            types.EmbeddedResource(
                type="resource",
                resource=types.BlobResourceContents(
                    uri="file:///srv/logo.png", mime_type="image/png", blob=_PNG
                ),
                meta={"origin": "test"},
            ),
        ]
    ),
    "mixed": types.CallToolResult(
        content=[
            types.TextContent(
                type="text",
                text="Here is the chart",
                annotations=types.Annotations(audience=["assistant"]),
                meta={"chart": 1},
            ),
            types.ImageContent(type="image", data=_PNG, mime_type="image/png"),
            _LINK,
            types.TextContent(type="text", text="done"),
        ],
        structured_content={"charts": 1, "links": ["file:///srv/report.txt"]},
    ),
    "texts": types.CallToolResult(
        content=[
            types.TextContent(type="text", text="one", annotations=types.Annotations(priority=1)),
            types.TextContent(type="text", text="two"),
        ]
    ),
    # structured content beside a text far larger than it: the gateway falls back
    "padded": types.CallToolResult(
        content=[types.TextContent(type="text", text="p" * 20_000)],
        structured_content={"n": 1},
    ),
}
"""Results that ``--content`` adds as tools of the same name, each answered as it is."""

BUS = InMemorySubscriptionBus()
RECORD = ""


def _changed_schemas() -> dict[str, Any]:
    """The input schemas ``add_tool`` changed (in this server or an earlier one)."""
    try:
        with open(RECORD + ".tools.json", encoding="utf-8") as changed:
            found: dict[str, Any] = json.load(changed)
            return found
    except FileNotFoundError:
        return {}


def _keep_schema(name: str, schema: Any) -> None:
    schemas = _changed_schemas()
    schemas[name] = schema
    with open(RECORD + ".tools.json", "w", encoding="utf-8") as out:
        json.dump(schemas, out)


def record(**event: Any) -> None:
    with open(RECORD, "a", encoding="utf-8") as out:
        out.write(json.dumps(event) + "\n")


def text(*items: str) -> list[types.ContentBlock]:
    return [types.TextContent(type="text", text=item) for item in items]


async def list_tools(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=list(TOOLS.values()))


async def call_tool(
    ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    name, args = params.name, params.arguments or {}
    headers = getattr(ctx.request, "headers", None)  # the HTTP request, on streamable HTTP
    record(
        event="call",
        tool=name,
        arguments=args,
        protocol=ctx.protocol_version,
        x_test=None if headers is None else headers.get("x-test"),
        # the trace context the caller passed on (test_gateway_traces), when there is one
        **(
            {"trace": {k: v for k, v in ctx.meta.items() if k in ("traceparent", "tracestate")}}
            if ctx.meta and "traceparent" in ctx.meta
            else {}
        ),
    )
    if name not in TOOLS:
        raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {name}")
    if name in CONTENT:
        return CONTENT[name]
    if name == "structured":
        n = int(args["n"])
        return types.CallToolResult(
            content=text(f"{n} doubled is {2 * n}"), structured_content={"n": n, "doubled": 2 * n}
        )
    if name == "text":
        return types.CallToolResult(content=text(f"echo: {args['message']}"))
    if name == "multi":
        return types.CallToolResult(content=text("one", "two"))
    if name == "fail":
        return types.CallToolResult(
            content=text("the widget is broken: " + "x" * 500), is_error=True
        )
    if name == "hang":
        try:
            await anyio.sleep(float(args.get("seconds", 30)))
        except anyio.get_cancelled_exc_class():
            record(event="cancelled", tool=name, tag=args.get("tag"))
            raise
        return types.CallToolResult(content=text("woke up"))
    if name == "big":
        return types.CallToolResult(content=text("a" * int(float(args["mib"]) * 1024 * 1024)))
    if name == "pid":
        return types.CallToolResult(
            content=text(str(os.getpid())), structured_content={"pid": os.getpid()}
        )
    if name == "add_tool":
        added = str(args["name"])
        if "input_schema" in args:  # kept beside the record: every later server lists it too
            _keep_schema(added, args["input_schema"])
            TOOLS[added] = TOOLS[added].model_copy(update={"input_schema": args["input_schema"]})
        else:
            TOOLS[added] = types.Tool(
                name=added, description="Added at run time.", input_schema=OBJECT
            )
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            await BUS.publish(ToolsListChanged())  # 2026: reaches subscriptions/listen streams
        else:
            await ctx.session.send_tool_list_changed()  # 2025: notifications/tools/list_changed
        return types.CallToolResult(content=text(f"added {added}"))
    if name == "crash":
        os._exit(3)
    if name == "touch":  # the resource at uri changed (lists: its subscribers are told)
        uri = str(args["uri"])
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            await BUS.publish(ResourceUpdated(uri))
        else:
            await ctx.session.send_resource_updated(uri)
        return types.CallToolResult(content=text(f"touched {uri}"))
    if name == "add_prompt":
        PROMPTS.append(types.Prompt(name=str(args["name"]), description="Added at run time."))
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            await BUS.publish(PromptsListChanged())
        else:
            await ctx.session.send_prompt_list_changed()
        return types.CallToolResult(content=text("added"))
    if name == "redos":  # 30 characters: ~50 s in a backtracking regex engine
        word = "a" * 29 + "!"
        return types.CallToolResult(content=text(word), structured_content={"word": word})
    return types.CallToolResult(content=text(f"{name} works"))


SERVER = Server(
    "toolrelay-test",
    version="1",
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_subscriptions_listen=ListenHandler(BUS),
)


# --lists TAG: resources TAG://doc/0..119 (pages of 50), a blob, the template
# TAG://item/{id}, prompts (pages of 1) and completions; subscriptions are recorded.
TAG = ""
PROMPTS: list[types.Prompt] = []
PAGE = {"resources": 50, "templates": 1, "prompts": 1}


def _page(kind: str, items: list[Any], cursor: str | None) -> tuple[list[Any], str | None]:
    start = int(cursor or 0)
    end = start + PAGE[kind]
    return items[start:end], (str(end) if end < len(items) else None)


def _resources() -> list[types.Resource]:
    docs = [
        types.Resource(uri=f"{TAG}://doc/{n}", name=f"doc{n}", mime_type="text/plain")
        for n in range(120)
    ]
    return [*docs, types.Resource(uri=f"{TAG}://blob", name="blob", mime_type="image/png")]


async def list_resources(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListResourcesResult:
    page, cursor = _page("resources", _resources(), params.cursor if params else None)
    return types.ListResourcesResult(resources=page, next_cursor=cursor)


async def list_templates(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListResourceTemplatesResult:
    templates = [
        types.ResourceTemplate(uri_template=f"{TAG}://item/{{id}}", name="item"),
        types.ResourceTemplate(uri_template=f"{TAG}://user/{{name}}/card", name="card"),
    ]
    page, cursor = _page("templates", templates, params.cursor if params else None)
    return types.ListResourceTemplatesResult(resource_templates=page, next_cursor=cursor)


async def read_resource(
    ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
) -> types.ReadResourceResult:
    uri = str(params.uri)
    record(event="read", uri=uri, protocol=ctx.protocol_version)
    if uri == f"{TAG}://blob":
        blob = types.BlobResourceContents(uri=uri, mime_type="image/png", blob=_PNG)
        return types.ReadResourceResult(contents=[blob])
    if uri == f"{TAG}://item/slow":  # answers after 30 s
        await anyio.sleep(30)
    known = uri.startswith((f"{TAG}://doc/", f"{TAG}://item/", f"{TAG}://user/"))
    if not known:
        raise MCPError(code=-32002, message=f"Resource not found: {uri}")
    contents = types.TextResourceContents(uri=uri, mime_type="text/plain", text=f"{TAG}: {uri}")
    return types.ReadResourceResult(contents=[contents])


async def subscribe(
    ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
) -> types.EmptyResult:
    uri = str(params.uri)
    record(event="subscribe", uri=uri)
    if uri == f"{TAG}://item/late" and uri not in _LATE:  # the first one answers after 1 s
        _LATE.add(uri)
        await anyio.sleep(1)
    return types.EmptyResult()


_LATE: set[str] = set()


async def unsubscribe(
    ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
) -> types.EmptyResult:
    record(event="unsubscribe", uri=str(params.uri))
    if str(params.uri) == f"{TAG}://item/slow":  # answers after the gateway's 2 s bound
        await anyio.sleep(5)
    return types.EmptyResult()


async def list_prompts(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListPromptsResult:
    page, cursor = _page("prompts", PROMPTS, params.cursor if params else None)
    return types.ListPromptsResult(prompts=page, next_cursor=cursor)


async def get_prompt(
    ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
) -> types.GetPromptResult:
    args = params.arguments or {}
    if params.name not in {prompt.name for prompt in PROMPTS}:
        raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown prompt: {params.name}")
    said = f"{TAG} says hello to {args.get('name', 'nobody')}"
    message = types.PromptMessage(role="user", content=types.TextContent(type="text", text=said))
    return types.GetPromptResult(description=params.name, messages=[message])


async def complete(
    ctx: ServerRequestContext[Any], params: types.CompleteRequestParams
) -> types.CompleteResult:
    ref, argument = params.ref, params.argument
    record(event="complete", ref=ref.model_dump(mode="json"), argument=argument.name)
    names = ["alice", "bob", "bert"] if argument.name == "name" else ["1", "2", "12"]
    values = [name for name in names if name.startswith(argument.value)]
    return types.CompleteResult(completion=types.Completion(values=values, total=len(values)))


def offer_lists(tag: str) -> None:
    global TAG
    TAG = tag
    PROMPTS[:] = [
        types.Prompt(
            name="greet",
            description="Greets someone.",
            arguments=[types.PromptArgument(name="name", required=True)],
        ),
        types.Prompt(name="plain", description="No arguments."),
    ]
    for name in ("touch", "add_prompt"):
        TOOLS[name] = types.Tool(name=name, input_schema={"type": "object"})
    handlers: list[tuple[str, Any, Any]] = [
        ("resources/list", types.PaginatedRequestParams, list_resources),
        ("resources/templates/list", types.PaginatedRequestParams, list_templates),
        ("resources/read", types.ReadResourceRequestParams, read_resource),
        ("resources/subscribe", types.SubscribeRequestParams, subscribe),
        ("resources/unsubscribe", types.UnsubscribeRequestParams, unsubscribe),
        ("prompts/list", types.PaginatedRequestParams, list_prompts),
        ("prompts/get", types.GetPromptRequestParams, get_prompt),
        ("completion/complete", types.CompleteRequestParams, complete),
    ]
    for method, params, handler in handlers:
        SERVER.add_request_handler(method, params, handler)


async def refuse_handshake(ctx: ServerRequestContext[Any, Any], call_next: Any) -> Any:
    """A 2026-era-only server: ``initialize`` is answered as the SDK's own modern-locked
    connection answers it (-32022, naming the versions served); everything else passes."""
    if ctx.method == "initialize":
        record(event="handshake_refused")
        raise MCPError(
            code=types.UNSUPPORTED_PROTOCOL_VERSION,
            message="this server speaks only the 2026-era protocol",
            data={"supported": list(MODERN_PROTOCOL_VERSIONS)},
        )
    return await call_next(ctx)


async def serve_stdio() -> None:
    async with stdio_server() as (read_stream, write_stream):
        changed = NotificationOptions(tools_changed=True, prompts_changed=True)
        options = SERVER.create_initialization_options(changed)
        await SERVER.run(read_stream, write_stream, options)


async def serve_http(port: int, json_response: bool = False) -> None:
    import uvicorn

    app = SERVER.streamable_http_app(json_response=json_response)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    await uvicorn.Server(config).serve()


def main() -> None:
    global RECORD
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", required=True, help="append calls and cancellations here")
    parser.add_argument("--http", type=int, metavar="PORT", help="serve HTTP on 127.0.0.1:PORT")
    parser.add_argument("--json", action="store_true", help="HTTP answers as JSON, not SSE")
    parser.add_argument("--content", action="store_true", help="also the CONTENT tools")
    parser.add_argument("--modern-only", action="store_true", help="refuse the 2025 handshake")
    parser.add_argument("--lists", metavar="TAG", help="also resources, prompts, completions")
    parser.add_argument("--tool", action="append", default=[], help="also this read-only tool")
    options = parser.parse_args()
    if options.modern_only:
        SERVER.middleware.append(refuse_handshake)
    RECORD = options.record
    for changed, schema in _changed_schemas().items():
        TOOLS[changed] = TOOLS[changed].model_copy(update={"input_schema": schema})
    if options.content:
        for name in CONTENT:
            TOOLS[name] = types.Tool(name=name, input_schema=OBJECT, annotations=READ)
    for name in options.tool:  # any arguments (an open schema), answered "<name> works"
        TOOLS[name] = types.Tool(name=name, input_schema={"type": "object"}, annotations=READ)
    if options.lists:
        offer_lists(options.lists)
    record(event="started", pid=os.getpid())
    if options.http is None:
        anyio.run(serve_stdio)
    else:
        anyio.run(serve_http, options.http, options.json)


if __name__ == "__main__":
    main()
