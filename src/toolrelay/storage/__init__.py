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

from .link import RedisLink
from .lua import CHANNEL
from .shared import SharedStorage

__all__ = ["CHANNEL", "RedisLink", "SharedStorage"]
