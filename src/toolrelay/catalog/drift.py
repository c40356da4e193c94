"""Drift: a tool whose live definition differs from its lock entry, and what is done about it.

:class:`Catalog` is a registry gate (:class:`toolrelay.registry.Gate`): the registry asks it
once per declaration content whether the tool is offered. A tool whose hash matches its
lock entry is; one that drifted follows ``on_drift``, one the lock does not name ``on_new``
(``docs/catalog.md``). Each drifted definition is logged and counted once
(``toolrelay_tool_drift_total{tool,kind}``); :meth:`Catalog.drift` shows the diff.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel

from ..contract import ToolDeclaration
from ..registry import ToolRefused
from ..settings import MODEL, Text
from .diff import Change, diff_entries
from .lock import entry, load

__all__ = ["Catalog", "CatalogSettings"]

log = logging.getLogger("toolrelay.catalog")


class CatalogSettings(BaseModel):
    """``[serve.catalog]``: the tool lock and what drift from it does."""

    model_config = MODEL

    lock: Text | None = None
    """The lock file (relative to the config file); ``None``: no lock, nothing pinned."""
    on_drift: Literal["refuse", "warn", "accept_compatible"] = "refuse"
    """A tool whose definition differs from its lock entry: not offered (``refuse``),
    offered and logged once (``warn``), or offered only when every change is compatible."""
    on_new: Literal["refuse", "warn"] = "refuse"
    """A tool the lock does not name: not offered, or offered and logged once."""


class Catalog:
    """The registry gate of a lock file; re-reads the file when it changes."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        settings: CatalogSettings | None = None,
        metrics_registry: CollectorRegistry | None = None,
    ) -> None:
        self.path = Path(path)
        self.settings = settings or CatalogSettings()
        self.drifted: dict[str, dict[str, Any]] = {}
        """Tools whose definition differs from the lock now, by name: what :meth:`drift` shows."""
        self._counted: set[tuple[str, str]] = set()
        self._stamp: tuple[int, int] | None = None
        self.locked: dict[str, dict[str, Any]] = {}
        self._read()  # a lock that cannot be read stops the start (LockError)
        self.drift_total = Counter(
            "toolrelay_tool_drift_total",
            "Tool definitions that differ from the lock file, each counted once, by kind "
            "(breaking, compatible, new).",
            ["tool", "kind"],
            registry=metrics_registry,
        )

    def _read(self) -> None:
        """Load the lock again when its size or modification time changed."""
        try:
            stat = self.path.stat()
        except OSError:
            stat = None
        stamp = None if stat is None else (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp and self._stamp is not None:
            return
        locked = load(self.path)
        if self._stamp is not None:
            log.info("toolrelay: the lock file %s changed: read again", self.path)
        self.locked, self._stamp = locked, stamp

    def __call__(self, decl: ToolDeclaration) -> ToolDeclaration:
        try:
            self._read()
        except ValueError as exc:  # a half-written lock: keep the one read before
            log.warning("toolrelay: %s (the lock read before stays in force)", exc)
        live = entry(decl)
        locked = self.locked.get(decl.name)
        if locked is not None and (locked.get("sha256"), locked.get("version")) == (
            live["sha256"],
            live["version"],
        ):
            self.drifted.pop(decl.name, None)
            return decl
        changes = [] if locked is None else diff_entries(decl.name, locked, live)
        policy: str
        if locked is None:
            kind, policy = "new", self.settings.on_new
        else:
            kind = "breaking" if any(c.breaking for c in changes) else "compatible"
            policy = self.settings.on_drift
        offered = policy == "warn" or (policy == "accept_compatible" and kind == "compatible")
        self._note(decl.name, kind, offered, locked, live, changes)
        if offered:
            return decl
        why = (
            "it is not in the lock file"
            if locked is None
            else ("its definition changed since it was locked")
        )
        raise ToolRefused(f"tool {decl.name!r} is not offered: {why}")

    def _note(
        self,
        name: str,
        kind: str,
        offered: bool,
        locked: dict[str, Any] | None,
        live: dict[str, Any],
        changes: list[Change],
    ) -> None:
        self.drifted[name] = {
            "tool": name,
            "kind": kind,
            "offered": offered,
            "changes": [
                {"where": c.where, "what": c.what, "breaking": c.breaking} for c in changes
            ],
            "locked": locked,
            "live": live,
        }
        if (name, live["sha256"]) in self._counted:
            return
        self._counted.add((name, live["sha256"]))
        self.drift_total.labels(name, kind).inc()
        log.warning(
            "toolrelay: tool %s %s (%s): %s",
            name,
            "is not in the lock file" if locked is None else "differs from its lock entry",
            kind,
            "offered" if offered else "not offered",
        )

    def drift(self, name: str) -> dict[str, Any] | None:
        """How ``name`` differs from its lock entry now; ``None`` for a tool the lock does
        not name and that was never seen."""
        if name in self.drifted:
            return self.drifted[name]
        if name in self.locked:
            return {"tool": name, "kind": None, "offered": True, "changes": []}
        return None
