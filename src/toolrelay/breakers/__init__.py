"""Circuit breakers per breaker key, on pybreaker's state and storage: options, failure
windows, the state machine, what replicas share (:mod:`.replica`), and the operator's
controls (:mod:`.control`: :class:`KeyBreaker`, :class:`Breakers`)."""

from .control import Breakers, KeyBreaker, StorageFactory
from .machine import REJECT, TransitionListener
from .options import BreakerOptions, Window
from .replica import NOBODY, REPLY_WAIT_S, Others, Remote, Replica, Replication, State

__all__ = [
    "NOBODY",
    "REJECT",
    "REPLY_WAIT_S",
    "BreakerOptions",
    "Breakers",
    "KeyBreaker",
    "Others",
    "Remote",
    "Replica",
    "Replication",
    "State",
    "StorageFactory",
    "TransitionListener",
    "Window",
]
