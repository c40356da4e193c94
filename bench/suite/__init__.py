"""The benchmark suite behind ``bench/run.py``: a shared harness (:mod:`.harness`: settings,
rows and targets, interleaved rounds, the no-op tool and its dispatchers), one module per
family of benchmarks (:mod:`.overhead`, :mod:`.baselines`, :mod:`.deadline` with its
instrument :mod:`.flood`, :mod:`.memory`, :mod:`.breakers`, :mod:`.adapters`, :mod:`.serve`
over the gateway benchmark :mod:`.gateway`, which ``bench/gateway.py`` also runs alone;
:mod:`.fleet`, replicas behind HAProxy), and
the report (:mod:`.report`: the table, bench/RESULTS.md).

Each benchmark is an ``async def bench_NAME(settings) -> list[Row]``; :data:`BENCHES` names
them in the order a run takes (the ``--only`` names)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from .adapters import (
    bench_adapter_langchain,
    bench_adapter_openai_agents,
    bench_adapter_pydantic_ai,
)
from .baselines import bench_agents, bench_naive
from .breakers import bench_breakers
from .deadline import bench_deadline
from .fleet import bench_fleet
from .harness import Row, Settings
from .memory import bench_memory
from .overhead import bench_fastfail, bench_overhead, bench_scale, bench_throughput, bench_typed
from .serve import bench_gateway

BENCHES: dict[str, Callable[[Settings], Awaitable[list[Row]]]] = {
    "overhead": bench_overhead,
    "naive": bench_naive,
    "agents": bench_agents,
    "fastfail": bench_fastfail,
    "deadline": bench_deadline,
    "scale": bench_scale,
    "memory": bench_memory,
    "throughput": bench_throughput,
    "breakers": bench_breakers,
    "adapter-langchain": bench_adapter_langchain,
    "typed": bench_typed,
    "adapter-openai-agents": bench_adapter_openai_agents,
    "adapter-pydantic-ai": bench_adapter_pydantic_ai,
    "gateway": bench_gateway,
    "fleet": bench_fleet,
}
