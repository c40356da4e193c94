"""Per-client limits of the gateway: requests per second and calls in flight.

Each client (a bearer token's client name; ``default`` without configured clients;
``unauthenticated``) has its own token bucket and its own cap on ``tools/call`` requests in
flight, so one client flooding the gateway is refused while the others are served. What is
limited, the answers and the metrics: ``docs/serve.md``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Literal

from mcp.shared.exceptions import MCPError

from ..contract import ErrorType
from ..result import ToolResult
from .metrics import GatewayMetrics
from .settings import ClientSettings, HttpSection, ServeSection

__all__ = [
    "RATE_LIMITED",
    "ClientLimit",
    "ClientLimits",
    "Refusal",
    "TokenBucket",
    "configured_limits",
]

RATE_LIMITED = -32000
"""The JSON-RPC error code of a ``tools/list`` over its client's rate (an
implementation-defined server error)."""

Reason = Literal["rate", "concurrency"]
Clock = Callable[[], float]


class TokenBucket:
    """``rate_per_s`` tokens a second, at most ``burst`` of them saved (full at first)."""

    __slots__ = ("_clock", "_last", "_tokens", "burst", "rate_per_s")

    def __init__(self, rate_per_s: float, burst: int, clock: Clock = time.monotonic) -> None:
        if not rate_per_s > 0 or math.isinf(rate_per_s):
            raise ValueError("rate_per_s must be a positive number")
        if burst < 1:
            raise ValueError("burst must be at least 1")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def take(self) -> float:
        """Take one token: ``0.0`` when there was one, else the seconds until there is
        one (nothing is taken then)."""
        now = self._clock()
        tokens = min(self.burst, self._tokens + (now - self._last) * self.rate_per_s)
        self._last = now
        if tokens >= 1.0:
            self._tokens = tokens - 1.0
            return 0.0
        self._tokens = tokens
        return (1.0 - tokens) / self.rate_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientLimit:
    """One client's limits; ``None`` is no limit.

    ``burst`` defaults to one second's worth of ``rate_per_s`` (at least 1)."""

    rate_per_s: float | None = None
    burst: int | None = None
    max_concurrent_calls: int | None = None

    @classmethod
    def of(cls, settings: HttpSection | ClientSettings) -> ClientLimit:
        """The limits ``[serve.http]`` or one of its clients sets."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})

    def over(self, other: ClientLimit) -> ClientLimit:
        """These limits, with ``other``'s where these are unset."""
        return replace(other, **{k: v for k, v in asdict(self).items() if v is not None})

    def bucket(self, clock: Clock) -> TokenBucket | None:
        if self.rate_per_s is None:
            return None
        burst = self.burst if self.burst is not None else max(1, math.ceil(self.rate_per_s))
        return TokenBucket(self.rate_per_s, burst, clock)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a client's request is refused, and when asking again can help."""

    client: str
    reason: Reason
    retry_after_s: float | None

    def result(self, tool: str, call_id: str | None) -> ToolResult:
        """The ``overloaded`` answer to a refused ``tools/call``."""
        if self.reason == "rate":
            message = f"too many requests from this client: retry {tool} in a moment"
        else:
            message = f"too many calls of this client in flight: retry {tool} when one ends"
        return ToolResult(
            ok=False,
            tool=tool,
            call_id=call_id,
            error_type=ErrorType.OVERLOADED,
            message=message,
            retryable=True,
            retry_after_s=self.retry_after_s,
        )

    def error(self) -> MCPError:
        """The JSON-RPC error for a refused request other than ``tools/call``."""
        assert self.retry_after_s is not None
        return MCPError(
            RATE_LIMITED,
            f"too many requests from this client: retry after {self.retry_after_s:.3f} s",
            {"error_type": str(ErrorType.OVERLOADED), "retry_after_s": self.retry_after_s},
        )


class _Client:
    __slots__ = ("bucket", "in_flight", "limit")

    def __init__(self, limit: ClientLimit, clock: Clock) -> None:
        self.limit = limit
        self.bucket = limit.bucket(clock)
        self.in_flight = 0


class ClientLimits:
    """The limits of every client the gateway knows, by caller name.

    ``clients`` maps a client's name to its own limits, over ``default`` (which every
    other caller — ``default``, ``unauthenticated`` — has as it is). ``names`` are the
    callers whose series are created up front. Only touched from the event loop."""

    def __init__(
        self,
        default: ClientLimit = ClientLimit(),
        clients: Mapping[str, ClientLimit] | None = None,
        *,
        names: Iterable[str] = (),
        metrics: GatewayMetrics | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self._clock = clock
        self._metrics = metrics
        self._clients: dict[str, _Client] = {}
        self.update(default, clients)
        names = {*names, *self._limits}
        if metrics is not None:
            metrics.track_clients(sorted(names), self._in_flight)
        for name in names:
            self._client(name)

    def update(
        self, default: ClientLimit, clients: Mapping[str, ClientLimit] | None = None
    ) -> None:
        """New limits (a reload): a client whose limits changed gets a full bucket; calls in
        flight stay counted."""
        self._default = default
        self._limits = {name: limit.over(default) for name, limit in (clients or {}).items()}
        for name, client in self._clients.items():
            limit = self.limit(name)
            if limit != client.limit:
                fresh = _Client(limit, self._clock)
                fresh.in_flight = client.in_flight
                self._clients[name] = fresh

    def limit(self, name: str) -> ClientLimit:
        """The limits of the caller ``name``."""
        return self._limits.get(name, self._default)

    def _client(self, name: str) -> _Client:
        client = self._clients.get(name)
        if client is None:
            client = self._clients[name] = _Client(self.limit(name), self._clock)
        return client

    def _in_flight(self, name: str) -> int:
        client = self._clients.get(name)
        return 0 if client is None else client.in_flight

    def _refuse(self, name: str, reason: Reason, retry_after_s: float | None) -> Refusal:
        if self._metrics is not None:
            self._metrics.client_rejections.labels(name, reason).inc()
        return Refusal(name, reason, retry_after_s)

    def check(self, name: str) -> Refusal | None:
        """Take one of ``name``'s tokens for a request that is not a call (``None``: go)."""
        client = self._client(name)
        if client.bucket is None:
            return None
        wait = client.bucket.take()
        return None if wait == 0.0 else self._refuse(name, "rate", wait)

    def enter(self, name: str) -> Refusal | None:
        """Admit one ``tools/call`` of ``name`` (``None``: go, and :meth:`leave` when it
        ends) or refuse it."""
        client = self._client(name)
        most = client.limit.max_concurrent_calls
        if most is not None and client.in_flight >= most:
            return self._refuse(name, "concurrency", None)
        if client.bucket is not None:
            wait = client.bucket.take()
            if wait > 0.0:
                return self._refuse(name, "rate", wait)
        client.in_flight += 1
        return None

    def leave(self, name: str) -> None:
        """One admitted call of ``name`` ended (answered, failed or cancelled)."""
        self._clients[name].in_flight -= 1


def configured_limits(settings: ServeSection) -> tuple[ClientLimit, dict[str, ClientLimit]]:
    """The default and per-client limits ``settings`` set (``[serve.http]`` and its
    clients), for :class:`ClientLimits` or its :meth:`~ClientLimits.update`. HTTP only: a
    stdio gateway has one client, the process that started it, and no limits."""
    if settings.transport != "http":
        return ClientLimit(), {}
    clients = settings.http.clients.items()
    return ClientLimit.of(settings.http), {name: ClientLimit.of(c) for name, c in clients}
