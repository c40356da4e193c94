"""``toolrelay serve``: the dispatcher's tools behind an MCP server, with an admin API.

* :mod:`~toolrelay.serve.settings` — the ``[serve]`` section of ``toolrelay.toml``, which
  extends the core config (``GatewaySettings``);
* :mod:`~toolrelay.serve.gateway` — the MCP server (stdio and streamable HTTP; its HTTP
  sessions: ``sessions``; plain ``tools/call`` POSTs: ``fast_lane``);
* :mod:`~toolrelay.serve.answers` — toolrelay answers as MCP tool results;
* :mod:`~toolrelay.serve.watch` — ``tools/list_changed`` when breakers or plugins change;
* :mod:`~toolrelay.serve.admin` — the admin API (FastAPI; its bodies: ``admin_models``, its
  auth, checks and error bodies: ``admin_http``);
* :mod:`~toolrelay.serve.upstreams` — MCP servers behind the gateway (their resources,
  prompts and completions: ``resources``);
* :mod:`~toolrelay.serve.runner` — starting and stopping all of it.

Needs the ``serve`` extra (the MCP SDK 2.x, with starlette and uvicorn). ``settings`` and
``errors`` import without it, so ``[serve]`` can be checked anywhere; the rest is imported
on first use. See docs/serve.md.
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
