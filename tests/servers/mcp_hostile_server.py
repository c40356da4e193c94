"""A conforming 2025-era MCP server over stdio, written without the SDK, whose ``hostile``
tool answers with whatever ``kind`` names: huge, deep, wide or parser-hostile.

    python mcp_hostile_server.py --record FILE

Every ``tools/call`` is appended to FILE as one JSON line (and ``started`` once). Only the
standard library: the process starts in ~50 ms, where importing the SDK took ~1 s of CPU
(tests/test_hostile_upstreams.py starts it ten times).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

METHOD_NOT_FOUND = -32601
MIB = 1024 * 1024
RECORD = ""

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


def record(**event: Any) -> None:
    with open(RECORD, "a", encoding="utf-8") as out:
        out.write(json.dumps(event) + "\n")


def _deep(levels: int) -> str:
    return '{"d":' * levels + "1" + "}" * levels


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


def serve() -> None:
    properties = {"kind": {"type": "string"}, "mib": {"type": "number"}}
    listing = [
        {
            "name": "hostile",
            "inputSchema": {
                "type": "object",
                "properties": properties,
                "required": [],
                "additionalProperties": False,
            },
            "annotations": {"readOnlyHint": True},
        }
    ]
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
                "serverInfo": {"name": "hostile", "version": "1"},
            }
        elif method == "tools/list":
            reply["result"] = {"tools": listing}
        elif method == "tools/call":
            args = message["params"].get("arguments") or {}
            record(event="call", tool=message["params"]["name"], arguments=args)
            sys.stdout.write(hostile_answer(message["id"], args) + "\n")
            sys.stdout.flush()
            continue
        else:
            reply["error"] = {"code": METHOD_NOT_FOUND, "message": "Method not found"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def main() -> None:
    global RECORD
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", required=True, help="append calls here")
    RECORD = parser.parse_args().record
    record(event="started", pid=os.getpid())
    serve()


if __name__ == "__main__":
    main()
