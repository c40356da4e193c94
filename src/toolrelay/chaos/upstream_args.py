"""The options of ``toolrelay chaos upstream``, apart from the server: the ``toolrelay``
command builds its parser from them without importing h11 (the ``chaos`` extra)."""

from __future__ import annotations

import argparse

__all__ = ["DESCRIPTION", "add_arguments"]

DESCRIPTION = (
    "Serve stand-ins for Open-Meteo, SearXNG and feeds; misbehave on command (POST /_admin/faults)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``toolrelay chaos upstream`` (shared with the ``toolrelay`` CLI)."""
    parser.add_argument("--host", default="127.0.0.1", help="loopback address (127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="port, 0 for any (8765)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault dice (0)")
    parser.add_argument(
        "--live-clock",
        action="store_true",
        help="date answers by the wall clock instead of a fixed instant",
    )
