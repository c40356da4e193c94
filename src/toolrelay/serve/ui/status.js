// The admin API's status page: read-only, refreshed every few seconds from its JSON
// endpoints (and /metrics for calls, outcomes and p95). The admin token lives in this tab's
// sessionStorage only; every data request sends it as the bearer header. Without it, only
// /healthz is asked. Text goes into the page with textContent, never as markup, and names
// (a tool may be called "__proto__") are Map keys, never keys of a plain object.
"use strict";

const TOKEN_KEY = "toolrelay-admin-token";
const REFRESH_MS = 3000;
const WINDOW_MS = 5 * 60 * 1000;
let history = []; // {at, calls: tool → outcome → n, buckets: tool → le → n}, in Maps
let busy = false;

class Unauthorized extends Error {}

const $ = (selector) => document.querySelector(selector);

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

async function get(path, authorized) {
  const headers = authorized ? { Authorization: `Bearer ${token()}` } : {};
  const response = await fetch(`../${path}`, { headers, cache: "no-store", credentials: "omit" });
  if (response.status === 401) throw new Unauthorized();
  if (!response.ok && response.status !== 503) throw new Error(`${path}: HTTP ${response.status}`);
  return response;
}

function parseMetrics(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = /^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const labels = new Map();
    for (const label of (match[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) {
      labels.set(label[1], label[2].replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c)));
    }
    samples.push({ name: match[1], labels, value: Number(match[3]) });
  }
  return samples;
}

function entry(map, key) {
  if (!map.has(key)) map.set(key, new Map());
  return map.get(key);
}

function snapshot(samples, at) {
  const calls = new Map();
  const buckets = new Map();
  let storageUp = null;
  for (const { name, labels, value } of samples) {
    if (name === "toolrelay_tool_calls_total") {
      entry(calls, labels.get("tool")).set(labels.get("outcome"), value);
    } else if (name === "toolrelay_tool_call_duration_seconds_bucket") {
      const tool = entry(buckets, labels.get("tool"));
      const le = labels.get("le");
      tool.set(le, (tool.get(le) || 0) + value);
    } else if (name === "toolrelay_breaker_storage_up") {
      storageUp = value;
    }
  }
  return { at, calls, buckets, storageUp };
}

function minus(now, then) {
  const out = new Map();
  for (const [key, value] of now || []) {
    const before = (then && then.get(key)) || 0;
    out.set(key, value >= before ? value - before : value); // a counter reset: count from zero
  }
  return out;
}

function p95(buckets) {
  const bounds = [...buckets]
    .map(([le, count]) => [le === "+Inf" ? Infinity : Number(le), count])
    .sort((a, b) => a[0] - b[0]);
  const total = bounds.length ? bounds[bounds.length - 1][1] : 0;
  if (!total) return null;
  const rank = 0.95 * total;
  let lower = 0;
  let below = 0;
  for (const [le, count] of bounds) {
    if (count >= rank) {
      if (le === Infinity) return lower;
      return lower + ((le - lower) * (rank - below)) / Math.max(count - below, 1e-9);
    }
    lower = le;
    below = count;
  }
  return lower;
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function fill(table, rows, render) {
  const body = table.tBodies[0];
  body.replaceChildren();
  for (const item of rows) render(body.insertRow(), item);
}

function seconds(value) {
  if (value === null || value === undefined) return "—";
  return value < 1 ? `${Math.round(value * 1000)} ms` : `${value.toFixed(1)} s`;
}

function showLogin(message) {
  $("#status").hidden = true;
  $("#forget").hidden = true;
  $("#login").hidden = false;
  $("#login-error").textContent = message || "";
  $("#updated").textContent = "";
  history = [];
}

function render(ready, tools, breakers, faults, metrics) {
  const now = snapshot(metrics, Date.now());
  history = history.filter((s) => now.at - s.at <= WINDOW_MS);
  const covered = history.length && now.at - history[0].at >= WINDOW_MS - 2 * REFRESH_MS;
  const base = covered ? history[0] : { calls: new Map(), buckets: new Map() };
  history.push(now);
  $("#window").textContent = covered ? "(last 5 minutes)" : "(since the gateway started)";

  fill($("#tools"), tools.tools, (row, tool) => {
    row.dataset.tool = tool.name;
    const outcomes = minus(now.calls.get(tool.name), base.calls.get(tool.name));
    const calls = [...outcomes.values()].reduce((a, b) => a + b, 0);
    const shown = [...outcomes]
      .filter(([, n]) => n > 0)
      .sort((a, b) => b[1] - a[1])
      .map(([outcome, n]) => `${outcome} ${n}`);
    cell(row, tool.name);
    cell(row, tool.breaker_key);
    cell(row, tool.offered ? "yes" : "no (breaker open)");
    cell(row, String(calls), "num calls");
    const buckets = minus(now.buckets.get(tool.name), base.buckets.get(tool.name));
    cell(row, seconds(p95(buckets)), "num p95");
    cell(row, shown.join(" · ") || "—", "outcomes");
  });

  const entries = Object.entries(breakers.breakers);
  fill($("#breakers"), entries, (row, [key, b]) => {
    row.dataset.key = key;
    cell(row, key);
    cell(row, b.state + (b.pinned_open ? " (pinned)" : ""), `state state-${b.state}`);
    cell(row, b.failure_rate === null ? "—" : `${(b.failure_rate * 100).toFixed(1)} %`, "num rate");
    cell(row, String(b.failures), "num");
    const trial = b.pinned_open ? "not until closed" : b.state === "open" ? seconds(b.retry_after_s) : "—";
    cell(row, trial, "num trial");
  });

  fill($("#faults"), faults.faults, (row, f) => {
    row.dataset.id = String(f.id);
    cell(row, String(f.id), "num");
    cell(row, f.kind);
    cell(row, f.tool !== undefined ? `tool ${f.tool}` : `breaker key ${f.breaker_key}`);
    cell(row, `${Math.round((f.rate ?? 1) * 100)} %`, "num");
    const detail = [];
    if (f.latency_s) detail.push(`latency ${seconds(f.latency_s)}`);
    if (f.kind === "error") detail.push(`${f.error_type}: ${f.message}`);
    cell(row, detail.join("; "));
  });
  $("#no-faults").hidden = faults.faults.length > 0;

  const open = entries.filter(([, b]) => b.state !== "closed").map(([key]) => key);
  const offered = tools.tools.filter((t) => t.offered).length;
  const facts = [
    ["readiness", ready.ready ? `ready (${ready.tools} tools)` : `not ready: ${ready.reason}`],
    ["tools offered", `${offered} of ${tools.tools.length}`],
    ["breakers not closed", open.length ? open.join(", ") : "none"],
    [
      "shared breaker storage",
      now.storageUp === null ? "—" : now.storageUp ? "answering" : "degraded (local fallback)",
    ],
  ];
  const list = $("#upstream");
  list.replaceChildren();
  for (const [term, value] of facts) {
    const dt = document.createElement("dt");
    const dd = document.createElement("dd");
    dt.textContent = term;
    dd.textContent = value;
    list.append(dt, dd);
  }
}

async function refresh() {
  if (busy) return;
  busy = true;
  try {
    const health = $("#health");
    try {
      const body = await (await get("healthz", false)).json();
      health.textContent = `process: ${body.status}`;
      health.className = "pill up";
    } catch {
      health.textContent = "process: not answering";
      health.className = "pill down";
    }
    if (!token()) return showLogin();
    // Every request of the round is answered before the page changes: a refused token shows
    // the login once all five refusals are in, not while four are still on their way.
    const settled = await Promise.allSettled(
      ["readyz", "tools", "breakers", "faults", "metrics"].map((path) => get(path, true)),
    );
    const refused = settled.find((s) => s.status === "rejected");
    if (refused) throw refused.reason;
    const responses = settled.map((s) => s.value);
    const [ready, tools, breakers, faults] = await Promise.all(
      responses.slice(0, 4).map((r) => r.json()),
    );
    const metrics = parseMetrics(await responses[4].text());
    render(ready, tools, breakers, faults, metrics);
    $("#login").hidden = true;
    $("#status").hidden = false;
    $("#forget").hidden = false;
    $("#updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    if (error instanceof Unauthorized) {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin("The admin API refused this token.");
    } else {
      $("#updated").textContent = `not updated: ${error.message}`;
    }
  } finally {
    busy = false;
  }
}

$("#login").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = $("#token");
  if (input.value) sessionStorage.setItem(TOKEN_KEY, input.value);
  input.value = "";
  refresh();
});
$("#forget").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  showLogin();
});
refresh();
setInterval(refresh, REFRESH_MS);
