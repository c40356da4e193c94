"""An MCP server with every feature the MCP conformance suite's server scenarios exercise.

    python everything_server.py               # over stdio
    python everything_server.py --http 0      # streamable HTTP on 127.0.0.1 (0: any port)

Written with the MCP Python SDK's low-level ``Server`` from the scenarios' own requirements
(``@modelcontextprotocol/conformance`` 0.1.16, ``conformance list``): the ``test_*`` tools
(content of every kind, logging, progress, sampling, elicitation with SEP-1034 defaults and
SEP-1330 enums, an error, a JSON Schema 2020-12 input), the ``test://`` resources, a template
and subscriptions, the ``test_*`` prompts, completions and ``logging/setLevel``. It asks the
client as each era asks: a request during the call (2025), an ``InputRequiredResult`` and
the call again with the answer (2026, as the gateway connects over HTTP by default). The suite
run directly against it proves the server (tests/test_conformance.py); then toolrelay serve
in front of it must pass the same scenarios. Over HTTP it prints ``PORT <n>`` on stdout once
it listens; DNS-rebinding protection is the SDK's (on for a loopback bind).
"""

from __future__ import annotations

import argparse
import base64
import json
import socket
import sys
import warnings
from typing import Any

import anyio
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.types.version import MODERN_PROTOCOL_VERSIONS

Ctx = ServerRequestContext[Any]

# a 1x1 red pixel PNG, and a WAV header with a few silent samples
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0g"
    "AAAABJRU5ErkJggg=="
)
WAV = base64.b64encode(b"RIFF\x2c\x00\x00\x00WAVEfmt " + bytes(36)).decode()
OBJECT: dict[str, Any] = {"type": "object", "properties": {}}
LEVELS = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]


def _tool(name: str, description: str, schema: dict[str, Any] = OBJECT) -> types.Tool:
    return types.Tool(name=name, description=description, input_schema=schema)


def _string_arg(name: str, description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": "string", "description": description}},
        "required": [name],
    }


TOOLS = [
    _tool("test_simple_text", "Answers with one text block."),
    _tool("test_image_content", "Answers with a PNG image."),
    _tool("test_audio_content", "Answers with a WAV clip."),
    _tool("test_embedded_resource", "Answers with an embedded text resource."),
    _tool("test_multiple_content_types", "Answers with text, an image and a resource."),
    _tool("test_tool_with_logging", "Logs three lines at info while it runs."),
    _tool("test_tool_with_progress", "Reports progress 0, 50 and 100 of 100."),
    _tool("test_error_handling", "Always fails (isError)."),
    _tool("test_sampling", "Asks the client's model.", _string_arg("prompt", "The prompt")),
    _tool("test_elicitation", "Asks the user.", _string_arg("message", "Shown to the user")),
    _tool("test_elicitation_sep1034_defaults", "Asks with defaults of every primitive type."),
    _tool("test_elicitation_sep1330_enums", "Asks with every enum variant."),
    _tool(
        "json_schema_2020_12_tool",
        "Tool with JSON Schema 2020-12 features",
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {
                "address": {
                    "type": "object",
                    "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                }
            },
            "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
            "additionalProperties": False,
        },
    ),
]
RESOURCES = [
    types.Resource(
        uri="test://static-text",
        name="static-text",
        description="A static text resource.",
        mime_type="text/plain",
    ),
    types.Resource(
        uri="test://static-binary",
        name="static-binary",
        description="A static PNG.",
        mime_type="image/png",
    ),
    types.Resource(
        uri="test://watched-resource",
        name="watched-resource",
        description="A resource that can be subscribed to.",
        mime_type="text/plain",
    ),
]
TEMPLATE = types.ResourceTemplate(
    uri_template="test://template/{id}/data",
    name="template-data",
    description="Data for an id.",
    mime_type="application/json",
)
PROMPTS = [
    types.Prompt(name="test_simple_prompt", description="A prompt without arguments."),
    types.Prompt(
        name="test_prompt_with_arguments",
        description="A prompt with two arguments.",
        arguments=[
            types.PromptArgument(name="arg1", description="First test argument", required=True),
            types.PromptArgument(name="arg2", description="Second test argument", required=True),
        ],
    ),
    types.Prompt(
        name="test_prompt_with_embedded_resource",
        description="A prompt embedding a resource.",
        arguments=[
            types.PromptArgument(name="resourceUri", description="What to embed", required=True)
        ],
    ),
    types.Prompt(name="test_prompt_with_image", description="A prompt with an image."),
]
ELICIT_DEFAULTS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "default": "John Doe"},
        "age": {"type": "integer", "default": 30},
        "score": {"type": "number", "default": 95.5},
        "status": {
            "type": "string",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "default": True},
    },
}
_OPTIONS = ["option1", "option2", "option3"]
ELICIT_ENUMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": _OPTIONS},
        "titledSingle": {
            "type": "string",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {"type": "array", "items": {"type": "string", "enum": _OPTIONS}},
        "titledMulti": {
            "type": "array",
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            },
        },
    },
}
ELICIT_USER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "username": {"type": "string", "description": "User's response"},
        "email": {"type": "string", "description": "User's email address"},
    },
    "required": ["username", "email"],
}
STATE: dict[str, Any] = {"level": "info", "subscriptions": set()}


def text(*items: str) -> list[types.ContentBlock]:
    return [types.TextContent(type="text", text=item) for item in items]


async def log(ctx: Ctx, level: types.LoggingLevel, message: str) -> None:
    if LEVELS.index(level) < LEVELS.index(STATE["level"]):
        return  # filtered by logging/setLevel
    with warnings.catch_warnings():  # logging is deprecated in the 2026 era, served still
        warnings.simplefilter("ignore")
        await ctx.session.send_log_message(level, message, related_request_id=ctx.request_id)


def asked(
    ctx: Ctx,
    params: types.CallToolRequestParams,
    request: types.CreateMessageRequest | types.ElicitRequest,
) -> types.InputRequiredResult | types.CreateMessageResult | types.ElicitResult | None:
    """On a 2026-era connection a server asks with an ``InputRequiredResult`` and gets the
    call again with the answer (``None``: a 2025-era connection, asked with a request)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return None
    answer = (params.input_responses or {}).get("ask")
    if isinstance(answer, types.CreateMessageResult | types.ElicitResult):
        return answer
    return types.InputRequiredResult(input_requests={"ask": request})


async def elicit(
    ctx: Ctx, params: types.CallToolRequestParams, message: str, schema: dict[str, Any]
) -> types.CallToolResult | types.InputRequiredResult:
    form = types.ElicitRequestFormParams(message=message, requested_schema=schema)
    result = asked(ctx, params, types.ElicitRequest(params=form))
    if result is None:
        result = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
    if isinstance(result, types.InputRequiredResult):
        return result
    assert isinstance(result, types.ElicitResult)
    content = json.dumps(result.content, sort_keys=True)
    return types.CallToolResult(
        content=text(f"Elicitation completed: action={result.action}, content={content}")
    )


async def sample(
    ctx: Ctx, params: types.CallToolRequestParams, prompt: str
) -> types.CallToolResult | types.InputRequiredResult:
    message = types.SamplingMessage(role="user", content=text(prompt)[0])
    request = types.CreateMessageRequestParams(messages=[message], max_tokens=100)
    answer = asked(ctx, params, types.CreateMessageRequest(params=request))
    if answer is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            answer = await ctx.session.create_message(
                [message], max_tokens=100, related_request_id=ctx.request_id
            )
    if isinstance(answer, types.InputRequiredResult):
        return answer
    assert isinstance(answer, types.CreateMessageResult)
    said = answer.content.text if isinstance(answer.content, types.TextContent) else ""
    return types.CallToolResult(content=text(f"LLM response: {said}"))


async def call_tool(
    ctx: Ctx, params: types.CallToolRequestParams
) -> types.CallToolResult | types.InputRequiredResult:
    name, args = params.name, params.arguments or {}
    if name == "test_simple_text":
        return types.CallToolResult(content=text("This is a simple text response for testing."))
    if name == "test_image_content":
        return types.CallToolResult(
            content=[types.ImageContent(type="image", data=PNG, mime_type="image/png")]
        )
    if name == "test_audio_content":
        return types.CallToolResult(
            content=[types.AudioContent(type="audio", data=WAV, mime_type="audio/wav")]
        )
    if name == "test_embedded_resource":
        return types.CallToolResult(content=[embedded("test://embedded-resource")])
    if name == "test_multiple_content_types":
        resource = types.TextResourceContents(
            uri="test://mixed-content-resource",
            mime_type="application/json",
            text='{"test":"data","value":123}',
        )
        return types.CallToolResult(
            content=[
                *text("Multiple content types test:"),
                types.ImageContent(type="image", data=PNG, mime_type="image/png"),
                types.EmbeddedResource(type="resource", resource=resource),
            ]
        )
    if name == "test_tool_with_logging":
        await log(ctx, "info", "Tool execution started")
        await anyio.sleep(0.05)
        await log(ctx, "info", "Tool processing data")
        await anyio.sleep(0.05)
        await log(ctx, "info", "Tool execution completed")
        return types.CallToolResult(content=text("Tool with logging executed successfully"))
    if name == "test_tool_with_progress":
        for step in (0, 50, 100):
            await ctx.session.report_progress(step, 100)
            if step < 100:
                await anyio.sleep(0.05)
        return types.CallToolResult(content=text("Tool with progress executed successfully"))
    if name == "test_error_handling":
        return types.CallToolResult(
            content=text("This tool intentionally returns an error for testing"), is_error=True
        )
    if name == "test_sampling":
        if not ctx.session.check_client_capability(
            types.ClientCapabilities(sampling=types.SamplingCapability())
        ):
            raise MCPError(code=types.INVALID_REQUEST, message="the client cannot sample")
        return await sample(ctx, params, str(args["prompt"]))
    if name == "test_elicitation":
        return await elicit(ctx, params, str(args["message"]), ELICIT_USER)
    if name == "test_elicitation_sep1034_defaults":
        return await elicit(ctx, params, "Please review the defaults", ELICIT_DEFAULTS)
    if name == "test_elicitation_sep1330_enums":
        return await elicit(ctx, params, "Please choose", ELICIT_ENUMS)
    if name == "json_schema_2020_12_tool":
        return types.CallToolResult(content=text(json.dumps(args, sort_keys=True)))
    raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {name}")


def embedded(uri: str, body: str = "This is an embedded resource content.") -> Any:
    resource = types.TextResourceContents(uri=uri, mime_type="text/plain", text=body)
    return types.EmbeddedResource(type="resource", resource=resource)


async def list_tools(ctx: Ctx, params: types.PaginatedRequestParams | None) -> Any:
    return types.ListToolsResult(tools=TOOLS)


async def list_resources(ctx: Ctx, params: types.PaginatedRequestParams | None) -> Any:
    return types.ListResourcesResult(resources=RESOURCES)


async def list_templates(ctx: Ctx, params: types.PaginatedRequestParams | None) -> Any:
    return types.ListResourceTemplatesResult(resource_templates=[TEMPLATE])


async def read_resource(ctx: Ctx, params: types.ReadResourceRequestParams) -> Any:
    uri = str(params.uri)
    contents: types.TextResourceContents | types.BlobResourceContents
    if uri == "test://static-text":
        body = "This is the content of the static text resource."
        contents = types.TextResourceContents(uri=uri, mime_type="text/plain", text=body)
    elif uri == "test://static-binary":
        contents = types.BlobResourceContents(uri=uri, mime_type="image/png", blob=PNG)
    elif uri == "test://watched-resource":
        contents = types.TextResourceContents(uri=uri, mime_type="text/plain", text="watched")
    elif uri.startswith("test://template/") and uri.endswith("/data"):
        key = uri.removeprefix("test://template/").removesuffix("/data")
        body = json.dumps({"id": key, "templateTest": True, "data": f"Data for ID: {key}"})
        contents = types.TextResourceContents(uri=uri, mime_type="application/json", text=body)
    else:
        raise MCPError(code=types.INVALID_PARAMS, message=f"Resource not found: {uri}")
    return types.ReadResourceResult(contents=[contents])


async def subscribe(ctx: Ctx, params: types.SubscribeRequestParams) -> Any:
    STATE["subscriptions"].add(str(params.uri))
    return types.EmptyResult()


async def unsubscribe(ctx: Ctx, params: types.UnsubscribeRequestParams) -> Any:
    STATE["subscriptions"].discard(str(params.uri))
    return types.EmptyResult()


async def list_prompts(ctx: Ctx, params: types.PaginatedRequestParams | None) -> Any:
    return types.ListPromptsResult(prompts=PROMPTS)


async def get_prompt(ctx: Ctx, params: types.GetPromptRequestParams) -> Any:
    name, args = params.name, params.arguments or {}

    def user(content: Any) -> types.PromptMessage:
        return types.PromptMessage(role="user", content=content)

    if name == "test_simple_prompt":
        messages = [user(text("This is a simple prompt for testing.")[0])]
    elif name == "test_prompt_with_arguments":
        said = f"Prompt with arguments: arg1='{args.get('arg1')}', arg2='{args.get('arg2')}'"
        messages = [user(text(said)[0])]
    elif name == "test_prompt_with_embedded_resource":
        uri = args.get("resourceUri", "test://example-resource")
        messages = [
            user(embedded(uri, "Embedded resource content for testing.")),
            user(text("Please process the embedded resource above.")[0]),
        ]
    elif name == "test_prompt_with_image":
        messages = [
            user(types.ImageContent(type="image", data=PNG, mime_type="image/png")),
            user(text("Please analyze the image above.")[0]),
        ]
    else:
        raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown prompt: {name}")
    return types.GetPromptResult(messages=messages)


async def complete(ctx: Ctx, params: types.CompleteRequestParams) -> Any:
    known = ["paris", "park", "party", "test", "testing"]
    values = [value for value in known if value.startswith(params.argument.value)]
    return types.CompleteResult(
        completion=types.Completion(values=values, total=len(values), has_more=False)
    )


async def set_level(ctx: Ctx, params: types.SetLevelRequestParams) -> Any:
    STATE["level"] = params.level
    return types.EmptyResult()


with warnings.catch_warnings():  # logging/setLevel: deprecated in the 2026 era, still served
    warnings.simplefilter("ignore")
    SERVER = Server(
        "toolrelay-everything",
        version="1.0.0",
        instructions="The MCP conformance suite's everything server, in Python.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
        on_subscribe_resource=subscribe,
        on_unsubscribe_resource=unsubscribe,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
        on_completion=complete,
        on_set_logging_level=set_level,
    )
OPTIONS = NotificationOptions(prompts_changed=True, resources_changed=True, tools_changed=True)


async def serve_stdio() -> None:
    async with stdio_server() as (read_stream, write_stream):
        await SERVER.run(read_stream, write_stream, SERVER.create_initialization_options(OPTIONS))


async def serve_http(port: int) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)  # connections wait in the backlog until uvicorn accepts them
    app = SERVER.streamable_http_app()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    await server.serve(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--http", type=int, metavar="PORT", help="serve HTTP on 127.0.0.1:PORT")
    options = parser.parse_args()
    if options.http is None:
        anyio.run(serve_stdio)
    else:
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        anyio.run(serve_http, options.http)


if __name__ == "__main__":
    main()
