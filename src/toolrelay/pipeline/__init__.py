"""The dispatch pipeline: one stage a module, composed once by the dispatcher.

A stage is an object whose ``__call__(call_next, inv)`` returns an awaitable
:class:`~toolrelay.outcome.Outcome`. It may answer at once or pass the invocation on to
``call_next(inv)``. A stage that only checks or prepares the call is a plain ``def`` that
returns an outcome (an outcome is its own finished awaitable) or ``call_next(inv)``
itself, so it adds no coroutine frame to a call; a stage that must see the answer (or a
cancellation) is an ``async def`` that awaits ``call_next(inv)``. Stages never raise for a
failure of the call; only a cancellation (and bugs) propagate.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..contract import AuthContext
from ..events import Event
from ..outcome import Outcome, timeout_outcome

if TYPE_CHECKING:
    from ..policy import Profile
    from ..registry import CompiledTool
    from ..slot import SlotLease

__all__ = ["Invocation", "Next", "Observer", "Stage", "compose"]


class Observer(Protocol):
    def __call__(self, inv: Invocation, event: Event) -> None: ...


class Invocation:
    """The state of one call as it moves through the stages."""

    __slots__ = (
        "approval",
        "approver",
        "args",
        "attempts",
        "call_id",
        "ctx",
        "deadline",
        "key",
        "name",
        "observers",
        "profile",
        "raw_args",
        "slot",
        "slot_bound",
        "started",
        "tool",
    )

    def __init__(
        self,
        name: str,
        raw_args: Any,
        ctx: AuthContext,
        profile: Profile,
        call_id: str | None,
        slot: SlotLease | None,
        observers: tuple[Observer, ...],
    ) -> None:
        self.name = name
        self.raw_args = raw_args
        self.ctx = ctx
        self.profile = profile
        self.call_id = call_id
        self.slot = slot
        self.observers = observers
        self.args: dict[str, Any] = {}
        self.tool: CompiledTool | None = None
        self.key: str | None = None
        self.deadline: float = float("inf")
        self.slot_bound = False
        self.attempts = 0
        self.started = 0.0
        """When the current attempt got its bulkhead place (``time.perf_counter``)."""
        self.approval = "not_required"
        self.approver: str | None = None
        """Who decided the approval, when the approver said (an :class:`Approval`)."""

    def timed_out(self) -> Outcome:
        """The ``timeout`` answer of this call (the slot's budget or the tool's timeout)."""
        assert self.tool is not None
        slot = self.slot if self.slot_bound else None
        return timeout_outcome(self.tool.decl, None if slot is None else slot.elapsed())

    def emit(self, event: Event) -> None:
        for observer in self.observers:
            observer(self, event)


Next = Callable[[Invocation], Awaitable[Outcome]]


class Stage(Protocol):
    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]: ...


def compose(stages: Sequence[Stage], terminal: Next) -> Next:
    """Build the chain once: ``stages[0]`` is outermost, ``terminal`` runs the tool."""
    handler = terminal
    for stage in reversed(stages):
        handler = functools.partial(stage, handler)
    return handler
