"""What a breaker shares with the other replicas, and in which order it adopts their news.

With shared storage (:mod:`toolrelay.storage`) the breaker stays local-first: decisions are
made from local state at once, and the storage replicates them on a thread of its own;
what other replicas decided arrives in :attr:`Replica.inbox` and is adopted on the next
call. While one of this replica's own decisions is on its way to Redis, what arrives from
Redis may predate it: it waits for the decision's reply (see :meth:`Replica.adopt`).

:class:`Replication` is what a breaker needs of its shared storage; the storage implements
it (and imports this module, never the other way round).
"""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Literal, NamedTuple, Protocol

State = Literal["closed", "open", "half_open"]
Clock = Callable[[], float]

REPLY_WAIT_S = 5.0
"""How long a replica waits for Redis's reply to one of its decisions before it takes the
reply as lost (a failed batch; Redis being down is handled by the resync)."""


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


class Replica(ABC):
    """The replication side of a breaker: what the shared storage's thread reads and
    writes (:attr:`inbox`, :attr:`others`, the declared attributes), and the order in
    which news from the storage is adopted. :meth:`_adopt` (the breaker's) applies one."""

    period: int
    """Bumped by every state change; a call's verdict counts only in its own period."""
    known: State
    """The state as this process knows it."""
    pinned_open: bool
    break_s: float
    records: int
    """Verdicts recorded (cumulative; the shared storage watches it for activity)."""
    clock: Clock

    def __init__(self) -> None:
        self.inbox: deque[Remote] = deque()
        self.decided = 0
        """Serial of this replica's latest decision sent to the shared storage."""
        self.answered = 0
        """Serial of the latest decision whose reply has come back from the shared storage."""
        self._decided_at = -math.inf
        self.deferred: deque[Remote] = deque(maxlen=64)
        """What arrived while a decision of ours was on its way (judged after its reply)."""
        self.others = NOBODY

    @abstractmethod
    def window_counts(self, *, others: bool = True) -> tuple[int, int, int]: ...

    @abstractmethod
    def _adopt(self, remote: Remote) -> None: ...

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

    def _drain(self) -> None:
        inbox = self.inbox
        while inbox:
            self.adopt(inbox.popleft())


class Replication(Protocol):
    """What a breaker needs of shared storage (:class:`toolrelay.storage.SharedStorage`).
    Every method only queues work for the storage's thread: none waits on I/O."""

    replicated: bool
    joined: threading.Event
    """Set once the first read of the fleet's state of the key has ended, either way."""
    heard: bool
    """Whether that read got the fleet's state (else the key decides alone until a sync)."""

    @property
    def up(self) -> bool:
        """False while the storage is unreachable (the breaker decides alone)."""
        ...

    def attach(self, breaker: Replica) -> None:
        """Replicate ``breaker`` (its decisions and what the other replicas say)."""
        ...

    def transition(self, expected: int, state: State, decision: int, *, forced: int = 0) -> bool:
        """A local decision (serial ``decision``); False if it was dropped (Redis down)."""
        ...

    def force(self, decision: int) -> bool:
        """An operator's decision: applied whatever the period (pin, unpin)."""
        ...

    def claim(self, max_trials: int) -> None:
        """Ask for a half-open trial place (answered through the inbox)."""
        ...

    def trial_done(
        self, period: int, permit: str, success: bool | None, threshold: int, base_break_s: float
    ) -> None:
        """A trial that held ``permit`` ended (``None``: without a verdict)."""
        ...
