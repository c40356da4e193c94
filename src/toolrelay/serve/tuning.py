"""Process tuning for ``toolrelay serve``, applied once the gateway is ready."""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Collect what start-up left behind, then freeze the rest out of later collections.

    What start-up built (the SDK, pydantic's validators, uvicorn) lives for the whole run;
    frozen, the full collections the per-call garbage triggers no longer walk it (tens of
    milliseconds each, landing on calls in flight: ``bench/gateway.py``). Safe to call
    again: what was built since is frozen too."""
    gc.collect()
    gc.freeze()
