"""Profiles: which tools a caller may see and call, and which need approval.

One decision function, :meth:`Profile.permits`, serves both ``specs()`` and ``dispatch()``,
so the model is never shown a tool it may not call, and never calls one it was not shown.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Literal

from pydantic.dataclasses import dataclass

from .contract import RISK_ORDER, Risk, ToolDeclaration
from .settings import DATACLASS, one_line_errors


@one_line_errors("{}")
@dataclass(frozen=True, slots=True, kw_only=True, config=DATACLASS)
class Profile:
    """What one kind of caller may do.

    A tool is permitted when it is not denied (by name or tag), its risk is at most
    ``max_risk``, and either no allow-list is set or its name is in ``allow`` or one of its
    tags is in ``allow_tags``. ``require_approval`` names the risks that need an approval.
    An upstream MCP server's resources (by URI) and prompts (by name, as the gateway lists
    it) are permitted by :meth:`reaches`: ``fnmatch`` patterns, deny first, then the
    allow-list when one is set (``None``: every one).
    Every collection of names may be any iterable of strings but a single string.
    """

    allow: frozenset[str] | None = None
    deny: frozenset[str] = frozenset()
    allow_tags: frozenset[str] | None = None
    deny_tags: frozenset[str] = frozenset()
    max_risk: Risk = "dangerous"
    require_approval: frozenset[Risk] = frozenset(("write", "dangerous"))
    allow_resources: frozenset[str] | None = None
    deny_resources: frozenset[str] = frozenset()
    allow_prompts: frozenset[str] | None = None
    deny_prompts: frozenset[str] = frozenset()

    if TYPE_CHECKING:  # what callers may pass; pydantic turns each into a frozenset

        def __init__(
            self,
            *,
            allow: Iterable[str] | None = None,
            deny: Iterable[str] = (),
            allow_tags: Iterable[str] | None = None,
            deny_tags: Iterable[str] = (),
            max_risk: Risk = "dangerous",
            require_approval: Iterable[Risk] = ("write", "dangerous"),
            allow_resources: Iterable[str] | None = None,
            deny_resources: Iterable[str] = (),
            allow_prompts: Iterable[str] | None = None,
            deny_prompts: Iterable[str] = (),
        ) -> None: ...

    def permits(self, decl: ToolDeclaration) -> bool:
        """May a caller with this profile see and call the tool?"""
        if decl.name in self.deny or (self.deny_tags and self.deny_tags & decl.tags):
            return False
        if RISK_ORDER[decl.risk] > RISK_ORDER[self.max_risk]:
            return False
        if self.allow is None and self.allow_tags is None:
            return True
        if self.allow is not None and decl.name in self.allow:
            return True
        return bool(self.allow_tags and self.allow_tags & decl.tags)

    def reaches(self, kind: Literal["resource", "prompt"], name: str) -> bool:
        """May a caller with this profile see and use the resource URI or prompt name?"""
        if kind == "resource":
            allow, deny = self.allow_resources, self.deny_resources
        else:
            allow, deny = self.allow_prompts, self.deny_prompts
        if any(fnmatchcase(name, pattern) for pattern in deny):
            return False
        return allow is None or any(fnmatchcase(name, pattern) for pattern in allow)

    def needs_approval(self, decl: ToolDeclaration) -> bool:
        return decl.risk in self.require_approval


EVERYTHING = Profile()
"""The profile of a caller that names none: every tool, approvals as by default."""

NOTHING = Profile(allow=(), allow_resources=(), allow_prompts=())
"""The profile of a caller that names a profile nobody defined: no tool, resource or
prompt at all."""
