"""The link to Redis: one client shared by every key's storage, the threads that
replicate them beside the event loop, and the link's health."""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import queue
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..breakers import NOBODY
from ..budget import RetryBudgets
from . import fleet, lua
from .lua import CHANNEL, CLAIM, TRANSITION, TRIAL_DONE, Rejected, ms, text
from .shared import SharedStorage

log = logging.getLogger("toolrelay")


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[-1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


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
        join_timeout_s: float = 0.05,
        lease_s: float = 60.0,
        prefix: str = "toolrelay:",
        budgets: RetryBudgets | None = None,
        on_change: Callable[[bool], None] | None = None,
        on_reject: Callable[[str, str], None] | None = None,
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
        self.join_timeout_s = join_timeout_s
        self.lease_ms = ms(lease_s)
        self.prefix = prefix
        self.on_change = on_change
        self.on_reject = on_reject
        """Told ``(key, field)`` of each value read from Redis and refused."""
        self._warned: set[str] = set()
        self.replica = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.serial = itertools.count(1)
        self.up = True
        self.failures = 0
        self.commands = 0
        """Redis round trips made by the replication thread (a pipeline counts once)."""
        self._storages: dict[str, SharedStorage] = {}
        self.shares: list[fleet.Share] = []
        self.budgets = budgets
        """The dispatcher's retry budgets, replicated with the breaker counts."""
        self._ops: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._scripts = {
            "transition": self.client.register_script(TRANSITION),
            "claim": self.client.register_script(CLAIM),
            "done": self.client.register_script(TRIAL_DONE),
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
        self._start()

    def share(self, share: fleet.Share) -> None:
        """Share ``share``'s value with the other replicas at every sync."""
        self.shares.append(share)
        self._start()

    def _start(self) -> None:
        self._next_sync = 0.0  # read the new key's (or share's) shared state at once
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
        for storage in list(self._storages.values()):
            storage.joined.set()  # a key's first calls wait no more: they decide alone

    def _recovered(self) -> None:
        self.up = True
        log.warning("toolrelay: breaker storage %s reachable again; state is shared", self.url)
        if self.on_change is not None:
            self.on_change(True)

    def reject(self, key: str, field: str) -> None:
        """A value of ``key``'s shared state was refused: the key decides alone on it."""
        if self.on_reject is not None:
            self.on_reject(key, field)
        if key not in self._warned:
            self._warned.add(key)
            log.warning(
                "toolrelay: breaker storage %s holds a bad %s for %r (not written by toolrelay "
                "%s); ignored: the key decides on its local state until a replica rewrites it",
                self.url, field, key, "or an older version",
            )  # fmt: skip

    # -- the replication thread ------------------------------------------------------------------
    def _write(self) -> None:
        ops = self._ops
        while True:  # until close()'s stop: what was queued before it is handed over
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
        replies = pipe.execute(raise_on_error=False)  # a script's error is its key's alone
        self.commands += 1
        for op, reply in zip(batch, replies, strict=True):
            kind, storage = op[0], op[1]
            breaker = storage.breaker
            if breaker is None:
                continue
            try:
                if isinstance(reply, self.error_type):  # arithmetic on a bad value
                    raise Rejected("script")
                done = reply[0] == 1
                if kind == "transition":
                    # a refused local decision: Redis's state wins
                    authoritative = not done or op[6] == 1
                    remote = lua.read_remote(reply, authoritative=authoritative, decision=op[7])
                elif kind == "claim":
                    remote = lua.read_remote(reply, authoritative=False, permit=done)
                else:
                    remote = lua.read_remote(reply, authoritative=False)
            except Rejected as exc:
                self.reject(storage.key, exc.field)
                continue
            breaker.inbox.append(remote)

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
        active, shares = self._active(), list(self.shares)
        if not active and not shares:
            return
        wall = time.time()
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        fleet.queue(pipe, shares, self.prefix, self.replica, wall)
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
            pipe.pexpire(counts_key, max(60_000, 10 * ms(self.sync_interval_s)))
            pipe.hmget(state_key, "gen", "state", "opened_ms", "break_ms", "pinned")
            pipe.hgetall(counts_key)
        replies = pipe.execute()
        self.commands += 1
        seconds, micros = replies[0]
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        stale = wall - max(2.0, 5 * self.sync_interval_s)
        fleet.read(replies[1 : 1 + 3 * len(shares)], shares, self.replica, stale)
        base = 1 + 3 * len(shares)
        for index, storage in enumerate(active):
            breaker = storage.breaker
            assert breaker is not None
            fields, counts = replies[base + 4 * index + 2], replies[base + 4 * index + 3]
            reject = functools.partial(self.reject, storage.key)
            try:
                remote = lua.read_state(fields, now_ms, authoritative=False)
            except Rejected as exc:  # the key decides alone: nothing of Redis's is used
                reject(exc.field)
                breaker.others = NOBODY
                continue
            if fields[0] is not None:  # gen: Redis knows the key
                breaker.inbox.append(remote)
            storage.heard = True
            breaker.others = lua.read_others(counts, self.replica, remote.period, stale, reject)
            budget = None if self.budgets is None else self.budgets.known(storage.key)
            if budget is not None:
                budget.share(*lua.read_budget_others(counts, self.replica, stale, reject))
        for storage in active:
            storage.joined.set()  # after the inbox and the budget: a first call sees both

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
            try:
                remote = lua.read_state(fields, now_ms, authoritative=True)
            except Rejected as exc:
                self.reject(storage.key, exc.field)
                continue
            if breaker.known == "open" and remote.state == "closed":
                pin = int(breaker.pinned_open)
                brk = ms(breaker.break_s)
                pushes.append(("transition", storage, remote.period, "open", brk, pin, 0, 0))
            else:
                breaker.inbox.append(remote)
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
                        self._announced(text(message["data"]))
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
        *state, key = data.split("|", 6)
        storage = self._storages.get(key)
        if storage is None or storage.breaker is None or len(state) != 6:
            return  # not about a key of ours (nor from a replica)
        try:
            remote = lua.read_remote([1, *state, ""], authoritative=False)
        except Rejected as exc:
            self.reject(key, exc.field)
            return
        storage.breaker.inbox.append(remote)
