"""The toolrelay benchmark suite: one table of side-by-side ratios, with targets.

    python bench/run.py [--quick] [--check] [--only NAME,...] [--results PATH]
                        [--normal-priority]

Every benchmark runs in its own fresh interpreter, in its own session (so memory figures,
thread pools and OpenTelemetry state never leak from one into another, and a process
started from the same shell shares no scheduling group with it), on asyncio. Costs that
are compared are measured side by side in interleaved rounds (the order alternating round
by round), timed in CPU time, and reported as the median of the per-round ratios, so the
figures hold on a noisy shared machine; absolute figures are medians too, for context.

Benchmarks (``--only`` names): overhead, naive, agents, fastfail, deadline, scale, memory,
throughput, breakers, typed, adapter-openai-agents, adapter-pydantic-ai, adapter-langchain,
gateway, fleet.

``--check`` exits 1 when a target in force is missed, or a benchmark fails. A target is in
force unless its row says "(not checked)": info and stress rows have no target; in a
``--quick`` run the targets whose quick figure is noise (tracing extras, scale, the slowed
Redis p99, the flood latencies measured on one flood) are shown but not checked; and a
flood's latency targets are not checked when its event loop waited for a CPU (other
processes took it: see ``CPU_WAIT_LIMIT_S``). The checked async flood's healthy-call target
is toolrelay's own share: its p99 / unloaded ratio over that of the same flood on bare
anyio, run beside it.

A full run writes bench/RESULTS.md; ``--quick`` is a seconds-long smoke run that writes
nothing unless ``--results PATH`` says where; ``--results -`` writes nothing.
``--normal-priority``: the deadline benchmark's event loop keeps the normal priority (by
default it asks for real-time priority, where permitted, for the checked floods).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # loaded by path (the tests), not run as a script
    sys.path.insert(0, str(HERE))

from suite import BENCHES, bench  # noqa: E402
from suite.flood import PRIORITY_ENV  # noqa: E402
from suite.harness import (  # noqa: E402  (bench/hotpath.py takes the tool and dispatchers)
    ARGS,
    CTX,
    SCHEMA,
    SKIP_BENCH,
    Row,
    Settings,
    dispatcher,
    noop,
    noop_registry,
    paired_ratio,
    percentile,
)
from suite.report import markdown, text_table  # noqa: E402
from suite.serve import gateway_rows  # noqa: E402

__all__ = [
    "ARGS",
    "BENCHES",
    "CTX",
    "DEFAULT_RESULTS",
    "SCHEMA",
    "SKIP_BENCH",
    "Row",
    "dispatcher",
    "gateway_rows",
    "main",
    "noop",
    "noop_registry",
    "paired_ratio",
    "percentile",
    "run_isolated",
    "text_table",
]

DEFAULT_RESULTS = HERE / "RESULTS.md"
ROWS_MARK = "@@rows "


# -- orchestration ----------------------------------------------------------------------
def run_worker(name: str, quick: bool) -> None:
    rows = anyio.run(bench(name), Settings.make(quick))
    print(ROWS_MARK + json.dumps([dataclasses.asdict(r) for r in rows]), flush=True)


def run_isolated(name: str, quick: bool, timeout_s: float = 600) -> list[Row]:
    """Run one benchmark in a fresh interpreter and collect its rows."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", name]
    if quick:
        command.append("--quick")
    try:
        # its own session: its own scheduling group (Linux autogroup), which a CPU hog
        # started from the same shell would otherwise share, taking half its CPU share
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, start_new_session=True
        )
    except subprocess.TimeoutExpired:
        return [Row(name, name, status="ERROR", context=f"timed out after {timeout_s:g} s")]
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(ROWS_MARK):
            return [Row(**row) for row in json.loads(line[len(ROWS_MARK) :])]
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    sys.stderr.write(proc.stderr)
    return [Row(name, name, status="ERROR", context=f"exit {proc.returncode}: {tail[:160]}")]


def command(quick: bool, only: list[str]) -> str:
    """The run's command line, as RESULTS.md states it."""
    return (
        f"python bench/run.py{' --quick' if quick else ''}"
        f"{' --only ' + ','.join(only) if only != list(BENCHES) else ''}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run (seconds)")
    parser.add_argument("--check", action="store_true", help="exit 1 if any target is missed")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {list(BENCHES)}")
    parser.add_argument(
        "--results",
        help=f"where to write the results ('-': nowhere; default {DEFAULT_RESULTS.name} "
        "beside this script on a full run, nowhere on a --quick run)",
    )
    parser.add_argument(
        "--normal-priority",
        action="store_true",
        help="no real-time priority for the deadline benchmark's event loop",
    )
    parser.add_argument("--worker", choices=list(BENCHES), help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.worker:
        run_worker(opts.worker, opts.quick)
        return 0
    only = [n.strip() for n in opts.only.split(",") if n.strip()] or list(BENCHES)
    unknown = [n for n in only if n not in BENCHES]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHES)}")
    settings = Settings.make(opts.quick)
    if opts.normal_priority:
        os.environ[PRIORITY_ENV] = "normal"  # the workers inherit it
    started = time.perf_counter()
    rows: list[Row] = []
    for name in only:
        print(f"running {name} …", file=sys.stderr, flush=True)
        began = time.perf_counter()
        rows += run_isolated(name, opts.quick)
        print(f"  {name}: {time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True)
    wall = time.perf_counter() - started
    mode = "quick" if opts.quick else "full"
    print(f"\ntoolrelay benchmarks ({mode} run, {wall:.0f} s)\n")
    print(text_table(rows))
    results = opts.results or ("-" if opts.quick else str(DEFAULT_RESULTS))
    if results != "-":
        path = Path(results)
        path.write_text(markdown(rows, settings, wall, command(opts.quick, only)), encoding="utf-8")
        print(f"\nwrote {path}")
    missed = [r for r in rows if r.fails_check]
    if missed:
        print(f"\n{len(missed)} target(s) missed or failed: " + "; ".join(r.name for r in missed))
    unchecked = [r for r in rows if r.passed is False and not r.in_force]
    if unchecked:
        print(
            f"{len(unchecked)} target(s) not in force in this run missed: "
            + "; ".join(r.name for r in unchecked)
        )
    return 1 if opts.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
