"""The catalog gate: drift from the lock file, description checks, deprecation windows.

:class:`Catalog` is a registry gate (:class:`toolrelay.registry.Gate`): the registry asks it
once per declaration content whether the tool is offered. A tool whose hash matches its
lock entry is; one that drifted follows ``on_drift``, one the lock does not name ``on_new``
(``docs/catalog.md``). Each drifted definition is logged and counted once
(``toolrelay_tool_drift_total{tool,kind}``); :meth:`Catalog.drift` shows the diff.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, Field

from ..contract import ToolDeclaration
from ..registry import ToolRefused
from ..result import ToolResult
from ..settings import MODEL, Text
from .deprecation import DEPRECATED_TAG, Deprecation
from .descriptions import flags
from .diff import diff_entries
from .lock import entry, load

log = logging.getLogger("toolrelay.catalog")


class CatalogSettings(BaseModel):
    """``[serve.catalog]``: the tool lock, what drift from it does, deprecation windows."""

    model_config = MODEL

    lock: Text | None = None
    """The lock file (relative to the config file); ``None``: no lock, nothing pinned."""
    on_drift: Literal["refuse", "warn", "accept_compatible"] = "refuse"
    """A tool whose definition differs from its lock entry: not offered (``refuse``),
    offered and logged once (``warn``), or offered only when every change is compatible."""
    on_new: Literal["refuse", "warn"] = "refuse"
    """A tool the lock does not name: not offered, or offered and logged once."""
    deprecated: dict[str, Deprecation] = {}
    """Tool name → its deprecation window."""
    descriptions: Literal["refuse", "warn", "off"] = "warn"
    """A tool whose descriptions break a rule (:mod:`.descriptions`): not offered, or
    offered; either way logged and counted once per definition."""
    max_description_chars: Annotated[int, Field(strict=True, ge=1)] = 1024
    """A tool description longer than this is flagged ``too_long``."""

    @property
    def active(self) -> bool:
        """Is there anything for a gate to do?"""
        return self.lock is not None or bool(self.deprecated) or self.descriptions != "off"


class Catalog:
    """The registry gate of ``[serve.catalog]``; re-reads the lock file when it changes."""

    def __init__(
        self,
        settings: CatalogSettings,
        base: str | os.PathLike[str] = ".",
        metrics_registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.path = None if settings.lock is None else Path(base) / settings.lock
        self.drifted: dict[str, dict[str, Any]] = {}
        """Tools whose definition differs from the lock now, by name: what :meth:`drift` shows."""
        self._counted: set[tuple[str, ...]] = set()
        self._stamp: tuple[int, int] | None = None
        self.locked: dict[str, dict[str, Any]] = {}
        self._seen: dict[str, tuple[tuple[ToolDeclaration, Any], ToolRefused | None]] = {}
        self.drift_total = Counter(
            "toolrelay_tool_drift_total",
            "Tool definitions that differ from the lock file, each counted once, by kind "
            "(breaking, compatible, new).",
            ["tool", "kind"],
            registry=metrics_registry,
        )
        self.flagged_total = Counter(
            "toolrelay_tool_descriptions_flagged_total",
            "Tool definitions whose descriptions break a rule, each counted once, by rule.",
            ["tool", "rule"],
            registry=metrics_registry,
        )
        self.deprecated_calls = Counter(
            "toolrelay_deprecated_calls_total",
            "Calls of deprecated tools, by caller.",
            ["tool", "caller"],
            registry=metrics_registry,
        )
        if self.path is not None:
            self._read()  # a lock that cannot be read stops the start (LockError)

    def _read(self) -> None:
        """Load the lock again when its size or modification time changed."""
        assert self.path is not None
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
        for name in locked:  # at 0, so that the first drift of a locked tool is an increase
            for kind in ("breaking", "compatible"):
                self.drift_total.labels(name, kind)

    def __call__(self, decl: ToolDeclaration) -> ToolDeclaration:
        if self.path is not None:
            try:
                self._read()
            except ValueError as exc:  # a half-written lock: keep the one read before
                log.warning("toolrelay: %s (the lock read before stays in force)", exc)
        seen = self._seen.get(decl.name)  # a refused tool is asked on every call: decide once
        if seen is None or seen[0] != (decl, self._stamp):
            seen = self._seen[decl.name] = ((decl, self._stamp), self._decide(decl))
        if seen[1] is not None:  # a new one: a raised exception keeps its traceback
            raise ToolRefused(seen[1].message, seen[1].error_type)
        window = self.settings.deprecated.get(decl.name)
        if window is None:
            return decl
        if dt.datetime.now(dt.UTC) >= window.sunset_at:
            why = f"tool {decl.name!r} was retired on {window.sunset}: use {window.use!r}"
            raise ToolRefused(why, "unknown_tool")
        return dataclasses.replace(decl, tags=decl.tags | {DEPRECATED_TAG})

    def _decide(self, decl: ToolDeclaration) -> ToolRefused | None:
        """Why the lock or the description checks refuse ``decl`` (``None``: they do not)."""
        live = entry(decl)
        try:
            if self.path is not None:
                self._pin(decl, live)
            if self.settings.descriptions != "off":
                self._check(decl.name, live)
        except ToolRefused as refused:
            return refused.with_traceback(None)  # kept: holds no frames
        return None

    def _check(self, name: str, live: dict[str, Any]) -> None:
        """Flag (and by policy refuse) descriptions that break a rule."""
        rules = flags(live["definition"], self.settings.max_description_chars)
        if not rules:
            return
        if (name, live["sha256"], "flags") not in self._counted:
            self._counted.add((name, live["sha256"], "flags"))
            for rule in rules:
                self.flagged_total.labels(name, rule).inc()
            log.warning("toolrelay: tool %s: its description is flagged: %s", name, rules)
        if self.settings.descriptions == "refuse":
            why = f"its description was flagged ({', '.join(rules)})"
            raise ToolRefused(f"tool {name!r} is not offered: {why}")

    def _pin(self, decl: ToolDeclaration, live: dict[str, Any]) -> None:
        """Note how ``decl`` differs from its lock entry (logged and counted once per
        definition) and raise :class:`ToolRefused` when the policy refuses it."""
        name = decl.name
        locked = self.locked.get(name)
        pinned = None if locked is None else (locked.get("sha256"), locked.get("version"))
        if pinned == (live["sha256"], live["version"]):
            self.drifted.pop(name, None)
            return
        changes = [] if locked is None else diff_entries(name, locked, live)
        policy: str
        if locked is None:
            kind, policy = "new", self.settings.on_new
        else:
            kind = "breaking" if any(c.breaking for c in changes) else "compatible"
            policy = self.settings.on_drift
        offered = policy == "warn" or (policy == "accept_compatible" and kind == "compatible")
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
        if (name, live["sha256"]) not in self._counted:
            self._counted.add((name, live["sha256"]))
            self.drift_total.labels(name, kind).inc()
            how = "is not in the lock file" if locked is None else "differs from its lock entry"
            verdict = "offered" if offered else "not offered"
            log.warning("toolrelay: tool %s %s (%s): %s", name, how, kind, verdict)
        if not offered:
            why = "it is not in the lock file"
            if locked is not None:
                why = "its definition changed since it was locked"
            raise ToolRefused(f"tool {name!r} is not offered: {why}")

    def drift(self, name: str) -> dict[str, Any] | None:
        """How ``name`` differs from its lock entry now; ``None`` for a tool the lock does
        not name and that was never seen."""
        if name in self.drifted:
            return self.drifted[name]
        if name in self.locked:
            return {"tool": name, "kind": None, "offered": True, "changes": []}
        return None

    def annotate(self, result: ToolResult, caller: str) -> ToolResult:
        """The answer of a deprecated tool with its hint, the call counted for ``caller``;
        any other answer as it is."""
        window = self.settings.deprecated.get(result.tool)
        if window is None:
            return result
        self.deprecated_calls.labels(result.tool, caller).inc()
        return dataclasses.replace(result, deprecated={"use": window.use, "sunset": window.sunset})

    def next_sunset(self, now: dt.datetime | None = None) -> float | None:
        """Seconds until the next sunset (``None``: none to come). A gate's verdicts are
        kept by the registry: set ``registry.gate`` again then, to have them asked again."""
        now = now or dt.datetime.now(dt.UTC)
        due = [w.sunset_at for w in self.settings.deprecated.values() if w.sunset_at > now]
        return None if not due else (min(due) - now).total_seconds()
