"""The report: a server's figures over the rounds, the ratios against the targets of issue
19 (the median of the per-round ratios), and the markdown table."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..harness import percentile
from .clients import Sample
from .servers import CONCURRENCY, UPSTREAMS


@dataclass
class Figures:
    p50_ms: float
    p99_ms: float
    rate: float
    cpu_ms: float
    upstream_cpu_ms: float
    client_cpu_ms: float

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> Figures:
        pooled = [x for s in samples for x in s.latencies]
        return cls(
            percentile(pooled, 50) * 1e3,
            percentile(pooled, 99) * 1e3,
            statistics.median(s.calls / s.wall_s for s in samples),
            statistics.median(s.cpu_s / s.calls for s in samples) * 1e3,
            statistics.median(s.upstream_cpu_s / s.calls for s in samples) * 1e3,
            statistics.median(s.client_cpu_s / s.calls for s in samples) * 1e3,
        )


def round_ratio(top: Sequence[Sample], bottom: Sequence[Sample], what: str) -> float:
    def figure(s: Sample) -> float:
        if what == "rate":
            return s.calls / s.wall_s
        if what == "cpu":
            return (s.cpu_s + s.upstream_cpu_s) / s.calls
        return percentile(s.latencies, 50 if what == "p50" else 99)

    return statistics.median(figure(a) / figure(b) for a, b in zip(top, bottom, strict=True))


@dataclass(frozen=True)
class Ratio:
    """One target of issue 19: ``value`` against ``target`` (at least or at most)."""

    name: str
    value: float
    target: float | None
    """``None``: shown for context, no target."""
    at_least: bool
    label: str = ""
    """The toolrelay configuration judged: "" (as configured by default) or a variant's name."""

    @property
    def passed(self) -> bool:
        if self.target is None:
            return True
        return self.value >= self.target if self.at_least else self.value <= self.target

    @property
    def shown_target(self) -> str:
        if self.target is None:
            return "—"
        return f"{'≥' if self.at_least else '≤'} {self.target:g}×"


@dataclass
class Comparison:
    servers: list[str]
    labels: list[str]
    """"" (toolrelay as configured by default), then each variant's name"""
    results: dict[tuple[str, int], list[Sample]]
    rss: dict[str, float]
    saturated: dict[str, list[Sample]] = field(default_factory=dict)
    """Per server: the rounds of :func:`saturate` (the light client, 8 connections)."""
    operations: dict[tuple[str, str], list[Sample]] = field(default_factory=dict)
    """Per server and request beyond ``tools/call`` (``OPERATIONS``): its rounds."""
    refused: dict[tuple[str, str], str] = field(default_factory=dict)
    """Per server and request it does not serve: why (its error)."""
    progress: dict[str, list[int]] = field(default_factory=dict)
    """Per server: the progress notifications each progress-tool call got back."""

    def figures(self, server: str, clients: int) -> Figures:
        return Figures.of(self.results[server, clients])

    def ratios(self) -> list[Ratio]:
        out: list[Ratio] = []
        light = "saturated (8 light connections)"
        for label in self.labels:
            tag = f"[{label}]" if label else ""
            tr, plugin = f"toolrelay{tag}", f"toolrelay-plugin{tag}"

            def add(
                name: str,
                top: Sequence[Sample],
                bottom: Sequence[Sample],
                what: str,
                target: float | None,
                at_least: bool = False,
                label: str = label,
            ) -> None:
                value = round_ratio(top, bottom, what)
                out.append(Ratio(name, value, target, at_least, label))

            if "@" in label:
                out.extend(self._before_after(label))
            if "mcp-proxy" in self.servers:
                for clients in CONCURRENCY:
                    top, bottom = self.results[tr, clients], self.results["mcp-proxy", clients]
                    name = f"{tr} / mcp-proxy, {clients} client(s)"
                    add(f"p50 {name}", top, bottom, "p50", 0.9)
                    add(f"p99 {name}", top, bottom, "p99", 1.0)
                top, bottom = self.results[tr, 8], self.results["mcp-proxy", 8]
                name = f"calls/s {tr} / mcp-proxy, 8 SDK clients (client-bound)"
                add(name, top, bottom, "rate", None, at_least=True)
                if self.saturated:
                    top, bottom = self.saturated[tr], self.saturated["mcp-proxy"]
                    add(f"calls/s {tr} / mcp-proxy, {light}", top, bottom, "rate", 1.2, True)
            for bare in UPSTREAMS:
                for clients in CONCURRENCY:
                    # Eight SDK clients cost more CPU than either server: context only.
                    target = 1.05 if clients == 1 or not self.saturated else None
                    top, bottom = self.results[plugin, clients], self.results[bare, clients]
                    how = "1 client(s)" if clients == 1 else "8 SDK clients (client-bound)"
                    add(f"p50 {plugin} / {bare}, {how}", top, bottom, "p50", target)
                    add(f"calls/s {bare} / {plugin}, {how}", bottom, top, "rate", target)
                if self.saturated:
                    top, bottom = self.saturated[plugin], self.saturated[bare]
                    add(f"p50 {plugin} / {bare}, {light}", top, bottom, "p50", 1.05)
                    add(f"calls/s {bare} / {plugin}, {light}", bottom, top, "rate", 1.05)
        return out

    def _before_after(self, label: str) -> list[Ratio]:
        """This checkout's toolrelay against the same configuration run from another
        (``NAME@TREE``, ``--against``), both in the same rounds: shown, no target."""
        mine = label.split("@", 1)[0]
        out = []
        for kind in ("toolrelay", "toolrelay-plugin"):
            top, bottom = f"{kind}[{mine}]" if mine else kind, f"{kind}[{label}]"
            rows: list[tuple[str, Sequence[Sample], Sequence[Sample], str]] = [
                (f"p50 {top} / {bottom}, {c} client(s)", *self._pair(top, bottom, c), "p50")
                for c in CONCURRENCY
            ]
            if self.saturated:
                light = (self.saturated[top], self.saturated[bottom])
                rows.append((f"calls/s {top} / {bottom}, saturated", *light, "rate"))
                rows.append((f"CPU/call {top} / {bottom}, saturated", *light, "cpu"))
            for name, new, old, what in rows:
                out.append(Ratio(name, round_ratio(new, old, what), None, what == "rate", label))
        return out

    def _pair(self, top: str, bottom: str, clients: int) -> tuple[list[Sample], list[Sample]]:
        return self.results[top, clients], self.results[bottom, clients]

    def table(self) -> str:
        out = [
            "| server | clients | p50 | p99 | calls/s | server CPU/call "
            "| its upstream's | the clients' | RSS |"
        ]
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for clients in CONCURRENCY:
            for server in self.servers:
                f = self.figures(server, clients)
                out.append(
                    f"| {server} | {clients} | {f.p50_ms:.2f} ms | {f.p99_ms:.2f} ms | "
                    f"{f.rate:,.0f} | {f.cpu_ms:.2f} ms | {f.upstream_cpu_ms:.2f} ms | "
                    f"{f.client_cpu_ms:.2f} ms | {self.rss[server]:.0f} MB |"
                )
        for server, samples in self.saturated.items():
            f = Figures.of(samples)
            out.append(
                f"| {server} | 8 light | {f.p50_ms:.2f} ms | {f.p99_ms:.2f} ms | "
                f"{f.rate:,.0f} | {f.cpu_ms:.2f} ms | {f.upstream_cpu_ms:.2f} ms | "
                f"{f.client_cpu_ms:.2f} ms | {self.rss[server]:.0f} MB |"
            )
        if self.operations or self.refused:
            out += [
                "",
                "| server | request (1 SDK client) | p50 | p99 | calls/s | server CPU/call ",
            ]
            out[-1] += "| progress notifications a call |"
            out.append("|---|---|---:|---:|---:|---:|---:|")
            for (server, operation), samples in sorted(self.operations.items()):
                f, seen = Figures.of(samples), self.progress.get(server, [])
                notes = f"{min(seen)}–{max(seen)}" if seen and "progress" in operation else "—"
                out.append(
                    f"| {server} | {operation} | {f.p50_ms:.2f} ms | {f.p99_ms:.2f} ms | "
                    f"{f.rate:,.0f} | {f.cpu_ms:.2f} ms | {notes} |"
                )
            for (server, operation), why in sorted(self.refused.items()):
                out.append(f"| {server} | {operation} | refused: {why} | | | | |")
        out += ["", "| ratio (median of the per-round ratios) | result | target | status |"]
        out.append("|---|---:|---|---|")
        for r in self.ratios():
            verdict = "ok" if r.passed else "MISS"
            out.append(f"| {r.name} | {r.value:.2f}× | {r.shown_target} | {verdict} |")
        return "\n".join(out)
