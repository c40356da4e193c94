"""A plugin's optional capabilities, each an explicit, ``runtime_checkable`` protocol.

:class:`~toolrelay.contract.ToolPlugin` (``describe()`` and ``execute()``) is all a plugin
must offer; toolrelay checks for these with ``isinstance``, never by probing names. Plugins
need not import this module: the protocols are structural (``docs/plugins.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from .contract import ToolDeclaration
from .handler import Handler
from .isolation.target import ProcessTarget


@runtime_checkable
class DeclaresOne(Protocol):
    """A plugin that finds one of its declarations by name."""

    def declaration(self, name: str) -> ToolDeclaration | None:
        """The tool's declaration now (what ``describe()`` would list), or ``None``."""
        ...


@runtime_checkable
class HasHandler(Protocol):
    """A plugin that hands out each tool's handler, run instead of ``execute(name, …)``."""

    def handler(self, name: str) -> Handler:
        """``fn(args, ctx)`` for the tool (sync or async, as ``execute`` may be)."""
        ...


@runtime_checkable
class ProcessIsolatable(Protocol):
    """A plugin that says where a worker process finds a tool's handler."""

    def process_target(self, name: str) -> Callable[[], ProcessTarget]:
        """A function that gives the :class:`ProcessTarget`, or raises :class:`ValueError`
        saying why the tool cannot run in a worker process (called only for tools declared
        ``isolation="process"``)."""
        ...


@runtime_checkable
class Closeable(Protocol):
    """A plugin holding resources (connections, processes) to release when it is done."""

    async def aclose(self) -> None:
        """Release them; called once, on the event loop."""
        ...
