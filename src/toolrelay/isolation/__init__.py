"""Process isolation for sync handlers: a bounded pool of worker processes per breaker key.

A tool declared ``isolation="process"`` runs in a worker process of its breaker key. At the
deadline (or when the host cancels the call) the process is killed (``SIGKILL``) and waited
for; the key's next call gets a fresh one. A thread cannot be stopped, a process can: nothing
of a hung handler is left behind.

The modules: :mod:`.target` (where a worker finds a handler), :mod:`.wire` (the messages
between host and worker), :mod:`.worker` (the worker process's side) and :mod:`.pool` (the
host's side: the per-key pools). ``docs/isolation.md`` explains how workers start, what
travels over their socket, how many there are and how they stop.
"""

from .pool import (
    IDLE_S,
    KILL_WAIT_S,
    PoolFull,
    ProcessPool,
    ProcessPools,
    StartFailed,
    WorkerCrashed,
    WorkerRaised,
)
from .target import ProcessTarget, target_of
from .wire import encode_call

__all__ = [
    "IDLE_S",
    "KILL_WAIT_S",
    "PoolFull",
    "ProcessPool",
    "ProcessPools",
    "ProcessTarget",
    "StartFailed",
    "WorkerCrashed",
    "WorkerRaised",
    "encode_call",
    "target_of",
]
