"""Breaker state shared through Redis (extra ``redis``), without ever waiting on Redis.

Each breaker decides at once from its local pybreaker storage (:class:`SharedStorage`); one
:class:`RedisLink` thread replicates beside the event loop: a local decision becomes a
compare-and-set Lua script on the key's *period*, announced on a channel; half-open trial
places are granted by Redis; every ``sync_interval_s`` the active keys' counts and retry
budgets are exchanged. While Redis is unreachable the breakers go on alone, and each key is
re-read when it answers again. Every guarantee: ``docs/breakers.md``, "Shared state across
replicas".
"""

from .link import RedisLink
from .lua import CHANNEL
from .shared import SharedStorage

__all__ = ["CHANNEL", "RedisLink", "SharedStorage"]
