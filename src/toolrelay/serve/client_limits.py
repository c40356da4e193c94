"""Per-client limits of the gateway: requests per second and calls in flight.

Each client (a bearer token's client name; ``default`` without configured clients;
``unauthenticated``) has its own token bucket and its own cap on ``tools/call`` requests in
flight, so one client flooding the gateway is refused while the others are served. What is
limited, the answers and the metrics: ``docs/serve.md``.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Literal, Protocol

from mcp.shared.exceptions import MCPError

from ..contract import ErrorType
from ..result import ToolResult
from .metrics import GatewayMetrics
from .settings import ClientSettings, HttpSection, ServeSection

RATE_LIMITED = -32000
"""The JSON-RPC error code of a ``tools/list`` over its client's rate (an
implementation-defined server error)."""

Reason = Literal["rate", "concurrency"]


class Sharing(Protocol):
    """What the limits need of the shared storage (:class:`toolrelay.storage.RedisLink`)."""

    def share(self, share: FleetRates) -> None: ...


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
        self.burst: float = burst
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
    __slots__ = ("bucket", "demand", "in_flight", "limit")

    def __init__(self, limit: ClientLimit, clock: Clock) -> None:
        self.limit = limit
        self.bucket = limit.bucket(clock)
        self.in_flight = 0
        self.demand = [-1, 0, 0]  # this second, requests in it, requests in the one before


class FleetRates:
    """A fleet's share of each client's rate: each replica publishes each client's demand
    (requests in the last second) at every storage sync and reads the others'; its bucket
    refills at ``rate_per_s × mine / (mine + theirs)`` (``docs/serve.md``, "Across a fleet
    of replicas"). Without fresh news (older than :data:`FRESH_S`), a share is 1."""

    name = "client_demand"
    FRESH_S = 2.0

    def __init__(self, clients: Mapping[str, _Client], clock: Clock) -> None:
        self._clients = clients
        self._clock = clock
        self._theirs: dict[str, float] = {}
        self._until = -math.inf

    def mine(self) -> str:
        now = self._clock()
        return json.dumps({name: _demand(c.demand, now) for name, c in list(self._clients.items())})

    def heard(self, others: list[str]) -> None:
        theirs: dict[str, float] = {}
        for value in others:
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                for name, demand in json.loads(value).items():
                    theirs[name] = theirs.get(name, 0.0) + max(0.0, float(demand))
        self._theirs, self._until = theirs, self._clock() + self.FRESH_S

    def share(self, name: str, client: _Client) -> float:
        """``name``'s share of its rate on this replica (counting this request)."""
        now = self._clock()
        second, demand = int(now), client.demand
        if demand[0] != second:
            demand[:] = [second, 0, demand[1] if demand[0] == second - 1 else 0]
        demand[1] += 1
        theirs = self._theirs.get(name, 0.0) if now <= self._until else 0.0
        mine = _demand(demand, now)
        return mine / (mine + theirs) if theirs > 0 else 1.0


def _demand(demand: list[int], now: float) -> float:
    """Requests over the last second, from two one-second buckets (the older pro rata)."""
    second, current, before = demand
    left = 1.0 - (now - int(now))
    if second == int(now):
        return current + before * left
    return current * left if second == int(now) - 1 else 0.0


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
        self.fleet: FleetRates | None = None
        """The fleet's shares of the clients' rates (:meth:`share_with`), if shared."""
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

    def share_with(self, link: Sharing) -> None:
        """Make the clients' rates fleet-wide through ``link`` (the shared storage's)."""
        self.fleet = FleetRates(self._clients, self._clock)
        link.share(self.fleet)

    def _take(self, name: str, client: _Client) -> Refusal | None:
        """Take one of ``name``'s tokens (``None``: taken, or no rate to keep)."""
        bucket, limit, fleet = client.bucket, client.limit, self.fleet
        if bucket is None:
            return None
        if fleet is not None and limit.rate_per_s is not None:
            share = fleet.share(name, client)
            bucket.rate_per_s = limit.rate_per_s * share
            burst = limit.burst if limit.burst is not None else math.ceil(limit.rate_per_s)
            bucket.burst = max(1.0, burst * share)
        wait = bucket.take()
        return None if wait == 0.0 else self._refuse(name, "rate", wait)

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
        return self._take(name, self._client(name))

    def enter(self, name: str) -> Refusal | None:
        """Admit one ``tools/call`` of ``name`` (``None``: go, and :meth:`leave` when it
        ends) or refuse it."""
        client = self._client(name)
        most = client.limit.max_concurrent_calls
        if most is not None and client.in_flight >= most:
            return self._refuse(name, "concurrency", None)
        refusal = self._take(name, client)
        if refusal is None:
            client.in_flight += 1
        return refusal

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
