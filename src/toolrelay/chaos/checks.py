"""The invariants a chaos experiment is judged by (its ``[invariants]`` table)."""

from __future__ import annotations

import math

from .record import Check, Run


def judge(run: Run) -> list[Check]:
    """The checks of an experiment defined in data, in the order they are reported."""
    record = run.record
    settings = run.data.get("invariants", {})
    slack = float(settings.get("deadline_slack_ms", 50.0)) / 1000
    checks = [
        Check(
            "every call answered",
            not record.escaped and record.calls == record.answered == run.calls_metric,
            f"calls {record.calls}, answers {record.answered}, tool_calls_total "
            f"{run.calls_metric:.0f}, exceptions {len(record.escaped)}",
        )
    ]
    late = [a for a in record.answers if a[2].duration_s > a[3] + slack]
    worst = max((a[2].duration_s - a[3] for a in record.answers), default=0.0)
    checks.append(
        Check(
            f"every answer within its deadline + {slack * 1000:.0f} ms",
            not late,
            f"{len(late)} late of {len(record.answers)}; worst {worst * 1000:+.1f} ms vs deadline",
        )
    )
    faults = run.data.get("faults", [])
    outage = (
        (min(f["from_s"] for f in faults), max(f["until_s"] for f in faults)) if faults else None
    )
    for key in settings.get("breakers", []):
        checks += _breaker_checks(key, run, outage)
    over = [h for h in record.holds if h[0] > h[1] + slack]
    longest = max((h[0] - h[1] for h in record.holds), default=-math.inf)
    checks.append(
        Check(
            "slot hold never beyond budget",
            not over,
            f"{len(record.holds)} holds, {len(over)} over; closest {longest * 1000:+.1f} ms",
        )
    )
    steady = run.data.get("steady_state")
    if steady is not None and outage is not None:
        before = [a for a in record.answers if a[0] + a[2].duration_s < outage[0]]
        errors = sum(not a[2].ok for a in before)
        ratio = errors / len(before) if before else 1.0
        limit = float(steady.get("max_error_ratio", 0.0))
        checks.append(
            Check(
                "steady state before the faults",
                len(before) >= int(steady.get("min_calls", 1)) and ratio <= limit,
                f"error ratio {ratio:.3f} over {len(before)} calls (≤ {limit})",
            )
        )
    if settings.get("no_leaks", True):
        leaks = run.leaks
        clean = leaks["inflight"] == 0 and leaks["bulkhead"] == 0 and leaks["threads"] == 0
        checks.append(
            Check(
                "no leaked tasks, threads or in-flight calls",
                clean and leaks["tasks"] == 0,
                f"in-flight {leaks['inflight']:.0f}, bulkhead {leaks['bulkhead']:.0f}, "
                f"threads {leaks['threads']:.0f} (+{leaks['abandoned']:.0f} abandoned, "
                f"counted), tasks {leaks['tasks']:.0f}",
            )
        )
    return checks


def _breaker_checks(key: str, run: Run, outage: tuple[float, float] | None) -> list[Check]:
    breakers = run.dispatcher.breakers
    config = run.dispatcher.policy(key).breaker
    moves = [t for t in run.record.transitions if t[1] == key]
    start, end = outage if outage is not None else (0.0, math.inf)
    opened = next((t for t in moves if t[3] == "open" and t[0] >= start), None)
    at_start = run.record.failures_at_start.get(key, 0)
    counted = (opened[6] if opened else breakers.get(key).failures_recorded) - at_start
    checks = [
        Check(
            f"{key}: breaker opened within fail_max failures of the outage",
            opened is not None and counted <= config.fail_max,
            (
                f"opened at {opened[0]:.2f} s after {counted} failures (fail_max {config.fail_max})"
                if opened
                else f"never opened ({counted} failures from {start:.1f} s)"
            ),
        )
    ]
    # While not closed, only half-open trials may be admitted: the closed-state admission
    # counter must not move between an open and the next close, and each half-open period
    # admits at most half_open_max_calls trials.
    leaked = 0
    trials_over = 0
    for move, nxt in zip(moves, [*moves[1:], None], strict=False):
        if move[3] == "open":
            leaked += (nxt[4] if nxt else breakers.get(key).admitted) - move[4]
        elif move[3] == "half_open":
            trials = (nxt[5] if nxt else breakers.get(key).trials_admitted) - move[5]
            trials_over += max(0, trials - config.half_open_max_calls)
    rejected = sum(1 for a in run.record.attempts if a[1] == key and a[2] == "circuit_open")
    checks.append(
        Check(
            f"{key}: fast-failed while open, only half-open trials reached the service",
            opened is not None and leaked == 0 and trials_over == 0 and rejected > 0,
            f"{rejected} fast-fails, {leaked} admitted while open, "
            f"{trials_over} trials over the half-open limit",
        )
    )
    closed = next((t for t in moves if t[3] == "closed" and t[0] >= end), None)
    checks.append(
        Check(
            f"{key}: breaker closed after recovery",
            closed is not None and opened is not None,
            f"closed at {closed[0]:.2f} s (faults ended {end:.1f} s)"
            if closed
            else f"not closed after {end:.1f} s; state {breakers.state(key)}",
        )
    )
    return checks
