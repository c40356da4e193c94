"""What a tool's handler is: a callable ``fn(args, ctx)``, sync or async.

The registry compiles tools around handlers, typed tools build them from a signature and
the invoke stage runs them; all three read :func:`is_async` from here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .contract import AuthContext

Handler = Callable[[dict[str, Any], AuthContext], Any]
"""A tool's handler: the validated arguments and the caller's ``AuthContext`` in, the
result (or an awaitable of it) out."""

ASYNC_MARK = "__toolrelay_async__"
"""Set on a typed tool's caller that returns the handler's coroutine without being
``async def`` (one frame less per call than awaiting it)."""


def is_async(fn: Callable[..., Any]) -> bool:
    """``async def`` functions, partials of them, objects with an ``async __call__``, and
    typed tools' callers of an ``async def`` (marked :data:`ASYNC_MARK`: they return its
    coroutine)."""
    if inspect.iscoroutinefunction(fn) or getattr(fn, ASYNC_MARK, False):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004
    return call is not None and inspect.iscoroutinefunction(call)
