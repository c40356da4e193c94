"""Values every replica shares with the others through the link's periodic sync, beside
the breakers' counts: a :class:`Share` publishes this replica's value and is told the other
replicas' fresh ones (the gateway's per-client demand, :mod:`toolrelay.serve.client_limits`).
One hash per share (``<prefix>fleet:<name>``, a field per replica: ``<time> <value>``); no
round trip of its own, and never a wait on the event loop."""

from __future__ import annotations

from typing import Any, Protocol

from .lua import text


class Share(Protocol):
    name: str

    def mine(self) -> str:
        """This replica's value (called on the link's thread: read-only)."""
        ...

    def heard(self, others: list[str]) -> None:
        """The other replicas' fresh values (on the link's thread)."""
        ...


def queue(pipe: Any, shares: list[Share], prefix: str, replica: str, wall: float) -> None:
    """Three commands per share: publish ours, keep the hash a minute, read everyone's."""
    for share in shares:
        key = f"{prefix}fleet:{share.name}"
        pipe.hset(key, replica, f"{wall:.3f} {share.mine()}")
        pipe.pexpire(key, 60_000)
        pipe.hgetall(key)


def read(replies: list[Any], shares: list[Share], replica: str, stale: float) -> None:
    """Tell each share the other replicas' values written since ``stale`` (wall clock)."""
    for share, values in zip(shares, replies[2::3], strict=True):
        fresh = []
        for field, value in values.items():
            at, _, rest = text(value).partition(" ")
            try:
                if text(field) != replica and float(at) >= stale:
                    fresh.append(rest)
            except ValueError:  # not written by a replica: left out
                continue
        share.heard(fresh)
