"""The Redis side of shared breaker state: the Lua scripts, the announcement channel, and
how their replies and the counts hash read back (:class:`~toolrelay.breakers.Remote`,
:class:`~toolrelay.breakers.Others`).

A key's state is a hash (``gen``, ``state``, ``opened_ms``, ``break_ms``, ``pinned``,
``succ``); its trial places a sorted set of leases; its counts a hash with one field per
replica (``period,calls,failures,slow,consecutive,at``) and one per replica's retry budget
(``<replica>|budget``: ``calls,extras,at``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, get_args

from ..breakers import Others, Remote, State

CHANNEL = "toolrelay:breakers"
"""Where a replica that changed a key's state announces it."""

_PRELUDE = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function snap(ok, extra)
  local s = redis.call('HMGET', KEYS[1], 'gen', 'state', 'opened_ms', 'break_ms', 'pinned')
  return {ok, s[1] or '0', s[2] or 'closed', s[3] or '0', s[4] or '0', s[5] or '0',
          now_ms(), extra or ''}
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
TRANSITION = (
    _PRELUDE
    + """
local gen = gen_now()
if ARGV[7] ~= '1' and gen ~= tonumber(ARGV[3]) then return snap(0) end
set_state(gen + 1, ARGV[4], ARGV[5], ARGV[6])
return snap(1)
"""
)

# ARGV: channel, key, max trials, member, lease_ms
CLAIM = (
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
TRIAL_DONE = (
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


def ms(seconds: float) -> int:
    return round(seconds * 1000)


def text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class Rejected(ValueError):
    """A value in Redis this replica refuses: written by something else (a bad deploy, an
    old version, someone with access to Redis). ``field`` names it, never its value."""

    def __init__(self, field: str) -> None:
        super().__init__(field)
        self.field = field


_COUNT = re.compile(r"[0-9]{1,15}")
_STATES: frozenset[str] = frozenset(get_args(State))


def _count(value: Any, field: str) -> int:
    """A non-negative integer below 10**15, written in decimal digits (else :class:`Rejected`)."""
    raw = text(value)
    if not _COUNT.fullmatch(raw):
        raise Rejected(field)
    return int(raw)


def _seconds(value: Any, field: str) -> float:
    try:
        seconds = float(text(value))
    except ValueError:
        raise Rejected(field) from None
    if not math.isfinite(seconds):
        raise Rejected(field)
    return seconds


def read_remote(
    reply: list[Any], *, authoritative: bool, permit: bool = False, decision: int = 0
) -> Remote:
    """A script's reply (``snap`` in the Lua prelude) as a :class:`Remote`; raises
    :class:`Rejected` for a value no replica writes."""
    _, gen, state, opened_ms, break_ms, pinned, now_ms, extra = reply
    state_name = text(state)
    if state_name not in _STATES:
        raise Rejected("state")
    if text(pinned) not in ("0", "1"):
        raise Rejected("pinned")
    return Remote(
        _count(gen, "gen"),
        state_name,  # type: ignore[arg-type]
        max(0.0, (_count(now_ms, "now_ms") - _count(opened_ms, "opened_ms")) / 1000),
        _count(break_ms, "break_ms") / 1000,
        text(pinned) == "1",
        text(extra) if permit and extra else None,
        authoritative,
        decision,
    )


def read_state(fields: list[Any], now_ms: int, *, authoritative: bool) -> Remote:
    """A key's hash (``gen``, ``state``, ``opened_ms``, ``break_ms``, ``pinned``) as a
    :class:`Remote` (a missing field as a fresh key has it). Raises :class:`Rejected`."""
    gen, state, opened_ms, break_ms, pinned = fields
    reply = [1, gen or 0, state or "closed", opened_ms or 0, break_ms or 0, pinned or 0]
    return read_remote([*reply, now_ms, ""], authoritative=authoritative)


Reject = Callable[[str], None]
"""Told the field of a value that was refused (``counts``, ``budget``)."""


def read_others(
    counts: dict[Any, Any], replica: str, gen: int, stale: float, reject: Reject
) -> Others:
    """The other replicas' fresh counts of period ``gen`` (``reject`` told of a bad one)."""
    totals = [0, 0, 0, 0]
    for field, value in counts.items():
        name = text(field)
        if name == replica or name.endswith("|budget"):
            continue
        try:
            period, *values, at = text(value).split(",")
            numbers = [_count(v, "counts") for v in values if len(values) == 4]
            fresh = _count(period, "counts") == gen and _seconds(at, "counts") >= stale
        except ValueError:  # Rejected, or too few values
            numbers = []
        if len(numbers) != 4:
            reject("counts")
        elif fresh:
            totals = [a + b for a, b in zip(totals, numbers, strict=True)]
    return Others(gen, *totals)


def read_budget_others(
    counts: dict[Any, Any], replica: str, stale: float, reject: Reject
) -> tuple[int, int]:
    """The other replicas' fresh retry-budget counts: (calls, extras)."""
    calls = extras = 0
    mine = f"{replica}|budget"
    for field, value in counts.items():
        name = text(field)
        if not name.endswith("|budget") or name == mine:
            continue
        try:
            c, e, at = text(value).split(",")
            spent = _count(c, "budget"), _count(e, "budget")
            if _seconds(at, "budget") >= stale:
                calls, extras = calls + spent[0], extras + spent[1]
        except ValueError:  # Rejected, or not three values
            reject("budget")
    return calls, extras
