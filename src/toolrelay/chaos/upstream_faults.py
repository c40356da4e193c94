"""The stand-in upstream's faults: what each kind takes, how a fault is checked, and the
table the server draws from (one seeded :class:`random.Random`)."""

from __future__ import annotations

import math
import random
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FAULT_KINDS: dict[str, frozenset[str]] = {
    "delay": frozenset({"seconds"}),
    "slow_body": frozenset({"seconds"}),
    "hang": frozenset(),
    "reset": frozenset(),
    "status": frozenset({"status", "retry_after"}),
    "rate_limit": frozenset({"retry_after"}),
    "malformed": frozenset(),
    "truncated": frozenset(),
    "load": frozenset({"seconds", "capacity"}),
    "slow_tail": frozenset({"seconds", "tail", "tail_seconds"}),
}
"""Every fault kind and the parameters it takes (besides ``path`` and ``rate``)."""

MAX_SECONDS = 3600.0
MAX_PATHS = 1000


class FaultError(ValueError):
    """A fault description that cannot be used; the message says what is wrong."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamFault:
    """One fault, applied to requests whose path starts with ``path``."""

    path: str
    fault: str
    rate: float = 1.0
    seconds: float = 1.0
    status: int = 500
    retry_after: str | None = None
    capacity: int = 20
    tail: float = 0.05
    tail_seconds: float = 2.0

    def to_json(self) -> dict[str, Any]:
        """The fault as the admin endpoint lists it: only the parameters its kind uses."""
        out: dict[str, Any] = {"path": self.path, "fault": self.fault, "rate": self.rate}
        for name in sorted(FAULT_KINDS[self.fault]):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> UpstreamFault:
        """Check an admin request's fields; raise :class:`FaultError` with a clear reason."""
        kind = data.get("fault")
        if not isinstance(kind, str) or kind not in FAULT_KINDS:
            raise FaultError(f"'fault' must be one of {', '.join(sorted(FAULT_KINDS))}")
        path = data.get("path")
        if not isinstance(path, str) or not path.startswith("/") or len(path) > 200:
            raise FaultError("'path' must be a path prefix starting with '/'")
        if path.startswith("/_admin"):
            raise FaultError("the admin endpoint cannot be given faults")
        allowed = FAULT_KINDS[kind]
        unknown = sorted(set(data) - {"path", "fault", "rate"} - allowed)
        if unknown:
            raise FaultError(f"fault {kind!r} takes no parameter {unknown[0]!r}")
        rate = _number(data.get("rate", 1.0), "rate", 0.0, 1.0)
        fields: dict[str, Any] = {"path": path, "fault": kind, "rate": rate}
        if "seconds" in allowed:
            fields["seconds"] = _number(data.get("seconds", 1.0), "seconds", 0.0, MAX_SECONDS)
        if "status" in allowed:
            status = data.get("status", 500)
            if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 599:
                raise FaultError("'status' must be an integer from 400 to 599")
            fields["status"] = status
        if "capacity" in allowed:
            fields["capacity"] = int(_number(data.get("capacity", 20), "capacity", 1, 10000))
        if "tail" in allowed:
            fields["tail"] = _number(data.get("tail", 0.05), "tail", 0.0, 1.0)
            fields["tail_seconds"] = _number(
                data.get("tail_seconds", 2.0), "tail_seconds", 0.0, MAX_SECONDS
            )
        if "retry_after" in allowed:
            default = "1" if kind == "rate_limit" else None
            fields["retry_after"] = _retry_after(data.get("retry_after", default))
        return cls(**fields)


def _number(value: Any, name: str, low: float, high: float) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise FaultError(f"{name!r} must be a number from {low:g} to {high:g}")
    return float(value)


def _retry_after(value: Any) -> str | None:
    """Seconds (a number) or an HTTP-date (a string), as the header will carry it."""
    if value is None:
        return None
    if isinstance(value, str):
        if not 0 < len(value) <= 64 or not all(" " <= ch <= "~" for ch in value):
            raise FaultError("'retry_after' must be seconds or a short HTTP-date")
        return value
    seconds = _number(value, "retry_after", 0.0, 86400.0)
    return str(int(seconds)) if seconds.is_integer() else str(seconds)


class FaultTable:
    """The faults in force, their dice (one seeded :class:`random.Random`) and the counters;
    shared by the server's loop and other threads. :class:`StandInUpstream` is one."""

    def __init__(self, seed: int) -> None:
        self._lock = threading.Lock()
        self._faults: dict[str, UpstreamFault] = {}
        self._random = random.Random(seed)
        self._requests: Counter[str] = Counter()
        self._applied: Counter[str] = Counter()

    def set_fault(self, path: str, fault: str, rate: float = 1.0, **params: Any) -> UpstreamFault:
        """Apply ``fault`` to requests under ``path`` (replacing its previous fault)."""
        return self.put(UpstreamFault.parse({"path": path, "fault": fault, "rate": rate, **params}))

    def put(self, fault: UpstreamFault) -> UpstreamFault:
        with self._lock:
            self._faults[fault.path] = fault
        return fault

    def clear_faults(self, path: str | None = None) -> None:
        """Remove every fault, or the fault of one path prefix."""
        with self._lock:
            if path is None:
                self._faults.clear()
            else:
                self._faults.pop(path, None)

    @property
    def faults(self) -> list[UpstreamFault]:
        """The faults in force, most specific last."""
        with self._lock:
            return sorted(self._faults.values(), key=lambda f: (len(f.path), f.path))

    def seed(self, seed: int) -> None:
        """Restart the fault dice: the same seed gives the same sequence again."""
        with self._lock:
            self._random.seed(seed)

    @property
    def stats(self) -> dict[str, dict[str, int]]:
        """``{"requests": {path: n}, "faults": {kind: n}}`` since start (or the last reset)."""
        with self._lock:
            return {"requests": dict(self._requests), "faults": dict(self._applied)}

    def reset_stats(self) -> None:
        """Start counting requests and faults from zero."""
        with self._lock:
            self._requests.clear()
            self._applied.clear()

    def draw(self, path: str) -> UpstreamFault | None:
        """Count the request; return the fault to apply to it, if any."""
        with self._lock:
            if path in self._requests or len(self._requests) < MAX_PATHS:
                self._requests[path] += 1
            else:
                self._requests["<other>"] += 1
            matches = [p for p in self._faults if path.startswith(p)]
            if not matches:
                return None
            fault = self._faults[max(matches, key=len)]  # the most specific prefix wins
            if self._random.random() >= fault.rate:
                return None
            self._applied[fault.fault] += 1
            return fault

    def chance(self, share: float) -> bool:
        """A throw of the dice that comes up with probability ``share``."""
        with self._lock:
            return self._random.random() < share
