#!/usr/bin/env node
// Calls tools on an MCP server through the official TypeScript SDK and prints, as one JSON
// object on stdout, what the SDK handed back: the listed output schemas and, per call, the
// CallToolResult or the error the SDK threw (e.g. -32602 when structuredContent breaks the
// tool's outputSchema). Used by tests/test_gateway_clients.py.
//
//   node mcp_call.mjs --sdk v1|v2 [--era legacy|auto] --calls '[["tool", {...}], ...]' \
//        (--url http://127.0.0.1:PORT/mcp | -- command arg...)
//
// --sdk v1 is @modelcontextprotocol/sdk (the 1.x line, npm's `latest` of that name);
// --sdk v2 is @modelcontextprotocol/client (the 2.x line), which with --era auto negotiates
// the 2026-07-28 protocol when the server offers it. The client lists the tools before
// calling them, as real clients do: the SDKs only validate results of listed tools.
import process from "node:process";
import { parseArgs } from "node:util";

const { values, positionals } = parseArgs({
  options: {
    sdk: { type: "string", default: "v1" },
    era: { type: "string", default: "legacy" },
    url: { type: "string" },
    calls: { type: "string", default: "[]" },
  },
  allowPositionals: true,
});

async function loadSdk(sdk) {
  if (sdk === "v1") {
    const { Client } = await import("@modelcontextprotocol/sdk/client/index.js");
    const { StdioClientTransport } = await import("@modelcontextprotocol/sdk/client/stdio.js");
    const { StreamableHTTPClientTransport } = await import(
      "@modelcontextprotocol/sdk/client/streamableHttp.js"
    );
    return { Client, StdioClientTransport, StreamableHTTPClientTransport };
  }
  if (sdk === "v2") {
    const { Client, StreamableHTTPClientTransport } = await import("@modelcontextprotocol/client");
    const { StdioClientTransport } = await import("@modelcontextprotocol/client/stdio");
    return { Client, StdioClientTransport, StreamableHTTPClientTransport };
  }
  throw new Error(`--sdk must be v1 or v2, not ${sdk}`);
}

function describeError(error) {
  return {
    code: error?.code ?? null,
    name: error?.name ?? null,
    message: error instanceof Error ? error.message : String(error),
  };
}

async function main() {
  const { Client, StdioClientTransport, StreamableHTTPClientTransport } = await loadSdk(
    values.sdk,
  );
  let transport;
  if (values.url) {
    transport = new StreamableHTTPClientTransport(new URL(values.url));
  } else if (positionals.length > 0) {
    const [command, ...args] = positionals;
    transport = new StdioClientTransport({ command, args, env: { ...process.env } });
  } else {
    throw new Error("give --url or a server command after --");
  }
  const options = values.era === "auto" ? { versionNegotiation: { mode: "auto" } } : undefined;
  const client = new Client({ name: "toolrelay-tests", version: "1.0.0" }, options);
  await client.connect(transport);
  const out = {
    sdk: values.sdk,
    protocolVersion:
      typeof client.getNegotiatedProtocolVersion === "function"
        ? (client.getNegotiatedProtocolVersion() ?? null)
        : null,
    tools: {},
    calls: [],
  };
  try {
    const listing = await client.listTools();
    for (const tool of listing.tools) out.tools[tool.name] = tool.outputSchema ?? null;
    for (const [name, args] of JSON.parse(values.calls)) {
      try {
        const result = await client.callTool({ name, arguments: args });
        out.calls.push({ name, result });
      } catch (error) {
        out.calls.push({ name, error: describeError(error) });
      }
    }
  } finally {
    await client.close();
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().then(
  () => process.exit(0),
  (error) => {
    process.stderr.write(`mcp_call.mjs: ${error?.stack ?? error}\n`);
    process.exit(1);
  },
);
