"""Breaker state shared through Redis (extra ``redis``), with a local fallback.

Each breaker key gets pybreaker's own ``CircuitRedisStorage`` under the namespace
``toolrelay:<key>``, so every process using the same Redis sees one state per key and N
host replicas open together. Every write also goes to a local ``CircuitMemoryStorage``
shadow, and every state read refreshes it, so when Redis is unreachable — at start or
mid-run — the breaker keeps opening and closing on local counts instead of pybreaker's
own fallback (which reports "closed" with a zero count and never opens).

Redis calls are synchronous (pybreaker's storage API is), so they are bounded: short
socket timeouts, no client-side retries, and while Redis is down it is probed at most
once per ``probe_interval_s``; in between, no call waits on it.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import pybreaker

__all__ = ["RedisLink", "SharedStorage"]

log = logging.getLogger("toolrelay")
T = TypeVar("T")
_MISSING: Any = object()


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[-1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


class RedisLink:
    """One Redis client shared by the storages of every key, and its health."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 0.05,
        probe_interval_s: float = 5.0,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "breaker_storage='redis://…' needs the redis extra: pip install 'toolrelay[redis]'"
            ) from exc
        self.url = _redacted(url)
        self.error_type: type[Exception] = redis.RedisError
        self.client = redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        self.probe_interval_s = probe_interval_s
        self.on_change = on_change
        self.up = True
        self.failures = 0
        self._next_probe = 0.0

    def usable(self) -> bool:
        """May a call go to Redis now? While down, once per probe interval."""
        if self.up:
            return True
        now = time.monotonic()
        if now >= self._next_probe:
            self._next_probe = now + self.probe_interval_s
            return True
        return False

    def failed(self, exc: BaseException | None) -> None:
        self.failures += 1
        self._next_probe = time.monotonic() + self.probe_interval_s
        if self.up:
            self.up = False
            log.warning(
                "toolrelay: breaker storage %s unreachable (%s); using local breaker state, "
                "retrying every %g s",
                self.url,
                type(exc).__name__ if exc else "error",
                self.probe_interval_s,
            )
            if self.on_change is not None:
                self.on_change(False)

    def succeeded(self) -> None:
        if not self.up:
            self.up = True
            log.warning("toolrelay: breaker storage %s reachable again; state is shared", self.url)
            if self.on_change is not None:
                self.on_change(True)

    def close(self) -> None:
        self.client.close()


class _LinkLogger:
    """Stands in for pybreaker's logger: its swallowed RedisErrors mark the link down."""

    def __init__(self, link: RedisLink) -> None:
        self.link = link

    def exception(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.link.failed(sys.exc_info()[1])


class _RedisStorage(pybreaker.CircuitRedisStorage):
    def __init__(self, link: RedisLink, namespace: str) -> None:
        self.logger = _LinkLogger(link)  # type: ignore[assignment]
        super().__init__(pybreaker.STATE_CLOSED, link.client, namespace=namespace)


class SharedStorage(pybreaker.CircuitBreakerStorage):
    """pybreaker storage: Redis while it answers, a local shadow when it does not."""

    def __init__(self, link: RedisLink, key: str) -> None:
        super().__init__("redis")
        self.link = link
        self.namespace = f"toolrelay:{key}"
        self.local = pybreaker.CircuitMemoryStorage(pybreaker.STATE_CLOSED)
        self._remote: _RedisStorage | None = None

    def _call(self, op: Callable[[_RedisStorage], T]) -> T:
        """``op`` on the Redis storage, or ``_MISSING`` if Redis did not answer."""
        link = self.link
        if not link.usable():
            return _MISSING  # type: ignore[no-any-return]
        before = link.failures
        try:
            if self._remote is None:
                self._remote = _RedisStorage(link, self.namespace)
            value = op(self._remote)
        except link.error_type as exc:
            link.failed(exc)
            return _MISSING  # type: ignore[no-any-return]
        if link.failures != before:
            return _MISSING  # type: ignore[no-any-return]
        link.succeeded()
        return value

    # -- state -----------------------------------------------------------------------------
    @property
    def state(self) -> str:
        value = self._call(lambda r: r.state)
        if value is _MISSING:
            return str(self.local.state)
        if value != self.local.state:
            self.local.state = value
            if value == pybreaker.STATE_OPEN:
                opened = self._call(lambda r: r.opened_at)
                if opened is not _MISSING and opened is not None:
                    self.local.opened_at = opened
        return str(value)

    @state.setter
    def state(self, state: str) -> None:
        self.local.state = state
        self._call(lambda r: setattr(r, "state", state))

    @property
    def opened_at(self) -> datetime | None:
        value = self._call(lambda r: r.opened_at)
        if value is _MISSING or value is None:
            return self.local.opened_at
        return value

    @opened_at.setter
    def opened_at(self, when: datetime) -> None:
        self.local.opened_at = when
        self._call(lambda r: setattr(r, "opened_at", when))

    # -- counters --------------------------------------------------------------------------
    def increment_counter(self) -> None:
        self.local.increment_counter()
        self._call(lambda r: r.increment_counter())

    def reset_counter(self) -> None:
        self.local.reset_counter()
        self._call(lambda r: r.reset_counter())

    def increment_success_counter(self) -> None:
        self.local.increment_success_counter()
        self._call(lambda r: r.increment_success_counter())

    def reset_success_counter(self) -> None:
        self.local.reset_success_counter()
        self._call(lambda r: r.reset_success_counter())

    @property
    def counter(self) -> int:
        value = self._call(lambda r: r.counter)
        return int(self.local.counter if value is _MISSING else value)

    @property
    def success_counter(self) -> int:
        value = self._call(lambda r: r.success_counter)
        return int(self.local.success_counter if value is _MISSING else value)
