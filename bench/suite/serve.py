"""The MCP gateway (``toolrelay serve``) beside the bare upstream and ``mcp-proxy``, as
:mod:`.gateway` measures it (also run alone: ``python bench/gateway.py``)."""

from __future__ import annotations

from typing import Any

from .harness import (
    Row,
    Settings,
)


async def bench_gateway(s: Settings) -> list[Row]:
    """``toolrelay serve`` beside the bare upstream and ``mcp-proxy`` (bench/gateway.py),
    with ``[serve.http] json_response = true`` (the targets) and as configured by default
    (SSE answers: shown, not checked)."""
    # imported here: the MCP SDK, h11 and httpx2 load in this benchmark's worker only
    from .gateway import compare

    rounds, calls = (2, 80) if s.quick else (6, 400)
    comparison = await compare(rounds, calls, [("json", "json_response = true")])
    return gateway_rows(comparison, s.quick)


def gateway_rows(comparison: Any, quick: bool) -> list[Row]:
    """The gateway's rows: the ratios of the JSON-answer variant are in force (in a full
    run); those of the default configuration (SSE answers) are shown."""
    clients = max(count for _, count in comparison.results)
    rows = [
        Row(
            "gateway",
            r.name,
            r.value,
            target=r.shown_target,
            passed=r.passed,
            in_force=not quick and r.label == "json",
        )
        for r in comparison.ratios()
    ]
    for server in comparison.servers:
        f = comparison.figures(server, clients)
        rows.append(
            Row(
                "gateway",
                f"{server}, {clients} clients",
                f.rate,
                unit="calls/s",
                context=f"p50 {f.p50_ms:.2f} ms, p99 {f.p99_ms:.2f} ms, server CPU "
                f"{f.cpu_ms:.2f} ms/call, RSS {comparison.rss[server]:.0f} MB",
            )
        )
    from .gateway.figures import Figures  # with the MCP SDK, as above

    for (server, operation), samples in sorted(comparison.operations.items()):
        f, seen = Figures.of(samples), comparison.progress.get(server, [])
        notes = f", {min(seen)}–{max(seen)} progress notifications a call" if seen else ""
        if "progress" not in operation:
            notes = ""
        rows.append(
            Row(
                "gateway",
                f"{server}, {operation}, 1 client",
                f.rate,
                unit="calls/s",
                context=f"p50 {f.p50_ms:.2f} ms, p99 {f.p99_ms:.2f} ms, server CPU "
                f"{f.cpu_ms:.2f} ms/call{notes}",
            )
        )
    return rows
