"""What a dispatcher is told: one frozen model of data (what a TOML file can say).

Live objects (an approver, an audit sink, observers, providers) are the dispatcher's
keyword arguments instead, as httpx's ``Client(transport=…, timeout=Timeout(…))``. A
breaker key's resilience is a :class:`KeyPolicy` of each strategy's own options class
(``docs/architecture.md``, "Options: one class per strategy").
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, Strict
from pydantic.dataclasses import dataclass

from .breakers import BreakerOptions
from .budget import BudgetOptions
from .faults import Fault
from .jsonlimits import DEFAULT_MAX_BYTES, DEFAULT_MAX_DEPTH, DEFAULT_MAX_OUTPUT_BYTES
from .pipeline.bulkhead import BulkheadOptions
from .pipeline.hedge import HedgeOptions
from .pipeline.retry import RetryOptions
from .policy import Profile
from .settings import DATACLASS, MODEL, Count, Flag, Positive, one_line_errors

__all__ = [
    "BreakerOptions",
    "BudgetOptions",
    "BulkheadOptions",
    "DispatcherOptions",
    "HedgeOptions",
    "KeyPolicy",
    "Limits",
    "RetryOptions",
    "StorageOptions",
]


@one_line_errors("KeyPolicy.{}")
@dataclass(frozen=True, slots=True, kw_only=True, config=DATACLASS)
class KeyPolicy:
    """The resilience of every tool naming one ``breaker_key``: one options class per
    strategy (TOML: ``[keys.NAME.breaker]``, ``[keys.NAME.retry]``, …)."""

    breaker: BreakerOptions = BreakerOptions()
    retry: RetryOptions = RetryOptions()
    hedge: HedgeOptions = HedgeOptions()
    bulkhead: BulkheadOptions = BulkheadOptions()
    budget: BudgetOptions = BudgetOptions()

    def fixed_changes(self, new: KeyPolicy) -> list[str]:
        """The ``part.field`` settings that differ in ``new`` but cannot change on reload
        for a key in use (its options class is not ``RELOADABLE``)."""
        changes = []
        for part in ("breaker", "retry", "hedge", "bulkhead", "budget"):
            old_part, new_part = getattr(self, part), getattr(new, part)
            if old_part == new_part or type(old_part).RELOADABLE:
                continue
            changes += [
                f"{part}.{name}"
                for name in old_part.__dataclass_fields__
                if getattr(old_part, name) != getattr(new_part, name)
            ]
        return changes


@one_line_errors("Limits.{}")
@dataclass(frozen=True, slots=True, kw_only=True, config=DATACLASS)
class Limits:
    """What a call may carry: its arguments (bytes, nesting depth) and its answer (bytes;
    ``truncate_output`` cuts a longer one instead of refusing it)."""

    max_argument_bytes: Count = DEFAULT_MAX_BYTES
    max_argument_depth: Count = DEFAULT_MAX_DEPTH
    max_output_bytes: Count = DEFAULT_MAX_OUTPUT_BYTES
    truncate_output: Flag = False


@one_line_errors("StorageOptions.{}")
@dataclass(frozen=True, slots=True, kw_only=True, config=DATACLASS)
class StorageOptions:
    """Breaker state shared by the replicas through Redis (:mod:`toolrelay.storage`):
    ``url``, each command's ``timeout_s``, how often an unreachable Redis is probed
    (``probe_interval_s``), how often counts are shared (``sync_interval_s``) and how long
    a key's first calls wait for the fleet's state of it (``join_timeout_s``)."""

    url: Annotated[str, Strict(), Field(pattern=r"^(redis|rediss|unix)://")]
    timeout_s: Positive = 0.05
    probe_interval_s: Positive = 5.0
    sync_interval_s: Positive = 0.2
    join_timeout_s: Positive = 0.05


@one_line_errors("DispatcherOptions.{}")
class DispatcherOptions(BaseModel):
    """Everything a :class:`~toolrelay.Dispatcher` is told that is data: caller
    ``profiles``; each breaker key's :class:`KeyPolicy` (``keys``, else ``default_key``);
    Redis ``storage`` shared by the replicas' breakers; argument and output ``limits``;
    injected ``faults`` (and their dice's ``fault_seed``); more ``secret_patterns`` to
    redact; the environment variables an ``isolation="process"`` worker gets besides the
    minimal ones (``isolation_env``, docs/isolation.md); the ``audit`` line (with the
    redacted arguments: ``audit_arguments``);
    ``telemetry`` (with arguments and results on spans: ``capture_content``).
    :meth:`~toolrelay.Dispatcher.reconfigure` may change ``profiles``, ``keys``,
    ``default_key`` (their reloadable options) and ``faults``.
    """

    model_config = MODEL

    profiles: dict[str, Profile] = {}
    keys: dict[str, KeyPolicy] = {}
    default_key: KeyPolicy = KeyPolicy()
    storage: StorageOptions | None = None
    limits: Limits = Limits()
    faults: tuple[Fault, ...] = ()
    fault_seed: Annotated[int, Strict()] | None = None
    secret_patterns: frozenset[str] = frozenset()
    isolation_env: frozenset[str] = frozenset()
    audit: Flag = True
    audit_arguments: Flag = False
    telemetry: Flag = True
    capture_content: Flag = False

    def policy(self, key: str) -> KeyPolicy:
        """The policy of breaker key ``key`` (``default_key`` unless ``keys`` names it)."""
        return self.keys.get(key, self.default_key)

    def replace(self, **changes: Any) -> DispatcherOptions:
        """A copy with ``changes`` (checked like the constructor's arguments)."""
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        return DispatcherOptions(**{**fields, **changes})
