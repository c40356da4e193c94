"""Typed tools: schemas inferred from signatures, keyword arguments, AuthContext and
CallContext by annotation, and the rule that keeps ``(args, ctx)`` handlers unchanged.

Golden files: ``tests/golden/typed/<case>.json`` hold each signature's generated
declaration; ``TOOLRELAY_REGEN_GOLDEN=1 pytest tests/test_typed_tools.py`` rewrites them.
(No ``from __future__ import annotations`` here: the tools below are defined inside test
functions and their annotations name local classes.)
"""

import dataclasses
import datetime
import enum
import functools
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import threading
import time
import typing
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import anyio
import jsonschema_rs
import pytest
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from toolrelay import (
    AuthContext,
    CallContext,
    Dispatcher,
    DispatcherOptions,
    ErrorType,
    KeyPolicy,
    RegistrationError,
    RetryOptions,
    ToolDeclaration,
    ToolError,
    ToolRegistry,
)

GOLDEN = Path(__file__).parent / "golden" / "typed"
REGENERATE = os.environ.get("TOOLRELAY_REGEN_GOLDEN") == "1"
CTX = AuthContext(user_id="u1", tenant_id="t1")


# -- the table of signatures ----------------------------------------------------------------
class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Unit(enum.IntEnum):
    C = 1
    F = 2


@dataclasses.dataclass
class Point:
    x: int
    y: int = 0


class Item(BaseModel):
    """A line of an order."""

    sku: Annotated[str, Field(description="stock keeping unit", pattern="^[A-Z]{3}$")]
    qty: int = Field(1, ge=1)


class Order(BaseModel):
    items: list[Item]
    ship_to: Point | None = None


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str


class Tree(BaseModel):
    label: str
    children: list["Tree"] = []


def scalars(city: str, days: int = 3, metric: bool = True, ratio: float = 0.5) -> dict[str, Any]:
    """Forecast for a city."""
    return {}


def optionals(query: str | None, limit: Optional[int] = None, tags: list[str] = []) -> list[str]:  # noqa: B006, UP045
    return []


def literals(mode: Literal["fast", "exact"], level: Literal[1, 2, 3] = 1) -> str:
    return mode


def enums(color: Color, unit: Unit = Unit.C) -> str:
    return color.value


def annotated(
    city: Annotated[str, Field(description="a city name", min_length=1, max_length=64)],
    days: Annotated[int, Field(ge=1, le=14)] = 3,
    note: str = Field("", description="free text", max_length=100),
) -> str:
    return city


def nested(order: Order, at: Point) -> Item:
    """Place an order."""
    return order.items[0]


def open_model(obj: Open) -> None:
    return None


def recursive(tree: Tree) -> int:
    return 1


def google(city: str, days: int = 3) -> str:
    """Forecast for a city.

    A second paragraph the model does not need.

    Args:
        city: The city, in English.
        days: How many days
            ahead, at most 14.
    """
    return city


def google_tight(city: str) -> str:
    """Forecast for a city.
    Args:
        city: The city.
    """
    return city


def numpy_style(city: str, days: int = 3) -> str:
    """Forecast for a city.

    Parameters
    ----------
    city : str
        The city, in English.
    days : int
        How many days ahead.
    """
    return city


def sphinx_style(city: str) -> str:
    """Forecast for a city.

    :param city: The city, in English.
    """
    return city


def field_wins(city: Annotated[str, Field(description="from Field")]) -> str:
    """Forecast.

    Args:
        city: from the docstring
    """
    return city


def contexts(city: str, auth: AuthContext, call: CallContext, *, units: str = "metric") -> str:
    return city


def when(
    day: datetime.date, at: datetime.datetime | None = None, ref: uuid.UUID | None = None
) -> str:
    return ""


def dataclass_out(x: int) -> Point:
    return Point(x)


def no_parameters() -> str:
    """Say hello."""
    return "hello"


CASES: dict[str, Callable[..., Any]] = {
    f.__name__: f
    for f in (scalars, optionals, literals, enums, annotated, nested, open_model, recursive,
              google, google_tight, numpy_style, sphinx_style, field_wins, contexts, when,
              dataclass_out, no_parameters)
}  # fmt: skip


def declaration(fn: Callable[..., Any]) -> dict[str, Any]:
    registry = ToolRegistry()
    registry.tool()(fn)
    tool = registry.resolve(fn.__name__)
    assert tool is not None
    decl = tool.decl
    return {
        "description": decl.description,
        "parameters": decl.parameters,
        "output_schema": decl.output_schema,
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_generated_schemas_match_golden_files(case: str) -> None:
    got = declaration(CASES[case])
    jsonschema_rs.Draft202012Validator(got["parameters"])  # a valid schema
    path = GOLDEN / f"{case}.json"
    text = json.dumps(got, indent=2, sort_keys=True) + "\n"
    if REGENERATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with TOOLRELAY_REGEN_GOLDEN=1"
    assert json.loads(path.read_text()) == got


def test_every_golden_file_has_a_case() -> None:
    assert {p.stem for p in GOLDEN.glob("*.json")} == set(CASES)


def test_inferred_schemas_are_closed_and_inline() -> None:
    order = declaration(nested)["parameters"]
    assert order["additionalProperties"] is False
    assert order["properties"]["order"]["additionalProperties"] is False  # nested model
    assert order["properties"]["at"]["additionalProperties"] is False  # dataclass
    assert "$defs" not in order and "title" not in json.dumps(order)
    assert order["required"] == ["order", "at"]
    # extra="allow" keeps its open object; a recursive model keeps its $defs
    assert declaration(open_model)["parameters"]["properties"]["obj"]["additionalProperties"]
    tree = declaration(recursive)["parameters"]
    assert set(tree["$defs"]) == {"Tree"}
    validator = jsonschema_rs.Draft202012Validator(tree)
    assert validator.is_valid({"tree": {"label": "a", "children": [{"label": "b"}]}})
    assert not validator.is_valid({"tree": {"label": "a", "children": [{"label": 1}]}})


def test_docstrings_give_the_description_and_argument_descriptions() -> None:
    for fn in (google, numpy_style, sphinx_style, google_tight):
        decl = declaration(fn)
        assert decl["description"] == "Forecast for a city."
        assert decl["parameters"]["properties"]["city"]["description"].startswith("The city")
    assert declaration(google)["parameters"]["properties"]["days"]["description"] == (
        "How many days ahead, at most 14."
    )
    assert declaration(field_wins)["parameters"]["properties"]["city"]["description"] == (
        "from Field"
    )
    registry = ToolRegistry()
    registry.tool(name="explicit", description="Given.")(google)
    tool = registry.resolve("explicit")
    assert tool is not None and tool.decl.description == "Given."


def test_contexts_are_not_arguments_and_outputs_get_schemas() -> None:
    decl = declaration(contexts)
    assert set(decl["parameters"]["properties"]) == {"city", "units"}
    assert declaration(nested)["output_schema"]["properties"]["qty"]["minimum"] == 1
    assert declaration(dataclass_out)["output_schema"]["required"] == ["x"]
    assert declaration(scalars)["output_schema"] is None  # only objects of named shape


# -- which convention -----------------------------------------------------------------------
def convention(fn: Callable[..., Any], **kwargs: Any) -> dict[str, Any]:
    registry = ToolRegistry()
    registry.tool(name="t", **kwargs)(fn)
    tool = registry.resolve("t")
    assert tool is not None
    return dict(tool.decl.parameters)


EMPTY = {"type": "object", "properties": {}, "additionalProperties": False}


def test_legacy_handlers_registered_without_parameters_keep_the_empty_schema() -> None:
    def bare(args, ctx):  # type: ignore[no-untyped-def]
        return args

    def annotated_legacy(args: dict[str, Any], ctx: AuthContext) -> Any:
        return args

    def mapping_legacy(payload: Mapping[str, Any], auth: AuthContext | None) -> Any:
        return payload

    def any_legacy(args: Any, ctx: Any) -> Any:
        return args

    def unresolvable(args: "NotImported", ctx: "AuthContext") -> Any:  # type: ignore[name-defined]  # noqa: F821
        return args

    for fn in (bare, annotated_legacy, mapping_legacy, any_legacy, unresolvable):
        assert convention(fn) == EMPTY, fn.__name__
    assert convention(lambda args, ctx: args) == EMPTY
    assert convention(lambda _args, context: None) == EMPTY


def test_typed_when_the_signature_is_not_args_and_ctx() -> None:
    def add(a: int, b: int) -> int:
        return a + b

    def one_dict_by_keyword(payload: dict[str, Any], *, auth: AuthContext) -> Any:
        return payload

    def three(args: dict[str, Any], ctx: AuthContext, extra: int = 1) -> Any:
        return args

    assert set(convention(add)["properties"]) == {"a", "b"}
    assert set(convention(one_dict_by_keyword)["properties"]) == {"payload"}
    assert set(convention(three)["properties"]) == {"args", "extra"}


def test_explicit_parameters_mean_args_and_ctx() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}

    def add(a: int, b: int) -> int:
        return a + b

    def city(city: str) -> str:
        return city

    for fn in (add, city):
        with pytest.raises(RegistrationError, match="parameters= is given"):
            convention(fn, parameters=schema)

    def star(*parts: Any) -> Any:
        return parts

    def spare(args: dict[str, Any], ctx: AuthContext, extra: int = 1) -> Any:
        return args

    legacy: tuple[Callable[..., Any], ...] = (star, spare, lambda a, c: a)
    for handler in legacy:
        assert convention(handler, parameters=schema) == schema


def test_signatures_that_cannot_be_tools_are_refused() -> None:
    def star_args(*cities: str) -> str:
        return ""

    def star_kwargs(city: str, **rest: str) -> str:
        return ""

    def positional(city: str, /) -> str:
        return ""

    def two_auth(a: AuthContext, b: AuthContext, city: str) -> str:
        return ""

    def unresolved(city: "Missing") -> str:  # type: ignore[name-defined]  # noqa: F821
        return ""

    def not_json(callback: Callable[[int], int]) -> str:
        return ""

    def private(_hidden: int) -> int:
        return 0

    def aliased(city: Annotated[str, Field(alias="town")]) -> str:
        return city

    def two_calls(a: CallContext, b: CallContext | None, city: str) -> str:
        return ""

    def unannotated_pair(a, b):  # type: ignore[no-untyped-def]
        return a + b  # (args, ctx) or a typed add? not guessed

    for fn, why in (
        (star_args, "variadic"),
        (star_kwargs, "variadic"),
        (positional, "positional"),
        (two_auth, "more than one"),
        (two_calls, "more than one"),
        (aliased, "alias"),
        (unresolved, "cannot be evaluated"),
        (not_json, "."),
        (private, "."),
        (unannotated_pair, r"no annotations.*annotate.*\(args, ctx\)"),
        (lambda a, c: a, "no annotations"),
    ):
        with pytest.raises(RegistrationError, match=f"tool 't': .*{why}"):
            convention(fn)


class Stop(typing.TypedDict):
    city: str
    nights: typing.NotRequired[int]


class Trip(typing.TypedDict, total=False):
    stops: list[Stop]
    note: str | None


@pytest.mark.anyio
async def test_typing_typed_dicts_are_accepted_on_every_python() -> None:
    """``typing.TypedDict`` (which pydantic refuses before Python 3.12, asking for
    ``typing_extensions.TypedDict``), nested too, as a parameter and as a return."""

    def plan(trip: Trip, first: Stop | None = None) -> Stop:
        return trip["stops"][0]

    d = registry_with(plan)
    decl = d.registry.resolve("t").decl  # type: ignore[union-attr]
    stop = decl.parameters["properties"]["trip"]["properties"]["stops"]["items"]
    assert stop["required"] == ["city"] and set(stop["properties"]) == {"city", "nights"}
    assert decl.parameters["properties"]["trip"].get("required") is None  # total=False
    assert decl.output_schema is not None and decl.output_schema["required"] == ["city"]
    answer = await d.dispatch("t", {"trip": {"stops": [{"city": "Oslo", "nights": 2}]}}, CTX)
    assert answer.data == {"city": "Oslo", "nights": 2}, answer.to_model()
    refused = await d.dispatch("t", {"trip": {"stops": [{"nights": 2}]}}, CTX)
    assert refused.error_type is ErrorType.VALIDATION_ERROR


@pytest.mark.anyio
async def test_defaulted_parameters_give_a_strict_openai_schema_where_null_means_the_default() -> (
    None
):
    """OpenAI's strict mode makes every property required: a defaulted parameter is also
    nullable, and ``null`` (what a strict model sends for "the default") gets the default."""
    seen: list[tuple[Any, ...]] = []

    def forecast(
        city: str,
        days: Annotated[int, Field(ge=1)] = 3,
        units: Literal["metric", "imperial"] = "metric",
        note: str | None = None,
    ) -> str:
        seen.append((days, units, note))
        return city

    d = registry_with(forecast)
    (chat,) = d.specs(format="openai")
    (responses,) = d.specs(format="openai-responses")
    params = chat["function"]["parameters"]
    assert chat["function"]["strict"] is True and responses["strict"] is True
    assert responses["parameters"] == params
    assert params["required"] == ["city", "days", "units", "note"]
    assert params["properties"]["days"] == {
        "anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
        "default": 3,
    }
    nulls = {"city": "Oslo", "days": None, "units": None, "note": None}
    assert (await d.dispatch("t", nulls, CTX)).data == "Oslo"
    assert (await d.dispatch("t", {"city": "Oslo"}, CTX)).ok  # omitted: as before
    assert seen == [(3, "metric", None)] * 2
    assert (await d.dispatch("t", {"days": None}, CTX)).error_type is ErrorType.VALIDATION_ERROR

    registry = ToolRegistry()  # an optional property that refuses null cannot be strict
    loose = {"type": "object", "properties": {"q": {"type": "string"}},
             "additionalProperties": False}  # fmt: skip
    registry.tool(name="loose", parameters=loose)(lambda args, ctx: None)
    (spec,) = Dispatcher(registry).specs(format="openai")
    assert "strict" not in spec["function"] and spec["function"]["parameters"] == loose


def test_reserved_identity_properties_are_refused_for_typed_tools() -> None:
    def by_argument(user_id: str, city: str) -> str:
        return city

    class Who(BaseModel):
        tenant_id: str

    def nested_identity(who: Who) -> str:
        return ""

    for fn in (by_argument, nested_identity):
        with pytest.raises(RegistrationError, match="identity"):
            convention(fn)


# -- calls ------------------------------------------------------------------------------------
def registry_with(fn: Callable[..., Any], **kwargs: Any) -> Dispatcher:
    registry = ToolRegistry()
    registry.tool(name="t", breaker_key="k", **kwargs)(fn)
    return Dispatcher(registry, DispatcherOptions(telemetry=False), audit=None)


@pytest.mark.anyio
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_arguments_arrive_typed_and_output_comes_back_as_json(sync: bool) -> None:
    seen: dict[str, Any] = {}

    def body(
        order: Order,
        at: Point,
        color: Color,
        day: datetime.date,
        count: int,
        ratio: float,
        auth: AuthContext,
        note: str = Field("none", max_length=10),
        tags: list[str] = Field(default_factory=list),  # noqa: B008
    ) -> Order:
        seen.update(order=order, at=at, color=color, day=day, count=count, ratio=ratio,
                    auth=auth, note=note, tags=tags, thread=threading.current_thread())  # fmt: skip
        return order

    if sync:
        fn: Callable[..., Any] = body
    else:

        async def fn(**kwargs: Any) -> Any:
            return body(**kwargs)

        fn.__signature__ = inspect.signature(body)  # type: ignore[attr-defined]

    d = registry_with(fn)
    raw = json.dumps({"order": {"items": [{"sku": "ABC"}], "ship_to": {"x": 2}}, "at": {"x": 1},
                      "color": "blue", "day": "2025-03-01", "count": 4.0, "ratio": 2})  # fmt: skip
    result = await d.dispatch("t", raw, CTX)
    assert result.to_model() == {
        "ok": True,
        "data": {"items": [{"sku": "ABC", "qty": 1}], "ship_to": {"x": 2, "y": 0}},
    }
    assert seen["order"] == Order(items=[Item(sku="ABC", qty=1)], ship_to=Point(2))
    assert seen["at"] == Point(1) and seen["color"] is Color.BLUE
    assert seen["day"] == datetime.date(2025, 3, 1)
    assert type(seen["count"]) is int and seen["count"] == 4
    assert type(seen["ratio"]) is float and seen["ratio"] == 2.0
    assert seen["auth"] is CTX and seen["note"] == "none" and seen["tags"] == []
    assert (seen["thread"] is threading.main_thread()) is not sync


@pytest.mark.anyio
async def test_schema_refusals_keep_their_messages() -> None:
    registry = ToolRegistry()

    @registry.tool(name="typed")
    async def typed(city: Annotated[str, Field(max_length=64)]) -> str:
        return city

    registry.tool(name="legacy", parameters=registry.resolve("typed").decl.parameters)(  # type: ignore[union-attr]
        lambda args, ctx: args["city"]
    )
    d = Dispatcher(registry, DispatcherOptions(telemetry=False), audit=None)
    for raw in ("{}", '{"city": 3}', '{"city": "x", "extra": 1}', '{"city": "' + "x" * 65 + '"}'):
        typed_answer = (await d.dispatch("typed", raw, CTX)).to_model()
        legacy_answer = (await d.dispatch("legacy", raw, CTX)).to_model()
        assert typed_answer["error_type"] == "validation_error"
        assert typed_answer == legacy_answer


class Person(BaseModel):
    name: str


@pytest.mark.anyio
async def test_a_union_that_fails_names_the_branch_that_came_closest() -> None:
    """An ``Optional``/union argument is refused with the reason of the branch that came
    closest (the non-null one of an ``Optional``), at its path, not "is not valid under any
    of the schemas listed in the 'anyOf' keyword"."""

    def fn(
        days: Annotated[int, Field(ge=1)] | None = None,
        who: Person | None = None,
        code: int | Annotated[str, Field(max_length=2)] = 0,
        flag: int | bool = 0,
    ) -> str:
        return "ran"

    d = registry_with(fn)
    for raw, reason in (
        ('{"days": 0}', "/days: <value> is less than the minimum of 1"),
        ('{"days": "x"}', '/days: <value> is not of type "integer"'),
        ('{"who": {"name": 3}}', '/who/name: <value> is not of type "string"'),
        ('{"who": {}}', '/who: "name" is a required property'),
        ('{"code": "abc"}', "/code: <value> is longer than 2 characters"),
        (
            '{"flag": "x"}',
            '/flag: <value> is not of type "integer"; /flag: <value> is not of type "boolean"',
        ),
    ):
        result = await d.dispatch("t", raw, CTX)
        assert result.error_type is ErrorType.VALIDATION_ERROR, raw
        assert result.message == "arguments do not match the schema: " + reason, raw
    assert (await d.dispatch("t", '{"days": null, "who": {"name": "Ann"}}', CTX)).ok


@pytest.mark.anyio
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_values_the_schema_admits_and_pydantic_refuses_are_invalid_arguments(
    sync: bool,
) -> None:
    ran: list[Any] = []

    def positive(value: int) -> int:
        if value <= 0:
            raise ValueError("must be positive")
        return value

    def body(n: Annotated[int, AfterValidator(positive)], ref: uuid.UUID | None = None) -> int:
        ran.append(n)
        return n

    if sync:
        fn: Callable[..., Any] = body
    else:

        async def fn(
            n: Annotated[int, AfterValidator(positive)], ref: uuid.UUID | None = None
        ) -> int:
            return body(n, ref)

    d = registry_with(fn)
    for raw, where in (
        ('{"n": -1}', "/n: Value error, must be positive"),
        ('{"n": 1, "ref": "nope"}', "/ref"),
    ):
        result = await d.dispatch("t", raw, CTX)
        assert result.error_type is ErrorType.INVALID_ARGUMENTS
        assert result.retryable is False
        assert result.message.startswith("arguments do not fit t's parameter types: " + where)
        assert "Traceback" not in result.message and "nope" not in result.message
    assert ran == []
    assert d.breakers.blocked_for("k") is None
    assert (await d.dispatch("t", '{"n": 2}', CTX)).data == 2


@pytest.mark.anyio
async def test_output_that_breaks_the_inferred_schema_is_invalid_output() -> None:
    async def wrong() -> Item:
        return {"sku": 5}  # type: ignore[return-value]

    class Opaque:
        pass

    async def opaque() -> Any:
        return Opaque()

    for fn in (wrong, opaque):
        result = await registry_with(fn).dispatch("t", "{}", CTX)
        assert result.error_type is ErrorType.INVALID_OUTPUT, result.to_model()


@pytest.mark.anyio
async def test_untyped_returns_of_models_and_dataclasses_are_dumped() -> None:
    async def model(x: int):  # type: ignore[no-untyped-def]
        return Item(sku="ABC", qty=x)

    def many(x: int) -> dict[str, Item]:
        return {"a": Item(sku="ABC", qty=x)}

    def stamp(x: int) -> Any:
        return datetime.date(2025, 1, x)

    assert (await registry_with(model).dispatch("t", '{"x": 2}')).data == {"sku": "ABC", "qty": 2}
    assert (await registry_with(many).dispatch("t", '{"x": 2}')).data == {
        "a": {"sku": "ABC", "qty": 2}
    }
    assert (await registry_with(stamp).dispatch("t", '{"x": 2}')).data == "2025-01-02"


@pytest.mark.anyio
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_call_context_by_annotation_and_current(sync: bool) -> None:
    calls: list[tuple[CallContext, CallContext]] = []

    def body(city: str, call: CallContext) -> str:
        calls.append((call, CallContext.current()))
        if len(calls) == 1:
            raise ToolError("try again", retryable=True)
        return city

    if sync:
        fn: Callable[..., Any] = body
    else:

        async def fn(city: str, call: CallContext) -> str:
            return body(city, call)

    registry = ToolRegistry()
    registry.tool(name="t", breaker_key="k", timeout_s=5)(fn)
    config = KeyPolicy(retry=RetryOptions(backoff_initial_s=0.001, backoff_max_s=0.001))
    d = Dispatcher(registry, DispatcherOptions(telemetry=False, keys={"k": config}), audit=None)
    before = time.monotonic()
    result = await d.dispatch("t", '{"city": "Oslo"}', CTX, call_id="call-7")
    assert result.data == "Oslo" and result.attempts == 2
    assert [c.attempt for c, _ in calls] == [1, 2]
    for given, current in calls:
        assert given == current
        assert (given.tool, given.call_id, given.breaker_key) == ("t", "call-7", "k")
        assert before + 4.5 < given.deadline <= time.monotonic() + 5
        assert 0 < given.time_left <= 5
    with pytest.raises(LookupError):
        CallContext.current()


class SyncPlugin:
    """A plugin (not a typed tool) that reads the running call; ``execute`` runs on a
    worker thread."""

    def __init__(self) -> None:
        self.seen: list[CallContext] = []

    def describe(self) -> list[ToolDeclaration]:
        return [ToolDeclaration("p_sync", "")]

    def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Any:
        self.seen.append(CallContext.current())
        return threading.current_thread().name


class AsyncPlugin(SyncPlugin):
    def describe(self) -> list[ToolDeclaration]:
        return [ToolDeclaration("p_async", "", breaker_key="pk")]

    async def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Any:
        self.seen.append(CallContext.current())
        return threading.current_thread().name


@pytest.mark.anyio
async def test_plugins_get_the_current_call_context() -> None:
    sync_plugin, async_plugin = SyncPlugin(), AsyncPlugin()
    registry = ToolRegistry()
    registry.register(sync_plugin)
    registry.register(async_plugin)
    d = Dispatcher(registry, DispatcherOptions(telemetry=False), audit=None)
    assert (await d.dispatch("p_sync", "{}", CTX, call_id="s")).data != "MainThread"
    assert (await d.dispatch("p_async", "{}", CTX, call_id="a")).data == "MainThread"
    (sync_call,) = sync_plugin.seen
    (async_call,) = async_plugin.seen
    assert (sync_call.tool, sync_call.call_id, sync_call.breaker_key) == ("p_sync", "s", "p_sync")
    assert (async_call.tool, async_call.call_id, async_call.breaker_key) == ("p_async", "a", "pk")
    assert async_call.attempt == sync_call.attempt == 1
    assert 9 < sync_call.time_left <= 10 and 9 < async_call.time_left <= 10


@pytest.mark.anyio
async def test_cancellation_propagates_and_clears_the_call_context() -> None:
    started = anyio.Event()

    async def hang(call: CallContext) -> str:
        started.set()
        await anyio.sleep_forever()
        return ""

    d = registry_with(hang, timeout_s=30)
    answers: list[Any] = []
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            answers.append(await d.dispatch("t", "{}", CTX))

        tg.start_soon(run)
        await started.wait()
        tg.cancel_scope.cancel()
    assert answers == []
    with pytest.raises(LookupError):
        CallContext.current()


@pytest.mark.anyio
async def test_specs_show_the_inferred_declaration() -> None:
    registry = ToolRegistry()
    registry.tool()(google)
    dispatcher = Dispatcher(registry, DispatcherOptions(telemetry=False))
    (spec,) = dispatcher.specs(format="anthropic")
    assert spec["description"] == "Forecast for a city."
    assert spec["input_schema"]["required"] == ["city"]
    (strict,) = dispatcher.specs(format="openai")  # every property required, days nullable
    assert strict["function"]["parameters"]["required"] == ["city", "days"]


@pytest.mark.anyio
async def test_defaults_only_pydantic_knows_are_filled_in() -> None:
    def fill(
        z: int,
        x: Annotated[int, Field(default=7)],
        y: Annotated[list[int], Field(default_factory=list)],
        w: int = Field(5, ge=0),
    ) -> list[Any]:
        y.append(z)
        return [x, y, w]

    d = registry_with(fill)
    assert d.registry.resolve("t").decl.parameters["required"] == ["z"]  # type: ignore[union-attr]
    assert (await d.dispatch("t", '{"z": 1}')).data == [7, [1], 5]
    assert (await d.dispatch("t", '{"z": 2}')).data == [7, [2], 5]  # a fresh list each call
    assert (await d.dispatch("t", '{"z": 2, "x": 1, "w": 0}')).data == [1, [2], 0]


# -- methods, partials, callable objects ---------------------------------------------------
class Weather:
    """A service object whose methods are tools."""

    def __init__(self) -> None:
        self.unit = "C"

    def today(self, city: str) -> str:
        """Today's weather.

        Args:
            city: The city.
        """
        return f"{city}: 4 {self.unit}"

    async def tomorrow(self, city: str, auth: AuthContext) -> str:
        return f"{city}: 5 {self.unit} for {auth.user_id}"


class Doubler:
    """Doubles a number."""

    def __call__(self, n: int) -> int:
        return 2 * n


class AsyncDoubler:
    async def __call__(self, n: int) -> int:
        return 2 * n


def _search(query: str, limit: int = 5, *, api_key: str, region: str = "eu") -> dict[str, Any]:
    return {"query": query, "limit": limit, "key_used": api_key == "sk-secret", "region": region}


async def _search_async(endpoint: str, query: str, *, api_key: str) -> list[str]:
    return [endpoint, query, api_key[:3]]


def _legacy_with_client(args: dict[str, Any], ctx: AuthContext, *, client: str) -> Any:
    return {"args": args, "user": ctx.user_id, "client": client}


@pytest.mark.anyio
async def test_methods_partials_and_callable_objects_are_tools() -> None:
    """A bound method (``self`` is not an argument), a callable object (sync or async), and
    a ``functools.partial``, whose bound arguments are the host's: never in the schema the
    model reads (a bound key must not leak into it), never overridable by the model."""
    service = Weather()
    registry = ToolRegistry()
    registry.tool()(service.today)
    registry.tool()(service.tomorrow)
    registry.tool(name="double")(Doubler())
    registry.tool(name="double_async")(AsyncDoubler())
    registry.tool(name="search")(functools.partial(_search, api_key="sk-secret", region="us"))
    registry.tool(name="search_async")(
        functools.partial(_search_async, "https://search.example", api_key="sk-secret")
    )
    registry.tool(name="legacy")(functools.partial(_legacy_with_client, client="pool-1"))
    d = Dispatcher(registry, DispatcherOptions(telemetry=False), audit=None)

    specs = {s["function"]["name"]: s["function"] for s in d.specs(format="openai")}
    assert "sk-secret" not in json.dumps(specs) and "api_key" not in json.dumps(specs)
    assert specs["today"]["description"] == "Today's weather."
    assert specs["today"]["parameters"]["properties"] == {
        "city": {"type": "string", "description": "The city."}
    }
    assert set(specs["tomorrow"]["parameters"]["properties"]) == {"city"}
    assert specs["double"]["description"] == "Doubles a number."
    assert set(specs["search"]["parameters"]["properties"]) == {"query", "limit"}
    assert specs["search_async"]["parameters"]["required"] == ["query"]
    assert set(specs["search_async"]["parameters"]["properties"]) == {"query"}
    assert specs["legacy"]["parameters"] == EMPTY  # (args, ctx): the bound one does not count

    async def data(name: str, args: dict[str, Any]) -> Any:
        result = await d.dispatch(name, json.dumps(args), CTX)
        assert result.ok, result.to_model()
        return result.data

    assert await data("today", {"city": "Oslo"}) == "Oslo: 4 C"
    assert await data("tomorrow", {"city": "Oslo"}) == "Oslo: 5 C for u1"
    assert await data("double", {"n": 4.0}) == 8
    assert await data("double_async", {"n": 5}) == 10
    assert await data("search", {"query": "q"}) == {
        "query": "q", "limit": 5, "key_used": True, "region": "us"
    }  # fmt: skip
    assert await data("search_async", {"query": "q"}) == ["https://search.example", "q", "sk-"]
    assert await data("legacy", {}) == {"args": {}, "user": "u1", "client": "pool-1"}
    for name, args in (
        ("search", {"query": "q", "api_key": "mine"}),
        ("search", {"query": "q", "region": "cn"}),
        ("search_async", {"query": "q", "endpoint": "https://evil.example"}),
    ):
        refused = await d.dispatch(name, json.dumps(args), CTX)
        assert refused.error_type is ErrorType.VALIDATION_ERROR, refused.to_model()

    for nameless in (functools.partial(_search, api_key="k"), Doubler()):
        with pytest.raises(RegistrationError, match="give name="):
            ToolRegistry().tool()(nameless)


@pytest.mark.anyio
@pytest.mark.filterwarnings("ignore:Field name .* shadows an attribute")
async def test_parameters_named_like_base_model_attributes_are_ordinary_arguments() -> None:
    """pydantic would take ``BaseModel.model_dump`` as the default of a field of that name:
    such a parameter must stay required, and arrive as the model sent it."""

    def clash(model_dump: str, json: int, model_validate: bool, copy: str = "c") -> list[Any]:
        return [model_dump, json, model_validate, copy]

    d = registry_with(clash)
    decl = d.registry.resolve("t").decl  # type: ignore[union-attr]
    assert decl.parameters["required"] == ["model_dump", "json", "model_validate"]
    assert "default" not in decl.parameters["properties"]["model_dump"]
    missing = await d.dispatch("t", '{"json": 1, "model_validate": true}', CTX)
    assert missing.error_type is ErrorType.VALIDATION_ERROR
    full = await d.dispatch("t", '{"model_dump": "d", "json": 1, "model_validate": true}', CTX)
    assert full.data == ["d", 1, True, "c"]


FUTURE_MODULE = """
from __future__ import annotations

import datetime

from pydantic import BaseModel

from toolrelay import AuthContext, CallContext, ToolRegistry

registry = ToolRegistry()


class Stop(BaseModel):
    name: str
    at: datetime.datetime


@registry.tool()
async def plan(stops: list[Stop], note: str | None = None, *, auth: AuthContext,
               call: CallContext) -> Stop:
    return Stop(name=f"{stops[-1].name} for {auth.user_id}", at=stops[-1].at)


def with_local_types():
    class Local(BaseModel):
        v: int

    def local(x: Local) -> int:
        return x.v

    return local
"""


@pytest.mark.anyio
async def test_a_module_with_postponed_annotations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``from __future__ import annotations`` in the tool's module: the string annotations
    are evaluated in it; types local to a function cannot be, and are refused."""
    path = tmp_path / "future_tools.py"
    path.write_text(FUTURE_MODULE)
    spec = importlib.util.spec_from_file_location("future_tools", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "future_tools", module)  # as an import would
    spec.loader.exec_module(module)

    d = Dispatcher(module.registry, DispatcherOptions(telemetry=False), audit=None)
    decl = d.registry.resolve("plan").decl  # type: ignore[union-attr]
    stop = decl.parameters["properties"]["stops"]["items"]
    assert stop["properties"]["at"] == {"type": "string", "format": "date-time"}
    assert stop["additionalProperties"] is False
    assert decl.output_schema is not None
    assert set(decl.output_schema["properties"]) == {"name", "at"}
    raw = '{"stops": [{"name": "Oslo", "at": "2025-03-01T10:00:00Z"}]}'
    result = await d.dispatch("plan", raw, CTX)
    assert result.data == {"name": "Oslo for u1", "at": "2025-03-01T10:00:00Z"}

    with pytest.raises(RegistrationError, match="cannot be evaluated"):
        ToolRegistry().tool()(module.with_local_types())


GRIFFE_PROBE = '''
import sys
from toolrelay import ToolRegistry

registry = ToolRegistry()

def plain(a: int) -> int:
    return a

def told(a: int) -> int:
    """Told."""
    return a

registry.tool()(plain)
before = "griffe" in sys.modules
registry.tool()(told)
print(before, "griffe" in sys.modules)
'''


def test_griffe_is_imported_only_for_a_typed_tool_with_a_docstring() -> None:
    out = subprocess.run(
        [sys.executable, "-c", GRIFFE_PROBE], capture_output=True, text=True, timeout=60
    )
    assert out.stdout.split() == ["False", "True"], out.stderr[-2000:]
