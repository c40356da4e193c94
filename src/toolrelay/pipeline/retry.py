"""Retry: bounded retries for idempotent tools, on tenacity, within the call's deadline.

The first attempt runs without any retry machinery; only a retryable failure of an
idempotent tool enters tenacity's loop (exponential backoff with jitter, honouring a
``retry_after_s`` hint). When to retry and when never: ``docs/breakers.md``, "Retries". With
a retry budget (:class:`~toolrelay.budget.BudgetOptions`) a retry is made only while the
key's retries and hedges are within it (``docs/retry-budgets.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import anyio
from pydantic.dataclasses import dataclass
from tenacity import AsyncRetrying, RetryCallState, retry_if_result, stop_after_attempt
from tenacity.stop import stop_base
from tenacity.wait import wait_base, wait_exponential, wait_random

from ..budget import KeyBudget, RetryBudgets
from ..contract import ErrorType
from ..events import AttemptEnded, RetryBudgetExhausted, RetryScheduled
from ..outcome import Outcome
from ..settings import DATACLASS, Count, Seconds, one_line_errors
from . import Invocation, Next

NOT_RETRIED = frozenset({ErrorType.CIRCUIT_OPEN, ErrorType.OVERLOADED})
FIRST_OK = AttemptEnded(1, "ok")  # events are immutable: the commonest one is built once


@one_line_errors("RetryOptions.{}")
@dataclass(frozen=True, slots=True, kw_only=True, config=DATACLASS)
class RetryOptions:
    """Retries of a key's idempotent tools: ``max_attempts`` counts all attempts (a tool's
    own ``max_attempts`` wins); waits between them start near ``backoff_initial_s`` and
    double up to ``backoff_max_s``, with jitter. Reloadable."""

    RELOADABLE: ClassVar[bool] = True
    """Whether a hot reload may change these settings of a key already in use."""

    max_attempts: Count = 3
    backoff_initial_s: Seconds = 0.05
    backoff_max_s: Seconds = 2.0


def _worth_retrying(out: Outcome) -> bool:
    return not out.ok and out.retryable and not out.final and out.error_type not in NOT_RETRIED


class _Backoff(wait_base):
    """Exponential backoff with jitter, but never shorter than the outcome's retry-after."""

    def __init__(self, options: RetryOptions) -> None:
        base = options.backoff_initial_s
        self.expo = wait_exponential(multiplier=base, max=options.backoff_max_s)
        self.jitter = wait_random(0, base / 2)

    def __call__(self, retry_state: RetryCallState) -> float:
        wait = self.expo(retry_state) + self.jitter(retry_state)
        outcome = retry_state.outcome
        hint = None if outcome is None or outcome.failed else outcome.result().retry_after_s
        return max(wait, hint or 0.0)


class _PastDeadline(stop_base):
    """Stop when the coming wait would end at or past the call's deadline."""

    def __call__(self, retry_state: RetryCallState) -> bool:
        inv: Invocation = retry_state.args[0]
        return anyio.current_time() + retry_state.upcoming_sleep >= inv.deadline


class _BudgetSpent(stop_base):
    """Stop when the key's retry budget cannot pay for the retry (consulted last: it spends)."""

    def __init__(self, budget: KeyBudget) -> None:
        self.budget = budget

    def __call__(self, retry_state: RetryCallState) -> bool:
        if self.budget.try_spend():
            return False
        inv: Invocation = retry_state.args[0]
        if inv.observers and inv.key is not None:
            inv.emit(RetryBudgetExhausted(inv.key, "retry"))
        return True


def _last_outcome(retry_state: RetryCallState) -> Any:
    assert retry_state.outcome is not None
    return retry_state.outcome.result()


def _made(out: Outcome, default: int) -> int:
    """How many attempts the call has made when ``out`` came (hedges included)."""
    request = out.request
    return default if request is None or not request.attempts else request.attempts


def _announce(retry_state: RetryCallState) -> None:
    inv: Invocation = retry_state.args[0]
    if inv.observers and retry_state.outcome is not None:
        out: Outcome = retry_state.outcome.result()
        number = _made(out, 1)
        inv.emit(RetryScheduled(number, retry_state.upcoming_sleep, str(out.error_type)))


class Retry:
    __slots__ = ("_budgets", "_options_for", "_retry_if", "_stop_deadline", "_waits")

    def __init__(self, options_for: Callable[[str], RetryOptions], budgets: RetryBudgets) -> None:
        """``options_for(key)``: the key's retry options; ``budgets``: the keys' retry budgets
        (a key without one: retries are limited by attempts only)."""
        self._options_for = options_for
        self._budgets = budgets
        self._waits: dict[RetryOptions, _Backoff] = {}
        self._retry_if = retry_if_result(_worth_retrying)
        self._stop_deadline = _PastDeadline()

    async def __call__(self, call_next: Next, inv: Invocation) -> Outcome:
        assert inv.key is not None
        budget = self._budgets.get(inv.key)
        if budget is not None:
            budget.deposit()
        out = await call_next(inv)  # attempt 1 (the deadline stage's number)
        if inv.observers:
            inv.emit(FIRST_OK if out.ok else AttemptEnded(1, str(out.error_type)))
        if out.ok or out.error_type is ErrorType.TIMEOUT or not _worth_retrying(out):
            return out  # a timeout means the call's one deadline has passed
        assert inv.tool is not None
        decl = inv.tool.decl
        options = self._options_for(inv.key)
        max_attempts = decl.max_attempts or options.max_attempts
        if max_attempts < 2 or not decl.is_idempotent:
            return out
        if anyio.current_time() + options.backoff_initial_s >= inv.deadline:
            return out  # not even the shortest wait fits before the deadline
        wait = self._waits.get(options)
        if wait is None:
            wait = self._waits[options] = _Backoff(options)
        first: list[Outcome] = [out]
        made = _made(out, 1)

        async def attempt(inv: Invocation) -> Outcome:
            nonlocal made
            if first:
                return first.pop()
            made += 1
            this = inv.attempt(made)
            result = await call_next(this)
            made = _made(result, made)
            if inv.observers:
                this.emit(AttemptEnded(made, "ok" if result.ok else str(result.error_type)))
            return result

        stop = stop_after_attempt(max_attempts) | self._stop_deadline
        if budget is not None:
            stop = stop | _BudgetSpent(budget)
        retrying = AsyncRetrying(
            sleep=anyio.sleep,
            stop=stop,
            wait=wait,
            retry=self._retry_if,
            before_sleep=_announce,
            retry_error_callback=_last_outcome,
        )
        result: Outcome = await retrying(attempt, inv)
        return result
