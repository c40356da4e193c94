"""Stage 2: find the tool as its plugin declares it now, and apply the caller's profile."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from ..contract import ErrorType
from ..outcome import Outcome, failure
from ..registry import RegistrationError, ToolRegistry
from . import Invocation, Next

log = logging.getLogger("toolrelay")


def shown(name: object) -> str:
    """A model-supplied name, safe to echo: short and printable."""
    text = name if isinstance(name, str) else type(name).__name__
    text = "".join(ch if ch.isprintable() else "?" for ch in text[:64])
    return repr(text)


class Resolve:
    """Unknown name → ``unknown_tool``; outside the profile → ``tool_policy``."""

    __slots__ = ("redact", "registry")

    def __init__(self, registry: ToolRegistry, redact: Callable[[str], str] | None = None) -> None:
        self.registry = registry
        self.redact = redact

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        name = inv.name
        try:
            tool = self.registry.resolve(name) if isinstance(name, str) else None
        except RegistrationError as exc:
            log.error("toolrelay: %s", exc)
            return failure(ErrorType.INTERNAL_ERROR, f"tool {shown(name)} is misconfigured")
        if tool is None:
            message = f"there is no tool named {shown(name)}"
            return failure(ErrorType.UNKNOWN_TOOL, self.redact(message) if self.redact else message)
        inv.tool = tool
        if not inv.profile.permits(tool.decl):
            inv.approval = "policy"
            return failure(ErrorType.TOOL_POLICY, f"tool {shown(name)} is not available to you")
        inv.key = tool.decl.key
        return call_next(inv)
