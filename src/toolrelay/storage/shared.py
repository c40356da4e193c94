"""A key's breaker storage replicated through Redis: the
:class:`~toolrelay.breakers.Replication` a breaker asks, turned into steps queued for the
link's thread (never a wait)."""

from __future__ import annotations

import itertools
import threading
from typing import Any, Protocol

import pybreaker

from ..breakers import Replica, State
from .lua import ms


class Link(Protocol):
    """What a key's storage needs of the link (:class:`~toolrelay.storage.RedisLink`)."""

    prefix: str
    replica: str
    serial: itertools.count[int]
    up: bool

    def attach(self, storage: SharedStorage) -> None: ...

    def send(self, op: tuple[Any, ...]) -> bool: ...


class SharedStorage(pybreaker.CircuitMemoryStorage):
    """A key's local pybreaker storage, replicated through a :class:`RedisLink`."""

    replicated = True

    def __init__(self, link: Link, key: str) -> None:
        super().__init__(pybreaker.STATE_CLOSED)
        self.link = link
        self.key = key
        base = f"{link.prefix}{key}"
        self.redis_keys = (base, f"{base}:trials", f"{base}:counts")
        self.breaker: Replica | None = None
        self.synced_records = -1
        self.active_until = 0.0
        self.joined = threading.Event()
        """Set when the first read of the fleet's state of the key ended (or Redis failed)."""
        self.heard = False
        """The fleet's state of the key has been read (set before :attr:`joined`)."""

    @property
    def up(self) -> bool:
        return self.link.up

    def attach(self, breaker: Replica) -> None:
        self.breaker = breaker
        self.link.attach(self)

    # -- what the breaker asks for (never waits) ------------------------------------------------
    def transition(self, expected: int, state: State, decision: int, *, forced: int = 0) -> bool:
        """A local decision (serial ``decision``); False if it was dropped (Redis down)."""
        breaker = self.breaker
        assert breaker is not None
        brk, pinned = ms(breaker.break_s), int(breaker.pinned_open)
        op = ("transition", self, expected, state, brk, pinned, forced, decision)
        return self.link.send(op)

    def force(self, decision: int) -> bool:
        """An operator's decision: applied whatever the period (pin, unpin)."""
        breaker = self.breaker
        assert breaker is not None
        return self.transition(breaker.period, breaker.known, decision, forced=1)

    def claim(self, max_trials: int) -> None:
        member = f"{self.link.replica}:{next(self.link.serial)}"
        self.link.send(("claim", self, max_trials, member))

    def trial_done(
        self, period: int, permit: str, success: bool | None, threshold: int, base_break_s: float
    ) -> None:
        result = 1 if success else 0
        self.link.send(("done", self, period, permit, result, threshold, ms(base_break_s)))
