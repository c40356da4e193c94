"""``toolrelay serve``: the dispatcher's tools behind an MCP server, with an admin API (its
modules: docs/architecture.md; its use: docs/serve.md).

Needs the ``serve`` extra (the MCP SDK 2.x, with starlette and uvicorn). ``settings`` and
``errors`` import without it, so ``[serve]`` can be checked anywhere; the rest is imported
on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import ServeError
from .settings import ServeSection, load

if TYPE_CHECKING:
    from .runner import Service, main

__all__ = ["ServeError", "ServeSection", "Service", "load", "main"]


def __getattr__(name: str) -> Any:
    if name in ("Service", "main"):
        from . import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
