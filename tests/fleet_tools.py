"""The tools of the fleet tests (``[plugins.fleet] module = "fleet_tools"``, tests/ on the
path): ``lookup``, an idempotent read that says which replica answered, and ``pay``, a call
to a "payments service" shared by every replica — down while the file ``down`` exists in
the plugin's ``state_dir`` — that logs each run (start and end, on the one system-wide
monotonic clock) to ``state_dir/pay.log``, so a test can count the trials the fleet let
through; and ``refund``, a ``write`` that the calling client must approve (a 2026-era
client: in an ``InputRequiredResult`` round). ``lookup`` logs the process id of each slow
call (1 s or more) as it starts to ``state_dir/slow.log``."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

from toolrelay import AuthContext, ToolError, ToolRegistry

LOOKUP = {
    "type": "object",
    "properties": {
        "text": {"type": "string", "maxLength": 100},
        "delay_s": {"type": "number", "minimum": 0, "maximum": 5},
    },
    "required": ["text"],
    "additionalProperties": False,
}
PAY = {
    "type": "object",
    "properties": {"amount": {"type": "integer"}, "delay_s": {"type": "number", "minimum": 0}},
    "required": ["amount"],
    "additionalProperties": False,
}


def register(registry: ToolRegistry, config: Mapping[str, Any]) -> None:
    state = Path(config.get("state_dir", "."))

    @registry.tool(
        name="lookup",
        description="Answers with the text, and the process id of the replica that ran it.",
        parameters=LOOKUP,
        idempotent=True,
        breaker_key="lookup",
    )
    async def lookup(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
        if args.get("delay_s", 0) >= 1:  # a slow call: the test waits until one runs here
            with (state / "slow.log").open("a") as out:
                out.write(f"{os.getpid()}\n")
        await anyio.sleep(args.get("delay_s", 0))
        return {"text": args["text"], "pid": os.getpid()}

    @registry.tool(
        name="refund",
        description="Needs the caller's approval; says which replica ran it.",
        parameters=PAY,
        risk="write",
    )
    async def refund(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
        return {"refunded": args["amount"], "pid": os.getpid()}

    @registry.tool(
        name="pay",
        description="Calls the payments service (down while state_dir/down exists).",
        parameters=PAY,
        idempotent=True,
        max_attempts=1,
        breaker_key="payments",
    )
    async def pay(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
        log = state / "pay.log"
        with log.open("a") as out:
            out.write(f"start {os.getpid()} {time.monotonic():.6f}\n")
        try:
            await anyio.sleep(args.get("delay_s", 0))
            if (state / "down").exists():
                raise ToolError("payments service unavailable", retryable=True)
            return {"paid": args["amount"], "pid": os.getpid()}
        finally:
            with log.open("a") as out:
                out.write(f"end {os.getpid()} {time.monotonic():.6f}\n")
