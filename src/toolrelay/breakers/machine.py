"""A breaker key's state machine: periods, transitions, admission and counting.

pybreaker keeps the state, the counters and the listeners, but its ``call()`` records a
coroutine as a success before it runs and holds a lock across the call, ``calling()``
counts a cancellation as a failure, and its half-open state admits every caller: so
:meth:`BreakerMachine.admit` and :meth:`BreakerMachine.record` do admission and counting,
never holding a lock across the call nor waiting on I/O. A call's verdict counts only in
the *period* (one per state change) that admitted it (``docs/breakers.md``); failures are
counted in one of the windows of :mod:`.window`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, cast

import pybreaker

from ..outcome import Verdict
from .options import BreakerOptions
from .replica import NOBODY, Clock, Remote, Replica, Replication, State
from .window import minimum_calls, new_window

_STATE: dict[str, State] = {
    pybreaker.STATE_CLOSED: "closed",
    pybreaker.STATE_OPEN: "open",
    pybreaker.STATE_HALF_OPEN: "half_open",
}
_PYBREAKER: dict[State, str] = {v: k for k, v in _STATE.items()}

REJECT = -1
"""What :meth:`BreakerMachine.admit` returns for a call that may not run. Any other value
is a token: ``period << 1`` for a call admitted while closed, ``period << 1 | 1`` for a
trial."""

TransitionListener = Callable[[str, str, str], None]


class _Listener(pybreaker.CircuitBreakerListener):
    def __init__(self, owner: BreakerMachine) -> None:
        self.owner = owner

    def state_change(self, cb: Any, old_state: Any, new_state: Any) -> None:
        old: State = _STATE.get(old_state.name, "closed") if old_state is not None else "closed"
        new = _STATE[new_state.name]
        if old != new:
            self.owner._transitioned(old, new)


class BreakerMachine(Replica):
    """The breaker of one key, without the operator's controls
    (:class:`~toolrelay.breakers.KeyBreaker` adds them). Not thread-safe: used from the
    event loop only (the shared storage's thread talks to it only through :attr:`inbox`
    and :attr:`others`)."""

    def __init__(
        self,
        key: str,
        options: BreakerOptions,
        storage: pybreaker.CircuitBreakerStorage | None,
        on_transition: TransitionListener,
        clock: Clock = time.monotonic,
    ) -> None:
        self.key = key
        self.options = options
        self.storage = storage or pybreaker.CircuitMemoryStorage(pybreaker.STATE_CLOSED)
        shared = getattr(storage, "replicated", False)
        self.shared = cast(Replication, storage) if shared else None
        self.clock = clock
        self._on_transition = on_transition
        super().__init__()
        self.period = 0
        self.trials = 0
        """Half-open trials of the current period in flight."""
        self.permits: list[str] = []
        """Shared storage: trial places granted to this process and not yet used."""
        self.held: list[str] = []
        """Shared storage: trial places in use by calls in flight."""
        self._claimed_at = -math.inf
        self.break_s = options.reset_timeout_s
        """The current break: ``reset_timeout_s``, grown by failed trials if configured."""
        self.opened = -math.inf
        """When the breaker last opened, on :attr:`clock`."""
        self.window = new_window(options)
        self.minimum_calls = minimum_calls(options)
        self.records = 0
        self.admitted = 0
        """Calls admitted in the closed state (cumulative)."""
        self.trials_admitted = 0
        """Half-open trial calls admitted (cumulative)."""
        self.failures_recorded = 0
        """Failures counted against the service, slow calls included (cumulative)."""
        self.pinned_open = False
        self.transitions = 0
        self.known = "closed"
        self.last_transition: tuple[str, str] = ("closed", "closed")
        self.cb = pybreaker.CircuitBreaker(
            fail_max=options.fail_max,
            reset_timeout=options.reset_timeout_s,
            success_threshold=options.success_threshold,
            state_storage=self.storage,
            listeners=[_Listener(self)],
            name=key,
        )
        self.known = _STATE[self.cb.state.name]
        self.joined = self.shared is None
        """Whether a call has decided on this key yet (with shared storage, the first ones
        wait for the fleet's state: :class:`~toolrelay.pipeline.join.Join`)."""
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
            self.window = new_window(self.options)
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
            self.break_s = self.options.reset_timeout_s
            self.cb.close()
        if self.shared is not None:
            self._sent(self.shared.transition(expected, new, self.decided + 1))

    def _open(self, *, after_trial: bool) -> None:
        top = self.options.reset_timeout_max_s
        if not after_trial:
            self.break_s = self.options.reset_timeout_s
        elif top is not None:
            self.break_s = min(top, max(self.break_s * 2, self.options.reset_timeout_s))
        self._move("open")

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
    def _claim(self) -> None:
        """Ask the shared storage for a trial place (answered through the inbox)."""
        now = self.clock()
        if now - self._claimed_at > 1.0:
            self._claimed_at = now
            assert self.shared is not None
            self.shared.claim(self.options.half_open_max_calls)

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
            if self.shared is not None and self.shared.up:
                self._claim()  # the shared storage moves every replica to half-open
                return REJECT
            self._move("half_open")
        if self.trials >= self.options.half_open_max_calls:
            return REJECT
        if self.shared is not None and self.shared.up:
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
        options = self.options
        self.shared.trial_done(
            self.period, permit, success, options.success_threshold, options.reset_timeout_s
        )

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
        limit = self.options.slow_call_s
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
            if storage.success_counter >= self.options.success_threshold:
                self._move("closed")
            return False
        window = self.window
        others = self.others
        if others.period != self.period:
            others = NOBODY
        if window is None:
            if failed or slow:
                storage.increment_counter()
                if storage.counter + others.consecutive >= self.options.fail_max:
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
        rate = self.options.slow_call_rate
        if failures / calls >= self.options.failure_rate or (
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
