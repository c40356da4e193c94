"""Where a worker process finds a handler: by module and qualified name."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ProcessTarget:
    """A handler as a worker process finds it: by module and qualified name."""

    module: str
    qualname: str
    typed: bool
    """A typed tool: the worker builds its ``(args, ctx)`` caller from the function."""
    tool: str


def target_of(fn: Callable[..., Any], tool: str, *, typed: bool) -> ProcessTarget:
    """The :class:`ProcessTarget` of a module-level function; :class:`ValueError` (a reason
    to complete "isolation='process' …") for anything a worker could not import by name."""
    if not inspect.isfunction(fn):
        raise ValueError(
            f"needs a module-level function, and {type(fn).__name__} {fn!r:.60} is not one"
        )
    module = getattr(fn, "__module__", None)
    qualname = fn.__qualname__
    if not module or "<" in qualname:  # <lambda>, <locals>
        raise ValueError(
            f"needs a module-level function a worker process can import by name, "
            f"and {qualname} is not defined at the top level of its module"
        )
    return ProcessTarget(module, qualname, typed, tool)
