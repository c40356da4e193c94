"""The MCP gateway side by side: a bare upstream, ``mcp-proxy``, and ``toolrelay serve``.

    python bench/gateway.py [--quick] [--rounds N] [--calls N] [--variant NAME=TOML]...
                            [--no-mcp-proxy] [--profile SECONDS] [--against TREE]

Servers, each its own process on a loopback port, serving streamable HTTP at ``/mcp``:

* ``upstream``: bench/gateway_echo.py, the MCP SDK's low-level ``Server`` with one ``echo``
  tool, on the SDK's default HTTP settings; ``upstream[json]``: the same with
  ``json_response=True`` (what the in-process plugin is compared with, too);
* ``mcp-proxy``: the PyPI ``mcp-proxy`` in front of the same server over stdio, installed
  by this script into its own venv (it pins ``mcp<2``) under
  ``$XDG_CACHE_HOME/toolrelay/bench-mcp-proxy`` (else ``~/.cache/…``); skipped, with a
  line saying why, when it cannot be installed;
* ``toolrelay``: ``toolrelay serve`` with the same server as an upstream over stdio;
* ``toolrelay-plugin``: ``toolrelay serve`` with the tool as an in-process plugin;
* one more toolrelay pair per ``--variant NAME=TOML``: ``TOML`` lines added to the config's
  ``[serve.http]`` table (``--variant json='json_response = true'``), except lines starting
  with ``upstream.``, which go to the upstream's table without that prefix
  (``upstream.protocol = "legacy"``), and lines starting with ``!``: Python run in the
  gateway before it starts
  (``--variant nofreeze='!import gc; gc.freeze = lambda: None'``: what a change buys;
  ``!import toolrelay.sources.mcp_connection as m; m.stamped_meta = lambda client: None``
  sends the upstream's ``tools/call`` through the SDK's session instead of the raw lane);
* with ``--against TREE`` (another checkout, e.g. ``git worktree add /tmp/base REV``): every
  toolrelay pair once more, run from ``TREE``'s ``src/`` and ``plugins/``, named
  ``toolrelay[NAME@TREE]``, in the same rounds: the before/after of a change, measured side by
  side, with the ratio rows ``toolrelay[NAME] / toolrelay[NAME@TREE]`` (context, no target).

The client is the MCP SDK's Python client (``ClientSession`` over
``streamable_http_client``, the 2025-era handshake every server here speaks), in this
process: 1 client making calls one after another, then 8 clients at once (8 sessions,
each calling in turn). Every server is measured in every round, the order alternating
round by round. Per server: p50 and p99 of the call latencies of all rounds, calls/s (the
median of the rounds' calls / wall time), the server process's CPU time per call (its
``utime + stime`` from ``/proc``, the gateway process alone, not its upstream) and its RSS
at the end. Ratios against the targets of issue 19 are the median of the per-round ratios.

Then, with one SDK client, a ``resources/read`` of the upstream's resource and a call of its
``progress`` tool (10 progress notifications before the answer; the table says how many
reached the client) on every server that serves them (the in-process plugin has no
resources: listed as refusing).

Then every server is **saturated**: 8 keep-alive connections of a light client
(:class:`LightSession`: h11, JSON-RPC written by hand, its own MCP session on each
connection, the same handshake), each calling back to back, rounds interleaved as above.
The SDK's client costs 2-3 ms of CPU a call in this process, more than a gateway and its
upstream together, so with 8 SDK sessions the calls per second measure the client as much
as the server; the light client costs 0.4-0.6 ms, so saturated it is the server (and its
upstream) that sets the rate. The throughput target (≥ 1.2× mcp-proxy's) is checked on
the saturated row, and so are the 8-client targets of the in-process plugin against the
bare server (p50 and calls/s within 1.05×); the 8-SDK-client rates, and the plugin's
8-SDK-client p50, are shown for context.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # loaded by path (the tests), not run as a script
    sys.path.insert(0, str(HERE))

from suite.gateway import CONCURRENCY, Comparison, Sample, against, compare  # noqa: E402
from suite.gateway.clients import OPERATIONS, PROGRESS_STEPS  # noqa: E402

__all__ = [
    "CONCURRENCY",
    "OPERATIONS",
    "PROGRESS_STEPS",
    "Comparison",
    "Sample",
    "against",
    "compare",
    "main",
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2 rounds of 80 calls")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=400, help="calls per server and round")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=TOML")
    parser.add_argument("--no-mcp-proxy", action="store_true", help="leave mcp-proxy out")
    parser.add_argument("--profile", type=float, default=0, metavar="SECONDS")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    parser.add_argument("--against", type=Path, metavar="TREE", help="also run from TREE")
    options = parser.parse_args(argv)
    if options.quick:
        options.rounds, options.calls = 2, 80
    variants = [tuple(v.split("=", 1)) for v in options.variant]
    if any(len(v) != 2 for v in variants):
        parser.error("--variant takes NAME=TOML (or NAME=!PYTHON)")
    if options.against is not None:
        variants += against(options.against, variants)
    comparison = anyio.run(
        compare,
        options.rounds,
        options.calls,
        variants,
        not options.no_mcp_proxy,
        options.profile,
        options.keep,
    )
    print(comparison.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
