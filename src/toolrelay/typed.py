"""Typed tools: a function's signature turned, once, into a declaration and a caller.

``ToolRegistry.tool`` asks :func:`is_legacy` which calling convention a function uses and,
for a typed one, :func:`typed_tool` for its JSON Schema (pydantic generates it), its
description (the docstring, read with griffe) and a caller ``call(args, ctx)`` that the
pipeline runs like any ``(args, ctx)`` handler. The arguments were already validated by
the tool's jsonschema-rs validator; the caller only converts the parameters whose Python
type differs from their JSON value (a model, a dataclass, an enum, a datetime, an ``int``
sent as ``1.0``…), with pydantic, and injects the ``AuthContext`` and ``CallContext``
parameters. Everything else is worked out here, at registration.
"""

from __future__ import annotations

import functools
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, create_model
from pydantic.fields import FieldInfo
from pydantic_core import PydanticSerializationError, PydanticUndefined, to_jsonable_python

from .contract import AuthContext, CallContext, ErrorType, ToolError
from .handler import ASYNC_MARK, Handler, is_async

__all__ = ["SignatureError", "TypedTool", "is_legacy", "typed_tool"]

_EMPTY = inspect.Parameter.empty
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_NONE = type(None)
_JSON_TYPES: frozenset[type] = frozenset({dict, list, str, int, float, bool, _NONE})
MAX_REPORTED = 3


class SignatureError(ValueError):
    """A signature toolrelay cannot turn into a tool; the message is one line."""


@dataclass(frozen=True, slots=True)
class TypedTool:
    """What a typed function declares, and the ``(args, ctx)`` caller that runs it."""

    parameters: dict[str, Any]
    output_schema: dict[str, Any] | None
    description: str
    call: Handler


# -- which convention ---------------------------------------------------------------------
def _signature(fn: Callable[..., Any]) -> tuple[inspect.Signature | None, bool]:
    """The signature with its annotations evaluated (and True), or as written (and False)
    when one cannot be evaluated; ``None`` when there is none to read (some builtins)."""
    try:
        return inspect.signature(fn, eval_str=True), True
    except (TypeError, ValueError):
        return None, False
    except Exception:  # an annotation names something missing at run time
        return inspect.signature(fn), False


def _parameters(fn: Callable[..., Any], sig: inspect.Signature) -> list[inspect.Parameter]:
    """The parameters a call can fill: those a ``functools.partial`` binds by keyword are
    the host's (a client, a key), never arguments, so they are left out."""
    bound = fn.keywords if isinstance(fn, functools.partial) else {}
    return [p for p in sig.parameters.values() if p.name not in bound]


def _split(annotation: Any) -> tuple[Any, tuple[Any, ...]]:
    """``Annotated[T, m1, m2]`` → ``(T, (m1, m2))``, nested ``Annotated`` flattened."""
    metadata: tuple[Any, ...] = ()
    while get_origin(annotation) is Annotated:
        annotation, *extra = get_args(annotation)
        metadata = (*metadata, *extra)
    return annotation, metadata


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _is_context(annotation: Any, cls: type) -> bool:
    """``cls`` or ``cls | None``."""
    base, _ = _split(annotation)
    if base is cls:
        return True
    return _is_union(base) and {a for a in get_args(base) if a is not _NONE} == {cls}


def _args_like(annotation: Any) -> bool:
    base, _ = _split(annotation)
    return base in (_EMPTY, Any, object) or (get_origin(base) or base) in (
        dict,
        Mapping,
        MutableMapping,
    )


def _ctx_like(annotation: Any) -> bool:
    return annotation in (_EMPTY, Any, object) or _is_context(annotation, AuthContext)


def is_legacy(fn: Callable[..., Any], *, explicit_schema: bool) -> bool:
    """Is ``fn`` an ``fn(args, ctx)`` handler? See ``docs/typed-tools.md`` for the rule.

    With a hand-written schema (``explicit_schema``) it always is, and a signature that
    plainly cannot be one raises :class:`SignatureError`. Without one, it is when it has
    exactly two parameters, both positional, the first unannotated or a mapping (``dict``,
    ``dict[str, Any]``, ``Mapping[…]``, ``Any``) and the second unannotated, ``Any`` or
    ``AuthContext`` (``| None``). Anything else is typed. Parameters a ``functools.partial``
    binds by keyword do not count.
    """
    sig, resolved = _signature(fn)
    if sig is None:
        if explicit_schema:
            return True
        raise SignatureError("its signature cannot be read: give parameters= to register it")
    fits = _fits_args_and_ctx(sig, resolved)
    if explicit_schema:
        if not fits:
            raise SignatureError(
                f"parameters= is given, so it is called as fn(args, ctx), which {sig} cannot "
                "take; leave parameters= out to have the schema inferred from the signature"
            )
        return True
    params = _parameters(fn, sig)
    return fits and len(params) == 2 and all(p.kind in _POSITIONAL for p in params)


def _fits_args_and_ctx(sig: inspect.Signature, resolved: bool) -> bool:
    """Can ``fn(args, ctx)`` bind, to parameters whose annotations (when readable) fit?"""
    try:
        bound = sig.bind(None, None)
    except TypeError:
        return False
    taking = [sig.parameters[name] for name in bound.arguments]
    if not resolved or len(taking) < 2:  # ``*args`` took both
        return True
    return _args_like(taking[0].annotation) and (
        taking[1].kind is inspect.Parameter.VAR_POSITIONAL or _ctx_like(taking[1].annotation)
    )


# -- docstrings ---------------------------------------------------------------------------
_ARGS_HEADER = re.compile(r"^(args|arguments|params|parameters|keyword args):\s*$", re.I)


def _docstring_style(doc: str) -> Literal["google", "numpy", "sphinx"]:
    if re.search(r"^:(param|parameter|arg|argument|type|returns?|rtype|raises?)\b", doc, re.M):
        return "sphinx"
    if re.search(r"^\s*(Parameters|Returns|Yields|Raises)\s*\n\s*-{3,}", doc, re.M):
        return "numpy"
    return "google"


def _blank_before_args(doc: str) -> str:
    """griffe skips a Google ``Args:`` header with no blank line above it."""
    lines = doc.splitlines()
    out: list[str] = []
    for index, line in enumerate(lines):
        if out and out[-1].strip() and _ARGS_HEADER.match(line) and index + 1 < len(lines):
            out.append("")
        out.append(line)
    return "\n".join(out)


def _docstring(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The description (the docstring's first paragraph, lines joined) and each parameter's
    description (Google, NumPy or Sphinx style, parsed by griffe)."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    doc = inspect.getdoc(target)
    if not doc:
        return "", {}
    import griffe  # only typed tools with a docstring need it

    style = _docstring_style(doc)
    options: griffe.DocstringOptions
    if style == "google":
        doc = _blank_before_args(doc)
        options = griffe.GoogleOptions(warnings=False)
    elif style == "numpy":
        options = griffe.NumpyOptions(warnings=False)
    else:
        options = griffe.SphinxOptions(warnings=False)
    sections = griffe.Docstring(doc, lineno=1, parser=style, parser_options=options).parse()
    text = next((s.value for s in sections if s.kind is griffe.DocstringSectionKind.text), "")
    first = str(text).strip().split("\n\n", 1)[0]
    described: dict[str, str] = {}
    for section in sections:
        if isinstance(section, griffe.DocstringSectionParameters):
            for param in section.value:
                described.setdefault(param.name.lstrip("*"), " ".join(param.description.split()))
    return " ".join(first.split()), described


# -- conversion plans ---------------------------------------------------------------------
def _plan(tp: Any) -> tuple[bool, frozenset[type]]:
    """How a JSON value valid for ``tp``'s schema relates to the Python value pydantic makes.

    ``(True, _)``: it already is that value: never convert. ``(False, types)``: a value
    whose type is in ``types`` already is; any other is converted (an empty set: always).
    """
    base, metadata = _split(tp)
    if any(not isinstance(m, annotated_types.BaseMetadata) for m in metadata):
        return False, frozenset()  # a validator or transformer: pydantic must run
    if base in (Any, object):
        return True, _JSON_TYPES
    if base in (str, bool, _NONE, None):
        return True, frozenset({_NONE if base is None else typing.cast(type, base)})
    if base in (int, float):  # JSON Schema's "integer" admits 1.0; "number" admits 1
        return False, frozenset({base})
    origin, args = get_origin(base), get_args(base)
    if origin is Literal:
        kinds = frozenset(type(a) for a in args)
        return kinds <= {str, bool, _NONE}, kinds if kinds <= _JSON_TYPES else frozenset()
    if origin is list and args:
        return _plan(args[0])[0], frozenset()
    if origin is dict and len(args) == 2 and args[0] is str:
        return _plan(args[1])[0], frozenset()
    if _is_union(base):
        plans = [_plan(a) for a in args]
        if all(plain for plain, _ in plans):
            return True, frozenset()
        if any(not plain and not kinds for plain, kinds in plans):
            return False, frozenset()
        return False, frozenset[type]().union(*(kinds for _, kinds in plans))
    return False, frozenset()


def _output_plan(tp: Any) -> bool | None:
    """Is ``tp``'s value JSON already (True), never (False: it holds a model, a dataclass,
    a datetime…), or only as far as the value's own type says (None: ``Any`` inside)?"""
    base, _ = _split(tp)
    if base in (_EMPTY, Any, object):
        return None
    if base in (str, bool, int, float, _NONE, None):
        return True
    origin, args = get_origin(base), get_args(base)
    if origin is Literal:
        return all(type(a) in _JSON_TYPES for a in args)
    if base in (dict, list) or (origin in (dict, list) and not args):
        return None
    if origin is list or (origin is dict and args and args[0] is str):
        return _output_plan(args[-1])
    if _is_union(base):
        plans = [_output_plan(a) for a in args]
        if False in plans:
            return False
        return True if all(plans) else None
    return False


def _dump(value: Any) -> Any:
    """A model, dataclass, enum, datetime… as JSON-safe data (``mode="json"``). What cannot
    be converted is returned as it is, for the shape stage to answer ``invalid_output``."""
    try:
        return to_jsonable_python(value)
    except (PydanticSerializationError, TypeError, ValueError):
        return value


def _dump_foreign(value: Any) -> Any:
    return value if type(value) in _JSON_TYPES else _dump(value)


def _refusal(tool: str, name: str, exc: ValidationError) -> ToolError:
    """A value the schema admitted and pydantic refused (a custom validator, a ``format``
    jsonschema-rs does not check): ``invalid_arguments``, like the schema's own refusals."""
    parts = []
    for index, error in enumerate(exc.errors(include_url=False, include_input=False)):
        if index == MAX_REPORTED:
            parts.append("…")
            break
        path = "/" + "/".join(str(p) for p in (name, *error["loc"]))
        parts.append(f"{path}: {str(error['msg'])[:120]}")
    return ToolError(
        f"arguments do not fit {tool}'s parameter types: " + "; ".join(parts),
        error_type=ErrorType.INVALID_ARGUMENTS,
        counts_as_failure=False,
    )


# -- schemas ------------------------------------------------------------------------------
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "dependentSchemas", "$defs"})
_SCHEMA_ONE = frozenset({"items", "additionalProperties", "not", "if", "then", "else",
                         "contains", "propertyNames", "unevaluatedItems",
                         "unevaluatedProperties"})  # fmt: skip
_SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_DEF = "#/$defs/"


def _refs(node: Any) -> set[str]:
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and ref.startswith(_DEF):
                found.add(ref[len(_DEF) :])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _recursive(defs: dict[str, Any]) -> set[str]:
    """The definitions that reach themselves through ``$ref``s (they must stay ``$defs``)."""
    edges = {name: _refs(body) for name, body in defs.items()}
    cyclic: set[str] = set()
    for start in defs:
        seen: set[str] = set()
        stack = list(edges[start])
        while stack:
            name = stack.pop()
            if name == start:
                cyclic.add(start)
                break
            if name not in seen and name in edges:
                seen.add(name)
                stack.extend(edges[name])
    return cyclic


def _tidy(schema: dict[str, Any], *, close_objects: bool) -> dict[str, Any]:
    """pydantic's schema made for a model to read: ``$defs`` inlined (the recursive ones
    kept), ``title``s dropped, and, with ``close_objects``, every object with
    ``properties`` and no ``additionalProperties`` closed (``false``) — pydantic ignores
    unknown fields of a nested model; the model is told of them instead."""
    defs: dict[str, Any] = schema.get("$defs", {})
    kept = _recursive(defs)

    def walk(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_DEF) and ref[len(_DEF) :] not in kept:
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            return {**walk(defs[ref[len(_DEF) :]]), **walk(siblings)}
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "title" or key == "$defs":
                continue
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {name: walk(sub) for name, sub in value.items()}
            elif key in _SCHEMA_ONE:
                out[key] = walk(value)
            elif key in _SCHEMA_LISTS and isinstance(value, list):
                out[key] = [walk(sub) for sub in value]
            else:
                out[key] = value
        if close_objects and "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out

    result: dict[str, Any] = walk(schema)
    if kept:
        result["$defs"] = {name: walk(defs[name]) for name in sorted(kept)}
    return result


# -- the typed tool -----------------------------------------------------------------------
def _annotated(base: Any, metadata: tuple[Any, ...]) -> Any:
    return typing.cast(Any, Annotated)[(base, *metadata)] if metadata else base


def typed_tool(fn: Callable[..., Any], name: str, description: str | None) -> TypedTool:
    """Infer a typed function's declaration parts and build its caller.

    Raises :class:`SignatureError` for what cannot be a tool's parameters."""
    sig, resolved = _signature(fn)
    if sig is None or not resolved:
        raise SignatureError(
            "its annotations cannot be evaluated (a name imported only for type checking?)"
        )
    summary, described = _docstring(fn)
    fields: dict[str, Any] = {}
    auth: str | None = None
    call: str | None = None
    python_defaults: dict[str, Any] = {}
    for param in _parameters(fn, sig):
        annotation = Any if param.annotation is _EMPTY else param.annotation
        if _is_context(annotation, AuthContext) or _is_context(annotation, CallContext):
            is_auth = _is_context(annotation, AuthContext)
            if (auth if is_auth else call) is not None:
                raise SignatureError(f"more than one parameter is annotated {annotation}")
            if is_auth:
                auth = param.name
            else:
                call = param.name
            continue
        if param.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD and (
            param.kind is not inspect.Parameter.KEYWORD_ONLY
        ):
            raise SignatureError(
                f"parameter {param.name!r} is {param.kind.description}: a tool's arguments "
                "are named (make it a plain or keyword-only parameter)"
            )
        base, metadata = _split(annotation)
        if param.name in described:  # an explicit Field(description=…) overrides it
            metadata = (Field(description=described[param.name]), *metadata)
        python_defaults[param.name] = param.default
        field_type = _annotated(base, metadata)  # its own Field(default=…) may apply
        # ``PydanticUndefined``, not a bare annotation: pydantic would take a name that
        # ``BaseModel`` has (``model_dump``…) as a default, and the parameter as optional
        default = PydanticUndefined if param.default is _EMPTY else param.default
        fields[param.name] = (field_type, default)
    try:
        model = create_model(
            f"{name}_arguments",
            __config__=ConfigDict(extra="forbid", protected_namespaces=()),
            **fields,
        )
        parameters = _tidy(model.model_json_schema(), close_objects=True)
    except Exception as exc:  # pydantic's errors for what it cannot model are many
        raise SignatureError(_first_line(exc)) from exc
    for missing in fields.keys() - model.model_fields.keys():  # pydantic's private names
        raise SignatureError(f"parameter {missing!r} cannot be an argument: rename it")
    for field_name, field in model.model_fields.items():
        if field.alias is not None or field.validation_alias is not None:
            raise SignatureError(f"parameter {field_name!r} has an alias: rename the parameter")

    converters: list[tuple[str, frozenset[type], Callable[[Any], Any]]] = []
    fills: list[tuple[str, Callable[[], Any]]] = []
    for field_name, field in model.model_fields.items():
        tp = _annotated(field.annotation, tuple(field.metadata))
        plain, kinds = _plan(tp)
        if not plain:
            converters.append((field_name, kinds, TypeAdapter(tp).validate_python))
        python_default = python_defaults[field_name]
        if not field.is_required() and (
            python_default is _EMPTY or isinstance(python_default, FieldInfo)
        ):  # pydantic knows a default Python does not: it is filled in per call
            fills.append(
                (field_name, functools.partial(field.get_default, call_default_factory=True))
            )

    output_schema, dump = _output(sig.return_annotation)
    caller = _caller(fn, name, is_async(fn), auth, call, tuple(converters), tuple(fills), dump)
    return TypedTool(
        parameters, output_schema, summary if description is None else description, caller
    )


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _output(annotation: Any) -> tuple[dict[str, Any] | None, Callable[[Any], Any] | None]:
    """The output schema a return annotation implies (objects only: a model, dataclass or
    TypedDict), and how a returned value is made JSON-safe (``None``: it already is)."""
    plan = _output_plan(annotation)
    dump = None if plan else _dump if plan is False else _dump_foreign
    if plan is not False:
        return None, dump
    try:
        schema = TypeAdapter(annotation).json_schema(mode="serialization")
    except Exception as exc:
        raise SignatureError(
            f"its return annotation has no JSON Schema: {_first_line(exc)}"
        ) from exc
    schema = _tidy(schema, close_objects=False)
    return (schema if schema.get("type") == "object" else None), dump


def _caller(
    fn: Callable[..., Any],
    tool: str,
    awaits: bool,
    auth: str | None,
    call: str | None,
    converters: tuple[tuple[str, frozenset[type], Callable[[Any], Any]], ...],
    fills: tuple[tuple[str, Callable[[], Any]], ...],
    dump: Callable[[Any], Any] | None,
) -> Handler:
    """``call(args, ctx)``: the handler the pipeline runs, as lean as the signature allows."""

    def prepare(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
        kwargs = dict(args)
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
    if converters or fills or call is not None:

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
