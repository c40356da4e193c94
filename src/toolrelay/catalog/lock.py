"""The lock file: every tool offered, pinned by a hash of what the model and the policy read.

``toolrelay.lock`` is JSON (not TOML): tool definitions are JSON Schema, which TOML cannot
always hold (``null`` has no TOML form), and the standard library reads and writes JSON
without a new dependency. Keys are sorted and the indentation fixed, so an unchanged catalog
writes the same bytes and a changed one reads as a small diff in code review.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..contract import ToolDeclaration
from ..formats import to_mcp

LOCK_VERSION = 1
"""The format of the lock file (its ``"lock_version"``)."""


class LockError(ValueError):
    """A lock file that cannot be read; the message names the file."""


def definition(decl: ToolDeclaration) -> dict[str, Any]:
    """What the model and the policy read of a tool: its MCP ``tools/list`` entry without
    the name (description, inputSchema, outputSchema, annotations)."""
    spec = to_mcp(decl, decl.description)
    del spec["name"]
    return spec


def digest(defn: Mapping[str, Any]) -> str:
    """``sha256:`` and the hex SHA-256 of the definition's canonical JSON: sorted keys, no
    spaces, UTF-8 (RFC 8785 for the JSON a tool definition holds: strings, integers,
    booleans, nulls, lists and objects)."""
    text = json.dumps(
        defn, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def entry(decl: ToolDeclaration) -> dict[str, Any]:
    """One tool's lock entry: version, risk, the hash, and the definition itself."""
    defn = definition(decl)
    return {"version": decl.version, "risk": decl.risk, "sha256": digest(defn), "definition": defn}


def lock_of(decls: Iterable[ToolDeclaration]) -> dict[str, Any]:
    """The lock of a catalog: ``{"lock_version": 1, "tools": {name: entry}}``."""
    return {"lock_version": LOCK_VERSION, "tools": {d.name: entry(d) for d in decls}}


def dumps(lock: Mapping[str, Any]) -> str:
    """The lock file's text: sorted keys, two-space indent, one final newline."""
    return json.dumps(lock, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def load(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """The tools of a lock file by name; :class:`LockError` when it is no lock file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise LockError(f"cannot read the lock file {os.fspath(path)}: {exc}") from None
    tools = data.get("tools") if isinstance(data, dict) else None
    if (
        not isinstance(tools, dict)
        or data.get("lock_version") != LOCK_VERSION
        or not all(
            isinstance(e, dict) and isinstance(e.get("definition"), dict) for e in tools.values()
        )
    ):
        raise LockError(f"{os.fspath(path)} is not a toolrelay lock file (lock_version 1)")
    return tools
