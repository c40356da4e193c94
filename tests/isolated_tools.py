"""Tools for ``isolation="process"`` tests: module-level functions a worker process imports
by name (kept light: a worker imports this module, not the test module and pytest)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from toolrelay import AuthContext, CallContext, ToolError


def _note_pid(args: dict[str, Any]) -> None:
    """Write this process's id where the test asked (then the test knows whom to look for)."""
    path = args.get("pidfile")
    if path:  # written whole, then renamed: whoever sees the file can read the id
        Path(f"{path}.tmp").write_text(str(os.getpid()))
        os.replace(f"{path}.tmp", path)


def describe(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
    """What the worker received."""
    call = CallContext.current()
    return {
        "args": args,
        "pid": os.getpid(),
        "user_id": ctx.user_id,
        "tenant_id": ctx.tenant_id,
        "roles": sorted(ctx.roles),
        "attributes": dict(ctx.attributes),
        "call": {
            "tool": call.tool,
            "call_id": call.call_id,
            "attempt": call.attempt,
            "breaker_key": call.breaker_key,
            "time_left": call.time_left,
            "deadline": call.deadline,
        },
    }


def typed_sum(a: int, b: int, ctx: AuthContext, call: CallContext) -> dict[str, Any]:
    """Add two numbers.

    Args:
        a: the first.
        b: the second.
    """
    return {"sum": a + b, "user_id": ctx.user_id, "tool": call.tool, "pid": os.getpid()}


def hang(args: dict[str, Any], ctx: AuthContext) -> None:
    """Never answers (an hour is never, for a test)."""
    _note_pid(args)
    time.sleep(3600)


def sleep_then_write(args: dict[str, Any], ctx: AuthContext) -> str:
    """Sleep, then leave a mark: a mark proves the work was not stopped."""
    _note_pid(args)
    time.sleep(args["sleep_s"])
    Path(args["mark"]).write_text("done")
    return "done"


def exit_abruptly(args: dict[str, Any], ctx: AuthContext) -> None:
    """Leave the process without a word: ``os._exit`` or a signal."""
    _note_pid(args)
    if args.get("signal"):
        os.kill(os.getpid(), signal.Signals[args["signal"]])
        time.sleep(10)
    os._exit(args.get("status", 3))


def raise_error(args: dict[str, Any], ctx: AuthContext) -> None:
    if args.get("precise"):
        raise ToolError("no such city", retryable=True, retry_after_s=2.5)
    raise ValueError(f"the password is {args.get('secret', 'hunter2')}")


def unpicklable(args: dict[str, Any], ctx: AuthContext) -> Any:
    """A value that cannot leave the worker process."""
    return {"lock": threading.Lock()}


def a_set(args: dict[str, Any], ctx: AuthContext) -> Any:
    """A value that leaves the process and is no JSON until converted (a list)."""
    return {1, 2, 3}


async def async_tool(args: dict[str, Any], ctx: AuthContext) -> str:
    return "async"


class Plugin:
    """A plugin whose sync ``execute`` is a method (no module-level function to import)."""

    def describe(self) -> list[Any]:
        from toolrelay import ToolDeclaration

        return [ToolDeclaration("plugin_tool", "A plugin tool.", isolation="process")]

    def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> str:
        return "from the plugin"


class HandlerPlugin(Plugin):
    """A plugin that offers a module-level function per tool."""

    def handler(self, name: str) -> Any:
        return describe


class Service:
    def run(self, args: dict[str, Any], ctx: AuthContext) -> str:
        """A bound method: its instance cannot be found by name."""
        return "service"


def fork_then_hang(args: dict[str, Any], ctx: AuthContext) -> None:
    """Fork a child that hangs too, note both ids (``pidfile``: the child's), and hang."""
    child = os.fork()
    if child == 0:
        time.sleep(3600)
        os._exit(0)
    Path(f"{args['pidfile']}.tmp").write_text(str(child))
    os.replace(f"{args['pidfile']}.tmp", args["pidfile"])
    if args.get("hang", True):
        time.sleep(3600)


def spawn_sleep(args: dict[str, Any], ctx: AuthContext) -> int:
    """Start ``sleep 77.5`` (not waited for), note its id, and hang (or answer with it)."""
    child = subprocess.Popen(["sleep", "77.5"])
    Path(f"{args['pidfile']}.tmp").write_text(str(child.pid))
    os.replace(f"{args['pidfile']}.tmp", args["pidfile"])
    if args.get("hang", True):
        time.sleep(3600)
    return child.pid


def environment(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
    """The worker's environment (names only), and what a subprocess of it sees."""
    seen = subprocess.run(["env"], capture_output=True, text=True, check=True).stdout
    return {
        "names": sorted(os.environ),
        "values": {name: os.environ.get(name) for name in args.get("names", [])},
        "subprocess": sorted(line.split("=", 1)[0] for line in seen.splitlines() if "=" in line),
    }


def big_result(args: dict[str, Any], ctx: AuthContext) -> str:
    return "x" * args["size"]


def forged_header(args: dict[str, Any], ctx: AuthContext) -> None:
    """Announce a result of ``size`` bytes on the worker's socket, send none, and hang."""
    import gc
    import socket
    import struct

    (sock,) = (o for o in gc.get_objects() if isinstance(o, socket.socket) and o.fileno() >= 0)
    sock.sendall(struct.pack("!Q", args["size"]))
    time.sleep(3600)
