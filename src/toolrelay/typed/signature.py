"""Which calling convention a function uses (typed, or ``fn(args, ctx)``), and reading
its parameters and their annotations."""

from __future__ import annotations

import functools
import inspect
import sys
import types
import typing
from collections.abc import Callable, Mapping, MutableMapping
from typing import Annotated, Any, NotRequired, Required, Union, get_args, get_origin

import typing_extensions

from ..contract import AuthContext

EMPTY = inspect.Parameter.empty
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
NONE = type(None)


class SignatureError(ValueError):
    """A signature toolrelay cannot turn into a tool; the message is one line."""


def read_signature(fn: Callable[..., Any]) -> tuple[inspect.Signature | None, bool]:
    """The signature with its annotations evaluated (and True), or as written (and False)
    when one cannot be evaluated; ``None`` when there is none to read (some builtins)."""
    try:
        return inspect.signature(fn, eval_str=True), True
    except (TypeError, ValueError):
        return None, False
    except Exception:  # an annotation names something missing at run time
        return inspect.signature(fn), False


def call_parameters(fn: Callable[..., Any], sig: inspect.Signature) -> list[inspect.Parameter]:
    """The parameters a call can fill: those a ``functools.partial`` binds by keyword are
    the host's (a client, a key), never arguments, so they are left out."""
    bound = fn.keywords if isinstance(fn, functools.partial) else {}
    return [p for p in sig.parameters.values() if p.name not in bound]


def split(annotation: Any) -> tuple[Any, tuple[Any, ...]]:
    """``Annotated[T, m1, m2]`` → ``(T, (m1, m2))``, nested ``Annotated`` flattened."""
    metadata: tuple[Any, ...] = ()
    while get_origin(annotation) is Annotated:
        annotation, *extra = get_args(annotation)
        metadata = (*metadata, *extra)
    return annotation, metadata


_MODERN: dict[type, Any] = {}


def modern(tp: Any) -> Any:
    """``tp`` with every ``typing.TypedDict`` in it (nested too) made a
    ``typing_extensions.TypedDict``, which pydantic asks for before Python 3.12."""
    if sys.version_info >= (3, 12):
        return tp
    if typing.is_typeddict(tp) and type(tp).__module__ == "typing":
        if tp not in _MODERN:
            _MODERN[tp] = tp  # a recursive one stays as it is (pydantic names it)
            hints = typing.get_type_hints(tp, include_extras=True)
            fields = {
                name: (Required if name in tp.__required_keys__ else NotRequired)[
                    modern(get_args(hint)[0] if get_origin(hint) in (Required, NotRequired)
                           else hint)
                ]
                for name, hint in hints.items()
            }  # fmt: skip
            made: Any = typing_extensions.TypedDict(tp.__name__, fields)  # type: ignore[misc]
            made.__doc__, made.__module__ = tp.__doc__, tp.__module__
            _MODERN[tp] = made
        return _MODERN[tp]
    args = get_args(tp)
    if not args or get_origin(tp) is typing.Literal:
        return tp
    new = tuple(modern(arg) for arg in args)
    if new == args:
        return tp
    if get_origin(tp) is Annotated:
        return typing.cast(Any, Annotated)[new]
    if is_union(tp):
        return Union[new]  # noqa: UP007 - built from a tuple
    if isinstance(tp, types.GenericAlias):
        return types.GenericAlias(get_origin(tp), new)
    return tp.copy_with(new)


def is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def is_context(annotation: Any, cls: type) -> bool:
    """``cls`` or ``cls | None``."""
    base, _ = split(annotation)
    if base is cls:
        return True
    return is_union(base) and {a for a in get_args(base) if a is not NONE} == {cls}


def _args_like(annotation: Any) -> bool:
    base, _ = split(annotation)
    return base in (EMPTY, Any, object) or (get_origin(base) or base) in (
        dict,
        Mapping,
        MutableMapping,
    )


def _ctx_like(annotation: Any) -> bool:
    return annotation in (EMPTY, Any, object) or is_context(annotation, AuthContext)


def is_legacy(fn: Callable[..., Any], *, explicit_schema: bool) -> bool:
    """Is ``fn`` an ``fn(args, ctx)`` handler? ``docs/typed-tools.md`` ("The rule") says
    when; :class:`SignatureError` for a signature that cannot be one with a hand-written
    schema (``explicit_schema``), or that could be either and is not guessed."""
    sig, resolved = read_signature(fn)
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
    params = call_parameters(fn, sig)
    legacy = fits and len(params) == 2 and all(p.kind in _POSITIONAL for p in params)
    if legacy and all(p.annotation is EMPTY for p in params) and not _named_args_ctx(params):
        raise SignatureError(
            f"{sig} has no annotations, so it could be a typed tool or an (args, ctx) "
            "handler: annotate its parameters for a typed tool, or name them (args, ctx) "
            "or give parameters= for an (args, ctx) handler"
        )
    return legacy


def _named_args_ctx(params: list[inspect.Parameter]) -> bool:
    first, second = (p.name.lstrip("_") for p in params)
    return first in ("args", "arguments") and second in ("ctx", "context", "auth")


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
