"""Shape (on the way out): output must be JSON, within the size cap and its schema."""

from __future__ import annotations

import dataclasses

from pydantic_core import to_jsonable_python

from ..contract import ErrorType
from ..jsonlimits import DEFAULT_MAX_OUTPUT_BYTES, ENCODER, schema_errors, truncated
from ..outcome import Outcome, failure
from . import Invocation, Next


class Shape:
    """Not JSON-safe or not matching ``output_schema`` → ``invalid_output``.

    Oversized output is refused (``invalid_output``) or, with ``truncate=True``, replaced by
    ``{"truncated": true, "original_bytes": N, "text": "<prefix>"}`` — never silently.
    """

    __slots__ = ("max_bytes", "truncate")

    def __init__(self, max_bytes: int = DEFAULT_MAX_OUTPUT_BYTES, truncate: bool = False) -> None:
        self.max_bytes = max_bytes
        self.truncate = truncate

    async def __call__(self, call_next: Next, inv: Invocation) -> Outcome:
        out = await call_next(inv)
        if not out.ok:
            return out
        assert inv.tool is not None
        name = inv.tool.decl.name
        try:
            text = ENCODER.encode(out.data)
        except TypeError:  # a date, UUID, model… anywhere: converted as pydantic's JSON mode
            try:
                data = to_jsonable_python(out.data)
                text = ENCODER.encode(data)
            except (TypeError, ValueError, RecursionError) as exc:
                return failure(ErrorType.INVALID_OUTPUT, _why(name, exc, out.data), out.request)
            out = dataclasses.replace(out, data=data)
        except (ValueError, RecursionError) as exc:
            return failure(ErrorType.INVALID_OUTPUT, _why(name, exc, out.data), out.request)
        size = (
            len(text) if len(text) * 4 <= self.max_bytes else len(text.encode("utf-8", "replace"))
        )
        if size > self.max_bytes:
            if not self.truncate:
                return failure(
                    ErrorType.INVALID_OUTPUT,
                    f"{name} returned {size} bytes, over the {self.max_bytes}-byte cap",
                    out.request,
                )
            return dataclasses.replace(out, data=truncated(text, size, self.max_bytes))
        checker = inv.tool.output_validator
        if checker is not None and not checker.is_valid(out.data):
            return failure(
                ErrorType.INVALID_OUTPUT,
                f"{name} returned output that breaks its schema: "
                + schema_errors(checker, out.data),
                out.request,
            )
        return out


def _why(name: str, exc: BaseException, data: object) -> str:
    """Why ``data`` cannot be JSON, naming the path of a value nothing converts."""
    if "Out of range" in str(exc):
        return f"{name} returned a value that is not finite"
    if isinstance(exc, RecursionError) or "ircular" in str(exc) or "ecursion" in str(exc):
        return f"{name} returned a circular or too deeply nested value"
    stack: list[tuple[tuple[object, ...], object]] = [((), data)]
    seen: set[int] = set()
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict | list | tuple):
            if id(node) not in seen:
                seen.add(id(node))
                items = node.items() if isinstance(node, dict) else enumerate(node)
                stack.extend(((*path, key), value) for key, value in reversed(list(items)))
            continue
        try:
            to_jsonable_python(node)
        except (TypeError, ValueError, RecursionError):
            where = f" at /{'/'.join(map(str, path))}" if path else ""
            return f"{name} returned a non-JSON value{where} ({type(node).__name__})"
    return f"{name} returned a non-JSON value"
