"""What a typed tool converts per call, worked out once: which arguments pydantic must
turn into their Python type, how a result is made JSON-safe, and the ``(args, ctx)``
caller that does only that."""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any, Literal, get_args, get_origin

import annotated_types
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from ..contract import AuthContext, CallContext, ErrorType, ToolError
from ..handler import ASYNC_MARK, Handler
from ..jsonlimits import failures
from .signature import EMPTY, NONE, is_union, split

_JSON_TYPES: frozenset[type] = frozenset({dict, list, str, int, float, bool, NONE})


def input_plan(tp: Any) -> tuple[bool, frozenset[type]]:
    """How a JSON value valid for ``tp``'s schema relates to the Python value pydantic makes.

    ``(True, _)``: it already is that value: never convert. ``(False, types)``: a value
    whose type is in ``types`` already is; any other is converted (an empty set: always).
    """
    base, metadata = split(tp)
    if any(not isinstance(m, annotated_types.BaseMetadata) for m in metadata):
        return False, frozenset()  # a validator or transformer: pydantic must run
    if base in (Any, object):
        return True, _JSON_TYPES
    if base in (str, bool, NONE, None):
        return True, frozenset({NONE if base is None else typing.cast(type, base)})
    if base in (int, float):  # JSON Schema's "integer" admits 1.0; "number" admits 1
        return False, frozenset({base})
    origin, args = get_origin(base), get_args(base)
    if origin is Literal:
        kinds = frozenset(type(a) for a in args)
        return kinds <= {str, bool, NONE}, kinds if kinds <= _JSON_TYPES else frozenset()
    if origin is list and args:
        return input_plan(args[0])[0], frozenset()
    if origin is dict and len(args) == 2 and args[0] is str:
        return input_plan(args[1])[0], frozenset()
    if is_union(base):
        plans = [input_plan(a) for a in args]
        if all(plain for plain, _ in plans):
            return True, frozenset()
        if any(not plain and not kinds for plain, kinds in plans):
            return False, frozenset()
        return False, frozenset[type]().union(*(kinds for _, kinds in plans))
    return False, frozenset()


def converts(tp: Any) -> bool:
    """Does a value of ``tp`` hold what is not JSON (a model, a dataclass, a datetime…), to
    be converted before its output schema is checked? (Other values the shape stage
    converts where it must.)"""
    base, _ = split(tp)
    if base in (EMPTY, Any, object, dict, list, str, bool, int, float, NONE, None):
        return False
    origin, args = get_origin(base), get_args(base)
    if origin is Literal:
        return any(type(a) not in _JSON_TYPES for a in args)
    if origin in (dict, list) and not args:
        return False
    if origin is list or (origin is dict and args[0] is str):
        return converts(args[-1])
    if is_union(base):
        return any(converts(a) for a in args)
    return True


def dump(value: Any) -> Any:
    """A model, dataclass, enum, datetime… as JSON-safe data (``mode="json"``). What cannot
    be converted is returned as it is, for the shape stage to answer ``invalid_output``."""
    try:
        return to_jsonable_python(value)
    except (PydanticSerializationError, TypeError, ValueError):
        return value


def _refusal(tool: str, name: str, exc: ValidationError) -> ToolError:
    """A value the schema admitted and pydantic refused (a custom validator, a ``format``
    jsonschema-rs does not check): ``invalid_arguments``, like the schema's own refusals."""
    errors = exc.errors(include_url=False, include_input=False)
    return ToolError(
        f"arguments do not fit {tool}'s parameter types: "
        + failures(((name, *e["loc"]), str(e["msg"])) for e in errors),
        error_type=ErrorType.INVALID_ARGUMENTS,
        counts_as_failure=False,
    )


def caller(
    fn: Callable[..., Any],
    tool: str,
    awaits: bool,
    auth: str | None,
    call: str | None,
    converters: tuple[tuple[str, frozenset[type], Callable[[Any], Any]], ...],
    fills: tuple[tuple[str, Callable[[], Any]], ...],
    nulls: tuple[str, ...],
    dump: Callable[[Any], Any] | None,
) -> Handler:
    """``call(args, ctx)``: the handler the pipeline runs, as lean as the signature allows.
    A parameter in ``nulls`` sent as ``null`` gets its default."""

    def prepare(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
        kwargs = dict(args)
        for name in nulls:
            if name in kwargs and kwargs[name] is None:
                del kwargs[name]
        if auth is not None:
            kwargs[auth] = ctx
        if call is not None:
            kwargs[call] = CallContext.current()
        for name, kinds, convert in converters:
            if name in kwargs:
                value = kwargs[name]
                if type(value) not in kinds:
                    try:
                        kwargs[name] = convert(value)
                    except ValidationError as exc:
                        raise _refusal(tool, name, exc) from None
        for name, default in fills:
            if name not in kwargs:
                kwargs[name] = default()
        return kwargs

    run: Handler
    if converters or fills or nulls or call is not None:

        def run(args: dict[str, Any], ctx: AuthContext) -> Any:
            return fn(**prepare(args, ctx))

    elif auth is not None:
        key = auth

        def run(args: dict[str, Any], ctx: AuthContext) -> Any:
            return fn(**args, **{key: ctx})

    else:

        def run(args: dict[str, Any], ctx: AuthContext) -> Any:
            return fn(**args)

    if dump is None:
        if awaits:
            setattr(run, ASYNC_MARK, True)
        return run
    convert_output = dump
    inner = run
    if awaits:

        async def run_async(args: dict[str, Any], ctx: AuthContext) -> Any:
            return convert_output(await inner(args, ctx))

        return run_async

    def run_sync(args: dict[str, Any], ctx: AuthContext) -> Any:
        return convert_output(inner(args, ctx))

    return run_sync
