"""Process isolation for sync handlers: a bounded pool of worker processes per breaker key.

A tool declared ``isolation="process"`` runs in a worker process of its breaker key. At the
deadline (or when the host cancels the call) the process is killed (``SIGKILL``) and waited
for; the key's next call gets a fresh one. A thread cannot be stopped, a process can: nothing
of a hung handler is left behind.

The modules: :mod:`.target` (where a worker finds a handler), :mod:`.wire` (the messages
between host and worker), :mod:`.worker` (the worker process's side) and :mod:`.pool` (the
host's side: the per-key pools).

- **Start.** Processes come from the standard library's ``forkserver`` (``spawn`` where it
  is missing): a single-threaded server process, started once per host process, that has
  imported toolrelay and forks a worker per request — fork safety without paying an
  interpreter start per worker. Starting is blocking, so a spawner thread of its own does
  it (a :class:`toolrelay.workers.Spawner`, fair between keys); the event loop only waits
  for the socket that says "started".
- **The function.** It travels by name (``module`` + ``qualname``, :class:`ProcessTarget`):
  a module-level function, imported by the worker on its first call and kept. A typed tool's
  caller is rebuilt in the worker from the same function.
- **Transport.** One ``socketpair`` per worker; length-prefixed pickles both ways. The
  parent's end is non-blocking and awaited with ``anyio.wait_readable``/``wait_writable``:
  the loop never blocks on a worker.
- **Size.** At most ``max_processes`` (the key's ``max_concurrent``) per key, started
  lazily, idle ones reused most-recent first. A worker idle for :data:`IDLE_S` says so and
  exits by itself (``forkserver`` reaps it); a worker whose host dies exits too (its watchdog
  thread sees the socket close).
- **Stop.** Killed at the deadline or cancellation, then waited for (at most
  :data:`KILL_WAIT_S`, shielded), so when the call is answered its process is gone.
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
