"""The operator's controls of a breaker (:class:`KeyBreaker`) and every breaker of a
dispatcher (:class:`Breakers`): force open, force close, reset, reconfigure, snapshot."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pybreaker

from .machine import BreakerMachine, TransitionListener
from .options import BreakerOptions
from .replica import Clock, State
from .window import minimum_calls, new_window

log = logging.getLogger("toolrelay")


class KeyBreaker(BreakerMachine):
    """The breaker of one key, with hot reload and the operator's controls."""

    def reconfigure(self, options: BreakerOptions) -> None:
        """Take on new settings, keeping the state (hot reload): an open breaker stays open
        (due a trial ``reset_timeout_s`` after it opened, under the new value; a grown
        break stays within ``reset_timeout_max_s``), a pinned one stays pinned, trials in
        flight finish, and the failure window keeps its counts unless its shape
        (``window``, ``window_size``) changed. The new thresholds decide from now on."""
        old, self.options = self.options, options
        self.cb.fail_max = options.fail_max
        self.cb.reset_timeout = options.reset_timeout_s
        self.cb.success_threshold = options.success_threshold
        if (old.window, old.window_size) != (options.window, options.window_size):
            self.window = new_window(options)
        self.minimum_calls = minimum_calls(options)
        grown = min(self.break_s, options.reset_timeout_max_s or options.reset_timeout_s)
        self.break_s = max(options.reset_timeout_s, grown)

    # -- operator controls --------------------------------------------------------------
    def force_open(self) -> None:
        """Open and stay open (no trials) until :meth:`force_close` or :meth:`reset`;
        with shared storage, on every replica."""
        self._drain()
        self.pinned_open = True
        if self.known != "open":
            self.opened = self.clock()
            self.cb.open()
        if self.shared is not None:
            self._sent(self.shared.force(self.decided + 1))

    def force_close(self) -> None:
        """Close now, counters cleared; normal operation resumes (on every replica)."""
        self._drain()
        self.pinned_open = False
        self.storage.reset_counter()
        self.break_s = self.options.reset_timeout_s
        if self.known != "closed":
            self.cb.close()
        else:
            self._new_period()
        if self.shared is not None:
            self._sent(self.shared.force(self.decided + 1))

    def snapshot(self) -> dict[str, Any]:
        """The breaker as ``/breakers`` shows it; the rates are ``None`` for the consecutive
        window, which counts failures in a row, not a share of calls."""
        state = self.state
        failure_rate = slow_rate = None
        if self.window is not None:
            failure_rate, slow_rate = (round(rate, 4) for rate in self.rates())
        return {
            "state": state,
            "failures": (
                self.storage.counter if self.window is None else self.window_counts(others=False)[1]
            ),
            "trials_in_flight": self.trials,
            "retry_after_s": round(self.retry_after(), 3) if state == "open" else None,
            "pinned_open": self.pinned_open,
            "failure_rate": failure_rate,
            "slow_call_rate": slow_rate,
            "break_s": float(self.break_s),
        }


StorageFactory = Callable[[str], "pybreaker.CircuitBreakerStorage | None"]


class Breakers:
    """Every breaker of a dispatcher, one per key, created on first use.

    ``storage_factory(key)`` returns the pybreaker storage for a key (``None`` for local
    memory); see :mod:`toolrelay.storage` for the shared one.
    """

    def __init__(
        self,
        options_for: Callable[[str], BreakerOptions],
        storage_factory: StorageFactory | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self._options_for = options_for
        self._storage_factory = storage_factory
        self._clock = clock
        self._breakers: dict[str, KeyBreaker] = {}
        self.listeners: list[TransitionListener] = []
        self.on_create: list[Callable[[str, str], None]] = []

    def get(self, key: str) -> KeyBreaker:
        breaker = self._breakers.get(key)
        if breaker is None:
            storage = None if self._storage_factory is None else self._storage_factory(key)
            breaker = KeyBreaker(key, self._options_for(key), storage, self._notify, self._clock)
            self._breakers[key] = breaker
            for hook in self.on_create:
                hook(key, breaker.state)
        return breaker

    def known(self, key: str) -> KeyBreaker | None:
        """``key``'s breaker if it exists (never creates one)."""
        return self._breakers.get(key)

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

    def reconfigure(self) -> list[str]:
        """Re-read every existing breaker's settings from ``options_for`` (hot reload) and
        apply changed ones with :meth:`KeyBreaker.reconfigure`; returns those keys."""
        changed = []
        for key, breaker in self._breakers.items():
            options = self._options_for(key)
            if options != breaker.options:
                breaker.reconfigure(options)
                changed.append(key)
        return sorted(changed)

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

    def blocked_for(self, key: str) -> float | None:
        """Seconds the key will still fail fast, or None if a call would be admitted now."""
        breaker = self._breakers.get(key)
        if breaker is None or breaker.state != "open":
            return None
        wait = breaker.retry_after()
        return wait if wait > 0 or breaker.pinned_open else None

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {key: self._breakers[key].snapshot() for key in self.keys()}
