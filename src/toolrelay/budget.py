"""Retry budgets: retries and hedges of a breaker key at most a share of its recent calls.

Over a sliding window of :data:`WINDOW_S` one-second buckets a budget counts the key's
calls and its extras (retries and hedges); an extra is allowed while
``extras + 1 ≤ max(ratio × calls, min_per_s × WINDOW_S)`` (Finagle's, tower's and Envoy's
retry budgets; ``docs/retry-budgets.md``). With shared breaker storage each replica adds
the other replicas' latest counts (:mod:`toolrelay.storage`), so the budget holds for the
fleet; the check never waits on Redis.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar

from pydantic.dataclasses import dataclass

from .settings import DATACLASS, Seconds, Share, one_line_errors

WINDOW_S = 10
"""The budget's sliding window, in seconds."""
OTHERS_TTL_S = 2.0
"""How long other replicas' counts are believed without a fresh reading."""

Clock = Callable[[], float]


@one_line_errors("BudgetOptions.{}")
@dataclass(frozen=True, slots=True, kw_only=True, config=DATACLASS)
class BudgetOptions:
    """A key's retry budget: its retries and hedges at most ``share`` of its calls in the
    last :data:`WINDOW_S` seconds, or ``min_per_s`` a second if more. ``share = None`` (the
    default): no budget, retries are limited by attempts only.

    Not reloadable: a key's budget keeps the settings of its first call.
    """

    RELOADABLE: ClassVar[bool] = False
    """Whether a hot reload may change these settings of a key already in use."""

    share: Share | None = None
    min_per_s: Seconds = 1.0  # a rate ≥ 0 (per second, not seconds)


class KeyBudget:
    """One key's budget. :meth:`deposit` per call; :meth:`try_spend` before a retry or hedge."""

    __slots__ = ("_buckets", "_clock", "_others", "min_per_s", "ratio", "window_s")

    def __init__(
        self,
        ratio: float,
        min_per_s: float = 1.0,
        *,
        window_s: int = WINDOW_S,
        clock: Clock = time.monotonic,
    ) -> None:
        if ratio < 0 or min_per_s < 0 or window_s < 1:
            raise ValueError("a retry budget needs ratio ≥ 0, min_per_s ≥ 0 and window_s ≥ 1")
        self.ratio = ratio
        self.min_per_s = min_per_s
        self.window_s = window_s
        self._clock = clock
        self._buckets = [[-1, 0, 0] for _ in range(window_s)]  # second, calls, extras
        self._others = (0, 0, float("-inf"))  # calls, extras, believed until

    def _bucket(self) -> list[int]:
        second = int(self._clock())
        bucket = self._buckets[second % self.window_s]
        if bucket[0] != second:
            bucket[0], bucket[1], bucket[2] = second, 0, 0
        return bucket

    def deposit(self) -> None:
        """Count one call."""
        self._bucket()[1] += 1

    def counts(self) -> tuple[int, int]:
        """This replica's (calls, extras) in the window. Read-only: safe from another thread."""
        first = int(self._clock()) - self.window_s + 1
        calls = extras = 0
        for second, c, e in list(self._buckets):
            if second >= first:
                calls += c
                extras += e
        return calls, extras

    def share(self, calls: int, extras: int) -> None:
        """The other replicas' latest counts (from the storage's thread)."""
        self._others = (calls, extras, self._clock() + OTHERS_TTL_S)

    def totals(self) -> tuple[int, int]:
        """(calls, extras) in the window, other replicas' included while fresh."""
        calls, extras = self.counts()
        others_calls, others_extras, until = self._others
        if self._clock() <= until:
            calls += others_calls
            extras += others_extras
        return calls, extras

    def try_spend(self) -> bool:
        """Spend one extra if it fits; ``False`` (and nothing spent) when the budget is spent."""
        calls, extras = self.totals()
        if extras + 1 > max(self.ratio * calls, self.min_per_s * self.window_s):
            return False
        self._bucket()[2] += 1
        return True


class RetryBudgets:
    """The budgets of every key whose :class:`BudgetOptions` set a ``share``."""

    __slots__ = ("_budgets", "_clock", "_options_for")

    def __init__(
        self, options_for: Callable[[str], BudgetOptions], clock: Clock = time.monotonic
    ) -> None:
        self._options_for = options_for
        self._clock = clock
        self._budgets: dict[str, KeyBudget | None] = {}

    def get(self, key: str) -> KeyBudget | None:
        """``key``'s budget, or ``None`` when it has none (retries limited only by attempts)."""
        try:
            return self._budgets[key]
        except KeyError:
            options = self._options_for(key)
            ratio = options.share
            budget = (
                None if ratio is None else KeyBudget(ratio, options.min_per_s, clock=self._clock)
            )
            self._budgets[key] = budget
            return budget

    def known(self, key: str) -> KeyBudget | None:
        """``key``'s budget if one was made already (never creates one; any thread)."""
        return self._budgets.get(key)
