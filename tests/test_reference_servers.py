"""The reference MCP servers behind toolrelay serve, byte for byte (issue 30).

``@modelcontextprotocol/server-everything``, ``server-filesystem`` (on a scratch folder) and
``server-memory`` (pinned in tests/node/package.json) are each run directly and behind
``toolrelay serve`` (stdio, upstream over stdio, ``prefix = "ref"``), with the MCP SDK's
client declaring sampling and elicitation (answered the same way on both sides). The test
takes ``tools/list``, ``resources/list``, ``resources/templates/list``, ``prompts/list`` and
a call of every tool (in a fixed order, with fixed arguments) on both sides, as the client
received them, and diffs them. What the gateway changes on purpose is undone first by
:data:`DIFFERENCES`, each of which names the sentence of docs/serve.md that states it; any
other difference fails the test, naming the method, the tool and the JSON path.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

import node_packages

pytestmark = pytest.mark.servers

DOCS = Path(__file__).resolve().parent.parent / "docs" / "serve.md"
PREFIX = "ref"
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000d4944415478da63f8cfc0f01f0005050200"
    "5fc8f1d20000000049454e44ae426082"
)
Snapshot = dict[str, Any]
Snapshots = tuple[dict[str, tuple[Snapshot, Snapshot]], dict[str, str]]


@dataclass
class Reference:
    """One reference server: how to start it, and the calls of every tool it lists."""

    bin: str
    args: Callable[[Path], list[str]]
    calls: list[tuple[str, dict[str, Any]]]
    skipped: dict[str, str] = field(default_factory=dict)  # tool -> why it is not called
    env: Callable[[Path], dict[str, str]] = lambda folder: {}


SERVERS = {
    "everything": Reference(
        "mcp-server-everything",
        lambda folder: [],
        [
            ("echo", {"message": "hello"}),
            ("get-env", {}),  # the upstream's environment: the SDK's default and `env` only
            ("get-annotated-message", {"messageType": "error", "includeImage": True}),
            ("get-annotated-message", {"messageType": "success"}),
            ("get-resource-links", {"count": 3}),
            ("get-resource-reference", {"resourceType": "Text", "resourceId": 1}),
            ("get-resource-reference", {"resourceType": "Blob", "resourceId": 2}),
            ("get-structured-content", {"location": "Chicago"}),
            ("get-sum", {"a": 1, "b": 2.5}),
            ("get-tiny-image", {}),
            ("trigger-long-running-operation", {"duration": 0.2, "steps": 2}),
            ("trigger-sampling-request", {"prompt": "hello", "maxTokens": 10}),
            ("trigger-elicitation-request", {}),
            ("trigger-url-elicitation", {"url": "https://example.com/", "elicitationId": "e1"}),
            ("toggle-simulated-logging", {}),
            ("toggle-simulated-logging", {}),
            ("toggle-subscriber-updates", {}),
            ("toggle-subscriber-updates", {}),
            ("get-sum", {"a": "one", "b": 2}),  # a failure: invalid arguments
        ],
        {
            "gzip-file-as-resource": "fetches a URL from the internet",
            "simulate-research-query": "a simulated research that runs for seconds",
        },
    ),
    "filesystem": Reference(
        "mcp-server-filesystem",
        lambda folder: [str(folder / "root")],
        [
            ("list_allowed_directories", {}),
            ("list_directory", {"path": "{root}"}),
            ("list_directory_with_sizes", {"path": "{root}", "sortBy": "name"}),
            ("directory_tree", {"path": "{root}"}),
            ("read_file", {"path": "{root}/notes.txt"}),
            ("read_text_file", {"path": "{root}/notes.txt", "head": 1}),
            ("read_multiple_files", {"paths": ["{root}/notes.txt", "{root}/sub/b.md"]}),
            ("read_media_file", {"path": "{root}/pixel.png"}),
            ("search_files", {"path": "{root}", "pattern": "*.md"}),
            ("write_file", {"path": "{root}/new.txt", "content": "new\nfile\n"}),
            (
                "edit_file",
                {"path": "{root}/new.txt", "edits": [{"oldText": "new", "newText": "old"}]},
            ),
            ("create_directory", {"path": "{root}/made"}),
            ("move_file", {"source": "{root}/new.txt", "destination": "{root}/made/new.txt"}),
            ("read_text_file", {"path": "{root}/made/new.txt"}),
            ("read_text_file", {"path": "/etc/passwd"}),  # a failure: outside the root
        ],
        {"get_file_info": "answers with access and modification times"},
    ),
    "memory": Reference(
        "mcp-server-memory",
        lambda folder: [],
        [
            ("read_graph", {}),
            (
                "create_entities",
                {
                    "entities": [
                        {"name": "Ada", "entityType": "person", "observations": ["maths"]},
                        {"name": "Engine", "entityType": "machine", "observations": []},
                    ]
                },
            ),
            (
                "create_relations",
                {"relations": [{"from": "Ada", "to": "Engine", "relationType": "programs"}]},
            ),
            ("add_observations", {"observations": [{"entityName": "Ada", "contents": ["notes"]}]}),
            ("search_nodes", {"query": "maths"}),
            ("open_nodes", {"names": ["Ada"]}),
            ("read_graph", {}),
            (
                "delete_observations",
                {"deletions": [{"entityName": "Ada", "observations": ["notes"]}]},
            ),
            (
                "delete_relations",
                {"relations": [{"from": "Ada", "to": "Engine", "relationType": "programs"}]},
            ),
            ("delete_entities", {"entityNames": ["Engine"]}),
            ("read_graph", {}),
            ("add_observations", {"observations": [{"entityName": "Nobody", "contents": ["x"]}]}),
        ],
        env=lambda folder: {"MEMORY_FILE_PATH": str(folder / "memory.jsonl")},
    ),
}


def wire(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_unset=True)


async def sample(context: Any, params: types.CreateMessageRequestParams) -> Any:
    said = types.TextContent(type="text", text="sampled")
    return types.CreateMessageResult(role="assistant", content=said, model="test-model")


async def elicit(context: Any, params: types.ElicitRequestParams) -> Any:
    return types.ElicitResult(action="decline")


async def listed(call: Callable[[], Any]) -> Any:
    try:
        return wire(await call())
    except MCPError as exc:
        return {"error": exc.error.code}


async def snapshot(session: ClientSession, ref: Reference, root: Path, prefix: str) -> Snapshot:
    """What a client receives from a server, in a fixed order."""
    shot: Snapshot = {
        "tools/list": await listed(session.list_tools),
        "resources/list": await listed(session.list_resources),
        "resources/templates/list": await listed(session.list_resource_templates),
        "prompts/list": await listed(session.list_prompts),
        "tools/call": [],
    }
    for name, arguments in ref.calls:
        filled = json.loads(json.dumps(arguments).replace("{root}", str(root)))
        try:
            result = wire(await session.call_tool(prefix + name, filled))
        except MCPError as exc:
            result = {"error": exc.error.code, "message": exc.error.message}
        shot["tools/call"].append({"tool": name, "arguments": arguments, "result": result})
    return shot


def prepare(folder: Path) -> Path:
    """A fresh scratch folder for server-filesystem (and server-memory's file)."""
    shutil.rmtree(folder, ignore_errors=True)
    root = folder / "root"
    (root / "sub").mkdir(parents=True)
    (root / "notes.txt").write_text("first line\nsecond line\n")
    (root / "sub" / "b.md").write_text("# B\n")
    (root / "pixel.png").write_bytes(PNG)
    return root


def log_file(stack: AsyncExitStack, path: Path) -> Any:
    return stack.enter_context(path.open("a"))


async def session_for(
    stack: AsyncExitStack, command: list[str], env: dict[str, str], errlog: Path
) -> Any:
    params = StdioServerParameters(command=command[0], args=command[1:], env=env)
    errlog = log_file(stack, errlog)
    read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
    session = ClientSession(read, write, sampling_callback=sample, elicitation_callback=elicit)
    await stack.enter_async_context(session)
    await session.initialize()
    return session


async def both_sides(name: str, ref: Reference, folder: Path) -> tuple[Snapshot, Snapshot]:
    """The server's answers directly, then behind the gateway (each on a fresh folder)."""
    packages = node_packages.installed()
    server = [packages.node, packages.bin(ref.bin), *ref.args(folder)]
    root = prepare(folder)
    async with AsyncExitStack() as stack:
        # started as the gateway starts an upstream: the MCP SDK's default environment
        # (HOME, LOGNAME, PATH, SHELL, TERM, USER) plus `env`, and nothing else
        errlog = folder.parent / f"{name}.direct.err"
        session = await session_for(stack, server, ref.env(folder), errlog)
        direct = await snapshot(session, ref, root, "")
    root = prepare(folder)
    config = folder / "toolrelay.toml"
    config.write_text(
        f"""
[profiles.reference]
require_approval = []
[serve]
profile = "reference"
[serve.upstreams.{name}]
command = {json.dumps(server)}
breaker_key = "{name}"
prefix = "{PREFIX}"
env = {{ {", ".join(f"{key} = {json.dumps(value)}" for key, value in ref.env(folder).items())} }}
"""
    )
    gateway = [sys.executable, "-m", "toolrelay", "serve", "--config", str(config)]
    async with AsyncExitStack() as stack:
        errlog = folder.parent / f"{name}.gateway.err"
        session = await session_for(stack, gateway, dict(os.environ), errlog)
        through = await snapshot(session, ref, root, PREFIX + "__")
    return direct, through


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> Snapshots:
    """Every reference server's answers, directly and through the gateway (side by side)."""
    tmp = tmp_path_factory.mktemp("reference")
    found: dict[str, tuple[Snapshot, Snapshot]] = {}
    failed: dict[str, str] = {}

    async def one(name: str) -> None:
        try:
            found[name] = await both_sides(name, SERVERS[name], tmp / name)
        except Exception as exc:  # reported by the tests of this server, not the others
            failed[name] = f"{type(exc).__name__}: {exc}"

    async def every() -> None:
        async with anyio.create_task_group() as group:
            for name in SERVERS:
                group.start_soon(one, name)

    anyio.run(every)
    return found, failed


# What the gateway changes on purpose. Each entry: the sentence of docs/serve.md that states
# it (the test checks it is there), and how it is undone on the gateway's side.
def unprefix(shot: Snapshot, direct: Snapshot) -> None:
    for method, key in (("tools/list", "tools"), ("prompts/list", "prompts")):
        for item in shot[method].get(key, []):
            if item["name"].startswith(PREFIX + "__"):
                item["name"] = item["name"].removeprefix(PREFIX + "__")


def envelope_of(result: dict[str, Any]) -> dict[str, Any]:
    """The answer envelope a gateway's failure carries as its first text block, else {}."""
    try:
        envelope = json.loads(result["content"][0]["text"])
    except (KeyError, IndexError, ValueError):
        return {}
    return envelope if isinstance(envelope, dict) else {}


def unwrap_failures(shot: Snapshot, direct: Snapshot) -> None:
    """A failure of the upstream's tool is the answer envelope, carrying its text."""
    for mine, theirs in zip(shot["tools/call"], direct["tools/call"], strict=True):
        result, original = mine["result"], theirs["result"]
        if not (result.get("isError") and original.get("isError")):
            continue
        envelope = envelope_of(result)
        said = " ".join(block.get("text", "") for block in original.get("content", []))
        if envelope.get("ok") is False and envelope.get("message", "")[:100] in said:
            mine["result"] = original


def validated_first(shot: Snapshot, direct: Snapshot) -> None:
    """Arguments the tool's schema refuses never reach the upstream: the gateway answers
    ``validation_error`` where the upstream would have answered its own error."""
    for mine, theirs in zip(shot["tools/call"], direct["tools/call"], strict=True):
        result, original = mine["result"], theirs["result"]
        if result.get("isError") and original.get("isError"):
            envelope = envelope_of(result)
            if envelope.get("error_type") == "validation_error":
                mine["result"] = original


def unstated_success(shot: Snapshot, direct: Snapshot) -> None:
    for call in (*shot["tools/call"], *direct["tools/call"]):
        if call["result"].get("isError") is False:
            del call["result"]["isError"]


def without_result_meta(shot: Snapshot, direct: Snapshot) -> None:
    for call in (*shot["tools/call"], *direct["tools/call"]):
        call["result"].pop("_meta", None)


# Tools a server offers only to a client that declared a capability this test's client
# (sampling and elicitation) did not: through the gateway, which declares it, they are listed.
CAPABILITY_TOOLS = {"get-roots-list"}  # server-everything: roots


def capabilities_declared(shot: Snapshot, direct: Snapshot) -> None:
    """The gateway declares every capability it relays, whatever its client declared."""
    direct_names = {tool["name"] for tool in direct["tools/list"].get("tools", [])}
    shot["tools/list"]["tools"] = [
        tool
        for tool in shot["tools/list"].get("tools", [])
        if tool["name"] in direct_names or tool["name"] not in CAPABILITY_TOOLS
    ]


DIFFERENCES: list[tuple[str, Callable[[Snapshot, Snapshot], None]]] = [
    ("tool and prompt names get the upstream's `prefix`", unprefix),
    ("a failure is the answer envelope", unwrap_failures),
    ("arguments are validated against the tool's schema before the upstream", validated_first),
    ("the result's own `_meta` is not passed on", without_result_meta),
    ("a successful result always says `isError: false`", unstated_success),
    (
        "the gateway declares `sampling`, `elicitation` and `roots` to every upstream",
        capabilities_declared,
    ),
]
CLOCK = re.compile(r"\b\d{1,2}:\d{2}:\d{2}( [AP]M)?\b")


def clock_free(value: Any) -> Any:
    """``value`` with times of day (server-everything's resources say when they were made)
    replaced, in text and in base64 blobs of text: the two sides run at different times."""
    if isinstance(value, dict):
        return {key: clock_free(item) for key, item in value.items()}
    if isinstance(value, list):
        return [clock_free(item) for item in value]
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            decoded = base64.b64decode(value, validate=True).decode()
            if CLOCK.search(decoded):
                return base64.b64encode(CLOCK.sub("<time>", decoded).encode()).decode()
        return CLOCK.sub("<time>", value)
    return value


def named(item: Any) -> str | None:
    """How a listed tool, prompt, resource or template is told apart."""
    if not isinstance(item, dict):
        return None
    for key in ("name", "uri", "uriTemplate"):
        if isinstance(item.get(key), str):
            return str(item[key])
    return None


def diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Every JSON path where ``a`` and ``b`` differ (at most a few lines each)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            line
            for key in sorted(set(a) | set(b), key=str)
            for line in (
                [f"{path}/{key}: only {'directly' if key in a else 'through the gateway'}"]
                if (key in a) != (key in b)
                else diff(a[key], b[key], f"{path}/{key}")
            )
        ]
    if isinstance(a, list) and isinstance(b, list) and all(named(x) for x in (*a, *b)):
        return diff({named(x): x for x in a}, {named(x): x for x in b}, path)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            line
            for n, (x, y) in enumerate(zip(a, b, strict=True))
            for line in diff(x, y, f"{path}/{n}")
        ]
    if a == b:
        return []
    show = lambda value: json.dumps(value)[:160]  # noqa: E731
    return [f"{path}: directly {show(a)}, through the gateway {show(b)}"]


def test_every_documented_difference_is_in_the_docs() -> None:
    text = " ".join(DOCS.read_text().split()).lower()
    for sentence, _ in DIFFERENCES:
        assert sentence.lower() in text, f"docs/serve.md does not state: {sentence}"


def taken(snapshots: Snapshots, server: str) -> tuple[Snapshot, Snapshot]:
    found, failed = snapshots
    if server in failed:
        pytest.fail(f"{server}: {failed[server]}")
    direct, through = clock_free(json.loads(json.dumps(found[server])))
    return direct, through


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_every_tool_is_called_or_skipped_for_a_reason(server: str, snapshots: Snapshots) -> None:
    ref, (direct, _) = SERVERS[server], taken(snapshots, server)
    listed = {tool["name"] for tool in direct["tools/list"]["tools"]}
    called = {name for name, _ in ref.calls}
    assert listed == called | set(ref.skipped), (listed - called - set(ref.skipped), listed)


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_the_gateway_changes_only_what_the_docs_say(server: str, snapshots: Snapshots) -> None:
    direct, through = taken(snapshots, server)
    for _, undo in DIFFERENCES:
        undo(through, direct)
    found = [
        f"{method}{line}"
        for method in direct
        if method != "tools/call"
        for line in diff(direct[method], through[method])
    ]
    for mine, theirs in zip(through["tools/call"], direct["tools/call"], strict=True):
        where = f"tools/call {theirs['tool']} {json.dumps(theirs['arguments'])[:50]}"
        found += [f"{where}: {line}" for line in diff(theirs["result"], mine["result"])]
    assert not found, f"{server}: {len(found)} undocumented difference(s)\n" + "\n".join(found)


def test_an_upstream_tool_deadline_is_30_s_everywhere_it_is_stated() -> None:
    """The default deadline of an upstream's tool is stated once, the same in code and docs
    (it was 30 s in code and 10 s in docs/deadlines.md)."""
    from toolrelay.contract import ToolDeclaration
    from toolrelay.sources.options import McpSourceOptions

    assert McpSourceOptions(breaker_key="k").timeout_s == 30.0
    assert ToolDeclaration.__dataclass_fields__["timeout_s"].default == 10.0  # a plugin's
    deadlines = " ".join((DOCS.parent / "deadlines.md").read_text().split())
    assert "`timeout_s` = 10 s per tool" in deadlines
    assert "The tools of an upstream MCP server (`toolrelay serve`, `McpSource`): 30 s" in deadlines
    serve = " ".join(DOCS.read_text().split())
    assert "its `timeout_s` (30 s unless set; or `tool_timeouts[MCP name]`)" in serve
    assert "its tools' `timeout_s`, 30 s unless set" in serve
    assert "timeout_s = 10 # the deadline of its tools (default 30 s)" in serve
