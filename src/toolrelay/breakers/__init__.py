"""Circuit breakers per breaker key, on pybreaker's state and storage.

- :mod:`.options`: :class:`BreakerOptions`, what a key's breaker is told;
- :mod:`.window`: the failure windows (consecutive, count, time);
- :mod:`.machine`: the state machine — periods, transitions, admission and counting;
- :mod:`.replica`: what a breaker shares with other replicas, and the protocol its shared
  storage (:mod:`toolrelay.storage`) implements;
- :mod:`.control`: :class:`KeyBreaker` (the operator's controls and hot reload) and
  :class:`Breakers`, every breaker of a dispatcher.
"""

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
