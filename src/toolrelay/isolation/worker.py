"""The worker process's side: import the handler by name, run calls, answer, and leave
when idle or when the host goes away."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import pickle
import select
import signal
import socket
import threading
import traceback
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from .. import typed
from ..contract import CURRENT_ATTEMPT, ToolError
from ..handler import Handler
from .target import ProcessTarget
from .wire import frame, receive_blocking


def _leave() -> NoReturn:
    """End the process and whatever its handlers started (its process group), if the group
    is its own (never the host's)."""
    if os.getpgrp() == os.getpid():
        os.killpg(0, signal.SIGKILL)
    os._exit(0)


def _watch(sock: socket.socket) -> None:
    """In the worker: end the process when the host's end of the socket closes (the host
    died, or dropped the worker), even while a handler hangs."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLHUP)
    while True:
        for _, mask in poller.poll():
            if mask & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                _leave()


def _load(target: ProcessTarget) -> Handler:
    """Import the handler by name (a typed tool's caller is rebuilt from its function)."""
    obj: Any = importlib.import_module(target.module)
    for part in target.qualname.split("."):
        obj = getattr(obj, part)
    if target.typed:
        obj = typed.typed_tool(obj, target.tool, None).call
    fn: Handler = obj
    return fn


def _run(handlers: dict[ProcessTarget, Callable[..., Any]], payload: bytes) -> Any:
    try:
        target, args, ctx, attempt = pickle.loads(payload)
        fn = handlers.get(target)
        if fn is None:
            fn = handlers[target] = _load(target)
    except Exception as exc:  # a module that cannot be imported here, say
        details = "".join(traceback.format_exception(exc))
        return ("raised", type(exc).__name__, f"the worker could not load the call\n{details}")
    token = CURRENT_ATTEMPT.set([attempt, attempt.deadline])
    try:
        return ("ok", fn(args, ctx))
    except ToolError as exc:
        return ("tool_error", exc.message, exc.error_type.value, exc.retryable,
                exc.counts_as_failure, exc.retry_after_s)  # fmt: skip
    except Exception as exc:
        return ("raised", type(exc).__name__, "".join(traceback.format_exception(exc)))
    finally:
        CURRENT_ATTEMPT.reset(token)


def worker_main(sock: socket.socket, idle_s: float, env: Mapping[str, str]) -> None:
    """A worker process: run calls until idle for ``idle_s`` or the host goes away, in a
    process group of its own (the host kills the group), with the environment ``env``."""
    os.setpgid(0, 0)
    os.environ.clear()  # the forkserver's (the host's, when it started): not the handler's
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the host's to handle
    sock.setblocking(True)
    threading.Thread(target=_watch, args=(sock,), name="toolrelay-watch", daemon=True).start()
    handlers: dict[ProcessTarget, Callable[..., Any]] = {}
    reader = sock.makefile("rb")  # one message in flight: it never buffers the next one
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    try:
        while True:
            if not poller.poll(idle_s * 1000):
                # A call sent from now on is left unread: the host reads "idle" and knows
                # that call never ran.
                sock.sendall(frame(("idle",)))
                break
            payload = receive_blocking(reader)
            if payload is None:
                break
            reply = _run(handlers, payload)
            try:
                data = frame(reply)
            except Exception:  # the result cannot leave the process: it is no JSON either
                data = frame(("unpicklable", type(reply[1]).__name__))
            sock.sendall(data)
    except OSError:  # the host went away
        pass
    _leave()


def start_context() -> Any:
    """How worker processes are started: ``forkserver``, ``spawn`` where it is missing."""
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" not in methods:
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # Workers are forked from a server that has imported toolrelay (and the main script,
    # as multiprocessing does by default); this takes effect if the server is not running.
    context.set_forkserver_preload(["__main__", __name__])
    return context
