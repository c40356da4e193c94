"""Profiles: which tools a caller may see and call, and which need approval.

One decision function, :meth:`Profile.permits`, serves both ``specs()`` and ``dispatch()``,
so the model is never shown a tool it may not call, and never calls one it was not shown.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .contract import RISK_ORDER, RISKS, Risk, ToolDeclaration

__all__ = ["Profile"]


def _names(value: Iterable[str] | None) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        raise TypeError("expected a collection of names, got a single string")
    return frozenset(value)


@dataclass(frozen=True, slots=True, init=False)
class Profile:
    """What one kind of caller may do.

    A tool is permitted when it is not denied (by name or tag), its risk is at most
    ``max_risk``, and either no allow-list is set or its name is in ``allow`` or one of its
    tags is in ``allow_tags``. ``require_approval`` names the risks that need an approval.
    """

    allow: frozenset[str] | None
    deny: frozenset[str]
    allow_tags: frozenset[str] | None
    deny_tags: frozenset[str]
    max_risk: Risk
    require_approval: frozenset[str]

    def __init__(
        self,
        *,
        allow: Iterable[str] | None = None,
        deny: Iterable[str] = (),
        allow_tags: Iterable[str] | None = None,
        deny_tags: Iterable[str] = (),
        max_risk: Risk = "dangerous",
        require_approval: Iterable[Risk] = ("write", "dangerous"),
    ) -> None:
        if max_risk not in RISKS:
            raise ValueError(f"max_risk must be one of {RISKS}, not {max_risk!r}")
        approval = frozenset(require_approval)
        if not approval <= set(RISKS):
            raise ValueError(f"require_approval takes risks from {RISKS}")
        object.__setattr__(self, "allow", _names(allow))
        object.__setattr__(self, "deny", _names(deny) or frozenset())
        object.__setattr__(self, "allow_tags", _names(allow_tags))
        object.__setattr__(self, "deny_tags", _names(deny_tags) or frozenset())
        object.__setattr__(self, "max_risk", max_risk)
        object.__setattr__(self, "require_approval", approval)

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

    def needs_approval(self, decl: ToolDeclaration) -> bool:
        return decl.risk in self.require_approval


EVERYTHING = Profile()
"""The profile of a caller that names none: every tool, approvals as by default."""

NOTHING = Profile(allow=())
"""The profile of a caller that names a profile nobody defined: no tool at all."""
