"""Circuit breakers per breaker key, on pybreaker's state and storage.

pybreaker keeps the state (``closed``/``open``/``half-open``), the consecutive-failure and
half-open success counters, and tells listeners about transitions. Its ``call()`` and
``calling()`` are not used: ``call()`` records a coroutine as a success before it runs and
holds a lock for the whole call, ``calling()`` counts a cancellation as a failure, its
half-open state admits every caller, and ``exclude`` resets the failure count. Admission
and counting are therefore done here, in :meth:`KeyBreaker.admit` and
:meth:`KeyBreaker.record`, which never hold a lock across the call and never wait on I/O.

Every state change starts a new *period* (a generation number). ``admit`` hands out a
token naming the period; a call's verdict counts only in the period that admitted it, so a
trial that outlives its half-open period neither frees a place in a later one nor helps
close it, and a failure admitted before a recovery does not count after it.

Failures are counted in one of three windows: ``consecutive`` (pybreaker's counter; the
default), ``count`` (the last N recorded calls) or ``time`` (the last N seconds, in
one-second buckets), the last two with a minimum number of calls and failure-rate and
slow-call-rate thresholds, as in resilience4j and Polly v8.

With shared storage (:mod:`toolrelay.storage`) the breaker stays local-first: decisions are
made from local state at once, and the storage replicates them on a thread of its own;
what other replicas decided arrives in :attr:`KeyBreaker.inbox` and is adopted on the next
call. While one of this replica's own decisions is on its way to Redis, what arrives from
Redis may predate it: it waits for the decision's reply (see :meth:`KeyBreaker.adopt`).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import pybreaker
from pydantic import ValidationInfo, field_validator
from pydantic.dataclasses import dataclass

from .outcome import Verdict
from .settings import DATACLASS, Count, Positive, Rate, Seconds, Share, one_line_errors

if TYPE_CHECKING:
    from .storage import SharedStorage

__all__ = ["BreakerConfig", "Breakers", "KeyBreaker", "Remote", "State"]

log = logging.getLogger("toolrelay")

State = Literal["closed", "open", "half_open"]
Window = Literal["consecutive", "count", "time"]
_STATE: dict[str, State] = {
    pybreaker.STATE_CLOSED: "closed",
    pybreaker.STATE_OPEN: "open",
    pybreaker.STATE_HALF_OPEN: "half_open",
}
_PYBREAKER: dict[State, str] = {v: k for k, v in _STATE.items()}

REPLY_WAIT_S = 5.0
"""How long a replica waits for Redis's reply to one of its decisions before it takes the
reply as lost (a failed batch; Redis being down is handled by the resync)."""

REJECT = -1
"""What :meth:`KeyBreaker.admit` returns for a call that may not run. Any other value is a
token: ``period << 1`` for a call admitted while closed, ``period << 1 | 1`` for a trial."""

TransitionListener = Callable[[str, str, str], None]
Clock = Callable[[], float]


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


# -- failure windows ----------------------------------------------------------------------
_FAILED, _SLOW, _SEEN = 1, 2, 4


class _CountWindow:
    """The last ``size`` recorded calls: a ring of outcome codes and running totals."""

    __slots__ = ("calls", "failures", "pos", "ring", "slow")

    def __init__(self, size: int) -> None:
        self.ring = bytearray(size)
        self.pos = 0
        self.calls = self.failures = self.slow = 0

    def add(self, failed: bool, slow: bool, now: float) -> None:
        ring, pos = self.ring, self.pos
        old = ring[pos]
        if old:
            self.calls -= 1
            self.failures -= old & _FAILED
            self.slow -= (old & _SLOW) >> 1
        ring[pos] = _SEEN | failed | (slow << 1)
        self.calls += 1
        self.failures += failed
        self.slow += slow
        self.pos = pos + 1 if pos + 1 < len(ring) else 0

    def totals(self, now: float) -> tuple[int, int, int]:
        return self.calls, self.failures, self.slow

    peek = totals  # reading a count window changes nothing


class _TimeWindow:
    """The calls of the last ``size`` seconds, in one-second buckets (as resilience4j)."""

    __slots__ = ("buckets", "calls", "failures", "head", "size", "slow")

    def __init__(self, size: int) -> None:
        self.size = size
        self.buckets = [[-1, 0, 0, 0] for _ in range(size)]  # second, calls, failures, slow
        self.head = -1
        self.calls = self.failures = self.slow = 0

    def _advance(self, second: int) -> None:
        """Move the window's end to ``second``, emptying the buckets that fall out."""
        size = self.size
        first = max(self.head + 1, second - size + 1)
        for s in range(first, second + 1):
            bucket = self.buckets[s % size]
            self.calls -= bucket[1]
            self.failures -= bucket[2]
            self.slow -= bucket[3]
            bucket[0], bucket[1], bucket[2], bucket[3] = s, 0, 0, 0
        self.head = second

    def add(self, failed: bool, slow: bool, now: float) -> None:
        second = int(now)
        if second > self.head:
            self._advance(second)
        elif second <= self.head - self.size:
            return  # older than the window (a clock that went back): dropped
        bucket = self.buckets[second % self.size]
        bucket[1] += 1
        bucket[2] += failed
        bucket[3] += slow
        self.calls += 1
        self.failures += failed
        self.slow += slow

    def totals(self, now: float) -> tuple[int, int, int]:
        second = int(now)
        if second > self.head:
            self._advance(second)
        return self.calls, self.failures, self.slow

    def peek(self, now: float) -> tuple[int, int, int]:
        """The totals at ``now`` without changing anything (for another thread)."""
        oldest = int(now) - self.size
        calls = failures = slow = 0
        for second, c, f, s in list(self.buckets):
            if second > oldest:
                calls += c
                failures += f
                slow += s
        return calls, failures, slow


_Window = _CountWindow | _TimeWindow


def _new_window(config: BreakerConfig) -> _Window | None:
    if config.window == "count":
        return _CountWindow(config.window_size)
    if config.window == "time":
        return _TimeWindow(config.window_size)
    return None


class Remote(NamedTuple):
    """A breaker's state as the shared storage has it (see :mod:`toolrelay.storage`)."""

    period: int
    state: State
    opened_ago_s: float
    break_s: float
    pinned: bool
    permit: str | None = None
    """A half-open trial place granted to this process, if any."""
    authoritative: bool = False
    """Adopt even if this process's period is ahead (a refused update, a resync)."""
    decision: int = 0
    """The serial of this replica's own decision this is Redis's reply to (0: not a reply
    to one: an announcement, a periodic read, a trial place, a resync)."""


class Others(NamedTuple):
    """What the other replicas counted in the current period (shared storage only)."""

    period: int = -1
    calls: int = 0
    failures: int = 0
    slow: int = 0
    consecutive: int = 0


NOBODY = Others()


class _Listener(pybreaker.CircuitBreakerListener):
    def __init__(self, owner: KeyBreaker) -> None:
        self.owner = owner

    def state_change(self, cb: Any, old_state: Any, new_state: Any) -> None:
        old: State = _STATE.get(old_state.name, "closed") if old_state is not None else "closed"
        new = _STATE[new_state.name]
        if old != new:
            self.owner._transitioned(old, new)


class KeyBreaker:
    """The breaker of one key. Not thread-safe: used from the event loop only (the shared
    storage's thread talks to it only through :attr:`inbox` and :attr:`others`)."""

    def __init__(
        self,
        key: str,
        config: BreakerConfig,
        storage: pybreaker.CircuitBreakerStorage | None,
        on_transition: TransitionListener,
        clock: Clock = time.monotonic,
    ) -> None:
        self.key = key
        self.config = config
        self.storage = storage or pybreaker.CircuitMemoryStorage(pybreaker.STATE_CLOSED)
        shared = getattr(storage, "replicated", False)
        self.shared: SharedStorage | None = storage if shared else None  # type: ignore[assignment]
        self.clock = clock
        self._on_transition = on_transition
        self.period = 0
        """Bumped by every state change; a call's verdict counts only in its own period."""
        self.trials = 0
        """Half-open trials of the current period in flight."""
        self.permits: list[str] = []
        """Shared storage: trial places granted to this process and not yet used."""
        self.held: list[str] = []
        """Shared storage: trial places in use by calls in flight."""
        self._claimed_at = -math.inf
        self.break_s = config.reset_timeout_s
        """The current break: ``reset_timeout_s``, grown by failed trials if configured."""
        self.opened = -math.inf
        """When the breaker last opened, on :attr:`clock`."""
        self.window = _new_window(config)
        self.minimum_calls = (
            min(config.minimum_calls, config.window_size)
            if config.window == "count"
            else config.minimum_calls
        )
        """A count window can never hold more than ``window_size`` calls (as resilience4j)."""
        self.inbox: deque[Remote] = deque()
        self.decided = 0
        """Serial of this replica's latest decision sent to the shared storage."""
        self.answered = 0
        """Serial of the latest decision whose reply has come back from the shared storage."""
        self._decided_at = -math.inf
        self.deferred: deque[Remote] = deque(maxlen=64)
        """What arrived while a decision of ours was on its way (judged after its reply)."""
        self.others = NOBODY
        self.records = 0
        """Verdicts recorded (cumulative; the shared storage watches it for activity)."""
        self.admitted = 0
        """Calls admitted in the closed state (cumulative)."""
        self.trials_admitted = 0
        """Half-open trial calls admitted (cumulative)."""
        self.failures_recorded = 0
        """Failures counted against the service, slow calls included (cumulative)."""
        self.pinned_open = False
        self.transitions = 0
        self.known: State = "closed"
        """The state as this process knows it."""
        self.last_transition: tuple[str, str] = ("closed", "closed")
        self._adopting = False
        self.cb = pybreaker.CircuitBreaker(
            fail_max=config.fail_max,
            reset_timeout=config.reset_timeout_s,
            success_threshold=config.success_threshold,
            state_storage=self.storage,
            listeners=[_Listener(self)],
            name=key,
        )
        self.known = _STATE[self.cb.state.name]
        if self.shared is not None:
            self.shared.attach(self)

    # -- periods and transitions ------------------------------------------------------------
    def _new_period(self) -> None:
        self.period += 1
        self.trials = 0
        self.permits.clear()
        self.held.clear()
        self._claimed_at = -math.inf
        if self.window is not None:
            self.window = _new_window(self.config)
        self.others = NOBODY

    def _transitioned(self, old: State, new: State) -> None:
        self._new_period()
        self.transitions += 1
        self.last_transition = (old, new)
        self.known = new
        self._on_transition(self.key, old, new)

    def _move(self, new: State) -> None:
        """Change state here (a local decision) and tell the shared storage."""
        expected = self.period
        if new == "open":
            self.opened = self.clock()
            self.cb.open()
        elif new == "half_open":
            self.cb.half_open()
        else:
            self.break_s = self.config.reset_timeout_s
            self.cb.close()
        if self.shared is not None:
            self._sent(self.shared.transition(self, expected, new, self.decided + 1))

    def _open(self, *, after_trial: bool) -> None:
        top = self.config.reset_timeout_max_s
        if not after_trial:
            self.break_s = self.config.reset_timeout_s
        elif top is not None:
            self.break_s = min(top, max(self.break_s * 2, self.config.reset_timeout_s))
        self._move("open")

    def _sent(self, queued: bool) -> None:
        """A decision of ours went to the shared storage (unless it was dropped: Redis down)."""
        if queued:
            self.decided += 1
            self._decided_at = self.clock()

    def adopt(self, remote: Remote) -> None:
        """Take on what the shared storage says (another replica's decision, or Redis's
        answer to one of ours).

        The reply to a decision of ours that a later one of ours has superseded is dropped:
        the later one's reply tells Redis's state after both (without this, forcing open and
        at once closed briefly rolled the replica back to open). Anything else that arrives
        while a decision of ours is on its way (an announcement, a periodic read, a trial
        place) may have been read before the decision reached Redis, and Redis's period
        cannot tell: it is judged once the reply is in, against the period the reply sets.
        A resync ends the wait, and so does a reply that has not come in
        :data:`REPLY_WAIT_S` (its batch was lost)."""
        if remote.decision:
            self.answered = max(self.answered, remote.decision)
            if remote.decision < self.decided:
                return  # superseded: the reply to our later decision is on its way
            self._adopt(remote)
            self._replay()
            return
        if self.answered < self.decided:
            if not remote.authoritative and self.clock() - self._decided_at < REPLY_WAIT_S:
                self.deferred.append(remote)
                return
            self.answered = self.decided  # a resync, or a reply that is not coming
            self._replay()
        self._adopt(remote)

    def _replay(self) -> None:
        deferred = self.deferred
        while deferred:
            self._adopt(deferred.popleft())

    def _adopt(self, remote: Remote) -> None:
        if not remote.authoritative and remote.period < self.period:
            return  # our own newer decision is on its way to the storage
        same = (
            remote.period == self.period
            and remote.state == self.known
            and remote.pinned == self.pinned_open
        )
        if not same:
            self.pinned_open = remote.pinned
            self.break_s = remote.break_s
            if remote.state == "open":
                self.opened = self.clock() - remote.opened_ago_s
            if remote.state != self.known:
                name = _PYBREAKER[remote.state]
                self.storage.state = name
                self.cb.state = name  # notifies: a new period
            else:
                self._new_period()
            self.period = remote.period
        if remote.permit is not None and remote.state == "half_open":
            self.permits.append(remote.permit)
            self._claimed_at = -math.inf

    def _drain(self) -> None:
        inbox = self.inbox
        while inbox:
            self.adopt(inbox.popleft())

    @property
    def state(self) -> State:
        """The state now (what other replicas decided included)."""
        if self.inbox:
            self._drain()
        return "open" if self.pinned_open else self.known

    def retry_after(self) -> float:
        """Seconds until a trial call will be admitted (0 when it would be now)."""
        if self.pinned_open:
            return self.break_s
        if self.known != "open":
            return 0.0
        return max(0.0, self.opened + self.break_s - self.clock())

    # -- admission and counting --------------------------------------------------------------
    def _sharing(self) -> bool:
        shared = self.shared
        return shared is not None and shared.link.up

    def _claim(self) -> None:
        """Ask the shared storage for a trial place (answered through the inbox)."""
        now = self.clock()
        if now - self._claimed_at > 1.0:
            self._claimed_at = now
            assert self.shared is not None
            self.shared.claim(self, self.period)

    def admit(self) -> int:
        """A token for the call (see :data:`REJECT`)."""
        if self.inbox:
            self._drain()
        state = self.known
        if state == "closed":
            self.admitted += 1
            return self.period << 1
        if state == "open":
            if self.pinned_open or self.retry_after() > 0:
                return REJECT
            if self._sharing():
                self._claim()  # the shared storage moves every replica to half-open
                return REJECT
            self._move("half_open")
        if self.trials >= self.config.half_open_max_calls:
            return REJECT
        if self._sharing():
            if not self.permits:
                self._claim()
                return REJECT
            self.held.append(self.permits.pop())
        self.trials += 1
        self.trials_admitted += 1
        return self.period << 1 | 1

    def release(self, token: int) -> None:
        """The admitted call ended without a verdict (cancelled)."""
        if token >> 1 == self.period and token & 1:
            self.trials -= 1
            if self.held:
                self._trial_done(None)

    def _trial_done(self, success: bool | None) -> None:
        permit = self.held.pop()
        self._claimed_at = -math.inf  # our place is free again: the next call may ask
        assert self.shared is not None
        self.shared.trial_done(self, self.period, permit, success)

    def record(self, verdict: Verdict, token: int, duration_s: float) -> bool:
        """Count one finished call; True when this failure opened the breaker."""
        if self.inbox:
            self._drain()
        if token >> 1 != self.period:
            return False  # admitted in an earlier period: says nothing about this one
        trial = token & 1
        if trial:
            self.trials -= 1
        if verdict is Verdict.IGNORE:
            if trial and self.held:
                self._trial_done(None)
            return False
        self.records += 1
        limit = self.config.slow_call_s
        slow = limit is not None and duration_s > limit
        failed = verdict is Verdict.FAILURE
        if failed or slow:
            self.failures_recorded += 1
        storage = self.storage
        if trial:
            if failed or slow:
                self._open(after_trial=True)
                return True
            storage.increment_success_counter()
            if self.held:
                self._trial_done(True)
            if storage.success_counter >= self.config.success_threshold:
                self._move("closed")
            return False
        window = self.window
        others = self.others
        if others.period != self.period:
            others = NOBODY
        if window is None:
            if failed or slow:
                storage.increment_counter()
                if storage.counter + others.consecutive >= self.config.fail_max:
                    self._open(after_trial=False)
                    return True
            elif storage.counter:
                storage.reset_counter()
            return False
        now = self.clock()
        window.add(failed, slow, now)
        calls, failures, slow_calls = window.totals(now)
        failures += others.failures
        slow_calls += others.slow
        if not (failures or slow_calls):
            return False  # the common case: nothing in the window could open it
        calls += others.calls
        if calls < self.minimum_calls:
            return False
        rate = self.config.slow_call_rate
        if failures / calls >= self.config.failure_rate or (
            rate is not None and slow_calls / calls >= rate
        ):
            self._open(after_trial=False)
            return True
        return False

    def window_counts(self, *, others: bool = True) -> tuple[int, int, int]:
        """Calls, failures and slow calls in the window (zeros for the consecutive window),
        with the other replicas' counts of this period unless ``others=False``. Only reads:
        safe from another thread (a scrape, the storage's replication)."""
        window = self.window
        if window is None:
            return 0, 0, 0
        calls, failures, slow = window.peek(self.clock())
        theirs = self.others
        if others and theirs.period == self.period:
            return calls + theirs.calls, failures + theirs.failures, slow + theirs.slow
        return calls, failures, slow

    def rates(self) -> tuple[float, float]:
        """Failure rate and slow-call rate in the current window (0 when it is empty)."""
        calls, failures, slow = self.window_counts()
        if not calls:
            return 0.0, 0.0
        return min(1.0, failures / calls), min(1.0, slow / calls)

    # -- hot reload -----------------------------------------------------------------------
    def reconfigure(self, config: BreakerConfig) -> None:
        """Take on new settings, keeping the state (hot reload): an open breaker stays open
        (due a trial ``reset_timeout_s`` after it opened, under the new value; a grown
        break stays within ``reset_timeout_max_s``), a pinned one stays pinned, trials in
        flight finish, and the failure window keeps its counts unless its shape
        (``window``, ``window_size``) changed. The new thresholds decide from now on."""
        old, self.config = self.config, config
        self.cb.fail_max = config.fail_max
        self.cb.reset_timeout = config.reset_timeout_s
        self.cb.success_threshold = config.success_threshold
        if (old.window, old.window_size) != (config.window, config.window_size):
            self.window = _new_window(config)
        self.minimum_calls = (
            min(config.minimum_calls, config.window_size)
            if config.window == "count"
            else config.minimum_calls
        )
        grown = min(self.break_s, config.reset_timeout_max_s or config.reset_timeout_s)
        self.break_s = max(config.reset_timeout_s, grown)

    # -- operator controls --------------------------------------------------------------
    def force_open(self) -> None:
        """Open and stay open (no trials) until :meth:`force_close` or :meth:`reset`;
        with shared storage, on every replica."""
        if self.inbox:
            self._drain()
        self.pinned_open = True
        if self.known != "open":
            self.opened = self.clock()
            self.cb.open()
        if self.shared is not None:
            self._sent(self.shared.force(self, self.decided + 1))

    def force_close(self) -> None:
        """Close now, counters cleared; normal operation resumes (on every replica)."""
        if self.inbox:
            self._drain()
        self.pinned_open = False
        self.storage.reset_counter()
        self.break_s = self.config.reset_timeout_s
        if self.known != "closed":
            self.cb.close()
        else:
            self._new_period()
        if self.shared is not None:
            self._sent(self.shared.force(self, self.decided + 1))

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
        config_for: Callable[[str], BreakerConfig],
        storage_factory: StorageFactory | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self._config_for = config_for
        self._storage_factory = storage_factory
        self._clock = clock
        self._breakers: dict[str, KeyBreaker] = {}
        self.listeners: list[TransitionListener] = []
        self.on_create: list[Callable[[str, str], None]] = []

    def get(self, key: str) -> KeyBreaker:
        breaker = self._breakers.get(key)
        if breaker is None:
            storage = None if self._storage_factory is None else self._storage_factory(key)
            breaker = KeyBreaker(key, self._config_for(key), storage, self._notify, self._clock)
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

    def reconfigure(self) -> list[str]:
        """Re-read every existing breaker's settings from ``config_for`` (hot reload) and
        apply changed ones with :meth:`KeyBreaker.reconfigure`; returns those keys."""
        changed = []
        for key, breaker in self._breakers.items():
            config = self._config_for(key)
            if config != breaker.config:
                breaker.reconfigure(config)
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
