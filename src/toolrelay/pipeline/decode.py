"""Decode and validate: raw arguments (JSON text, bytes or a mapping) into a dict, within
limits (:mod:`toolrelay.jsonlimits`), checked by the tool's compiled JSON Schema 2020-12
validator. One stage: the two checks always run back to back, and a stage costs a call."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..contract import ErrorType
from ..jsonlimits import decode_arguments, schema_errors
from ..outcome import Outcome, failure
from . import Invocation, Next


class Decode:
    """Refuse what is not a JSON object, too large or too deep → ``invalid_arguments``;
    arguments that fail the tool's schema → ``validation_error`` (the handler never runs).

    A refusal may quote the model's text (a duplicate key's name, the property names in a
    schema error): it is redacted like every message that carries outside text."""

    __slots__ = ("max_bytes", "max_depth", "redact")

    def __init__(self, max_bytes: int, max_depth: int, redact: Callable[[str], str]) -> None:
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        self.redact = redact

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        tool = inv.tool
        assert tool is not None
        args = decode_arguments(inv.raw_args, self.max_bytes, self.max_depth)
        if isinstance(args, str):
            return failure(ErrorType.INVALID_ARGUMENTS, self.redact(args), inv)
        inv = inv.decoded(args)
        validator = tool.validator
        try:
            valid = validator.is_valid(args)
        except (ValueError, TypeError, OverflowError):
            return failure(
                ErrorType.INVALID_ARGUMENTS, "arguments hold values that are not JSON", inv
            )
        if valid:
            return call_next(inv)
        try:
            reasons = schema_errors(validator, args)
        except (ValueError, TypeError, OverflowError):  # e.g. lone surrogates
            return failure(
                ErrorType.INVALID_ARGUMENTS, "arguments hold text that is not valid Unicode", inv
            )
        return failure(
            ErrorType.VALIDATION_ERROR,
            "arguments do not match the schema: " + self.redact(reasons),
            inv,
        )
