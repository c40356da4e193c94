"""Decode: raw arguments (JSON text, bytes or a mapping) into a dict, within limits
(:mod:`toolrelay.jsonlimits`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..contract import ErrorType
from ..jsonlimits import DEFAULT_MAX_BYTES, DEFAULT_MAX_DEPTH, decode_arguments
from ..outcome import Outcome, failure
from . import Invocation, Next


class Decode:
    """Refuse what is not a JSON object, too large or too deep → ``invalid_arguments``."""

    __slots__ = ("max_bytes", "max_depth", "redact")

    def __init__(
        self,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_depth: int = DEFAULT_MAX_DEPTH,
        redact: Callable[[str], str] | None = None,
    ):
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        self.redact = redact  # a refusal may quote the model's text (a duplicate key's name)

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        args = decode_arguments(inv.raw_args, self.max_bytes, self.max_depth)
        if isinstance(args, str):
            if self.redact is not None:
                args = self.redact(args)
            return failure(ErrorType.INVALID_ARGUMENTS, args, inv)
        return call_next(inv.decoded(args))
