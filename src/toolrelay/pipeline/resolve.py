"""Resolve and policy: the call names a tool the caller may call.

The dispatcher (and the fallback stage, for a fallback's call) looks the tool up with
:func:`find` when the call comes in, so every stage, telemetry and audit included, reads
it from the invocation; this stage answers for a name that found none, and applies the
caller's profile.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable

from ..contract import ErrorType
from ..outcome import Outcome, failure, shown
from ..registry import CompiledTool, RegistrationError, ToolRefused, ToolRegistry
from . import Invocation, Next

log = logging.getLogger("toolrelay")


def find(registry: ToolRegistry, name: object) -> CompiledTool | None:
    """The tool ``name`` names, as its plugin declares it now; ``None`` when there is none
    (or its declaration is invalid: :class:`Resolve` says which)."""
    if not isinstance(name, str):
        return None
    try:
        return registry.resolve(name)
    except RegistrationError:
        return None


class Resolve:
    """Unknown name → ``unknown_tool``; a declaration the plugin made invalid →
    ``internal_error``; outside the caller's profile → ``tool_policy`` (the audit line's
    decision: ``policy``)."""

    __slots__ = ("redact", "registry")

    def __init__(self, registry: ToolRegistry, redact: Callable[[str], str]) -> None:
        self.registry = registry
        self.redact = redact

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        tool = inv.tool
        if tool is None:
            return self._unresolved(inv.name)
        if inv.profile.permits(tool.decl):
            return call_next(inv)
        if inv.audit is not None:
            inv.audit(inv, "policy", None)
        message = f"tool {shown(inv.name)} is not available to you"
        # a call outside the profile never reaches a breaker: it reports no key
        return failure(ErrorType.TOOL_POLICY, message, dataclasses.replace(inv, key=None))

    def _unresolved(self, name: object) -> Outcome:
        """Why ``name`` found no tool (looked up again: this is the rare path)."""
        try:
            if isinstance(name, str):
                self.registry.resolve(name)
        except ToolRefused as exc:  # the tool catalog's policy (docs/catalog.md)
            return failure(ErrorType(exc.error_type), exc.message)
        except RegistrationError as exc:
            log.error("toolrelay: %s", exc)
            return failure(ErrorType.INTERNAL_ERROR, f"tool {shown(name)} is misconfigured")
        message = f"there is no tool named {shown(name)}"
        return failure(ErrorType.UNKNOWN_TOOL, self.redact(message))
