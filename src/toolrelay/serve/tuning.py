"""Process tuning for ``toolrelay serve``, applied once the gateway is ready.

Everything alive after start-up (the MCP SDK, pydantic's validators, uvicorn, the
dispatcher, the upstream sessions) stays alive for the whole run. :func:`settle_heap`
collects once and moves those objects to the collector's permanent generation
(:func:`gc.freeze`), so the full collections that the per-call garbage triggers no longer
walk them: with the SDK loaded, each such walk was tens of milliseconds, landing on
whichever calls were in flight (``bench/gateway.py`` measures the difference).
"""

from __future__ import annotations

import gc

__all__ = ["settle_heap"]


def settle_heap() -> None:
    """Collect what start-up left behind, then freeze the rest out of later collections.

    Safe to call again (after a reload, say): objects frozen earlier stay frozen, and
    what was built since is frozen with them."""
    gc.collect()
    gc.freeze()
