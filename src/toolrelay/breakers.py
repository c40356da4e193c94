"""Circuit breakers per breaker key, on pybreaker's state and storage.

pybreaker keeps the state (``closed``/``open``/``half-open``), the counters and
``opened_at``, in memory or in Redis, and tells listeners about transitions. Its ``call()``
and ``calling()`` are not used: ``call()`` records a coroutine as a success before it runs
and holds a lock for the whole call, ``calling()`` counts a cancellation as a failure, its
half-open state admits every caller, and ``exclude`` resets the failure count. Admission
and counting are therefore done here, in :meth:`KeyBreaker.admit` and
:meth:`KeyBreaker.record`, which never hold a lock across the call.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import pybreaker

from .outcome import Verdict

__all__ = ["BreakerConfig", "Breakers", "KeyBreaker", "State"]

log = logging.getLogger("toolrelay")

State = Literal["closed", "open", "half_open"]
_STATE: dict[str, State] = {
    pybreaker.STATE_CLOSED: "closed",
    pybreaker.STATE_OPEN: "open",
    pybreaker.STATE_HALF_OPEN: "half_open",
}

ADMIT, TRIAL, REJECT = 0, 1, 2

TransitionListener = Callable[[str, str, str], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerConfig:
    """The resilience settings shared by every tool naming one ``breaker_key``.

    ``fail_max`` consecutive failures open the breaker; after ``reset_timeout_s`` up to
    ``half_open_max_calls`` trial calls run at once, ``success_threshold`` successes close
    it and one failure re-opens it. ``slow_call_s`` makes a slower success count as a
    failure. ``max_concurrent`` calls may be in flight (and as many worker threads live);
    ``bulkhead_wait_s`` is how long a call may wait for a place before ``overloaded``;
    ``max_concurrent_per_tenant`` caps one tenant's share of those places.
    ``max_attempts`` counts all attempts of an idempotent tool; waits between them start
    near ``backoff_initial_s`` and double up to ``backoff_max_s``, with jitter.
    """

    fail_max: int = 5
    reset_timeout_s: float = 30.0
    success_threshold: int = 1
    half_open_max_calls: int = 1
    slow_call_s: float | None = None
    max_concurrent: int = 32
    max_concurrent_per_tenant: int | None = None
    bulkhead_wait_s: float = 0.0
    max_attempts: int = 3
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 2.0

    def __post_init__(self) -> None:
        positive_ints = ("fail_max", "success_threshold", "half_open_max_calls", "max_concurrent")
        for name in (*positive_ints, "max_attempts"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"BreakerConfig.{name} must be an integer ≥ 1, not {value!r}")
        for name in ("reset_timeout_s", "bulkhead_wait_s", "backoff_initial_s", "backoff_max_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise ValueError(f"BreakerConfig.{name} must be a number ≥ 0, not {value!r}")
        share = self.max_concurrent_per_tenant
        if share is not None and (
            not isinstance(share, int) or isinstance(share, bool) or share < 1
        ):
            raise ValueError("BreakerConfig.max_concurrent_per_tenant must be an integer ≥ 1")
        if self.slow_call_s is not None and not self.slow_call_s > 0:
            raise ValueError("BreakerConfig.slow_call_s must be positive or None")


class _Listener(pybreaker.CircuitBreakerListener):
    def __init__(self, owner: KeyBreaker) -> None:
        self.owner = owner

    def state_change(self, cb: Any, old_state: Any, new_state: Any) -> None:
        old: State = _STATE.get(old_state.name, "closed") if old_state is not None else "closed"
        new = _STATE[new_state.name]
        if old != new:
            self.owner._transitioned(old, new)


class KeyBreaker:
    """The breaker of one key. Not thread-safe: used from the event loop only."""

    def __init__(
        self,
        key: str,
        config: BreakerConfig,
        storage: pybreaker.CircuitBreakerStorage | None,
        on_transition: TransitionListener,
    ) -> None:
        self.key = key
        self.config = config
        self.storage = storage or pybreaker.CircuitMemoryStorage(pybreaker.STATE_CLOSED)
        self._on_transition = on_transition
        self.trials = 0
        self.admitted = 0
        """Calls admitted in the closed state (cumulative)."""
        self.trials_admitted = 0
        """Half-open trial calls admitted (cumulative)."""
        self.failures_recorded = 0
        """Failures counted against the service, slow successes included (cumulative)."""
        self.pinned_open = False
        self.transitions = 0
        self.known: State = "closed"
        """The state as last seen by this process (no storage read)."""
        self.last_transition: tuple[str, str] = ("closed", "closed")
        self.cb = pybreaker.CircuitBreaker(
            fail_max=config.fail_max,
            reset_timeout=config.reset_timeout_s,
            success_threshold=config.success_threshold,
            state_storage=self.storage,
            listeners=[_Listener(self)],
            name=key,
        )
        self.known = self.state

    def _transitioned(self, old: State, new: State) -> None:
        self.transitions += 1
        self.last_transition = (old, new)
        self.known = new
        if new != "half_open":
            self.trials = 0
        self._on_transition(self.key, old, new)

    @property
    def state(self) -> State:
        """The state now, syncing with shared storage (other processes' transitions)."""
        state: State = "open" if self.pinned_open else _STATE[self.cb.state.name]
        self.known = state
        return state

    def retry_after(self) -> float:
        """Seconds until a trial call will be admitted (0 when it would be now)."""
        if self.pinned_open:
            return self.config.reset_timeout_s
        opened_at = self.storage.opened_at
        if opened_at is None:
            return 0.0
        due = opened_at.timestamp() + self.config.reset_timeout_s
        return max(0.0, due - time.time())

    def admit(self) -> int:
        """ADMIT, TRIAL (a half-open trial; report it back with ``trial=True``) or REJECT."""
        state = self.state
        if state == "closed":
            self.admitted += 1
            return ADMIT
        if state == "open":
            if self.pinned_open or self.retry_after() > 0:
                return REJECT
            self.cb.half_open()
        if self.trials >= self.config.half_open_max_calls:
            return REJECT
        self.trials += 1
        self.trials_admitted += 1
        return TRIAL

    def release(self, trial: bool) -> None:
        """The admitted call ended without a verdict (cancelled)."""
        if trial and self.trials > 0:
            self.trials -= 1

    def record(self, verdict: Verdict, trial: bool, duration_s: float) -> bool:
        """Count one finished call; True when this failure opened the breaker."""
        self.release(trial)
        if verdict is Verdict.IGNORE:
            return False
        slow = self.config.slow_call_s
        if verdict is Verdict.SUCCESS and slow is not None and duration_s > slow:
            verdict = Verdict.FAILURE
        state = self.state
        storage = self.storage
        if verdict is Verdict.FAILURE:
            self.failures_recorded += 1
        if verdict is Verdict.SUCCESS:
            if state == "closed":
                if storage.counter:
                    storage.reset_counter()
            elif state == "half_open" and trial:
                storage.increment_success_counter()
                if storage.success_counter >= self.config.success_threshold:
                    self.cb.close()
            return False
        if state == "closed":
            storage.increment_counter()
            if storage.counter >= self.config.fail_max:
                self.cb.open()
                return True
        elif state == "half_open" and trial:
            self.cb.open()
            return True
        return False

    # -- operator controls --------------------------------------------------------------
    def force_open(self) -> None:
        """Open and stay open (no trials) until :meth:`force_close` or :meth:`reset`."""
        self.pinned_open = True
        if self.cb.state.name != pybreaker.STATE_OPEN:
            self.cb.open()

    def force_close(self) -> None:
        """Close now, counters cleared; normal operation resumes."""
        self.pinned_open = False
        self.trials = 0
        self.storage.reset_counter()
        if self.cb.state.name != pybreaker.STATE_CLOSED:
            self.cb.close()

    def snapshot(self) -> dict[str, Any]:
        state = self.state
        return {
            "state": state,
            "failures": self.storage.counter,
            "trials_in_flight": self.trials,
            "retry_after_s": round(self.retry_after(), 3) if state == "open" else None,
            "pinned_open": self.pinned_open,
        }


StorageFactory = Callable[[str], "pybreaker.CircuitBreakerStorage | None"]


class Breakers:
    """Every breaker of a dispatcher, one per key, created on first use.

    ``storage_factory(key)`` returns the pybreaker storage for a key (``None`` for local
    memory); see :mod:`toolrelay.storage` for the Redis one.
    """

    def __init__(
        self,
        config_for: Callable[[str], BreakerConfig],
        storage_factory: StorageFactory | None = None,
    ) -> None:
        self._config_for = config_for
        self._storage_factory = storage_factory
        self._breakers: dict[str, KeyBreaker] = {}
        self.listeners: list[TransitionListener] = []
        self.on_create: list[Callable[[str, str], None]] = []

    def get(self, key: str) -> KeyBreaker:
        breaker = self._breakers.get(key)
        if breaker is None:
            storage = None if self._storage_factory is None else self._storage_factory(key)
            breaker = KeyBreaker(key, self._config_for(key), storage, self._notify)
            self._breakers[key] = breaker
            for hook in self.on_create:
                hook(key, breaker.state)
        return breaker

    def _notify(self, key: str, old: str, new: str) -> None:
        log.info("toolrelay: breaker %s %s → %s", key, old, new)
        for listener in self.listeners:
            try:
                listener(key, old, new)
            except Exception:
                log.exception("toolrelay: breaker listener failed")

    def add_listener(self, listener: TransitionListener) -> None:
        """Call ``listener(key, from_state, to_state)`` on every transition."""
        self.listeners.append(listener)

    def keys(self) -> list[str]:
        return sorted(self._breakers)

    def state(self, key: str) -> State:
        return self.get(key).state

    def force_open(self, key: str) -> None:
        self.get(key).force_open()

    def force_close(self, key: str) -> None:
        self.get(key).force_close()

    def reset(self, key: str) -> None:
        """Back to a fresh closed breaker: unpinned, no failures, no trials."""
        breaker = self.get(key)
        breaker.force_close()
        breaker.storage.reset_success_counter()

    def blocked_for(self, key: str, *, fresh: bool = True) -> float | None:
        """Seconds the key will still fail fast, or None if a call would be admitted now.

        ``fresh=False`` trusts the state this process last saw instead of reading shared
        storage (the fast-fail check: the breaker stage reads it fresh anyway).
        """
        breaker = self._breakers.get(key)
        if breaker is None or (breaker.state if fresh else breaker.known) != "open":
            return None
        wait = breaker.retry_after()
        return wait if wait > 0 or breaker.pinned_open else None

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {key: self._breakers[key].snapshot() for key in self.keys()}
