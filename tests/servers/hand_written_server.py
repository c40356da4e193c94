"""MCP servers for toolrelay's tests written without the SDK, as servers in other languages are
(stdlib only: a start costs a few ms, not the SDK's second of imports).

    python hand_written_server.py --record FILE --raw      # non-conforming: an untyped schema
    python hand_written_server.py --record FILE --hostile  # conforming, pathological answers

Both speak the 2025-era protocol over stdio and append every ``tools/call`` to FILE as one
JSON line (as ``mcp_test_server.py`` does), after a ``started`` line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

METHOD_NOT_FOUND = -32601
RECORD = ""


def record(**event: Any) -> None:
    with open(RECORD, "a", encoding="utf-8") as out:
        out.write(json.dumps(event) + "\n")


def _schema(properties: dict[str, Any], *required: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


RAW_TOOLS = [  # non-conforming: "untyped" has ``inputSchema: {}`` (no "type": "object")
    {"name": "fine", "inputSchema": {"type": "object"}},
    {"name": "untyped", "inputSchema": {}},
]


def raw_answer(request_id: Any, args: dict[str, Any]) -> str:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "result": {"content": [{"type": "text", "text": "raw"}]},
        }
    )


def serve(
    name: str, tools: list[dict[str, Any]], answer: Callable[[Any, dict[str, Any]], str]
) -> None:
    """Answer the 2025-era handshake, ``tools/list`` with ``tools`` and each ``tools/call``
    with the line ``answer(id, arguments)`` gives, over stdio."""
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue
        method = message.get("method")
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
        if method == "initialize":
            reply["result"] = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": name, "version": "1"},
            }
        elif method == "tools/list":
            reply["result"] = {"tools": tools}
        elif method == "tools/call":
            args = message["params"].get("arguments") or {}
            record(event="call", tool=message["params"]["name"], arguments=args)
            sys.stdout.write(answer(message["id"], args) + "\n")
            sys.stdout.flush()
            continue
        else:
            reply["error"] = {"code": METHOD_NOT_FOUND, "message": "Method not found"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def _deep(levels: int) -> str:
    return '{"d":' * levels + "1" + "}" * levels


MIB = 1024 * 1024
HOSTILE: dict[str, Any] = {
    # text answers the pipeline must pass through without a quadratic step on the loop
    "comments": "<!--" * 30000,
    "cdata": "<![CDATA[" * 20000,
    "entities": "&lt;a" * 20000,
    "charrefs": "&#" * 50000,
    "commas": "a," * 100000,  # many commas inside a string: not JSON values
    "bearer": "Authorization: Bearer " + "a" * 200000,
    "pem": "-----BEGIN PRIVATE KEY-----" * 8000,
    "keys": "sk-" * 60000,
    "password": "password=" * 25000,
    "backtrack": "a" * 100000 + "!",
}


def hostile_answer(request_id: Any, args: dict[str, Any]) -> str:
    """One JSON-RPC answer line, written by hand so that no size or shape is off limits."""
    kind = str(args.get("kind"))
    head = f'{{"jsonrpc":"2.0","id":{json.dumps(request_id)},"result":'
    if kind in HOSTILE:
        return head + json.dumps({"content": [{"type": "text", "text": HOSTILE[kind]}]}) + "}"
    if kind in ("big", "big_id_last"):
        size = int(float(args.get("mib", 50)) * MIB)
        result = '{"content":[{"type":"text","text":"' + "a" * size + '"}]}'
        if kind == "big":
            return head + result + "}"
        return f'{{"jsonrpc":"2.0","result":{result},"id":{json.dumps(request_id)}}}'
    if kind == "items":  # 100k values
        items = ",".join(["0"] * 100_000)
        return head + f'{{"content":[],"structuredContent":{{"items":[{items}]}}}}}}'
    if kind == "deep":  # nested 100k levels
        return head + f'{{"content":[],"structuredContent":{_deep(100_000)}}}}}'
    if kind == "deep_array":
        nested = "[" * 100_000 + "]" * 100_000
        return head + f'{{"content":[],"structuredContent":{{"a":{nested}}}}}}}'
    return head + json.dumps({"content": [{"type": "text", "text": f"fine: {kind}"}]}) + "}"


HOSTILE_TOOLS = [
    {
        "name": "hostile",
        "inputSchema": _schema({"kind": {"type": "string"}, "mib": {"type": "number"}}),
        "annotations": {"readOnlyHint": True},
    }
]


def main() -> None:
    global RECORD
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", required=True, help="append calls here")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--raw", action="store_true", help="a non-conforming server")
    mode.add_argument("--hostile", action="store_true", help="pathological answers")
    options = parser.parse_args()
    RECORD = options.record
    record(event="started", pid=os.getpid())
    if options.raw:
        serve("raw", RAW_TOOLS, raw_answer)
    else:
        serve("hostile", HOSTILE_TOOLS, hostile_answer)


if __name__ == "__main__":
    main()
