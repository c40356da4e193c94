"""A typed function turned, once, into a tool's declaration parts and its caller."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import jsonschema_rs
from pydantic import ConfigDict, Field, TypeAdapter, create_model
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from ..contract import AuthContext, CallContext
from ..handler import Handler, is_async
from .convert import caller, converts, dump, input_plan
from .docstrings import docstring
from .schema import tidy
from .signature import (
    EMPTY,
    SignatureError,
    call_parameters,
    is_context,
    modern,
    read_signature,
    split,
)


@dataclass(frozen=True, slots=True)
class TypedTool:
    """What a typed function declares, and the ``(args, ctx)`` caller that runs it."""

    parameters: dict[str, Any]
    output_schema: dict[str, Any] | None
    description: str
    call: Handler


def _annotated(base: Any, metadata: tuple[Any, ...]) -> Any:
    return typing.cast(Any, Annotated)[(base, *metadata)] if metadata else base


def typed_tool(fn: Callable[..., Any], name: str, description: str | None) -> TypedTool:
    """Infer a typed function's declaration parts and build its caller.

    Raises :class:`SignatureError` for what cannot be a tool's parameters."""
    sig, resolved = read_signature(fn)
    if sig is None or not resolved:
        raise SignatureError(
            "its annotations cannot be evaluated (a name imported only for type checking?)"
        )
    summary, described = docstring(fn)
    fields: dict[str, Any] = {}
    injected: dict[type, str] = {}  # AuthContext, CallContext → the parameter given it
    python_defaults: dict[str, Any] = {}
    for param in call_parameters(fn, sig):
        annotation = Any if param.annotation is EMPTY else modern(param.annotation)
        context = next((c for c in (AuthContext, CallContext) if is_context(annotation, c)), None)
        if context is not None:
            if context in injected:
                raise SignatureError(f"more than one parameter is annotated {annotation}")
            injected[context] = param.name
            continue
        if param.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD and (
            param.kind is not inspect.Parameter.KEYWORD_ONLY
        ):
            raise SignatureError(
                f"parameter {param.name!r} is {param.kind.description}: a tool's arguments "
                "are named (make it a plain or keyword-only parameter)"
            )
        base, metadata = split(annotation)
        if param.name in described:  # an explicit Field(description=…) overrides it
            metadata = (Field(description=described[param.name]), *metadata)
        python_defaults[param.name] = param.default
        field_type = _annotated(base, metadata)  # its own Field(default=…) may apply
        # ``PydanticUndefined``, not a bare annotation: pydantic would take a name that
        # ``BaseModel`` has (``model_dump``…) as a default, and the parameter as optional
        default = PydanticUndefined if param.default is EMPTY else param.default
        fields[param.name] = (field_type, default)
    try:
        model = create_model(
            f"{name}_arguments",
            __config__=ConfigDict(extra="forbid", protected_namespaces=()),
            **fields,
        )
        parameters = tidy(model.model_json_schema(), close_objects=True)
    except Exception as exc:  # pydantic's errors for what it cannot model are many
        raise SignatureError(_first_line(exc)) from exc
    nulls = _nullable_defaults(parameters)
    for missing in fields.keys() - model.model_fields.keys():  # pydantic's private names
        raise SignatureError(f"parameter {missing!r} cannot be an argument: rename it")
    converters: list[tuple[str, frozenset[type], Callable[[Any], Any]]] = []
    fills: list[tuple[str, Callable[[], Any]]] = []
    for field_name, field in model.model_fields.items():
        if field.alias is not None or field.validation_alias is not None:
            raise SignatureError(f"parameter {field_name!r} has an alias: rename the parameter")
        tp = _annotated(field.annotation, tuple(field.metadata))
        plain, kinds = input_plan(tp)
        if not plain:
            converters.append((field_name, kinds, TypeAdapter(tp).validate_python))
        python_default = python_defaults[field_name]
        if not field.is_required() and (
            python_default is EMPTY or isinstance(python_default, FieldInfo)
        ):  # pydantic knows a default Python does not: it is filled in per call
            fills.append(
                (field_name, functools.partial(field.get_default, call_default_factory=True))
            )

    output_schema, convert_output = _output(modern(sig.return_annotation))
    run = caller(
        fn, name, is_async(fn), injected.get(AuthContext), injected.get(CallContext),
        tuple(converters), tuple(fills), nulls, convert_output,
    )  # fmt: skip
    return TypedTool(
        parameters, output_schema, summary if description is None else description, run
    )


def _nullable_defaults(parameters: dict[str, Any]) -> tuple[str, ...]:
    """Each optional parameter whose schema refuses ``null`` is made to admit it, meaning
    its default (OpenAI's strict mode makes every property required: ``null`` is how a
    model asks for the default); their names."""
    properties: dict[str, Any] = parameters["properties"]
    optional = [name for name in properties if name not in parameters.get("required", ())]
    errors = jsonschema_rs.validator_for(parameters).iter_errors(dict.fromkeys(optional))
    refused = {str(error.instance_path[0]) for error in errors if error.instance_path}
    for name in refused:
        schema = properties[name]
        outer = {key: schema.pop(key) for key in ("description", "default") if key in schema}
        properties[name] = {"anyOf": [schema, {"type": "null"}], **outer}
    return tuple(name for name in optional if name in refused)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _output(annotation: Any) -> tuple[dict[str, Any] | None, Callable[[Any], Any] | None]:
    """The output schema a return annotation implies (objects only: a model, dataclass or
    TypedDict), and how a returned value is made JSON-safe before its schema is checked
    (``None``: the shape stage converts what it must)."""
    if not converts(annotation):
        return None, None
    try:
        schema = TypeAdapter(annotation).json_schema(mode="serialization")
    except Exception as exc:
        raise SignatureError(
            f"its return annotation has no JSON Schema: {_first_line(exc)}"
        ) from exc
    schema = tidy(schema, close_objects=False)
    return (schema if schema.get("type") == "object" else None), dump
