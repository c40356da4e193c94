"""prometheus-client's value store of a bound metric child, for the dispatch hot path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def value_inc(child: Any) -> Callable[[float], None] | None:
    """The ``inc`` of a bound counter or gauge child's value store, or ``None`` if a release
    moved it.

    Relies on ``child._value.inc`` (``MutexValue``, or the file-backed value in
    multiprocess mode): the public ``inc`` re-checks per call what cannot change for a bound
    child, ~1.5 µs of a ~28 µs dispatch on the bench machine (see
    :func:`toolrelay.telemetry.metrics.adder`).
    """
    inc = getattr(getattr(child, "_value", None), "inc", None)
    return inc if callable(inc) else None
