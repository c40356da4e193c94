"""``map_mcp_errors()``: what an MCP request raises, in toolrelay's terms, by error code."""

from __future__ import annotations

import pytest

pytest.importorskip("mcp", reason="needs the MCP SDK: pip install 'toolrelay[mcp]'")
import anyio
import mcp.types as mcp_types
from mcp import MCPError
from pydantic import BaseModel, ValidationError

from toolrelay.sources.errors import (
    MESSAGE_TOO_LARGE,
    AnswerTooLarge,
    Disconnected,
    McpCallError,
    NotAToolResult,
    Refused,
    closed,
    map_mcp_errors,
    unreadable,
)
from toolrelay.sources.limits import too_large, too_many


def mapped(exc: BaseException) -> McpCallError:
    with pytest.raises(McpCallError) as caught, map_mcp_errors():
        raise exc
    return caught.value


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (MCPError(MESSAGE_TOO_LARGE, too_large(1024)), AnswerTooLarge),  # stdio's refusal
        (MCPError(MESSAGE_TOO_LARGE, too_many(100)), AnswerTooLarge),
        (MCPError(mcp_types.PARSE_ERROR, f"Failed to parse JSON response: {too_large(9)}"),
         AnswerTooLarge),  # HTTP: the SDK's code, our text
        (MCPError(mcp_types.CONNECTION_CLOSED,
                  "SSE stream failed: event exceeded the 1024 byte limit"), AnswerTooLarge),
        (unreadable(), NotAToolResult),
        (closed(), Disconnected),
        (MCPError(mcp_types.INVALID_REQUEST, "Session terminated"), Disconnected),
        (MCPError(-32001, "Session not found"), Disconnected),
        (MCPError(mcp_types.PARSE_ERROR, "Failed to parse JSON response: nope"), Refused),
        (MCPError(mcp_types.INVALID_REQUEST, "bad request"), Refused),
    ],
)  # fmt: skip
def test_mcp_errors_map_by_code(error: MCPError, kind: type[McpCallError]) -> None:
    assert type(mapped(error)) is kind


def test_a_refusal_says_whether_it_counts_and_whether_the_list_is_stale() -> None:
    failed = mapped(MCPError(mcp_types.INTERNAL_ERROR, "boom"))
    assert isinstance(failed, Refused) and failed.counted and not failed.stale
    for code in (mcp_types.INVALID_PARAMS, mcp_types.METHOD_NOT_FOUND):
        stale = mapped(MCPError(code, "no such tool"))
        assert isinstance(stale, Refused) and stale.stale and not stale.counted
        assert str(stale) == "no such tool"


def test_streams_ending_and_unparsable_answers_map_too() -> None:
    for ended in (anyio.BrokenResourceError(), anyio.ClosedResourceError(), anyio.EndOfStream()):
        gone = mapped(ended)
        assert isinstance(gone, Disconnected) and str(gone) == type(ended).__name__

    class Result(BaseModel):
        content: list[int]

    with pytest.raises(ValidationError) as invalid:
        Result.model_validate({"content": "x"})
    assert isinstance(mapped(invalid.value), NotAToolResult)


def test_anything_else_passes_unchanged() -> None:
    with pytest.raises(KeyError), map_mcp_errors():
        raise KeyError("x")
