"""Properties of ``dispatch`` and ``specs`` over generated input (hypothesis).

Whatever a model sends — any tool name, any raw arguments, any profile name, any caller —
the host gets a well-formed :class:`ToolResult`, never an exception; a handler only ever
sees arguments its schema accepts (checked against the pure-Python ``jsonschema`` package
as an independent oracle); and ``specs()`` lists exactly what ``dispatch()`` lets through.

Both anyio backends run every property (the anyio pytest plugin runs each hypothesis example
in the backend's event loop).
"""

from __future__ import annotations

import json
import re
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import jsonschema
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from helpers import MutablePlugin
from toolrelay import (
    AuthContext,
    BreakerOptions,
    Dispatcher,
    DispatcherOptions,
    ErrorType,
    KeyPolicy,
    Limits,
    Profile,
    RetryOptions,
    ToolCall,
    ToolDeclaration,
    ToolError,
    ToolRegistry,
    ToolResult,
)
from toolrelay.formats import FORMATS

pytestmark = pytest.mark.anyio

MAX_OUTPUT_BYTES = 2048
MESSAGE_CAP = 240
OK_ENVELOPE_BYTES = 32  # {"ok": true, "data": …}
ERROR_ANSWER_BYTES = 1200  # four keys, a ≤ 240-character message, a number

# Answers a model can act on again later; everything else must say retryable: false.
ALWAYS_RETRYABLE = {ErrorType.CIRCUIT_OPEN, ErrorType.OVERLOADED, ErrorType.TIMEOUT}
NEVER_RETRYABLE = {
    ErrorType.INVALID_ARGUMENTS,
    ErrorType.UNKNOWN_TOOL,
    ErrorType.TOOL_POLICY,
    ErrorType.VALIDATION_ERROR,
    ErrorType.NEEDS_APPROVAL,
    ErrorType.DENIED,
    ErrorType.INVALID_OUTPUT,
    ErrorType.INTERNAL_ERROR,
}
# Answered before the handler could run.
CALLER_SIDE = {
    ErrorType.INVALID_ARGUMENTS,
    ErrorType.UNKNOWN_TOOL,
    ErrorType.TOOL_POLICY,
    ErrorType.VALIDATION_ERROR,
    ErrorType.NEEDS_APPROVAL,
    ErrorType.DENIED,
}
SETTINGS = settings(
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)

# -- the tools under test ------------------------------------------------------------------
BOOK = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 40},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "opts": {
            "type": "object",
            "properties": {"metric": {"type": "boolean"}},
            "additionalProperties": False,
        },
        "mode": {"enum": ["fast", "slow"]},
        "note": {"type": ["string", "null"], "maxLength": 20},
    },
    "required": ["city"],
    "additionalProperties": False,
}
ANY_OBJECT = {"type": "object"}
NUMBERS = {
    "type": "object",
    "properties": {"n": {"type": "number", "minimum": -1000, "maximum": 1000}},
    "additionalProperties": {"type": "integer"},
}
FAIL = {
    "type": "object",
    "properties": {"msg": {"type": "string"}, "retry": {"type": "boolean"}},
}
SCHEMAS: dict[str, dict[str, Any]] = {
    "book": BOOK,
    "anything": ANY_OBJECT,
    "legacy": BOOK,
    "numbers": NUMBERS,
    "edit": FAIL,
    "fail": FAIL,
    "sleepy": ANY_OBJECT,
}
ORACLE = {name: jsonschema.Draft202012Validator(schema) for name, schema in SCHEMAS.items()}
TOOL_NAMES = sorted(SCHEMAS)


@dataclass
class Seen:
    """What handlers received during one example, judged by the oracle."""

    calls: list[str] = field(default_factory=list)
    received: list[Any] = field(default_factory=list)
    violations: list[tuple[str, str]] = field(default_factory=list)

    def reset(self) -> None:
        self.calls.clear()
        self.received.clear()
        self.violations.clear()

    def check(self, name: str, args: Any) -> None:
        self.calls.append(name)
        self.received.append(args)
        if not isinstance(args, dict):
            self.violations.append((name, f"args is a {type(args).__name__}"))
            return
        try:
            errors = [e.message for e in ORACLE[name].iter_errors(args)]
        except Exception as exc:  # the oracle could not even read it
            errors = [f"oracle raised {type(exc).__name__}: {exc}"[:200]]
        if errors:
            self.violations.append((name, errors[0][:200]))


SEEN = Seen()


def _build_registry() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(name="book", parameters=BOOK, tags={"travel"}, timeout_s=5)
    async def book(args: dict[str, Any], ctx: AuthContext) -> Any:
        SEEN.check("book", args)
        return args

    @registry.tool(name="anything", parameters=ANY_OBJECT, timeout_s=5)
    async def anything(args: dict[str, Any], ctx: AuthContext) -> Any:
        SEEN.check("anything", args)
        return args

    @registry.tool(name="legacy", parameters=BOOK, breaker_key="old", timeout_s=5)
    def legacy(args: dict[str, Any], ctx: AuthContext) -> Any:
        SEEN.check("legacy", args)
        return {"echo": args}

    @registry.tool(name="numbers", parameters=NUMBERS, timeout_s=5)
    async def numbers(args: dict[str, Any], ctx: AuthContext) -> Any:
        SEEN.check("numbers", args)
        return args

    @registry.tool(name="edit", parameters=FAIL, risk="write", tags={"travel"}, timeout_s=5)
    async def edit(args: dict[str, Any], ctx: AuthContext) -> Any:
        SEEN.check("edit", args)
        return {"edited": args.get("city")}

    @registry.tool(name="fail", parameters=FAIL, breaker_key="flaky", timeout_s=5)
    async def fail(args: dict[str, Any], ctx: AuthContext) -> Any:
        SEEN.check("fail", args)
        message = args.get("msg", "")
        if not message.strip():  # a blank message is pinned separately (see below)
            message = "upstream failed"
        if message.startswith("boom"):
            raise RuntimeError(message)
        raise ToolError(message, retryable=bool(args.get("retry")))

    @registry.tool(name="sleepy", parameters=ANY_OBJECT, breaker_key="slow", timeout_s=0.005)
    async def sleepy(args: dict[str, Any], ctx: AuthContext) -> Any:
        SEEN.check("sleepy", args)
        if args.get("retry"):
            await anyio.sleep(1)  # past the 5 ms deadline: a timeout, then one retry
        return "awake"

    return registry


REGISTRY = _build_registry()
PROFILES = {
    "reader": Profile(max_risk="read"),
    "writer": Profile(allow={"edit", "book"}, require_approval=()),
    "travel": Profile(allow_tags={"travel"}),
    "no_fail": Profile(deny={"fail"}, deny_tags={"nothing"}),
}


def approve_by_user(call: ToolCall, decl: ToolDeclaration, ctx: AuthContext) -> Any:
    """Deterministic in the caller: approves, refuses, raises or answers a non-bool."""
    user = ctx.user_id or ""
    if user.startswith("x"):
        raise RuntimeError("approval service down")
    if user.startswith("n"):
        return "yes"  # not True: must not count as an approval
    return len(user) % 2 == 0


def make_dispatcher(approver: bool) -> Dispatcher:
    return Dispatcher(
        REGISTRY,
        DispatcherOptions(
            profiles=PROFILES,
            default_key=KeyPolicy(
                breaker=BreakerOptions(fail_max=2),
                retry=RetryOptions(max_attempts=2, backoff_initial_s=0.001, backoff_max_s=0.002),
            ),
            limits=Limits(max_output_bytes=MAX_OUTPUT_BYTES),
        ),
        approver=approve_by_user if approver else None,
        metrics_registry=CollectorRegistry(),
        audit=None,
    )


# -- strategies ----------------------------------------------------------------------------
def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Pick a strategy by weight (``st.one_of`` flattens nested choices and evens them out)."""
    total = sum(weight for weight, _ in choices)

    @st.composite
    def pick(draw: st.DrawFn) -> Any:
        roll = draw(st.integers(0, total - 1))
        for weight, strategy in choices:
            if roll < weight:
                return draw(strategy)
            roll -= weight
        raise AssertionError("unreachable")

    return pick()


SURROGATES = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff", "\ud83d"])
CHARS = st.characters(codec=None, exclude_categories=())
TEXT = st.one_of(
    st.text(CHARS, max_size=24),
    st.tuples(st.text(CHARS, max_size=8), SURROGATES, st.text(CHARS, max_size=8)).map("".join),
    st.text(st.sampled_from('\x00\n\r\t\x1b\u202e\u2028\ufeff\ufffe ab"\\{}[]'), max_size=24),
)
FLOATS = st.one_of(*[st.floats(allow_nan=False, allow_infinity=False)] * 3, st.floats())
INTS = st.one_of(st.integers(), st.integers(-(2**70), 2**70), st.sampled_from([10**400, -(2**64)]))
SCALARS = st.one_of(st.none(), st.booleans(), INTS, FLOATS, TEXT)
JSONISH = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12,
)


class Opaque:
    """A value no JSON encoder knows."""


ODD_VALUES = st.one_of(
    JSONISH,
    st.builds(Opaque),
    st.binary(max_size=8),
    st.sets(st.integers(), max_size=3),
    st.tuples(st.integers(), TEXT),
    st.dictionaries(st.one_of(st.integers(), st.none(), st.tuples(st.integers())), JSONISH,
                    min_size=1, max_size=2),
    st.builds(types.MappingProxyType, st.dictionaries(TEXT, JSONISH, max_size=2)),
)  # fmt: skip


def _book_field(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(valid, valid, JSONISH)


NEAR_BOOK = st.fixed_dictionaries(
    {},
    optional={
        "city": _book_field(st.text(CHARS, min_size=1, max_size=40)),
        "days": _book_field(st.integers(1, 14)),
        "tags": _book_field(st.lists(st.text(max_size=5), max_size=3)),
        "opts": _book_field(st.fixed_dictionaries({}, optional={"metric": st.booleans()})),
        "mode": _book_field(st.sampled_from(["fast", "slow"])),
        "note": _book_field(st.one_of(st.none(), st.text(max_size=20))),
        "msg": _book_field(
            st.one_of(st.text(max_size=600), st.sampled_from([239, 240, 241, 600]).map("m".__mul__))
        ),
        "retry": st.booleans(),
        "n": _book_field(st.floats(-1000, 1000)),
        "extra": JSONISH,
    },
)
OBJECTS = weighted((75, NEAR_BOOK), (25, st.dictionaries(TEXT, JSONISH, max_size=5)))


def _duplicate_key_text(obj: dict[str, Any]) -> str:
    pairs = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in obj.items()]
    first = next(iter(obj), "k")
    return "{" + ", ".join([*pairs, f"{json.dumps(first)}: 1"]) + "}"


FORMS = ("text", "text", "text", "mapping", "mapping", "ascii", "bytes", "dup", "cut", "padded")


@st.composite
def encoded(draw: st.DrawFn) -> Any:
    """A generated value in one of the forms a host may hand over, mangled or not."""
    value = draw(weighted((85, OBJECTS), (15, JSONISH)))
    form = draw(st.sampled_from(FORMS))
    text = json.dumps(value, allow_nan=True, ensure_ascii=form == "ascii")
    if form == "bytes":
        return text.encode("utf-8", "surrogatepass")
    if form == "mapping":
        return value
    if form == "dup" and isinstance(value, dict):
        return _duplicate_key_text(value)
    if form == "cut":
        return text[: draw(st.integers(0, max(0, len(text) - 1)))]
    if form == "padded":
        return draw(st.sampled_from(["\ufeff", " \n\t", "\x00", ""])) + text
    return text


def _nested(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {}
    for _ in range(depth):
        node = {"a": node}
    return node


def _cycle() -> dict[str, Any]:
    node: dict[str, Any] = {"city": "x"}
    node["self"] = node
    return node


HOSTILE = st.sampled_from(
    [
        '{"city": "' + "x" * 300_000 + '"}',  # over 256 KiB
        ('{"city": "' + "é" * 70_000 + '"}').encode(),  # under the cap in characters only
        "{" * 100_000,
        "[" * 200_000 + "]" * 200_000,
        '{"a": ' * 70 + "1" + "}" * 70,
        '{"city": ' + "1" * 5000 + "}",
        '{"city": 1e999}',
        '{"city": NaN, "days": Infinity}',
        '{"city": "\\ud800"}',
        '{"city": "\\udfff\\ud800"}',
        b'{"city": "\xed\xa0\x80"}',  # an encoded surrogate is not UTF-8
        b"\xff\xfe{\x00}\x00",
        '{"city": "a", "city": "b"}',
        '{"__proto__": {}, "constructor": 1}',
        "\x00",
        "null",
        "[]",
        '"{}"',
        _nested(70),
        _nested(64),
        _cycle(),
        {"city": "x" * 400_000},
        {"tags": ["x"] * 100_000},
        types.MappingProxyType({"city": "Oslo"}),
    ]
)
BLOBS = st.builds(
    lambda n, char, form: form(json.dumps({"blob": char * n}, ensure_ascii=False)),
    st.sampled_from([500, 1000, 2000, 2030, 2040, 2100, 5000, 40_000]),
    st.sampled_from(["x", "é", '"', "𝄞", "\\"]),
    st.sampled_from([str, str.encode]),
)  # arguments around the output cap, for the echoing tools
RAW_ARGS = weighted(
    (52, encoded()),
    (8, BLOBS),
    (8, HOSTILE),
    (5, st.text(CHARS, max_size=50)),
    (5, st.binary(max_size=50)),
    (2, st.none()),
    (5, st.one_of(INTS, FLOATS, st.lists(st.integers(), max_size=3), st.builds(Opaque))),
    (15, st.dictionaries(st.one_of(TEXT, TEXT, st.integers()), ODD_VALUES, max_size=4)),
)
NAMES = weighted(
    (75, st.sampled_from(TOOL_NAMES)),
    (
        10,
        st.sampled_from(["", " ", "book ", "BOOK", "book\x00", "b" * 65, "x" * 100_000, "../book"]),
    ),
    (15, TEXT),
)
PROFILE_NAMES = weighted((50, st.none()), (40, st.sampled_from(sorted(PROFILES))), (10, TEXT))
CONTEXTS = st.builds(
    AuthContext,
    user_id=weighted(
        (60, st.sampled_from(["alice", "bob", "xavier", "nina"])), (20, st.none()), (20, TEXT)
    ),
    tenant_id=st.one_of(st.none(), TEXT),
    roles=st.frozensets(TEXT, max_size=3),
    attributes=st.dictionaries(TEXT, JSONISH, max_size=3),
)


# -- what every answer must look like ------------------------------------------------------
def _is_json(value: Any, depth: int = 0) -> bool:
    """Strict JSON data: str keys, finite floats, no foreign types."""
    if depth > 200:
        return False
    if value is None or isinstance(value, bool | int | str):
        return True
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    if isinstance(value, list):
        return all(_is_json(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v, depth + 1) for k, v in value.items())
    return False


def assert_well_formed(result: Any) -> dict[str, Any]:
    assert isinstance(result, ToolResult), type(result)
    assert result.ok is (result.error_type is None)
    if result.error_type is not None:
        assert type(result.error_type) is ErrorType
        assert result.error_type in set(ErrorType)
    answer = result.to_model()
    text = json.dumps(answer, allow_nan=False)  # raises on NaN/Infinity or foreign values
    assert json.loads(text)["ok"] is result.ok
    size = len(json.dumps(answer, allow_nan=False, ensure_ascii=False).encode("utf-8", "replace"))
    if result.ok:
        assert set(answer) == {"ok", "data"}
        data = json.dumps(answer["data"], allow_nan=False, ensure_ascii=False)
        assert len(data.encode("utf-8", "replace")) <= MAX_OUTPUT_BYTES  # the cap, exactly
        assert size <= MAX_OUTPUT_BYTES + OK_ENVELOPE_BYTES, size
        return answer
    assert {"ok", "error_type", "message", "retryable"} <= set(answer)
    assert set(answer) <= {"ok", "error_type", "message", "retryable", "retry_after_s"}
    message = answer["message"]
    assert isinstance(message, str) and message
    assert "\n" not in message and "\r" not in message
    assert "Traceback" not in message
    assert len(message) <= MESSAGE_CAP, len(message)
    assert size <= ERROR_ANSWER_BYTES, size
    if result.error_type in ALWAYS_RETRYABLE:
        assert answer["retryable"] is True
    if result.error_type in NEVER_RETRYABLE:
        assert answer["retryable"] is False
    if "retry_after_s" in answer:
        assert answer["retry_after_s"] >= 0
    return answer


def _non_json_mapping(raw: Any) -> bool:
    return isinstance(raw, Mapping) and not (isinstance(raw, dict) and _is_json_safe(raw))


SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _has_surrogate(value: Any) -> bool:
    """Does this value (text, bytes or data) carry a lone surrogate, escaped or not?"""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogatepass") if _utf8ish(value) else ""
    if isinstance(value, str):
        return bool(SURROGATE_ESCAPE.search(value)) or any(
            0xD800 <= ord(c) <= 0xDFFF for c in value
        )
    try:
        return _has_surrogate(json.dumps(value, ensure_ascii=True, default=repr))
    except (ValueError, RecursionError):
        return False


def _utf8ish(data: bytes) -> bool:
    try:
        data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return False
    return True


def _is_json_safe(raw: Any) -> bool:
    try:
        return _is_json(raw)
    except RecursionError:
        return False


# -- properties ------------------------------------------------------------------------------
@settings(SETTINGS, max_examples=300)
@given(
    calls=st.lists(st.tuples(NAMES, RAW_ARGS, PROFILE_NAMES), min_size=1, max_size=4),
    ctx=CONTEXTS,
    with_approver=st.booleans(),
)
async def test_dispatch_always_answers_within_the_contract(
    calls: list[tuple[str, Any, str | None]], ctx: AuthContext, with_approver: bool
) -> None:
    dispatcher = make_dispatcher(with_approver)
    for name, raw, profile in calls:
        SEEN.reset()
        note(f"dispatch({name!a:.120}, {raw!a:.400}, {ctx!a:.200}, profile={profile!a:.60})")
        result = await dispatcher.dispatch(name, raw, ctx, profile=profile, call_id="c1")
        note(f"-> {result!a:.600}")
        event(f"answer: {result.error_type or 'ok'}")
        if result.error_type is ErrorType.INVALID_ARGUMENTS:
            event(f"invalid: {result.message[:30]}")
        assert_well_formed(result)
        assert SEEN.violations == [], SEEN.violations  # the handler saw only valid arguments
        ran = list(SEEN.calls)
        assert len(ran) <= 2  # one attempt, one retry at most (max_attempts=2)
        if result.error_type in CALLER_SIDE:
            assert ran == [], (result.error_type, ran)
        if ran:
            assert ran[0] == name and name in SCHEMAS
            if isinstance(raw, str | bytes):  # text arguments reach a handler as strict JSON
                assert all(_is_json(args) for args in SEEN.received), SEEN.received
            chosen = dispatcher.profile(profile)
            decl = REGISTRY.resolve(name)
            assert decl is not None and chosen.permits(decl.decl)
            if chosen.needs_approval(decl.decl):  # risky tools run only when approved
                assert with_approver and approve_by_user(ToolCall(name), decl.decl, ctx) is True
        # our tools are declared well: nothing a caller sends is toolrelay's own error
        assert result.error_type is not ErrorType.INTERNAL_ERROR, (name, raw, result)
        if isinstance(raw, str | bytes):
            size = len(raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass"))
            if size > 256 * 1024:  # the size cap holds for text and bytes alike
                assert ran == []
                assert result.error_type in (
                    ErrorType.INVALID_ARGUMENTS,
                    ErrorType.UNKNOWN_TOOL,
                    ErrorType.TOOL_POLICY,
                ), result


@settings(SETTINGS, max_examples=80)
@given(
    value=NEAR_BOOK,
    form=st.sampled_from(["text", "bytes", "mapping"]),
    name=st.sampled_from(["book", "legacy", "edit"]),
)
async def test_the_oracle_and_the_validator_agree(value: Any, form: str, name: str) -> None:
    """The other half of the oracle check: what the oracle accepts reaches the handler
    unchanged; what it refuses is a validation_error and never runs."""
    if not _is_json(value):
        return  # NaN/Infinity and friends: the decode stage's business, covered above
    raw: Any = value
    if form == "text":
        raw = json.dumps(value)
        value = json.loads(raw)  # a JSON round trip joins an escaped surrogate pair
    elif form == "bytes":
        try:
            raw = json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return  # a lone surrogate cannot be UTF-8: invalid_arguments, not ours here
        value = json.loads(raw)
    dispatcher = make_dispatcher(approver=True)
    SEEN.reset()
    note(f"dispatch({name!a}, {raw!a:.400})")
    result = await dispatcher.dispatch(name, raw, AuthContext(user_id="al"))
    note(f"-> {result!a:.600}")
    assert_well_formed(result)
    if ORACLE[name].is_valid(value):
        assert SEEN.calls == [name], (value, result)
        assert SEEN.received == [value]
        assert result.ok or result.error_type is ErrorType.INVALID_OUTPUT, result
    else:
        assert SEEN.calls == []
        if _has_surrogate(value):
            # jsonschema-rs cannot read some lone surrogates: invalid_arguments ("not JSON")
            assert result.error_type in (
                ErrorType.VALIDATION_ERROR,
                ErrorType.INVALID_ARGUMENTS,
            ), (value, result)
        else:
            assert result.error_type is ErrorType.VALIDATION_ERROR, (value, result)


# -- specs() and dispatch() agree ------------------------------------------------------------
RISKS = ("read", "write", "dangerous")
TAGS = ("a", "b", "c")
TOOL_NAME = st.text("abcdefgh_-", min_size=1, max_size=6)


@dataclass(frozen=True)
class ToolSpec:
    name: str
    risk: str
    tags: frozenset[str]
    via_plugin: bool
    key: str


TOOL_SETS = st.lists(
    st.builds(
        ToolSpec,
        name=TOOL_NAME,
        risk=st.sampled_from(RISKS),
        tags=st.frozensets(st.sampled_from(TAGS)),
        via_plugin=st.booleans(),
        key=st.sampled_from(["k1", "k2", "k3"]),
    ),
    min_size=1,
    max_size=7,
    unique_by=lambda t: t.name,
)


def _names_or_none(pool: list[str]) -> st.SearchStrategy[frozenset[str] | None]:
    return st.one_of(st.none(), st.frozensets(st.sampled_from(pool)))


@st.composite
def profiles_for(draw: st.DrawFn, names: list[str]) -> Profile:
    pool = [*names, "ghost"]
    return Profile(
        allow=draw(_names_or_none(pool)),
        deny=draw(st.frozensets(st.sampled_from(pool))),
        allow_tags=draw(_names_or_none([*TAGS, "z"])),
        deny_tags=draw(st.frozensets(st.sampled_from([*TAGS, "z"]))),
        max_risk=draw(st.sampled_from(RISKS)),
        require_approval=draw(st.frozensets(st.sampled_from(RISKS))),
    )


def documented_permits(profile: Profile, tool: ToolSpec) -> bool:
    """The rule as Profile's docstring states it, written out independently."""
    if tool.name in profile.deny or tool.tags & profile.deny_tags:
        return False
    if RISKS.index(tool.risk) > RISKS.index(profile.max_risk):
        return False
    if profile.allow is None and profile.allow_tags is None:
        return True
    return tool.name in (profile.allow or ()) or bool(tool.tags & (profile.allow_tags or set()))


def _spec_name(spec: dict[str, Any]) -> str:
    name = spec["function"]["name"] if "function" in spec else spec["name"]
    assert isinstance(name, str)
    return name


def approve_even(call: ToolCall, decl: ToolDeclaration, ctx: AuthContext) -> Any:
    """Approves even-length names; answers a truthy "yes" (not an approval) for some others."""
    size = len(decl.name)
    return True if size % 2 == 0 else ("yes" if size % 3 == 0 else False)


@settings(SETTINGS, max_examples=120)
@given(data=st.data(), tools=TOOL_SETS, with_approver=st.booleans())
async def test_specs_and_dispatch_agree_for_every_profile(
    data: st.DataObject, tools: list[ToolSpec], with_approver: bool
) -> None:
    names = [t.name for t in tools]
    profile = data.draw(profiles_for(names), label="profile")
    opened = data.draw(st.frozensets(st.sampled_from(["k1", "k2", "k3"])), label="open keys")
    registry = ToolRegistry()
    ran: list[str] = []
    plugin = MutablePlugin([])

    def handler_for(tool: ToolSpec) -> Callable[[dict[str, Any], AuthContext], Any]:
        async def run(args: dict[str, Any], ctx: AuthContext) -> str:
            ran.append(tool.name)
            return tool.name

        return run

    for tool in tools:
        if tool.via_plugin:
            plugin.decls.append(
                ToolDeclaration(
                    tool.name, f"{tool.name} tool", {"type": "object"}, risk=tool.risk,  # type: ignore[arg-type]
                    tags=tool.tags, breaker_key=tool.key,
                )
            )  # fmt: skip
        else:
            registry.tool(
                name=tool.name, parameters={"type": "object"}, risk=tool.risk,  # type: ignore[arg-type]
                tags=tool.tags, breaker_key=tool.key,
            )(handler_for(tool))  # fmt: skip
    if plugin.decls:
        registry.register(plugin)
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(profiles={"p": profile}),
        approver=approve_even if with_approver else None,
        metrics_registry=CollectorRegistry(),
        audit=None,
    )
    for key in opened:
        dispatcher.breakers.force_open(key)

    expected = {t.name for t in tools if documented_permits(profile, t)}
    listings = {
        fmt: [_spec_name(s) for s in dispatcher.specs("p", fmt, unavailable="show")]
        for fmt in FORMATS
    }
    for fmt, listed in listings.items():
        assert len(listed) == len(set(listed)), (fmt, listed)  # no tool listed twice
        assert set(listed) == expected, (fmt, sorted(listed), sorted(expected))
    shown = {_spec_name(s) for s in dispatcher.specs("p")}
    assert shown == {t.name for t in tools if t.name in expected and t.key not in opened}
    assert {_spec_name(s) for s in dispatcher.specs("never-defined", unavailable="show")} == set()
    assert {_spec_name(s) for s in dispatcher.specs(None, unavailable="show")} == set(names)

    note(f"tools={tools!r}, approver={with_approver}")
    for tool in tools:
        ran.clear()
        plugin.calls.clear()
        result = await dispatcher.dispatch(tool.name, "{}", profile="p", call_id=tool.name)
        assert_well_formed(result)
        is_listed = tool.name in expected
        callable_ = result.error_type not in (ErrorType.TOOL_POLICY, ErrorType.UNKNOWN_TOOL)
        assert callable_ is is_listed, (tool, result.error_type)
        approval = tool.risk in profile.require_approval
        want: ErrorType | None = None  # pipeline order: policy, fast-fail, then approval
        if not is_listed:
            want = ErrorType.TOOL_POLICY
        elif tool.key in opened:
            want = ErrorType.CIRCUIT_OPEN
        elif approval and not with_approver:
            want = ErrorType.NEEDS_APPROVAL
        elif approval and len(tool.name) % 2:
            want = ErrorType.DENIED
        assert result.error_type is want, (tool, profile, result)
        handled = ran + [c[0] for c in plugin.calls]
        assert handled == ([tool.name] if want is None else [])
        unlisted = await dispatcher.dispatch(tool.name, "{}", profile="never-defined")
        assert unlisted.error_type is ErrorType.TOOL_POLICY
    unknown = await dispatcher.dispatch("ghost", "{}", profile="p")
    assert unknown.error_type is ErrorType.UNKNOWN_TOOL


# -- bugs these tests found (fixed) ---------------------------------------------------
SECRETISH = "token=a " * 60


async def test_redaction_never_lengthens_a_message_past_the_cap() -> None:
    registry = ToolRegistry()

    @registry.tool(name="leaky", parameters=ANY_OBJECT)
    async def leaky(args: dict[str, Any], ctx: AuthContext) -> Any:
        raise ToolError(SECRETISH)  # e.g. an upstream's error page quoted back

    result = await Dispatcher(registry, metrics_registry=CollectorRegistry()).dispatch("leaky")
    assert result.error_type is ErrorType.TOOL_ERROR
    assert "a token" not in result.message  # redacted…
    assert len(result.message) <= MESSAGE_CAP, len(result.message)  # …and still capped


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), b"bytes", {1, 2}, (1, 2), {1: "int key"}, Opaque()],
    ids=["nan", "inf", "bytes", "set", "tuple", "int-key", "object"],
)
async def test_mapping_arguments_with_non_json_values_are_refused(value: Any) -> None:
    received: list[dict[str, Any]] = []
    registry = ToolRegistry()

    @registry.tool(name="free", parameters=ANY_OBJECT)
    async def free(args: dict[str, Any], ctx: AuthContext) -> str:
        received.append(args)
        return "ran"

    dispatcher = Dispatcher(registry, metrics_registry=CollectorRegistry())
    result = await dispatcher.dispatch("free", {"x": value})
    assert received == [], "the handler received arguments that are not JSON"
    assert result.error_type is ErrorType.INVALID_ARGUMENTS


@pytest.mark.parametrize(
    "raw",
    [
        '{"city": "\\ud800\\ud800\\ud800\\ud800"}',  # too long, holds lone surrogates
        '{"city": 1, "extra": "\\udfff"}',  # wrong type next to a surrogate
        '{"city": ["\\ud800"]}',
        {"city": 1, "opts": {"metric": Opaque()}},  # a host mapping with a foreign value
    ],
    ids=["surrogate-too-long", "surrogate-beside", "surrogate-in-array", "mapping-object"],
)
async def test_arguments_failing_the_schema_never_answer_internal_error(raw: Any) -> None:
    registry = ToolRegistry()
    strict = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 3},
            "opts": {"type": "object", "properties": {"metric": {"type": "boolean"}}},
        },
        "additionalProperties": False,
    }
    registry.tool(name="t", parameters=strict)(lambda args, ctx: "ran")
    dispatcher = Dispatcher(registry, metrics_registry=CollectorRegistry())
    result = await dispatcher.dispatch("t", raw)
    assert result.error_type in (ErrorType.INVALID_ARGUMENTS, ErrorType.VALIDATION_ERROR), result


@pytest.mark.parametrize("char", ["é", "𝄞", '"'])
async def test_truncated_output_fits_the_cap(char: str) -> None:
    registry = ToolRegistry()

    @registry.tool(name="big", parameters=ANY_OBJECT)
    async def big(args: dict[str, Any], ctx: AuthContext) -> Any:
        return {"text": char * 5000}

    cap = 1000
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(limits=Limits(max_output_bytes=cap, truncate_output=True)),
        metrics_registry=CollectorRegistry(),
    )
    result = await dispatcher.dispatch("big", "{}")
    assert result.ok and result.data["truncated"] is True
    data = json.dumps(result.data, ensure_ascii=False).encode("utf-8")
    assert len(data) <= cap, len(data)


@pytest.mark.parametrize("blank", ["", "   ", "\n\t"])
async def test_a_blank_tool_error_message_still_tells_the_model_something(blank: str) -> None:
    registry = ToolRegistry()

    @registry.tool(name="mute", parameters=ANY_OBJECT)
    async def mute(args: dict[str, Any], ctx: AuthContext) -> Any:
        raise ToolError(blank)

    result = await Dispatcher(registry, metrics_registry=CollectorRegistry()).dispatch("mute")
    assert result.error_type is ErrorType.TOOL_ERROR
    assert result.message.strip(), "the model is told nothing"


async def test_a_failing_audit_sink_does_not_hide_that_a_write_happened() -> None:
    ran: list[str] = []
    registry = ToolRegistry()

    @registry.tool(name="pay", parameters=ANY_OBJECT, risk="write")
    async def pay(args: dict[str, Any], ctx: AuthContext) -> str:
        ran.append("paid")
        return "paid"

    def sink(record: dict[str, Any]) -> None:
        raise OSError("audit disk full")

    dispatcher = Dispatcher(
        registry, approver=lambda *a: True, audit=sink, metrics_registry=CollectorRegistry()
    )
    result = await dispatcher.dispatch("pay", "{}")
    assert ran == ["paid"]
    assert result.ok, result  # the payment was made: "internal_error" invites a second one
