"""A comparison: start the servers, measure them side by side round by round (the SDK's
clients, then the light ones saturating each server), stop them; py-spy on request."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.abc

from .clients import (
    OPERATIONS,
    Sample,
    light_sessions,
    measure,
    measure_operation,
    saturate,
    sessions,
)
from .figures import Comparison
from .servers import CONCURRENCY, Server, plan, running, wait_listening


async def compare(
    rounds: int,
    calls: int,
    variants: Sequence[tuple[str, str]] = (),
    proxy: bool = True,
    profile_s: float = 0,
    keep: bool = False,
) -> Comparison:
    """Start the servers, measure them side by side, stop them."""
    workdir = Path(tempfile.mkdtemp(prefix="toolrelay-bench-gateway-"))
    servers = plan(workdir, variants, proxy)
    results: dict[tuple[str, int], list[Sample]] = {
        (s.name, c): [] for s in servers for c in CONCURRENCY
    }
    rss: dict[str, float] = {}
    saturated: dict[str, list[Sample]] = {s.name: [] for s in servers}
    operations: dict[tuple[str, str], list[Sample]] = {}
    refused: dict[tuple[str, str], str] = {}
    try:
        with running(servers, workdir):
            for server in servers:
                await wait_listening(server, workdir)
            async with contextlib.AsyncExitStack() as stack:
                for server in servers:
                    await stack.enter_async_context(sessions(server, max(CONCURRENCY)))
                for server in servers:  # warm-up
                    await measure(server, max(CONCURRENCY), calls // 4)
                for clients in CONCURRENCY:
                    for index in range(rounds):
                        order = servers if index % 2 == 0 else list(reversed(servers))
                        for server in order:
                            sample = await measure(server, clients, calls)
                            results[server.name, clients].append(sample)
                await measure_operations(servers, rounds, calls, operations, refused)
                if profile_s:
                    await profile(servers, profile_s)
                rss = {server.name: server.rss_mb() for server in servers}
            # The SDK's sessions are closed first: idle meanwhile, a server may expire them.
            async with contextlib.AsyncExitStack() as stack:
                light = {}
                for server in servers:
                    light[server.name] = await stack.enter_async_context(
                        light_sessions(server, max(CONCURRENCY))
                    )
                    await saturate(server, light[server.name], calls // 4)  # warm-up
                for index in range(rounds):
                    order = servers if index % 2 == 0 else list(reversed(servers))
                    for server in order:
                        sample = await saturate(server, light[server.name], 2 * calls)
                        saturated[server.name].append(sample)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    labels = ["", *(name for name, _ in variants)]
    comparison = Comparison([s.name for s in servers], labels, results, rss, saturated)
    comparison.operations, comparison.refused = operations, refused
    comparison.progress = {s.name: s.progress_seen for s in servers if s.progress_seen}
    return comparison


async def measure_operations(
    servers: Sequence[Server],
    rounds: int,
    calls: int,
    operations: dict[tuple[str, str], list[Sample]],
    refused: dict[tuple[str, str], str],
) -> None:
    """The rows beyond ``tools/call`` (one SDK client, rounds interleaved): a server that
    does not serve one (the in-process plugin has no resources) is listed as refusing it."""
    for operation in OPERATIONS:
        serving = []
        for server in servers:
            try:
                await measure_operation(server, operation, 1)
            except Exception as exc:  # the server's refusal, reported in the table
                while isinstance(exc, ExceptionGroup) and exc.exceptions:
                    exc = exc.exceptions[0]  # the SDK's task groups wrap the MCP error
                refused[server.name, operation] = " ".join(str(exc).split())[:60]
            else:
                serving.append(server)
                operations[server.name, operation] = []
        for index in range(rounds):
            for server in serving if index % 2 == 0 else list(reversed(serving)):
                sample = await measure_operation(server, operation, calls)
                operations[server.name, operation].append(sample)


async def profile(servers: Sequence[Server], seconds: float) -> None:
    """py-spy each toolrelay gateway for ``seconds`` under 8 clients (flame graphs kept;
    only samples holding the GIL: where the CPU goes, not where the loop waits)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    for server in servers:
        if not server.name.startswith("toolrelay") or server.proc is None:
            continue
        out = Path.cwd() / f"profile-{server.name}.txt"
        command = [spy, "record", "-p", str(server.proc.pid), "-d", str(int(seconds))]
        command += ["-f", "raw", "-o", str(out), "--nonblocking", "--gil"]  # CPU, not waits
        spying = await anyio.open_process(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            await measure(server, max(CONCURRENCY), 200)
        await spying.wait()
        print(f"profile of {server.name}: {out}", file=sys.stderr)
