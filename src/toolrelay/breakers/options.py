"""The breaker settings of one breaker key (frozen, checked when built)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import ValidationInfo, field_validator
from pydantic.dataclasses import dataclass

from ..settings import DATACLASS, Count, Positive, Rate, Seconds, one_line_errors

Window = Literal["consecutive", "count", "time"]


@one_line_errors("BreakerOptions.{}")
@dataclass(frozen=True, slots=True, kw_only=True, config=DATACLASS)
class BreakerOptions:
    """What opens and closes the circuit breaker of one ``breaker_key``: ``fail_max``
    failures in a row (``window="consecutive"``), or a failure or slow-call rate over the
    last ``window_size`` calls (``"count"``) or seconds (``"time"``); then trials after
    ``reset_timeout_s``. Every field: ``docs/breakers.md``. Reloadable, keeping the
    breaker's state (:meth:`~toolrelay.breakers.KeyBreaker.reconfigure`).
    """

    RELOADABLE: ClassVar[bool] = True
    """Whether a hot reload may change these settings of a key already in use."""

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

    @field_validator("reset_timeout_max_s")
    @classmethod
    def _not_below_reset_timeout(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and value < info.data.get("reset_timeout_s", 0):
            raise ValueError("must be ≥ reset_timeout_s")
        return value

    @field_validator("slow_call_rate")
    @classmethod
    def _needs_slow_call_s(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and info.data.get("slow_call_s") is None:
            raise ValueError("needs slow_call_s")
        return value
