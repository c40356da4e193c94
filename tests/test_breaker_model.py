"""Stateful property test of :class:`toolrelay.breakers.KeyBreaker` against a reference model.

Hypothesis drives one breaker (on a fake clock) through admissions, completions in any order
with any verdict and duration, cancellations, clock steps and jumps, and the operator's
``force_open``/``force_close``, for each of the three failure windows (``consecutive``,
``count``, ``time``). After every step the breaker must agree with :class:`Model`, a small
reference written from the breaker's documented semantics (not from its code):

- every state change starts a new period; a verdict counts only in the period that admitted
  the call (a stale one changes nothing, not even a trial place);
- closed: the consecutive counter or the count/time window decides when to open; a window
  checks its rates after every counted call (a fast success can complete ``minimum_calls``),
  and a count window needs at most ``window_size`` calls (``minimum_calls`` is capped there,
  as in resilience4j);
- open: reject until the break (``reset_timeout_s``, doubled per failed trial up to
  ``reset_timeout_max_s``) has elapsed, then the next admission is a half-open trial;
- half-open: at most ``half_open_max_calls`` trials in flight, ``success_threshold``
  fast successes close, one failed or slow trial re-opens;
- ``force_open`` pins the breaker open until ``force_close``, which closes with counters
  cleared (and, like every close, starts a new period).

Clock steps, timeouts and rates are dyadic fractions, so the breaker's float arithmetic is
exact and agrees with the model's (which takes rates as fractions) at every boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import NamedTuple

from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from toolrelay.breakers import REJECT, BreakerOptions, Breakers, KeyBreaker
from toolrelay.outcome import Verdict

KEY = "svc"
SLOW_CALL_S = 0.5
DURATIONS = st.sampled_from([0.0, 0.125, 0.5, 0.5000001, 0.75, 3.0])
SMALL_STEPS = st.sampled_from([0.0, 0.125, 0.25, 0.5, 0.75, 1.0])
JUMPS = st.sampled_from([1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 11.0, 16.0, 33.0, 64.0, 200.0])


@st.composite
def configs(draw: st.DrawFn, window: str) -> BreakerOptions:
    reset = draw(st.integers(1, 5))
    top = draw(st.one_of(st.none(), st.sampled_from([0, 1, 3, 11, 60]).map(lambda d: reset + d)))
    slow_call_s = draw(st.sampled_from([None, SLOW_CALL_S]))
    slow_call_rate = None if slow_call_s is None else draw(st.sampled_from([None, 0.5]))
    return BreakerOptions(
        fail_max=draw(st.integers(1, 4)),
        reset_timeout_s=float(reset),
        reset_timeout_max_s=None if top is None else float(top),
        success_threshold=draw(st.integers(1, 3)),
        half_open_max_calls=draw(st.integers(1, 3)),
        slow_call_s=slow_call_s,
        window=window,
        window_size=draw(st.integers(1, 10)),
        minimum_calls=draw(st.integers(1, 6)),
        failure_rate=draw(st.sampled_from([0.25, 0.5, 1.0])),
        slow_call_rate=slow_call_rate,
    )


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- the reference model --------------------------------------------------------------------
CLOSED_ADMIT, TRIAL = "closed-admit", "trial"


@dataclass
class Model:
    """What the breaker should do, from its specification."""

    cfg: BreakerOptions
    now: float
    state: str = "closed"
    pinned: bool = False
    period: int = 0
    trials: int = 0
    successes: int = 0
    consecutive: int = 0
    records: list[tuple[float, bool, bool]] = field(default_factory=list)
    """(clock time, failed, slow) of the verdicts counted in this closed period."""
    break_s: float = 0.0
    opened_at: float = -math.inf
    transitions: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.break_s = self.cfg.reset_timeout_s

    @property
    def visible_state(self) -> str:
        return "open" if self.pinned else self.state

    def enter(self, new: str) -> None:
        """A state change (or a forced close): a new period, counters cleared."""
        if new != self.state:
            self.transitions.append((self.state, new))
        self.state = new
        self.period += 1
        self.trials = self.successes = self.consecutive = 0
        self.records = []
        if new == "open":
            self.opened_at = self.now
        elif new == "closed":
            self.break_s = self.cfg.reset_timeout_s

    def open_from_closed(self) -> None:
        self.break_s = self.cfg.reset_timeout_s
        self.enter("open")

    def open_after_trial(self) -> None:
        top = self.cfg.reset_timeout_max_s
        if top is not None:
            self.break_s = min(top, self.break_s * 2)
        self.enter("open")

    def admit(self) -> tuple[str, int] | None:
        """(kind, period) of an admitted call, None for a rejection."""
        if self.state == "closed":
            return CLOSED_ADMIT, self.period
        if self.state == "open":
            if self.pinned or self.now < self.opened_at + self.break_s:
                return None
            self.enter("half_open")
        if self.trials >= self.cfg.half_open_max_calls:
            return None
        self.trials += 1
        return TRIAL, self.period

    def release(self, kind: str, period: int) -> None:
        if period == self.period and kind == TRIAL:
            self.trials -= 1

    def window_totals(self) -> tuple[int, int, int]:
        cfg = self.cfg
        if cfg.window == "count":
            kept = self.records[-cfg.window_size :]
        else:
            kept = [r for r in self.records if int(r[0]) > int(self.now) - cfg.window_size]
        return len(kept), sum(r[1] for r in kept), sum(r[2] for r in kept)

    def record(self, kind: str, period: int, verdict: Verdict, duration: float) -> bool:
        """Whether this verdict opened the breaker."""
        if period != self.period:
            return False
        cfg = self.cfg
        failed = verdict is Verdict.FAILURE
        slow = cfg.slow_call_s is not None and duration > cfg.slow_call_s
        if kind == TRIAL:
            assert self.state == "half_open", "model: a current-period trial outside half-open"
            self.trials -= 1
            if verdict is Verdict.IGNORE:
                return False
            if failed or slow:
                self.open_after_trial()
                return True
            self.successes += 1
            if self.successes >= cfg.success_threshold:
                self.enter("closed")
            return False
        assert self.state == "closed", "model: a current-period closed call outside closed"
        if verdict is Verdict.IGNORE:
            return False
        if cfg.window == "consecutive":
            if failed or slow:
                self.consecutive += 1
                if self.consecutive >= cfg.fail_max:
                    self.open_from_closed()
                    return True
            else:
                self.consecutive = 0
            return False
        # The rates are checked after every counted call, a fast success included: it can
        # bring the window up to minimum_calls, or (time window) outlive older successes.
        self.records.append((self.now, failed, slow))
        calls, failures, slow_calls = self.window_totals()
        minimum = cfg.minimum_calls
        if cfg.window == "count":
            minimum = min(minimum, cfg.window_size)  # what the window can hold at most
        if calls < minimum:
            return False
        if Fraction(failures, calls) >= Fraction(cfg.failure_rate) or (
            cfg.slow_call_rate is not None
            and Fraction(slow_calls, calls) >= Fraction(cfg.slow_call_rate)
        ):
            self.open_from_closed()
            return True
        return False

    def force_open(self) -> None:
        self.pinned = True
        if self.state != "open":
            self.enter("open")

    def force_close(self) -> None:
        self.pinned = False
        self.enter("closed")

    def retry_after(self) -> float:
        return max(0.0, self.opened_at + self.break_s - self.now)


@dataclass(frozen=True)
class Call:
    """One admitted call: the breaker's token and the model's view of it."""

    token: int
    kind: str
    period: int


# -- the state machine ----------------------------------------------------------------------
RELEASE = "release"
"""A cancelled call: ``release(token)`` instead of a verdict."""
BREAK_END = "break-end"
"""A clock step exactly to the end of the current break (the boundary)."""


class Admit(NamedTuple):
    n: int


class Finish(NamedTuple):
    pick: int
    """0 ends the newest call in flight, 1 the one before, … (modulo their number)."""
    outcome: Verdict | str
    duration: float


class Burst(NamedTuple):
    """``n`` calls one after another, each admitted and at once ended with ``outcome``."""

    n: int
    outcome: Verdict | str
    duration: float


class Advance(NamedTuple):
    step: float | str


class Force(NamedTuple):
    action: str


Action = Admit | Finish | Burst | Advance | Force

OUTCOMES = st.sampled_from(
    [Verdict.FAILURE, Verdict.FAILURE, Verdict.SUCCESS, Verdict.SUCCESS, Verdict.IGNORE, RELEASE]
)
ADMITS = st.builds(Admit, st.integers(1, 4))
FINISHES = st.builds(Finish, st.integers(0, 7), OUTCOMES, DURATIONS)
BURSTS = st.builds(Burst, st.integers(1, 6), OUTCOMES, DURATIONS)
ADVANCES = st.builds(Advance, st.one_of(SMALL_STEPS, JUMPS, st.just(BREAK_END)))
FORCES = st.builds(Force, st.sampled_from(["open", "close"]))
ACTIONS: st.SearchStrategy[Action] = st.one_of(
    ADMITS, ADMITS, FINISHES, FINISHES, FINISHES, BURSTS, BURSTS, ADVANCES, ADVANCES, FORCES
)
"""One step. A single weighted rule rather than one rule per action: hypothesis switches
rules off at random per run (swarm testing), and a run needs admissions, completions and
clock steps together to get through open and half-open."""


class BreakerMachine(RuleBasedStateMachine):
    """One breaker and the model, driven in lockstep."""

    WINDOW = "consecutive"

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(0.0)
        self.model: Model
        self.breaker: KeyBreaker
        self.seen: list[tuple[str, str]] = []
        self.inflight: list[Call] = []
        self.forcing = False
        self.ready = False

    @initialize(
        config=st.data(),
        start=st.sampled_from([0.0, 0.75, 1000.25]),
        forcing=st.booleans(),
    )
    def setup(self, config: st.DataObject, start: float, forcing: bool) -> None:
        """A breaker with a drawn config; ``forcing`` lets the run use the operator's
        force_open/force_close (a run without them gets further through the states)."""
        cfg = config.draw(configs(self.WINDOW), label="config")
        self.clock.now = start
        self.forcing = forcing
        breakers = Breakers(lambda key: cfg, clock=self.clock)
        breakers.add_listener(lambda key, old, new: self.seen.append((old, new)))
        self.breaker = breakers.get(KEY)
        self.model = Model(cfg, now=start)
        self.ready = True

    @rule(action=ACTIONS)
    def act(self, action: Action) -> None:
        if isinstance(action, Admit):
            self.admit(action.n)
        elif isinstance(action, Finish):
            self.finish(action.pick, action.outcome, action.duration)
        elif isinstance(action, Burst):
            for _ in range(action.n):
                if self.admit(1):
                    self.finish(0, action.outcome, action.duration)
        elif isinstance(action, Advance):
            self.advance(action.step)
        elif self.forcing:
            self.force(action.action)

    # -- actions ------------------------------------------------------------------------
    def admit(self, n: int) -> int:
        """Admit ``n`` calls (or try to); how many got in."""
        admitted = 0
        for _ in range(n):
            token = self.breaker.admit()
            expected = self.model.admit()
            got = None if token == REJECT else (CLOSED_ADMIT if token & 1 == 0 else TRIAL)
            want = None if expected is None else expected[0]
            assert got == want, f"admit: breaker says {got}, model says {want}"
            if expected is not None:
                self.inflight.append(Call(token, *expected))
                admitted += 1
        return admitted

    def finish(self, pick: int, outcome: Verdict | str, duration: float) -> None:
        """End an in-flight call with a verdict or a release."""
        if not self.inflight:
            return
        call = self.inflight.pop(-1 - pick % len(self.inflight))
        if outcome == RELEASE:
            self.breaker.release(call.token)
            self.model.release(call.kind, call.period)
            return
        assert isinstance(outcome, Verdict)
        opened = self.breaker.record(outcome, call.token, duration)
        expected = self.model.record(call.kind, call.period, outcome, duration)
        assert opened == expected, (
            f"record({outcome}, {duration}) of a {call.kind} call: breaker says "
            f"opened={opened}, model says {expected}"
        )

    def advance(self, step: float | str) -> None:
        if step == BREAK_END:
            model = self.model
            if model.state != "open" or model.pinned:
                return
            self.clock.now = max(self.clock.now, model.opened_at + model.break_s)
        else:
            assert isinstance(step, float)
            self.clock.now += step
        self.model.now = self.clock.now

    def force(self, action: str) -> None:
        if action == "open":
            self.breaker.force_open()
            self.model.force_open()
        else:
            self.breaker.force_close()
            self.model.force_close()

    # -- invariants -----------------------------------------------------------------------
    @invariant()
    def agrees_with_model(self) -> None:
        if not self.ready:
            return
        model, breaker = self.model, self.breaker
        note(
            f"t={model.now} model: state={model.visible_state} trials={model.trials} "
            f"consecutive={model.consecutive} successes={model.successes} "
            f"window={model.window_totals() if model.cfg.window != 'consecutive' else '-'} "
            f"break={model.break_s}"
        )
        assert breaker.state == model.visible_state
        assert breaker.trials == model.trials
        assert 0 <= breaker.trials <= model.cfg.half_open_max_calls
        assert self.seen == model.transitions
        if model.visible_state == "open":
            if model.pinned:
                assert breaker.retry_after() > 0
            else:
                assert math.isclose(breaker.retry_after(), model.retry_after(), abs_tol=1e-9)
        else:
            assert breaker.retry_after() == 0.0


CI_SETTINGS = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class ConsecutiveMachine(BreakerMachine):
    WINDOW = "consecutive"


class CountMachine(BreakerMachine):
    WINDOW = "count"


class TimeMachine(BreakerMachine):
    WINDOW = "time"


TestConsecutiveWindow = ConsecutiveMachine.TestCase
TestConsecutiveWindow.settings = CI_SETTINGS
TestCountWindow = CountMachine.TestCase
TestCountWindow.settings = CI_SETTINGS
TestTimeWindow = TimeMachine.TestCase
TestTimeWindow.settings = CI_SETTINGS
