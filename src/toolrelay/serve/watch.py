"""Tell MCP clients when the tools they are offered change (docs/serve.md, "List changes").

A caller's list is ``dispatcher.specs(profile, format="mcp")``: breakers hide and show tools,
plugins and upstreams change theirs. :class:`ToolListWatcher` fingerprints it per profile,
re-checks on every breaker change and every ``interval_s``, and tells a changed profile's
clients: handshake-era (2025) connections with ``notifications/tools/list_changed``,
2026-era ``subscriptions/listen`` streams with ``ToolsListChanged`` (a bus per profile).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

import anyio
import anyio.from_thread
import anyio.lowlevel
from mcp.server.session import ServerSession
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ServerEvent,
    ToolsListChanged,
)

from ..dispatcher import Dispatcher
from .metrics import GatewayMetrics

log = logging.getLogger("toolrelay.serve")

MAX_PEERS = 2000
"""The most handshake-era connections remembered at once."""
NOTIFY_TIMEOUT_S = 2.0
"""How long one client may take to accept a notification before it is dropped."""


_SENDERS: dict[type, Callable[[ServerSession], Awaitable[None]]] = {
    ResourcesListChanged: ServerSession.send_resource_list_changed,
    PromptsListChanged: ServerSession.send_prompt_list_changed,
}


@dataclass(frozen=True, slots=True)
class _Peer:
    session: ServerSession
    profile: str | None
    client: str | None = None


class ToolListWatcher:
    """Fingerprints each profile's tool list and announces changes to its clients."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        profiles: Iterable[str | None],
        metrics: GatewayMetrics,
        *,
        interval_s: float = 1.0,
    ) -> None:
        self._dispatcher = dispatcher
        self._metrics = metrics
        self.interval_s = interval_s
        self._buses = {profile: InMemorySubscriptionBus() for profile in profiles}
        self._listeners = {profile: ListenHandler(bus) for profile, bus in self._buses.items()}
        self._fingerprints = {profile: self.fingerprint(profile) for profile in self._buses}
        self._peers: dict[str, _Peer] = {}
        self._wake: anyio.Event | None = None
        self._loop_thread: int | None = None
        self._token: anyio.lowlevel.EventLoopToken | None = None
        dispatcher.breakers.add_listener(lambda key, old, new: self.wake())

    # -- what clients are offered ------------------------------------------------------------
    def fingerprint(self, profile: str | None) -> str:
        """A digest of the ``tools/list`` a caller with ``profile`` gets now."""
        specs = self._dispatcher.specs(profile, format="mcp")
        text = json.dumps(specs, sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def listen_handler(self, profile: str | None) -> ListenHandler:
        """The ``subscriptions/listen`` handler of one profile's clients."""
        return self._listeners[profile]

    def add_peer(
        self, key: str, session: ServerSession, profile: str | None, client: str | None = None
    ) -> None:
        """Remember a handshake-era connection (``key`` names it) of ``client`` to notify of
        changes.

        At most :data:`MAX_PEERS` are kept, the least recently added dropped first (a
        safety net: connections are forgotten when they close, see :meth:`remove_peer`).
        """
        self._peers.pop(key, None)
        self._peers[key] = _Peer(session, profile, client)
        while len(self._peers) > MAX_PEERS:
            del self._peers[next(iter(self._peers))]

    def remove_peer(self, key: str) -> None:
        """Forget a connection (it closed)."""
        self._peers.pop(key, None)

    def peers(self) -> int:
        """How many handshake-era connections are remembered."""
        return len(self._peers)

    # -- triggers --------------------------------------------------------------------------
    def wake(self) -> None:
        """Re-check the lists now rather than at the next interval (from any thread: a
        breaker listener)."""
        event = self._wake
        if event is None:
            return
        if threading.get_ident() == self._loop_thread:
            event.set()
            return
        try:
            anyio.from_thread.run_sync(event.set, token=self._token)
        except Exception:  # the loop is gone: nobody to tell
            log.debug("toolrelay serve: watcher wake-up from a thread failed", exc_info=True)

    async def run(self) -> None:
        """Re-check on every wake-up and every ``interval_s``, until cancelled."""
        self._loop_thread = threading.get_ident()
        self._token = anyio.lowlevel.current_token()
        self._fingerprints = {profile: self.fingerprint(profile) for profile in self._buses}
        while True:
            self._wake = anyio.Event()
            with anyio.move_on_after(self.interval_s):
                await self._wake.wait()
            await self.check()

    async def check(self) -> list[str | None]:
        """Compare every profile's list with the last one; announce and return the changed."""
        changed = []
        for profile in self._buses:
            try:
                now = self.fingerprint(profile)
            except Exception:
                log.exception("toolrelay serve: could not list the tools of profile %r", profile)
                continue
            if now != self._fingerprints.get(profile):
                self._fingerprints[profile] = now
                changed.append(profile)
        for profile in changed:
            await self.announce(profile)
        return changed

    async def announce(self, profile: str | None) -> None:
        """Tell every client with ``profile`` that its tool list changed."""
        self._metrics.announced(profile)
        log.info("toolrelay serve: the tool list of profile %r changed", profile)
        await self._buses[profile].publish(ToolsListChanged())
        for key, peer in list(self._peers.items()):
            if peer.profile == profile:
                await self._notify(key, peer)

    async def tell(self, event: ServerEvent, concerns: Callable[[str | None], bool]) -> None:
        """Tell the clients whose profile ``concerns`` the event of another list (an
        upstream's resources or prompts): 2026-era ``subscriptions/listen`` streams that
        asked for it, and handshake-era connections of a list change."""
        for profile, bus in self._buses.items():
            if concerns(profile):
                await bus.publish(event)
        send = _SENDERS.get(type(event))
        for key, peer in list(self._peers.items()):
            if send is not None and concerns(peer.profile):
                await _send(send, key, peer)

    async def _notify(self, key: str, peer: _Peer) -> None:
        if not await _send(ServerSession.send_tool_list_changed, key, peer):
            self._peers.pop(key, None)

    # -- hot reload --------------------------------------------------------------------------
    async def reconfigure(
        self, before: Mapping[str, str | None], after: Mapping[str, str | None]
    ) -> list[str | None]:
        """After a reload (the dispatcher and callers already changed): ``before`` and
        ``after`` map every client name (``default`` and ``unauthenticated`` included) to
        its profile. New profiles get their subscription bus; connections of clients that
        are gone are forgotten (not notified any more); every connection whose tool list
        differs from the one it had is told. Returns the profiles whose list changed.

        A 2026-era ``subscriptions/listen`` stream stays on the bus of the profile it was
        opened with: when a client moves to another profile, that bus is told too (its
        other listeners re-list for nothing)."""
        listed = dict(self._fingerprints)  # each profile's list under the old settings
        for profile in {*after.values()} - self._buses.keys():
            bus = self._buses[profile] = InMemorySubscriptionBus()
            self._listeners[profile] = ListenHandler(bus)
        moved: dict[str, str | None] = {}  # connection → the profile it had
        for key, peer in list(self._peers.items()):
            if peer.client is None:
                continue
            if peer.client not in after:
                del self._peers[key]
            elif after[peer.client] != peer.profile:
                self._peers[key] = _Peer(peer.session, after[peer.client], peer.client)
                moved[key] = peer.profile
        changed = await self.check()
        for key, had in moved.items():
            now = self._peers.get(key)
            if (
                now is not None
                and now.profile not in changed
                and listed.get(had) != self._fingerprints.get(now.profile)
            ):
                await self._notify(key, now)
        left = {before[c] for c in before if c in after and after[c] != before[c]}
        for profile in left - {*changed}:
            if profile in self._buses:
                await self._buses[profile].publish(ToolsListChanged())
        return changed


async def _send(send: Callable[[ServerSession], Awaitable[None]], key: str, peer: _Peer) -> bool:
    """Whether ``peer`` accepted the notification within :data:`NOTIFY_TIMEOUT_S`."""
    with anyio.move_on_after(NOTIFY_TIMEOUT_S):
        try:
            await send(peer.session)
            return True
        except Exception:
            log.debug("toolrelay serve: client %s is gone", key, exc_info=True)
    return False
