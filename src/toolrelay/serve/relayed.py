"""What the gateway says about an upstream MCP server: its tools as the server stated them,
and its ``instructions``.

A tool of an upstream is listed with the server's own ``title``, ``annotations``,
``execution``, ``icons`` and ``_meta``, unchanged: toolrelay's risk (which decides approval)
never rewrites the hints, so a tool the server left unannotated is not advertised as
non-destructive, and a read-only one gains no ``idempotentHint`` it never claimed. The
name, description (with its "[unavailable …]" mark), ``inputSchema`` and ``outputSchema``
stay toolrelay's. A plugin's tool keeps the hints derived from its declaration.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..registry import ToolRegistry
from ..sources.mcp import McpSource

_STATED = ("title", "annotations", "execution", "icons", "_meta")


def _sources(registry: ToolRegistry) -> list[McpSource]:
    return [plugin for plugin in registry.plugins() if isinstance(plugin, McpSource)]


def as_stated(specs: Iterable[dict[str, Any]], registry: ToolRegistry) -> list[dict[str, Any]]:
    """``specs`` (``format="mcp"``) with each upstream tool's own statements about itself."""
    sources = _sources(registry)
    listed = []
    for spec in specs:
        for source in sources:
            tool = source.upstream_tool(spec["name"])
            if tool is not None:
                spec.pop("annotations", None)
                stated = tool.model_dump(mode="json", by_alias=True, exclude_none=True)
                spec.update((key, stated[key]) for key in _STATED if key in stated)
                break
        listed.append(spec)
    return listed


def upstream_instructions(registry: ToolRegistry) -> list[str]:
    """The upstream servers' ``instructions``, each named when there are several."""
    stated = [(s.name, text) for s in _sources(registry) if (text := s.instructions)]
    if len(stated) == 1:
        return [stated[0][1]]
    return [f"From {name}: {text}" for name, text in stated]
