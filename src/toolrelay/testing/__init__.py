"""A testing kit for hosts: test an agent against toolrelay without sleeping.

- :class:`ScriptedPlugin` / :class:`SyncScriptedPlugin`: tools whose calls answer by script
  (:func:`ok`, :func:`error`, :func:`hang`, :func:`slow`), every call recorded;
- :func:`capture_events`: the stage events (:mod:`toolrelay.events`) of the calls made in a
  block;
- :func:`force_state`: put a breaker in ``closed``, ``open`` or ``half_open``;
- :class:`FrozenClock`: the breakers' clock, moved by hand (``Dispatcher(..., clock=)``);
- :class:`StandInUpstream`: the chaos stand-in for the services the first-party plugins call.

See ``docs/testing.md``.
"""

from __future__ import annotations

from typing import Any

from .control import CapturedEvent, EventLog, FrozenClock, capture_events, force_state
from .scripted import (
    ScriptedCall,
    ScriptedPlugin,
    Step,
    SyncScriptedPlugin,
    error,
    hang,
    ok,
    slow,
)

try:
    from ..chaos.upstream import StandInUpstream
except ModuleNotFoundError as missing:  # the stand-in speaks HTTP with h11
    _UPSTREAM_MISSING: ModuleNotFoundError | None = missing
else:
    _UPSTREAM_MISSING = None

__all__ = [
    "CapturedEvent",
    "EventLog",
    "FrozenClock",
    "ScriptedCall",
    "ScriptedPlugin",
    "StandInUpstream",
    "Step",
    "SyncScriptedPlugin",
    "capture_events",
    "error",
    "force_state",
    "hang",
    "ok",
    "slow",
]


def __getattr__(name: str) -> Any:
    if name == "StandInUpstream" and _UPSTREAM_MISSING is not None:
        raise ImportError(
            f"toolrelay.testing.StandInUpstream needs {_UPSTREAM_MISSING.name!r}, which is not"
            " installed: pip install 'toolrelay[chaos]'"
        ) from _UPSTREAM_MISSING
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
