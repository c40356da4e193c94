"""The breaker settings of one breaker key (frozen, checked when built)."""

from __future__ import annotations

from typing import Literal

from pydantic import ValidationInfo, field_validator
from pydantic.dataclasses import dataclass

from ..settings import DATACLASS, Count, Positive, Rate, Seconds, Share, one_line_errors

__all__ = ["BreakerConfig", "Window"]

Window = Literal["consecutive", "count", "time"]


@one_line_errors("BreakerConfig.{}")
@dataclass(frozen=True, slots=True, kw_only=True, config=DATACLASS)
class BreakerConfig:
    """The resilience settings shared by every tool naming one ``breaker_key``.

    What opens the breaker (``window``):

    - ``"consecutive"`` (default): ``fail_max`` failures in a row.
    - ``"count"``: of the last ``window_size`` recorded calls, once at least
      ``minimum_calls`` are in the window, a share of ``failure_rate`` or more failed, or a
      share of ``slow_call_rate`` or more took longer than ``slow_call_s``.
    - ``"time"``: the same over the calls recorded in the last ``window_size`` seconds.

    After ``reset_timeout_s`` an open breaker lets up to ``half_open_max_calls`` trial
    calls run at once; ``success_threshold`` successful trials close it and one failed
    trial re-opens it. With ``reset_timeout_max_s`` each re-open after a failed trial
    doubles the break, up to that maximum; closing resets it. ``slow_call_s`` makes a
    slower success count as a failure in the consecutive window and in trials.

    ``max_concurrent`` calls may be in flight (and as many worker threads live);
    ``bulkhead_wait_s`` is how long a call may wait for a place before ``overloaded``;
    ``max_concurrent_per_tenant`` caps one tenant's share of those places.
    ``max_concurrent = "adaptive"``: the limit follows the key's latency, between
    ``adaptive_min`` and ``adaptive_max`` (:mod:`toolrelay.adaptive`).
    ``max_attempts`` counts all attempts of an idempotent tool; waits between them start
    near ``backoff_initial_s`` and double up to ``backoff_max_s``, with jitter.
    ``hedge_after_s`` (seconds, or ``"adaptive"``: the key's observed p95, at least
    ``hedge_after_min_s``) starts up to ``max_hedges`` extra attempts of a slow idempotent
    call; the first good answer wins (:mod:`toolrelay.pipeline.hedge`). ``retry_budget``
    caps the key's retries and hedges at that share of its calls in the last 10 s, or
    ``retry_budget_min_per_s`` a second if more (:mod:`toolrelay.budget`).
    A bad value raises :class:`~toolrelay.settings.SettingsError` (a ``ValueError``).
    """

    fail_max: Count = 5
    reset_timeout_s: Seconds = 30.0
    reset_timeout_max_s: Seconds | None = None
    success_threshold: Count = 1
    half_open_max_calls: Count = 1
    slow_call_s: Positive | None = None
    window: Window = "consecutive"
    window_size: Count = 100
    minimum_calls: Count = 10
    failure_rate: Rate = 0.5
    slow_call_rate: Rate | None = None
    max_concurrent: Count | Literal["adaptive"] = 32
    adaptive_min: Count = 2
    adaptive_max: Count = 100
    max_concurrent_per_tenant: Count | None = None
    bulkhead_wait_s: Seconds = 0.0
    max_attempts: Count = 3
    backoff_initial_s: Seconds = 0.05
    backoff_max_s: Seconds = 2.0
    hedge_after_s: Positive | Literal["adaptive"] | None = None
    hedge_after_min_s: Positive = 0.01
    max_hedges: Count = 1
    retry_budget: Share | None = None
    retry_budget_min_per_s: Seconds = 1.0  # a rate ≥ 0 (per second, not seconds)

    @property
    def max_places(self) -> int:
        """The most calls that may ever be in flight (and worker threads live)."""
        return self.adaptive_max if self.max_concurrent == "adaptive" else self.max_concurrent

    @field_validator("adaptive_max")
    @classmethod
    def _not_below_adaptive_min(cls, value: int, info: ValidationInfo) -> int:
        if value < info.data.get("adaptive_min", 1):
            raise ValueError(f"must be ≥ adaptive_min, not {value!r}")
        return value

    @field_validator("reset_timeout_max_s")
    @classmethod
    def _not_below_reset_timeout(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and value < info.data.get("reset_timeout_s", 0):
            raise ValueError(f"must be ≥ reset_timeout_s, not {value!r}")
        return value

    @field_validator("slow_call_rate")
    @classmethod
    def _needs_slow_call_s(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and info.data.get("slow_call_s") is None:
            raise ValueError("needs slow_call_s")
        return value
