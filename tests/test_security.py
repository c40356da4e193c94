"""Security model: identity, audit log, redaction, per-tenant shares."""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
import pytest

from helpers import OBJ, dispatcher_with, wait_until
from toolrelay import (
    AuthContext,
    BulkheadOptions,
    Dispatcher,
    DispatcherOptions,
    ErrorType,
    KeyPolicy,
    Profile,
    RetryOptions,
    ToolCall,
    ToolDeclaration,
    ToolError,
    ToolRegistry,
)

pytestmark = pytest.mark.anyio

ALICE = AuthContext(user_id="alice", tenant_id="acme")
BOB = AuthContext(user_id="bob", tenant_id="globex")


async def test_a_model_cannot_reach_another_tenants_data_through_arguments() -> None:
    orders = {"acme": ["acme-1"], "globex": ["globex-1"]}
    registry = ToolRegistry()

    @registry.tool(name="list_orders", parameters=OBJ)
    async def list_orders(args: dict[str, Any], ctx: AuthContext) -> list[str]:
        assert ctx.tenant_id is not None
        return orders[ctx.tenant_id]  # identity only from the host's context

    dispatcher = Dispatcher(registry)
    assert (await dispatcher.dispatch("list_orders", "{}", ALICE)).data == ["acme-1"]
    smuggled = await dispatcher.dispatch("list_orders", '{"tenant_id": "globex"}', ALICE)
    assert smuggled.error_type is ErrorType.VALIDATION_ERROR  # no such argument exists
    as_dict = await dispatcher.dispatch("list_orders", {"tenant_id": "globex"}, ALICE)
    assert as_dict.error_type is ErrorType.VALIDATION_ERROR


def audit_dispatcher(**kw: Any) -> tuple[Dispatcher, list[dict[str, Any]]]:
    registry = ToolRegistry()
    for name, risk in (("read_doc", "read"), ("edit_doc", "write"), ("drop_db", "dangerous")):

        async def tool(args: dict[str, Any], ctx: AuthContext) -> str:
            await anyio.sleep(float(args.get("wait", 0)))
            return "done"

        registry.tool(name=name, parameters={"type": "object"}, risk=risk)(tool)  # type: ignore[arg-type]
    records: list[dict[str, Any]] = []
    dispatcher = dispatcher_with(
        registry, audit=records.append, profiles={"reader": Profile(max_risk="read")}, **kw
    )
    return dispatcher, records


async def test_every_risky_call_and_decision_is_audited() -> None:
    async def approver(call: ToolCall, decl: ToolDeclaration, ctx: AuthContext) -> bool:
        return decl.risk == "write"

    dispatcher, records = audit_dispatcher(approver=approver)
    await dispatcher.dispatch("read_doc", "{}", ALICE, call_id="r1")
    await dispatcher.dispatch("edit_doc", '{"secret": "s3cret"}', ALICE, call_id="w1")
    await dispatcher.dispatch("drop_db", "{}", BOB, call_id="d1")
    await dispatcher.dispatch("drop_db", "{}", BOB, call_id="d2", profile="reader")
    assert records == [
        {"tool": "edit_doc", "risk": "write", "call_id": "w1", "user_id": "alice",
         "tenant_id": "acme", "decision": "approved", "outcome": "ok"},
        {"tool": "drop_db", "risk": "dangerous", "call_id": "d1", "user_id": "bob",
         "tenant_id": "globex", "decision": "denied", "outcome": "denied"},
        {"tool": "drop_db", "risk": "dangerous", "call_id": "d2", "user_id": "bob",
         "tenant_id": "globex", "decision": "policy", "outcome": "tool_policy"},
    ]  # fmt: skip
    assert "s3cret" not in json.dumps(records)


async def test_dangerous_tools_are_denied_by_default_and_arguments_are_opt_in() -> None:
    dispatcher, records = audit_dispatcher(audit_arguments=True)
    result = await dispatcher.dispatch("drop_db", '{"table": "users"}', ALICE, call_id="d1")
    assert result.error_type is ErrorType.NEEDS_APPROVAL
    assert records[0]["decision"] == "needs_approval"
    assert records[0]["arguments"] == {"table": "users"}


async def test_cancelled_risky_calls_are_audited() -> None:
    dispatcher, records = audit_dispatcher(approver=lambda *a: True)
    with anyio.move_on_after(0.05):
        await dispatcher.dispatch("edit_doc", '{"wait": 5}', ALICE, call_id="w9")
    assert records[-1]["outcome"] == "cancelled" and records[-1]["decision"] == "approved"


async def test_default_audit_sink_writes_json_lines(caplog: pytest.LogCaptureFixture) -> None:
    registry = ToolRegistry()
    registry.tool(name="edit", parameters=OBJ, risk="write")(lambda a, c: "ok")
    caplog.set_level(logging.INFO, logger="toolrelay.audit")
    await Dispatcher(registry).dispatch("edit", "{}", ALICE, call_id="x")
    (line,) = [r.getMessage() for r in caplog.records if r.name == "toolrelay.audit"]
    assert json.loads(line)["decision"] == "needs_approval"


@pytest.mark.parametrize(
    ("message", "leak"),
    [
        ("GET https://bob:hunter2@api.example.com failed", "hunter2"),
        ("upstream said 401 for Authorization: Bearer abcdef0123456789", "abcdef0123456789"),
        ("retry https://api.example.com/?api_key=XYZ987654&q=1", "XYZ987654"),
        ("key sk-proj-abcdefghijklmnopqrstuvwx is invalid", "abcdefghijklmnopqrstuvwx"),
        ("account acct-123456 is locked", "acct-123456"),
    ],
)
async def test_messages_to_the_model_are_redacted(message: str, leak: str) -> None:
    registry = ToolRegistry()

    @registry.tool(name="call_api", parameters=OBJ)
    async def call_api(args: dict[str, Any], ctx: AuthContext) -> None:
        raise ToolError(message)

    dispatcher = Dispatcher(registry, DispatcherOptions(secret_patterns=[r"acct-\d{6}"]))
    answer = (await dispatcher.dispatch("call_api", "{}")).to_model()
    assert leak not in json.dumps(answer)
    assert "***" in answer["message"]


async def test_one_tenant_cannot_take_every_place_of_a_key() -> None:
    registry = ToolRegistry()
    gate = anyio.Event()
    inside: list[str | None] = []

    @registry.tool(name="slow", parameters=OBJ, breaker_key="crm")
    async def slow(args: dict[str, Any], ctx: AuthContext) -> str:
        inside.append(ctx.tenant_id)
        await gate.wait()
        return "done"

    config = KeyPolicy(
        retry=RetryOptions(max_attempts=1),
        bulkhead=BulkheadOptions(max_concurrent=4, max_concurrent_per_tenant=2),
    )
    dispatcher = Dispatcher(registry, DispatcherOptions(keys={"crm": config}))
    results: list[Any] = []

    async def one(ctx: AuthContext) -> None:
        results.append(await dispatcher.dispatch("slow", "{}", ctx))

    async with anyio.create_task_group() as tg:
        for _ in range(2):
            tg.start_soon(one, ALICE)
        await wait_until(lambda: len(inside) == 2)
        third = await dispatcher.dispatch("slow", "{}", ALICE)
        assert third.error_type is ErrorType.OVERLOADED and "your 2 calls" in third.message
        tg.start_soon(one, BOB)  # another tenant still gets in
        await wait_until(lambda: len(inside) == 3)
        gate.set()
    assert inside == ["acme", "acme", "globex"] and all(r.ok for r in results)
    after = await dispatcher.dispatch("slow", "{}", ALICE)  # shares are given back
    assert after.ok
