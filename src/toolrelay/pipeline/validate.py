"""Validate: JSON Schema 2020-12 validation with the tool's compiled validator."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..contract import ErrorType
from ..jsonlimits import schema_errors
from ..outcome import Outcome, failure
from . import Invocation, Next


class Validate:
    """Arguments that fail the tool's schema → ``validation_error``; the handler never runs.

    The reasons quote property names the model chose: they are redacted like every message
    that carries outside text."""

    __slots__ = ("redact",)

    def __init__(self, redact: Callable[[str], str] | None = None) -> None:
        self.redact = redact

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        assert inv.tool is not None
        validator = inv.tool.validator
        try:
            valid = validator.is_valid(inv.args)
        except (ValueError, TypeError, OverflowError):
            return failure(
                ErrorType.INVALID_ARGUMENTS, "arguments hold values that are not JSON", inv
            )
        if not valid:
            try:
                reasons = schema_errors(validator, inv.args)
            except (ValueError, TypeError, OverflowError):  # e.g. lone surrogates
                return failure(
                    ErrorType.INVALID_ARGUMENTS,
                    "arguments hold text that is not valid Unicode",
                    inv,
                )
            if self.redact is not None:
                reasons = self.redact(reasons)
            return failure(
                ErrorType.VALIDATION_ERROR, "arguments do not match the schema: " + reasons, inv
            )
        return call_next(inv)
