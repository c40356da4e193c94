"""MCP tools as toolrelay declarations, MCP results as toolrelay data (see :mod:`.mcp`).

The rules (names, schemas, risk from annotations and the operator's floors and overrides,
size caps, results): ``docs/serve.md``, "The ``[serve]`` section". A dict or list a result is
read into (:class:`McpDict`, :class:`McpList`) carries the server's own ``content`` and
``structuredContent``, which ``toolrelay serve`` passes on unchanged
(:func:`upstream_result`) while their JSON is at most twice the data's size plus 4 KiB, so
the output cap, which measures the data, bounds them too.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mcp.types as mcp_types
from mcp.types import methods as mcp_methods

from .._compat.mcp_client import later_revision_fields
from ..contract import RISKS, AuthContext, Risk, ToolDeclaration
from ..registry import NAME_RE, RegistrationError, compile_tool
from ..schemas import nodes
from .options import McpSourceOptions

log = logging.getLogger("toolrelay.sources.mcp")

MAX_DESCRIPTION_CHARS = 2000
"""A tool description longer than this is cut (ending with ``…``)."""
MAX_SCHEMA_BYTES = 64 * 1024
"""A tool whose input or output schema serialises (compact JSON, UTF-8) to more is skipped."""
MAX_SCHEMA_DEPTH = 32
"""A tool whose input or output schema nests objects and arrays deeper is skipped."""
_INVALID_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_CARRIED_SLACK = 4096  # carried blocks may exceed twice the data's size by this much
_PLAIN_KEYS = frozenset({"content", "isError", "resultType", "_meta"})
_TEXT_KEYS = {"type": None, "text": None}.keys()


# -- tools ------------------------------------------------------------------------------------
def object_schema(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """``schema`` as an object schema (one with no top-level ``type`` made one: tool
    arguments are always an object), or ``None`` when it describes something else."""
    if not isinstance(schema, Mapping):
        return None
    kind = schema.get("type")
    if kind == "object":
        return dict(schema)
    if kind is None:
        return {**schema, "type": "object"}
    return None


def _schema_problem(what: str, schema: Any) -> str | None:
    """Why ``schema`` is too big to accept, or ``None``."""
    if schema is None:
        return None
    if any(depth > MAX_SCHEMA_DEPTH for _, depth in nodes(schema)):  # stops at the first
        return f"its {what} nests deeper than {MAX_SCHEMA_DEPTH} levels"
    try:
        size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    except (TypeError, ValueError):
        return f"its {what} is not JSON"
    if size > MAX_SCHEMA_BYTES:
        return f"its {what} is larger than {MAX_SCHEMA_BYTES} bytes ({size})"
    return None


def _risk(annotations: mcp_types.ToolAnnotations | None) -> tuple[Risk, bool | None]:
    """The risk the server's hints claim. ``destructiveHint: true`` wins over
    ``readOnlyHint``: contradictory hints never make a tool look safer than either says."""
    if annotations is None:
        return "write", None
    idempotent = annotations.idempotent_hint
    if annotations.destructive_hint:
        return "dangerous", idempotent
    if annotations.read_only_hint:
        return "read", idempotent
    return "write", idempotent


def _normal(name: str) -> str:
    """A name as per-tool floors match it: case and ``-``, ``.``, space vs ``_`` ignored."""
    return name.casefold().replace("-", "_").replace(".", "_").replace(" ", "_")


def _riskier(a: Risk, b: Risk | None) -> Risk:
    """The higher of two risks (``read`` < ``write`` < ``dangerous``)."""
    return a if b is None or RISKS.index(a) >= RISKS.index(b) else b


@dataclass(frozen=True, slots=True)
class Entry:
    remote: str
    decl: ToolDeclaration
    tool: mcp_types.Tool
    """The tool as the server listed it (its title, annotations, execution: the gateway's)."""


async def _never_called(args: dict[str, Any], ctx: AuthContext) -> None:  # pragma: no cover
    """Stands in for the handler when a declaration is checked (never called)."""


class ToolMap:
    """The declarations of one server's tools, rebuilt from every ``tools/list``."""

    def __init__(self, options: McpSourceOptions, name: str) -> None:
        self.options = options  # prefix, risk floors, timeouts, tags, …
        self.name = name
        self.tags = frozenset({"mcp", *options.tags})
        self.entries: dict[str, Entry] = {}
        self.decls: tuple[ToolDeclaration, ...] = ()
        self._skips_logged: set[tuple[str, str]] = set()
        self._floors: dict[str, Risk] = {}  # tool_risk by normalised name
        for key, floor in options.tool_risk.items():
            key = _normal(key)
            self._floors[key] = _riskier(floor, self._floors.get(key))
        ruled = bool(options.tool_risk or options.tool_risk_override)
        self._new_risk = options.new_tool_risk or ("dangerous" if ruled else None)
        self.new: set[str] = set()
        """The server's names of the tools no per-tool rule names (renamed or new)."""

    def install(self, tools: Sequence[mcp_types.Tool]) -> int:
        """Declare ``tools`` (one odd tool is skipped, never stops the others); how many."""
        entries: dict[str, Entry] = {}
        for tool in tools:
            entry = self._declare(tool)
            if entry is None:
                continue
            if entry.decl.name in entries:
                self._skip(tool.name, f"its name {entry.decl.name!r} is taken")
                continue
            entries[entry.decl.name] = entry
        self.entries = entries
        self.decls = tuple(entry.decl for entry in entries.values())
        return len(self.decls)

    def _exposed_name(self, remote: str) -> str | None:
        name = _INVALID_CHARS.sub("_", remote)
        if self.options.prefix is not None:
            name = f"{self.options.prefix}__{name}"
        if not NAME_RE.match(name):
            self._skip(remote, f"{name[:80]!r} does not match {NAME_RE.pattern}")
            return None
        return name

    def _skip(self, remote: str, reason: str) -> None:
        """Log a tool left out: a warning the first time, then (every refresh) at debug."""
        key = (remote, reason)
        level = logging.DEBUG if key in self._skips_logged else logging.WARNING
        self._skips_logged.add(key)
        log.log(
            level,
            "toolrelay: MCP server %s: skipping tool %r: %s",
            self.name,
            remote[:80],
            reason,
        )

    def _declare(self, tool: mcp_types.Tool) -> Entry | None:
        name = self._exposed_name(tool.name)
        if name is None:
            return None
        old = self.entries.get(name)
        for what, schema in (
            ("input schema", tool.input_schema),
            ("output schema", tool.output_schema),
        ):
            problem = _schema_problem(what, schema)
            if problem is not None:
                self._skip(tool.name, problem)
                return None
        parameters = object_schema(tool.input_schema)
        if parameters is None:
            self._skip(tool.name, "its input schema is not an object schema")
            return None
        risk, idempotent = _risk(tool.annotations)
        risk = _riskier(risk, self.options.risk)  # the operator's floors: hints cannot go below
        names = {_normal(tool.name), _normal(name)}
        floors = [self._floors[key] for key in names if key in self._floors]
        for floor in floors:
            risk = _riskier(risk, floor)
        overrides = self.options.tool_risk_override  # the operator's word: above all of that
        override = overrides.get(tool.name) or overrides.get(name)
        new = not floors and override is None and self._new_risk is not None
        override = override or self.options.risk_override
        risk = risk if override is None else override
        if new:  # named by no rule: renamed or added since the rules were written
            risk = _riskier(risk, self._new_risk)
        annotation_title = tool.annotations.title if tool.annotations is not None else None
        description = tool.description or tool.title or annotation_title or ""
        if len(description) > MAX_DESCRIPTION_CHARS:
            description = description[: MAX_DESCRIPTION_CHARS - 1] + "…"
        decl = ToolDeclaration(
            name=name,
            description=description,
            parameters=parameters,
            output_schema=tool.output_schema,
            risk=risk,
            timeout_s=self.options.tool_timeouts.get(tool.name, self.options.timeout_s),
            breaker_key=self.options.breaker_key,
            idempotent=idempotent,
            tags=self.tags,
        )
        if old is not None and old.remote == tool.name and old.decl == decl:
            return Entry(tool.name, old.decl, tool)  # keep the very decl (the registry's key)
        try:
            compile_tool(decl, _never_called, self.options.reserved_properties)
        except RegistrationError as exc:
            self._skip(tool.name, str(exc))
            return None
        if name != tool.name:
            log.info(
                "toolrelay: MCP server %s: tool %r is offered as %r",
                self.name,
                tool.name,
                name,
            )
        if new and tool.name not in self.new:
            self.new.add(tool.name)
            log.warning(
                "toolrelay: MCP server %s: no tool_risk or tool_risk_override rule names tool "
                "%r (renamed or new?): its risk is %s (new_tool_risk)",
                self.name,
                tool.name[:80],
                risk,
            )
        return Entry(tool.name, decl, tool)


# -- results ----------------------------------------------------------------------------------
class McpDict(dict[str, Any]):
    """Data from an MCP server that carries the server's own result (``mcp_result``)."""

    __slots__ = ("mcp_result",)
    mcp_result: mcp_types.CallToolResult


class McpList(list[Any]):
    __slots__ = ("mcp_result",)
    mcp_result: mcp_types.CallToolResult


class McpText(str):
    """The text of one text block the server annotated (``annotations``, ``_meta``)."""

    mcp_result: mcp_types.CallToolResult


def upstream_result(data: Any) -> mcp_types.CallToolResult | None:
    """The MCP server's own result (``content`` and ``structuredContent`` only) when ``data``
    is exactly what :class:`~toolrelay.sources.mcp.McpSource` returned for it, else ``None``
    (also when the pipeline replaced it, e.g. cut it to the output cap)."""
    return data.mcp_result if isinstance(data, McpDict | McpList | McpText) else None


def _carry(data: McpDict | McpList, result: mcp_types.CallToolResult, size: int) -> Any:
    blocks = sum(len(b.model_dump_json(by_alias=True, exclude_none=True)) for b in result.content)
    if blocks > 2 * size + _CARRIED_SLACK:
        return dict(data) if isinstance(data, dict) else list(data)
    data.mcp_result = mcp_types.CallToolResult(
        content=result.content, structured_content=result.structured_content, is_error=False
    )
    return data


def result_data(result: mcp_types.CallToolResult) -> Any:
    """What the model gets from a successful call (see the module docstring)."""
    content = result.content
    if result.structured_content is not None or "structured_content" in result.model_fields_set:
        structured = result.structured_content
        if not isinstance(structured, dict):
            return structured
        size = len(json.dumps(structured, ensure_ascii=False, separators=(",", ":")))
        return _carry(McpDict(structured), result, size)
    if all(isinstance(block, mcp_types.TextContent) for block in content):
        texts = [block.text for block in content if isinstance(block, mcp_types.TextContent)]
        if not texts:
            return None
        if len(texts) == 1:
            if content[0].annotations is None and content[0].meta is None:
                return texts[0]
            carried = McpText(texts[0])
            carried.mcp_result = mcp_types.CallToolResult(content=content, is_error=False)
            return carried
        return _carry(McpList(texts), result, sum(len(text) + 3 for text in texts))
    blocks = McpList(b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in content)
    blocks.mcp_result = mcp_types.CallToolResult(content=content, is_error=False)  # all of it
    return blocks


def plain_text(raw: dict[str, Any], modern: bool) -> str | None:
    """The text of the commonest answer — one text block and nothing else — read without
    pydantic (what :func:`result_data` makes of it, ~30 µs sooner); ``None`` for any
    other answer, which :func:`call_result` reads."""
    if not _PLAIN_KEYS.issuperset(raw) or raw.get("isError", False) is not False:
        return None
    if type(raw.get("_meta", {})) is not dict:  # 2026-era servers put serverInfo there
        return None
    if raw.get("resultType") != ("complete" if modern else None):  # 2026: required
        return None
    content = raw.get("content")
    if type(content) is not list or len(content) != 1:
        return None
    block = content[0]
    if type(block) is not dict or block.keys() != _TEXT_KEYS or block["type"] != "text":
        return None
    text = block["text"]
    return text if type(text) is str else None


def call_result(raw: dict[str, Any], version: str | None) -> mcp_types.CallToolResult | None:
    """A ``tools/call`` result read from the wire as the SDK's session reads it: checked
    against the negotiated protocol version's schema, a later revision's fields dropped, then
    parsed; ``None`` for an ``input_required`` result (which only the SDK's client can
    drive). Raises pydantic's ``ValidationError`` for a result that is not a tool result."""
    version = version or "2025-11-25"  # as the SDK, before a handshake
    mcp_methods.validate_server_result("tools/call", version, raw)  # every version has it
    foreign = later_revision_fields("tools/call", version)
    if not foreign.isdisjoint(raw):
        raw = {key: value for key, value in raw.items() if key not in foreign}
    if raw.get("resultType") == "input_required":
        return None
    return mcp_types.CallToolResult.model_validate(raw, by_name=False)


def error_text(result: mcp_types.CallToolResult) -> str:
    return " ".join(
        block.text for block in result.content if isinstance(block, mcp_types.TextContent)
    )
