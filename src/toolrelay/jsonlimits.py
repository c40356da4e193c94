"""JSON limits and checks shared by the stages and the gateway.

Arguments in: decoded from text, bytes or a mapping within a size and depth limit
(:func:`decode_arguments`), and :func:`too_big` for any JSON-like value. Raw JSON from an
upstream: how many values it holds, counted before it is decoded (:func:`json_values`,
used by the MCP transports and the first-party plugins). Output out: the
size cap's explicit truncation (:func:`truncated`, :data:`TRUNCATION_MARKER`). Schema
failures summed up in one line (:func:`schema_errors`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from jsonschema_rs import ValidationErrorKind

DEFAULT_MAX_BYTES = 256 * 1024
DEFAULT_MAX_DEPTH = 64


class _Rejected(ValueError):
    pass


def _no_constants(name: str) -> Any:
    raise _Rejected(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Rejected(f"number {text[:20]} is out of range")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Rejected(f"key {key[:40]!r} appears twice")
            seen.add(key)
    return obj


_DECODER = json.JSONDecoder(
    parse_constant=_no_constants, parse_float=_finite_float, object_pairs_hook=_unique_keys
)


def _text_bytes(text: str, budget: float) -> int:
    """UTF-8 size of ``text`` as JSON (quotes included; escapes not counted), exact only
    when it could matter against ``budget``."""
    size = len(text)
    if size * 4 > budget:
        size = len(text.encode("utf-8", "surrogatepass"))
    return size + 2


def _not_json(
    value: Any, limit: int, max_bytes: int | None = None, *, strict: bool = True
) -> str | None:
    """Why a value is not JSON-like, too deep (objects and arrays count, the top object is
    level 1) or, with ``max_bytes``, larger than that as compact JSON; else None.
    ``strict=False`` lets other leaf values through (only depth and size are checked).
    Iterative: no recursion, no copies."""
    budget: float = math.inf if max_bytes is None else max_bytes
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            budget -= _text_bytes(node, budget) + 1  # a comma or colon after it
        elif isinstance(node, Mapping):
            if depth > limit:
                return f"arguments are nested deeper than {limit} levels"
            budget -= 2
            for key, child in node.items():
                if not isinstance(key, str):
                    return "argument names must be strings"
                budget -= _text_bytes(key, budget) + 1
                stack.append((child, depth + 1))
        elif isinstance(node, list):
            if depth > limit:
                return f"arguments are nested deeper than {limit} levels"
            budget -= 2
            stack.extend((child, depth + 1) for child in node)
        elif isinstance(node, float):
            if not math.isfinite(node):
                return "arguments hold a number that is not finite"
            budget -= 8
        elif isinstance(node, int):  # bool included; no str(): huge ints refuse conversion
            budget -= node.bit_length() // 3 + 2
        elif node is not None and strict:
            return f"arguments hold a {type(node).__name__}, which is not JSON"
        else:
            budget -= 5
        if budget < 0:
            return f"arguments are larger than {max_bytes} bytes"
    return None


def too_big(value: Any, max_depth: int, max_bytes: int) -> str | None:
    """Why ``value`` is nested deeper than ``max_depth`` or larger than ``max_bytes`` as
    JSON, else None (leaves that are not JSON pass: only the shape is checked)."""
    problem = _not_json(value, max_depth, max_bytes, strict=False)
    return None if problem is None else problem.replace("arguments are", "it is")


def decode_arguments(raw: Any, max_bytes: int, max_depth: int) -> dict[str, Any] | str:
    """The decoded arguments, or a one-line reason they were refused."""
    if isinstance(raw, str):  # first: the commonest, and a Mapping check is an ABC's
        text = raw
        if len(text) > max_bytes or (
            len(text) * 4 > max_bytes and len(text.encode("utf-8", "surrogatepass")) > max_bytes
        ):
            return f"arguments are larger than {max_bytes} bytes"
    elif isinstance(raw, Mapping):
        problem = _not_json(raw, max_depth, max_bytes)
        if problem is not None:
            return problem
        return raw if isinstance(raw, dict) else dict(raw)
    elif isinstance(raw, bytes | bytearray | memoryview):
        if len(raw) > max_bytes:
            return f"arguments are larger than {max_bytes} bytes"
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            return "arguments are not valid UTF-8"
    elif raw is None:
        return {}
    else:
        return f"arguments must be a JSON object, not {type(raw).__name__}"
    if not text or text.isspace():
        return {}
    try:
        value = _DECODER.decode(text)
    except _Rejected as exc:
        return f"arguments are not valid JSON: {exc}"
    except json.JSONDecodeError as exc:
        return f"arguments are not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    except RecursionError:
        return f"arguments are nested deeper than {max_depth} levels"
    except ValueError as exc:  # e.g. integers longer than Python accepts
        return f"arguments are not valid JSON: {str(exc)[:80]}"
    if not isinstance(value, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
        return f"arguments must be a JSON object, not {kind.get(type(value), 'a number')}"
    if text.count("{") + text.count("[") > max_depth:  # else it cannot be too deep
        problem = _not_json(value, max_depth)  # decoded JSON: only its depth can be wrong
        if problem is not None:
            return problem
    return value


def json_values(message: bytes, limit: int) -> int:
    """How many values ``message`` (JSON) holds, counted as commas, brackets and braces
    outside strings, plus one — exact enough to bound, and linear in C: the strings are only
    cut out when the quick count (which includes them) goes over ``limit``."""
    quick = message.count(b",") + message.count(b"[") + message.count(b"{") + 1
    if quick <= limit:
        return quick
    strings = message.count(b'"') // 2
    if strings > 4 * limit:  # every value has at most a key and itself as strings
        return strings // 2
    plain = message.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(plain.split(b'"')[::2])
    return outside.count(b",") + outside.count(b"[") + outside.count(b"{") + 1


# -- output ----------------------------------------------------------------------------
DEFAULT_MAX_OUTPUT_BYTES = 256 * 1024
TRUNCATION_MARKER = "[truncated by toolrelay]"
ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False)


def truncated(text: str, size: int, cap: int) -> dict[str, object]:
    """``text`` (the output's JSON) cut to fit, with an explicit marker, within ``cap`` bytes."""
    budget = max(0, cap - 100)  # the envelope and the marker
    while True:
        prefix = text.encode("utf-8", "replace")[:budget].decode("utf-8", "ignore")
        data = {"truncated": True, "original_bytes": size, "text": prefix + TRUNCATION_MARKER}
        over = len(ENCODER.encode(data).encode("utf-8", "replace")) - cap
        if over <= 0 or budget == 0:
            return data
        budget = max(0, budget - over)  # escapes (\" \n …) grew it: cut what overshot


# -- schema failures -------------------------------------------------------------------
MAX_REPORTED = 3
_UNIONS = (ValidationErrorKind.AnyOf, ValidationErrorKind.OneOfNotValid)


def failures(errors: Iterable[tuple[Iterable[object], str]]) -> str:
    """Up to three ``(path, reason)`` pairs as ``/a/b: reason`` (reasons cut at 120)."""
    parts = []
    for index, (path, message) in enumerate(errors):
        if index == MAX_REPORTED:
            parts.append("…")
            break
        parts.append(f"/{'/'.join(map(str, path))}: {message[:120]}")
    return "; ".join(parts)


def schema_errors(validator: Any, instance: Any) -> str:
    """Up to three failing paths, each with its (value-masked) reason. A union (``anyOf``,
    ``oneOf``) no branch of which fits says why the closest branch failed, as pydantic
    does, rather than "is not valid under any of the schemas listed"."""
    return failures((e.instance_path, e.message) for e in _closest(validator.iter_errors(instance)))


def _closest(errors: Iterable[Any]) -> Iterator[Any]:
    """Each error, a failed union's replaced by its closest branch's: a branch that took
    the value's type and broke a constraint (the one with the fewest errors), else every
    branch but ``null`` (an ``Optional``'s other branch: "is not of type \"integer\"")."""
    for error in errors:
        if not isinstance(error.kind, _UNIONS):
            yield error
            continue
        branches: list[list[Any]] = [list(branch) for branch in error.kind.context]
        near = [b for b in branches if not all(_wrong_type(e, error.instance_path) for e in b)]
        if near:
            fewest: list[Any] = min(near, key=len)
            yield from _closest(fewest)
        else:
            yield from [e for b in branches for e in b if e.kind.types != ["null"]] or [error]


def _wrong_type(error: Any, path: list[str | int]) -> bool:
    return isinstance(error.kind, ValidationErrorKind.Type) and error.instance_path == path
