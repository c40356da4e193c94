"""The benchmark suite behind ``bench/run.py``: a shared harness (:mod:`.harness`: settings,
rows and targets, interleaved rounds, the no-op tool and its dispatchers), one module per
family of benchmarks (:mod:`.overhead`, :mod:`.baselines`, :mod:`.deadline` with its
instrument :mod:`.flood`, :mod:`.memory`, :mod:`.breakers`, :mod:`.adapters`, :mod:`.serve`
over the gateway benchmark :mod:`.gateway`, which ``bench/gateway.py`` also runs alone;
:mod:`.fleet`, replicas behind HAProxy), and
the report (:mod:`.report`: the table, bench/RESULTS.md).

Each benchmark is an ``async def bench_NAME(settings) -> list[Row]``; :data:`BENCHES` names
them in the order a run takes (the ``--only`` names), :func:`bench` imports one."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .harness import Row, Settings

BENCHES: dict[str, str] = {
    "overhead": "overhead",
    "naive": "baselines",
    "agents": "baselines",
    "fastfail": "overhead",
    "deadline": "deadline",
    "scale": "overhead",
    "memory": "memory",
    "throughput": "overhead",
    "breakers": "breakers",
    "adapter-langchain": "adapters",
    "typed": "overhead",
    "adapter-openai-agents": "adapters",
    "adapter-pydantic-ai": "adapters",
    "gateway": "serve",
    "fleet": "fleet",
}
"""Each benchmark's module, imported by :func:`bench` in the worker that runs it only: the
orchestrator and the other workers never load the MCP SDK, httpx or the frameworks."""


def bench(name: str) -> Callable[[Settings], Awaitable[list[Row]]]:
    """The ``bench_NAME`` function of the benchmark ``name`` (an ``--only`` name)."""
    module = importlib.import_module(f"{__name__}.{BENCHES[name]}")
    function: Callable[[Settings], Awaitable[list[Row]]] = getattr(
        module, "bench_" + name.replace("-", "_")
    )
    return function
