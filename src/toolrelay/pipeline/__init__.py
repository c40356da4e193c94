"""The dispatch pipeline: one stage a module, composed once by the dispatcher.

A stage is an object whose ``__call__(call_next, inv)`` returns an awaitable
:class:`~toolrelay.outcome.Outcome`. It may answer at once or pass the invocation on to
``call_next(inv)`` — a new :class:`~toolrelay.invocation.Invocation` when it established
something (invocations are immutable), and an answer changed on the way out is a new
outcome (``dataclasses.replace``). A stage that only checks or prepares the call is a plain
``def`` that returns an outcome (an outcome is its own finished awaitable) or
``call_next(inv)`` itself, so it adds no coroutine frame to a call; a stage that must see
the answer (or a cancellation) is an ``async def`` that awaits ``call_next(inv)``. Stages
never raise for a failure of the call; only a cancellation (and bugs) propagate. No stage
imports another.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from ..invocation import Invocation, Observer
from ..outcome import Outcome

__all__ = ["Invocation", "Next", "Observer", "Stage", "compose"]


Next = Callable[[Invocation], Awaitable[Outcome]]


class Stage(Protocol):
    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]: ...


def compose(stages: Sequence[Stage], terminal: Next) -> Next:
    """Build the chain once: ``stages[0]`` is outermost, ``terminal`` runs the tool."""
    handler = terminal
    for stage in reversed(stages):
        handler = functools.partial(stage, handler)
    return handler
