"""One call as the pipeline stages pass it inward: an immutable value.

The dispatcher builds an :class:`Invocation` from what the caller asked (name, raw
arguments, context, profile, call id, slot, observers) and the tool that name finds. A
stage that establishes something passes a *new* value on (:meth:`~Invocation.decoded`,
:meth:`~Invocation.bounded`, :meth:`~Invocation.attempt`, ``dataclasses.replace``); none
writes a field another stage reads later. What comes back out travels in the answer: an
:class:`~toolrelay.outcome.Outcome` names the invocation it answers (``request``).

An invocation is frozen for the type checker (``Final`` fields), not at run time: a
frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (five times
the cost, and a call builds three invocations), and a ``NamedTuple``'s fields are slower
to read than slots.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from .contract import AuthContext
from .events import Event
from .policy import Profile
from .registry import CompiledTool
from .slot import SlotLease

__all__ = ["AuditNote", "Invocation", "Observer"]


class Observer(Protocol):
    def __call__(self, inv: Invocation, event: Event) -> None: ...


AuditNote = Callable[["Invocation", str, "str | None"], None]
"""How the policy and approve stages tell the audit stage of a decision about a call it
watches: ``(invocation, decision, approver)``."""


@dataclass(slots=True)
class Invocation:
    """One call, or one attempt of it, as a stage receives it. Immutable: every field is
    ``Final`` (mypy refuses an assignment); a stage passes on a new value."""

    name: Final[Any]
    """The name the caller gave (not necessarily a string: a model may send anything)."""
    raw_args: Final[Any]
    ctx: Final[AuthContext]
    profile: Final[Profile]
    call_id: Final[str | None]
    slot: Final[SlotLease | None]
    observers: Final[tuple[Observer, ...]]
    tool: Final[CompiledTool | None] = None
    """The tool as its plugin declares it when the call came (``None``: no such tool)."""
    key: Final[str | None] = None
    """The tool's breaker key (``None`` for a call outside the caller's profile)."""
    args: Final[dict[str, Any]] = field(default_factory=dict)
    """Set by decode: the decoded arguments."""
    deadline: Final[float] = math.inf
    """Set by the deadline stage (a fallback's call starts with its primary's as a bound)."""
    slot_bound: Final[bool] = False
    """Set by the deadline stage: the model slot's budget is the deadline."""
    attempts: Final[int] = 0
    """This attempt's number: 1 from the deadline stage on, then set by retry and hedge
    (0: the call made no attempt)."""
    audit: Final[AuditNote | None] = None
    """Set by the audit stage for a call it writes a line for."""

    # the derivations a call makes on its way in, written out (``dataclasses.replace``
    # takes 10x as long: it is kept for the rarer changes)
    def decoded(self, args: dict[str, Any]) -> Invocation:
        return Invocation(
            self.name, self.raw_args, self.ctx, self.profile, self.call_id, self.slot,
            self.observers, self.tool, self.key, args, self.deadline, self.slot_bound,
            self.attempts, self.audit,
        )  # fmt: skip

    def bounded(self, now: float, attempts: int) -> Invocation:
        """This invocation with the call's one absolute deadline from ``now`` — ``now`` +
        the tool's ``timeout_s``, capped by the model slot's deadline and by a deadline the
        call already has (a fallback's: its primary's) — as attempt ``attempts``. The one
        place a deadline is worked out (the deadline and fallback stages ask it)."""
        assert self.tool is not None
        deadline = now + self.tool.decl.timeout_s
        if self.deadline < deadline:
            deadline = self.deadline
        slot = self.slot
        slot_bound = slot is not None and slot.deadline < deadline
        if slot_bound:
            assert slot is not None
            deadline = slot.deadline
        return Invocation(
            self.name, self.raw_args, self.ctx, self.profile, self.call_id, slot,
            self.observers, self.tool, self.key, self.args, deadline, slot_bound,
            attempts, self.audit,
        )  # fmt: skip

    def attempt(self, number: int) -> Invocation:
        return Invocation(
            self.name, self.raw_args, self.ctx, self.profile, self.call_id, self.slot,
            self.observers, self.tool, self.key, self.args, self.deadline, self.slot_bound,
            number, self.audit,
        )  # fmt: skip

    def emit(self, event: Event) -> None:
        for observer in self.observers:
            observer(self, event)
