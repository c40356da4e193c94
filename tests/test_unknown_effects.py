"""A write that failed or timed out may have happened: it is never presented as safe to repeat.

For a tool that is not idempotent, a timeout (its own deadline or the model slot's) and an
unexpected exception answer ``retryable: false`` with ``effect_unknown: true`` and a message
that says to check before calling again. Idempotent tools, calls that never started, and a
plugin's own ``ToolError`` keep their answers.
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest

from toolrelay import (
    AuthContext,
    Dispatcher,
    DispatcherOptions,
    ErrorType,
    Profile,
    ToolError,
    ToolRegistry,
)

pytestmark = pytest.mark.anyio

ANY = {"type": "object"}
OPEN = {"open": Profile(require_approval=())}
CHECK = "it may still have taken effect: check before calling it again"


def relay(sync: bool, behaviour: str, *, risk: str = "write", idempotent: bool | None = None):
    registry = ToolRegistry()
    release = threading.Event()

    def act() -> None:
        if behaviour == "crash":
            raise RuntimeError("connection reset after the charge was sent")
        if behaviour == "refuse":
            raise ToolError("payment service 503", retryable=True)

    if sync:

        def handler(args: dict[str, Any], ctx: AuthContext) -> str:
            act()
            if behaviour == "hang":
                release.wait(10)
            return "charged"
    else:

        async def handler(args: dict[str, Any], ctx: AuthContext) -> str:  # type: ignore[misc]
            act()
            if behaviour == "hang":
                await anyio.sleep_forever()
            return "charged"

    # only a hang needs a short deadline: a sync crash or refusal answered after a loaded
    # machine's thread start past 0.1 s would be a timeout
    timeout_s = 0.1 if behaviour == "hang" else 10
    registry.tool(
        name="charge", parameters=ANY, risk=risk, idempotent=idempotent, timeout_s=timeout_s
    )(handler)
    return Dispatcher(registry, DispatcherOptions(profiles=OPEN), audit=None), release


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_a_write_that_times_out_is_not_retryable(sync: bool) -> None:
    dispatcher, release = relay(sync, "hang")
    try:
        result = await dispatcher.dispatch("charge", {}, profile="open")
    finally:
        release.set()
    assert result.error_type is ErrorType.TIMEOUT
    assert result.retryable is False and result.effect_unknown is True
    assert CHECK in result.message
    answer = result.to_model()
    assert answer["retryable"] is False and answer["effect_unknown"] is True


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_a_write_that_crashes_part_way_is_not_retryable(sync: bool) -> None:
    dispatcher, _ = relay(sync, "crash")
    result = await dispatcher.dispatch("charge", {}, profile="open")
    assert result.error_type is ErrorType.TOOL_ERROR
    assert result.retryable is False and result.effect_unknown is True
    assert result.message.startswith("charge failed unexpectedly (RuntimeError)")
    assert CHECK in result.message and "charge was sent" not in result.message


async def test_a_write_stopped_by_the_model_slot_is_not_retryable() -> None:
    dispatcher, _ = relay(False, "hang")
    async with dispatcher.model_slot(budget_s=0.05).hold() as slot:
        result = await dispatcher.dispatch("charge", {}, profile="open", slot=slot)
    assert result.error_type is ErrorType.TIMEOUT and "time budget" in result.message
    assert result.retryable is False and result.effect_unknown is True


async def test_what_is_safe_to_repeat_stays_retryable() -> None:
    """An idempotent tool's timeout, a write that never started, and a plugin's own answer."""
    reader, _ = relay(False, "hang", risk="read")
    timed_out = await reader.dispatch("charge", {})
    assert timed_out.retryable is True and timed_out.effect_unknown is False
    assert "effect_unknown" not in timed_out.to_model()
    declared, _ = relay(False, "hang", idempotent=True)  # a write declared idempotent
    assert (await declared.dispatch("charge", {}, profile="open")).retryable is True
    refused, _ = relay(False, "refuse")  # the plugin knows the charge was not made
    answer = await refused.dispatch("charge", {}, profile="open")
    assert answer.retryable is True and answer.effect_unknown is False
    spent, _ = relay(False, "hang")
    async with spent.model_slot(budget_s=0.01).hold() as slot:
        await anyio.sleep(0.02)  # the budget is spent before the call
        never = await spent.dispatch("charge", {}, profile="open", slot=slot)
    assert never.error_type is ErrorType.TIMEOUT and "not started" in never.message
    assert never.retryable is True and never.effect_unknown is False
