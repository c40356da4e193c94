"""The dispatch pipeline: one stage a module, composed once by the dispatcher. A stage's
protocol, its two kinds (plain ``def`` / ``async def``) and the values it passes:
docs/architecture.md, "The pipeline"."""

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
