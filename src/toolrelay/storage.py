"""Breaker state shared through Redis (extra ``redis``), without ever waiting on Redis.

Each breaker keeps its state in a local pybreaker memory storage (:class:`SharedStorage`)
and decides at once from it; no Redis I/O happens on the dispatch path. One thread per
:class:`RedisLink` replicates beside the event loop:

- a local decision (open, half-open, close, force) becomes a compare-and-set on the key's
  *period* (generation) in Redis, run as a Lua script; the winner publishes the new state
  on a channel, so every replica adopts it within a round trip; the reply goes back to the
  deciding breaker with the decision's serial, so that it can drop a reply a later decision
  superseded and hold what it hears from Redis meanwhile (:meth:`KeyBreaker.adopt`);
- half-open trial places are global: a replica asks Redis for one (atomically, at most
  ``half_open_max_calls`` per period across replicas, each leased for ``lease_s`` so a
  crashed replica cannot hold one forever) and admits a trial only with a place in hand;
- every ``sync_interval_s`` each active replica publishes its window's counts and reads
  the others', which its next decision adds to its own, and re-reads the state (in case a
  message was missed); a key's retry budget (:mod:`toolrelay.budget`) rides along in the
  same hash (field ``<replica>|budget``: calls and extras of its window), so the budget
  holds for the fleet at no extra round trip;
- a state a replica merely observes is adopted locally and never written back, so it
  resets nobody's counters.

While Redis is unreachable the breakers go on alone on local counts, the link logs one line
and reports ``up = False``, and Redis is probed every ``probe_interval_s``. When it answers
again, each key is re-read: a replica that opened alone pushes its open state, otherwise it
adopts what Redis has.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import pybreaker

from .breakers import Others, Remote, State

if TYPE_CHECKING:
    from .breakers import KeyBreaker
    from .budget import RetryBudgets

__all__ = ["RedisLink", "SharedStorage"]

log = logging.getLogger("toolrelay")

CHANNEL = "toolrelay:breakers"
"""Where a replica that changed a key's state announces it."""

_PRELUDE = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function snap(ok, extra)
  local s = redis.call('HMGET', KEYS[1], 'gen', 'state', 'opened_ms', 'break_ms', 'pinned')
  return {ok, tonumber(s[1] or 0), s[2] or 'closed', tonumber(s[3] or 0),
          tonumber(s[4] or 0), tonumber(s[5] or 0), now_ms(), extra or ''}
end
local function set_state(gen, state, break_ms, pinned)
  local now = now_ms()
  redis.call('HSET', KEYS[1], 'gen', gen, 'state', state, 'break_ms', break_ms,
             'pinned', pinned, 'succ', 0)
  if state == 'open' then redis.call('HSET', KEYS[1], 'opened_ms', now) end
  redis.call('DEL', KEYS[2], KEYS[3])
  local opened = redis.call('HGET', KEYS[1], 'opened_ms') or 0
  redis.call('PUBLISH', ARGV[1], table.concat(
    {gen, state, opened, break_ms, pinned, now, ARGV[2]}, '|'))
end
local function gen_now()
  return tonumber(redis.call('HGET', KEYS[1], 'gen') or 0)
end
"""

# ARGV: channel, key, expected period, state, break_ms, pinned, force
_TRANSITION = (
    _PRELUDE
    + """
local gen = gen_now()
if ARGV[7] ~= '1' and gen ~= tonumber(ARGV[3]) then return snap(0) end
set_state(gen + 1, ARGV[4], ARGV[5], ARGV[6])
return snap(1)
"""
)

# ARGV: channel, key, max trials, member, lease_ms
_CLAIM = (
    _PRELUDE
    + """
local s = redis.call('HMGET', KEYS[1], 'gen', 'state', 'opened_ms', 'break_ms', 'pinned')
local gen, state = tonumber(s[1] or 0), s[2] or 'closed'
local now = now_ms()
if state == 'open' and s[5] ~= '1'
   and now >= tonumber(s[3] or 0) + tonumber(s[4] or 0) then
  set_state(gen + 1, 'half_open', s[4] or 0, 0)
  state = 'half_open'
end
if state == 'half_open' then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) < tonumber(ARGV[3]) then
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), ARGV[4])
    return snap(1, ARGV[4])
  end
end
return snap(0)
"""
)

# ARGV: channel, key, period, member, result (1 success, 0 released), threshold, base_break_ms
_TRIAL_DONE = (
    _PRELUDE
    + """
if gen_now() ~= tonumber(ARGV[3]) then return snap(0) end
redis.call('ZREM', KEYS[2], ARGV[4])
if ARGV[5] == '1' then
  local n = redis.call('HINCRBY', KEYS[1], 'succ', 1)
  if n >= tonumber(ARGV[6]) then set_state(gen_now() + 1, 'closed', ARGV[7], 0) end
end
return snap(1)
"""
)


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[-1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _remote(
    reply: list[Any], *, authoritative: bool, permit: bool = False, decision: int = 0
) -> Remote:
    """A script's reply (``snap`` in the Lua prelude) as a :class:`Remote`."""
    _, gen, state, opened_ms, break_ms, pinned, now_ms, extra = reply
    state_name: State = _text(state)  # type: ignore[assignment]
    return Remote(
        int(gen),
        state_name,
        max(0.0, (int(now_ms) - int(opened_ms)) / 1000),
        int(break_ms) / 1000,
        bool(int(pinned)),
        _text(extra) if permit and extra else None,
        authoritative,
        decision,
    )


class SharedStorage(pybreaker.CircuitMemoryStorage):
    """A key's local pybreaker storage, replicated through a :class:`RedisLink`."""

    replicated = True

    def __init__(self, link: RedisLink, key: str) -> None:
        super().__init__(pybreaker.STATE_CLOSED)
        self.link = link
        self.key = key
        base = f"{link.prefix}{key}"
        self.redis_keys = (base, f"{base}:trials", f"{base}:counts")
        self.breaker: KeyBreaker | None = None
        self.synced_records = -1
        self.active_until = 0.0

    def attach(self, breaker: KeyBreaker) -> None:
        self.breaker = breaker
        self.link.attach(self)

    # -- what the breaker asks for (never waits) ------------------------------------------------
    def transition(
        self, breaker: KeyBreaker, expected: int, state: State, decision: int, *, forced: int = 0
    ) -> bool:
        """A local decision (serial ``decision``); False if it was dropped (Redis down)."""
        brk, pinned = _ms(breaker.break_s), int(breaker.pinned_open)
        op = ("transition", self, expected, state, brk, pinned, forced, decision)
        return self.link.send(op)

    def force(self, breaker: KeyBreaker, decision: int) -> bool:
        """An operator's decision: applied whatever the period (pin, unpin)."""
        return self.transition(breaker, breaker.period, breaker.known, decision, forced=1)

    def claim(self, breaker: KeyBreaker, period: int) -> None:
        member = f"{self.link.replica}:{next(self.link.serial)}"
        self.link.send(("claim", self, breaker.config.half_open_max_calls, member))

    def trial_done(
        self, breaker: KeyBreaker, period: int, permit: str, success: bool | None
    ) -> None:
        config = breaker.config
        result = 1 if success else 0
        threshold = config.success_threshold
        base = _ms(config.reset_timeout_s)
        self.link.send(("done", self, period, permit, result, threshold, base))


_STOP: Any = object()


class RedisLink:
    """One Redis client shared by every key's storage, the thread that replicates them,
    and the link's health."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 0.05,
        probe_interval_s: float = 5.0,
        sync_interval_s: float = 0.2,
        lease_s: float = 60.0,
        prefix: str = "toolrelay:",
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "breaker_storage='redis://…' needs the redis extra: pip install 'toolrelay[redis]'"
            ) from exc
        self.url = _redacted(url)
        self.error_type: type[Exception] = redis.RedisError
        self.client = redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        self.probe_interval_s = probe_interval_s
        self.sync_interval_s = sync_interval_s
        self.lease_ms = _ms(lease_s)
        self.prefix = prefix
        self.on_change = on_change
        self.replica = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.serial = itertools.count(1)
        self.up = True
        self.failures = 0
        self.commands = 0
        """Redis round trips made by the replication thread (a pipeline counts once)."""
        self._storages: dict[str, SharedStorage] = {}
        self.budgets: RetryBudgets | None = None
        """The dispatcher's retry budgets, replicated with the breaker counts."""
        self._ops: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._scripts = {
            "transition": self.client.register_script(_TRANSITION),
            "claim": self.client.register_script(_CLAIM),
            "done": self.client.register_script(_TRIAL_DONE),
        }
        self._closed = threading.Event()
        self.listening = threading.Event()
        """Set while the link is subscribed to other replicas' announcements."""
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._next_sync = 0.0
        self._next_probe = 0.0

    # -- the event loop's side -----------------------------------------------------------------
    def attach(self, storage: SharedStorage) -> None:
        self._storages[storage.key] = storage
        self._next_sync = 0.0  # read the new key's shared state at once
        with self._lock:
            if not self._threads and not self._closed.is_set():
                for target, name in ((self._write, "writer"), (self._listen, "listener")):
                    thread = threading.Thread(
                        target=target, name=f"toolrelay-breaker-storage-{name}", daemon=True
                    )
                    thread.start()
                    self._threads.append(thread)
        self._ops.put(None)

    def send(self, op: tuple[Any, ...]) -> bool:
        """Queue a replication step; dropped while Redis is down (resynced on return)."""
        if self.up:
            self._ops.put(op)
            return True
        return False

    def close(self) -> None:
        """Hand over what is queued (waiting at most 2 s for the writer), then disconnect.
        The listener ends by itself, quietly: at once if the disconnect cuts its wait for a
        message short, else within half a second."""
        self._closed.set()
        self._ops.put(_STOP)
        writer = self._threads[0] if self._threads else None
        if writer is not None and writer is not threading.current_thread():
            writer.join(2.0)
        self.client.close()

    # -- health --------------------------------------------------------------------------------
    def failed(self, exc: BaseException | None) -> None:
        self.failures += 1
        self._next_probe = time.monotonic() + self.probe_interval_s
        if self.up:
            log.warning(
                "toolrelay: breaker storage %s unreachable (%s); using local breaker state, "
                "retrying every %g s",
                self.url,
                type(exc).__name__ if exc else "error",
                self.probe_interval_s,
            )
            if self.on_change is not None:
                self.on_change(False)
            self.up = False  # last: whoever sees it down also sees the gauge say so

    def _recovered(self) -> None:
        self.up = True
        log.warning("toolrelay: breaker storage %s reachable again; state is shared", self.url)
        if self.on_change is not None:
            self.on_change(True)

    # -- the replication thread ------------------------------------------------------------------
    def _write(self) -> None:
        ops = self._ops
        while not self._closed.is_set():
            wait = self._next_sync - time.monotonic()
            try:
                first = ops.get(timeout=max(0.0, wait)) if wait > 0 else ops.get_nowait()
            except queue.Empty:
                first = None
            batch = [] if first is None else [first]
            while len(batch) < 256:
                try:
                    batch.append(ops.get_nowait())
                except queue.Empty:
                    break
            stop = _STOP in batch
            batch = [op for op in batch if op is not None and op is not _STOP]
            if stop:  # hand over what this replica decided before going
                if batch and self.up:
                    with contextlib.suppress(Exception):
                        self._apply(batch)
                return
            try:
                if not self.up:
                    if time.monotonic() < self._next_probe:
                        continue
                    self.client.ping()
                    self._resync()
                    self._recovered()
                    continue
                if batch:
                    self._apply(batch)
                if time.monotonic() >= self._next_sync:
                    self._next_sync = time.monotonic() + self.sync_interval_s
                    self._sync()
            except self.error_type as exc:
                self.failed(exc)
            except Exception:  # a bug here must not end replication
                log.exception("toolrelay: breaker storage replication failed")

    def _apply(self, batch: list[tuple[Any, ...]]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for op in batch:
            kind, storage = op[0], op[1]
            args: tuple[Any, ...] = (CHANNEL, storage.key, *op[2:])
            if kind == "claim":
                args = (CHANNEL, storage.key, op[2], op[3], self.lease_ms)
            elif kind == "transition":  # the last item is the decision's serial, not an ARGV
                args = (CHANNEL, storage.key, *op[2:7])
            self._scripts[kind](keys=storage.redis_keys, args=args, client=pipe)
        replies = pipe.execute()
        self.commands += 1
        for op, reply in zip(batch, replies, strict=True):
            kind, storage = op[0], op[1]
            breaker = storage.breaker
            if breaker is None:
                continue
            done = bool(int(reply[0]))
            if kind == "transition":
                # a refused local decision: Redis's state wins
                authoritative = not done or op[6] == 1
                remote = _remote(reply, authoritative=authoritative, decision=op[7])
                breaker.inbox.append(remote)
            elif kind == "claim":
                breaker.inbox.append(_remote(reply, authoritative=False, permit=done))
            else:
                breaker.inbox.append(_remote(reply, authoritative=False))

    def _active(self) -> list[SharedStorage]:
        now = time.monotonic()
        active = []
        for storage in list(self._storages.values()):
            breaker = storage.breaker
            if breaker is None:
                continue
            if breaker.records != storage.synced_records or breaker.known != "closed":
                storage.synced_records = breaker.records
                storage.active_until = now + 60.0
            if now < storage.active_until or storage.synced_records < 0:
                active.append(storage)
        return active

    def _sync(self) -> None:
        """Publish this replica's counts and read the others' and the state, per active key."""
        active = self._active()
        if not active:
            return
        wall = time.time()
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        for storage in active:
            breaker = storage.breaker
            assert breaker is not None
            calls, failures, slow = breaker.window_counts(others=False)
            mine = f"{breaker.period},{calls},{failures},{slow},{storage.counter},{wall:.3f}"
            state_key, _, counts_key = storage.redis_keys
            budget = None if self.budgets is None else self.budgets.known(storage.key)
            extra: list[str] = []  # the budget's counts, in the same HSET
            if budget is not None:
                spent = budget.counts()
                extra = [f"{self.replica}|budget", f"{spent[0]},{spent[1]},{wall:.3f}"]
            pipe.hset(counts_key, self.replica, mine, items=extra or None)
            pipe.pexpire(counts_key, max(60_000, 10 * _ms(self.sync_interval_s)))
            pipe.hmget(state_key, "gen", "state", "opened_ms", "break_ms", "pinned")
            pipe.hgetall(counts_key)
        replies = pipe.execute()
        self.commands += 1
        seconds, micros = replies[0]
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        stale = wall - max(2.0, 5 * self.sync_interval_s)
        for index, storage in enumerate(active):
            breaker = storage.breaker
            assert breaker is not None
            fields, counts = replies[1 + 4 * index + 2], replies[1 + 4 * index + 3]
            gen, state, opened_ms, break_ms, pinned = fields
            if gen is not None:
                reply = [1, gen, state, opened_ms or 0, break_ms or 0, pinned or 0, now_ms, ""]
                breaker.inbox.append(_remote(reply, authoritative=False))
            breaker.others = _others(counts, self.replica, int(gen or 0), stale)
            budget = None if self.budgets is None else self.budgets.known(storage.key)
            if budget is not None:
                budget.share(*_budget_others(counts, self.replica, stale))

    def _resync(self) -> None:
        """Redis is back: push a local open state Redis lacks, else adopt Redis's state."""
        storages = [s for s in list(self._storages.values()) if s.breaker is not None]
        if not storages:
            return
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        for storage in storages:
            pipe.hmget(storage.redis_keys[0], "gen", "state", "opened_ms", "break_ms", "pinned")
        replies = pipe.execute()
        seconds, micros = replies[0]
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        pushes = []
        for storage, fields in zip(storages, replies[1:], strict=True):
            breaker = storage.breaker
            assert breaker is not None
            gen, state, opened_ms, break_ms, pinned = fields
            remote_state = _text(state) if state is not None else "closed"
            if breaker.known == "open" and remote_state == "closed":
                pin = int(breaker.pinned_open)
                brk = _ms(breaker.break_s)
                pushes.append(("transition", storage, int(gen or 0), "open", brk, pin, 0, 0))
            else:
                reply = [1, gen or 0, remote_state, opened_ms or 0, break_ms or 0, pinned or 0]
                breaker.inbox.append(_remote([*reply, now_ms, ""], authoritative=True))
        if pushes:
            self._apply(pushes)

    def _listen(self) -> None:
        """Adopt other replicas' transitions as they are announced."""
        while not self._closed.is_set():
            pubsub = None
            try:
                pubsub = self.client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
                pubsub.subscribe(CHANNEL)
                self.listening.set()
                self._next_sync = 0.0  # re-read now what was announced while not listening
                self._ops.put(None)
                while not self._closed.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message is not None:
                        self._announced(_text(message["data"]))
            except self.error_type:
                self.listening.clear()
                self._closed.wait(min(self.probe_interval_s, 1.0))
            except Exception:
                if self._closed.is_set():
                    # close() disconnected the client under get_message (a closed socket,
                    # ValueError or OSError): the link is ending, not failing
                    self.listening.clear()
                    return
                log.exception("toolrelay: breaker storage listener failed")
                self._closed.wait(1.0)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        pubsub.close()

    def _announced(self, data: str) -> None:
        gen, state, opened_ms, break_ms, pinned, now_ms, key = data.split("|", 6)
        storage = self._storages.get(key)
        if storage is None or storage.breaker is None:
            return
        reply = [1, gen, state, opened_ms, break_ms, pinned, now_ms, ""]
        storage.breaker.inbox.append(_remote(reply, authoritative=False))


def _others(counts: dict[Any, Any], replica: str, gen: int, stale: float) -> Others:
    calls = failures = slow = consecutive = 0
    for field, value in counts.items():
        if _text(field) == replica:
            continue
        try:
            period, c, f, s, n, at = _text(value).split(",")
            if int(period) != gen or float(at) < stale:
                continue
            calls += int(c)
            failures += int(f)
            slow += int(s)
            consecutive += int(n)
        except ValueError:
            continue
    return Others(gen, calls, failures, slow, consecutive)


def _budget_others(counts: dict[Any, Any], replica: str, stale: float) -> tuple[int, int]:
    """The other replicas' fresh retry-budget counts: (calls, extras)."""
    calls = extras = 0
    mine = f"{replica}|budget"
    for field, value in counts.items():
        name = _text(field)
        if not name.endswith("|budget") or name == mine:
            continue
        try:
            c, e, at = _text(value).split(",")
            if float(at) < stale:
                continue
            calls += int(c)
            extras += int(e)
        except ValueError:
            continue
    return calls, extras
