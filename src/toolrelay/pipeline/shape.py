"""Shape (on the way out): output must be JSON, within the size cap and its schema."""

from __future__ import annotations

import dataclasses

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
        except (TypeError, ValueError, RecursionError) as exc:
            why = "a value that is not finite" if "Out of range" in str(exc) else "a non-JSON value"
            if isinstance(exc, RecursionError) or "Circular" in str(exc):
                why = "a circular or too deeply nested value"
            return failure(ErrorType.INVALID_OUTPUT, f"{name} returned {why}", out.request)
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
