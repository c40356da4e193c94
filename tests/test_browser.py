"""In a real browser (headless Chromium driven by Playwright): the HTML experiment report and
the admin API's status page.

The browser is Debian's ``chromium`` (``.ci/install-servers`` installs it); without it these
tests skip, or fail under TOOLRELAY_REQUIRE_SERVERS=1. Screenshots go to ``tests/artifacts/``
(git-ignored).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest
from anyio.from_thread import start_blocking_portal
from prometheus_client import CollectorRegistry

from conftest import REQUIRE_SERVERS, need_binary
from helpers import SHORT_HANG_FAULT, short_hang_report
from toolrelay import (
    AuthContext,
    BreakerOptions,
    Dispatcher,
    DispatcherOptions,
    KeyPolicy,
    RetryOptions,
    ToolRegistry,
)
from toolrelay.chaos.report_html import write_html
from toolrelay.serve.admin import AdminState, admin_app
from toolrelay.serve.auth import transport_security
from toolrelay.serve.http import HttpService

pytestmark = pytest.mark.servers

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
TOKEN = "status-page-test-token-0123456789"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = need_binary("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        message = "playwright is not installed (pip install playwright)"
        if REQUIRE_SERVERS:
            pytest.fail(message)
        pytest.skip(message)
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium)
        yield launched
        launched.close()


class Watched:
    """A page with every console error, page error and request recorded."""

    def __init__(self, browser: Any) -> None:
        self.context = browser.new_context(viewport={"width": 1000, "height": 900})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[Any] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r))

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def watched(browser: Any) -> Iterator[Watched]:
    page = Watched(browser)
    yield page
    page.close()


# -- the experiment report ---------------------------------------------------------------------
# The dependency-hang runs (5 s each) are shared with test_experiments.py: one run per session.
FAULT_FROM, FAULT_UNTIL = SHORT_HANG_FAULT


AXIS_TO_SECONDS = """
(section) => {
  const axis = section.querySelector('g[aria-label^="X-axis titled \\'call started (s)\\'"]');
  const ticks = [...axis.querySelectorAll("g.role-axis-label text")].map((t) => {
    const box = t.getBoundingClientRect();
    return [box.left + box.width / 2, Number(t.textContent)];
  });
  const [[x0, s0], [x1, s1]] = [ticks[0], ticks[ticks.length - 1]];
  const box = section.querySelector("g[class*=' fault_window_'] path").getBoundingClientRect();
  const at = (x) => s0 + ((x - x0) * (s1 - s0)) / (x1 - x0);
  return [at(box.left), at(box.right), ticks.length];
}
"""


def test_report_renders_offline_with_one_chart_per_tool(watched: Watched, tmp_path: Path) -> None:
    report = short_hang_report(breaker=True)
    data = report.to_json()
    path = tmp_path / "report.html"
    write_html([data], path)

    page = watched.page
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)

    assert watched.errors == []
    assert [r.url for r in watched.requests] == [path.as_uri()]  # nothing fetched: offline
    tools = sorted(data["timeline"]["tools"])
    assert tools == ["weather_current", "web_search"]
    sections = page.locator("section.tool")
    assert [sections.nth(i).get_attribute("data-tool") for i in range(sections.count())] == tools
    for i in range(sections.count()):
        assert sections.nth(i).locator(":scope > svg").count() == 1
    assert page.locator("section.rate > svg").count() == 1
    assert page.locator("table.verdicts tr").count() == len(data["invariants"]) + 1

    for tool in tools:
        section = page.locator(f"section.tool[data-tool={tool}]")
        start, end, ticks = section.evaluate(AXIS_TO_SECONDS)
        assert ticks >= 3
        assert start == pytest.approx(FAULT_FROM, abs=0.05), tool
        assert end == pytest.approx(FAULT_UNTIL, abs=0.05), tool
    # The breaker band is drawn, and the search breaker was open at some point.
    search = page.locator("section.tool[data-tool=web_search]")
    assert search.locator("g[class*=' breaker_'] path").count() >= 3
    assert any(b["state"] == "open" for b in data["timeline"]["breaker_states"]["searxng"])


def test_two_runs_share_one_time_axis(watched: Watched, tmp_path: Path) -> None:
    runs = [short_hang_report(breaker=b).to_json() for b in (True, False)]
    path = tmp_path / "compare.html"
    write_html(runs, path)

    page = watched.page
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    page.screenshot(path=str(ARTIFACTS / "compare.png"), full_page=True)
    assert watched.errors == []
    rows = page.locator("table.headline tr")
    assert rows.count() == 3
    assert rows.nth(1).locator("td").first.inner_text() == "dependency hang"
    assert rows.nth(2).locator("td").first.inner_text() == "no breaker"
    # Each tool's one chart holds both runs, one above the other, on the same axis.
    search = page.locator("section.tool[data-tool=web_search]")
    axes = search.locator("g[aria-label^=\"X-axis titled 'call started (s)'\"]")
    assert axes.count() == 2
    first, second = (axes.nth(i).bounding_box() for i in range(2))
    assert first is not None and second is not None
    assert second["y"] > first["y"]
    assert (first["x"], first["width"]) == pytest.approx((second["x"], second["width"]), abs=1)
    assert search.locator("g[class*=' fault_window_'] path").count() == 2


# -- the status page ---------------------------------------------------------------------------
class LiveAdmin:
    def __init__(self, url: str, state: AdminState) -> None:
        self.url = url
        self.state = state

    def put_faults(self, body: Any) -> httpx.Response:
        return httpx.put(
            f"{self.url}/faults", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
        )


@pytest.fixture
def live_admin() -> Iterator[LiveAdmin]:
    """The admin API on loopback, over a dispatcher whose one tool is called all the time."""
    registry = ToolRegistry()

    @registry.tool(
        name="crm_lookup",
        description="Look a customer up.",
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
        breaker_key="crm",
        timeout_s=1.0,
    )
    async def crm_lookup(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
        return {"tier": "gold"}

    metrics = CollectorRegistry()
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(
            keys={
                "crm": KeyPolicy(
                    breaker=BreakerOptions(fail_max=3, reset_timeout_s=60),
                    retry=RetryOptions(max_attempts=1),
                )
            }
        ),
        metrics_registry=metrics,
        audit=None,
    )
    state = AdminState(dispatcher, metrics, TOKEN, ready=True)

    async def traffic() -> None:
        for n in range(100_000):  # bounded; ends with the test
            await dispatcher.dispatch("crm_lookup", "{}", call_id=f"c{n}")
            await anyio.sleep(0.05)

    hosts = transport_security("127.0.0.1")  # as toolrelay serve: the page passes them
    yield from served(state, dispatcher, hosts, beside=traffic)


def served(
    state: AdminState,
    dispatcher: Dispatcher,
    hosts: Any = None,
    *,
    before: Callable[[], Awaitable[None]] | None = None,
    beside: Callable[[], Coroutine[Any, Any, None]] | None = None,
) -> Iterator[LiveAdmin]:
    """The admin API of ``state`` served on loopback from a portal's event loop: ``before``
    awaited first, ``beside`` running while it serves; the dispatcher closed at the end."""

    async def serve(*, task_status: anyio.abc.TaskStatus[str]) -> None:
        if before is not None:
            await before()
        service = HttpService(admin_app(state, hosts), "127.0.0.1", 0)
        try:
            async with anyio.create_task_group() as tg:
                await service.start(tg)
                if beside is not None:
                    tg.start_soon(beside)
                task_status.started(service.url)
                await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await service.aclose()
                await dispatcher.aclose()

    with start_blocking_portal("asyncio") as portal:
        future, url = portal.start_task(serve)
        yield LiveAdmin(url, state)
        portal.call(lambda: future.cancel())


def open_status(page: Any, admin: LiveAdmin) -> Any:
    """Load the status page (its response returned, checked ``ok``)."""
    response = page.goto(f"{admin.url}/ui/")
    assert response is not None and response.ok
    return response


def log_in(page: Any, token: str = TOKEN) -> None:
    """Submit ``token`` in the status page's login form."""
    page.fill("#token", token)
    page.click("#login button[type=submit]")


def test_status_page_needs_the_token_and_shows_a_breaker_opening(
    watched: Watched, live_admin: LiveAdmin
) -> None:
    from playwright.sync_api import expect

    page = watched.page
    response = open_status(page, live_admin)
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "connect-src 'self'" in csp and "default-src 'none'" in csp

    # Without the token: /healthz only, through two refreshes.
    expect(page.locator("#health")).to_have_text("process: ok")
    with page.expect_request(lambda r: r.url.endswith("/healthz")):
        pass
    expect(page.locator("#login")).to_be_visible()
    expect(page.locator("#status")).to_be_hidden()
    assert "crm_lookup" not in page.content()
    fetched = {r.url.removeprefix(live_admin.url) for r in watched.requests}
    assert fetched == {"/ui/", "/ui/status.css", "/ui/status.js", "/ui/icon.svg", "/healthz"}
    assert watched.errors == []
    page.screenshot(path=str(ARTIFACTS / "status-no-token.png"), full_page=True)

    # A wrong token is refused, and not kept.
    log_in(page, "not-the-token")
    expect(page.locator("#login-error")).to_contain_text("refused")
    expect(page.locator("#status")).to_be_hidden()
    assert page.evaluate("sessionStorage.length") == 0
    wrong = "Bearer not-the-token"
    refused = [r for r in watched.requests if r.headers.get("authorization") == wrong]
    assert len(refused) == 5  # one round of the five data endpoints, then no more
    # The browser logs each 401 as it lands; the console events reach us a little later.
    for _ in range(100):
        if len(watched.errors) >= len(refused):
            break
        page.wait_for_timeout(50)
    assert len(watched.errors) == len(refused), watched.errors
    assert all("status of 401" in error for error in watched.errors), watched.errors
    watched.errors.clear()

    # The right token: the status shows; the token is in sessionStorage only.
    log_in(page)
    tool = page.locator("#tools tr[data-tool=crm_lookup]")
    expect(tool).to_be_visible()
    state = page.locator("#breakers tr[data-key=crm] .state")
    expect(state).to_have_text("closed")
    expect(tool.locator(".calls")).not_to_have_text("0")
    expect(page.locator("#no-faults")).to_be_visible()
    assert page.evaluate("Object.values(sessionStorage)") == [TOKEN]
    assert watched.context.cookies() == []
    assert all(TOKEN not in r.url for r in watched.requests)
    data = [r for r in watched.requests if not r.url.startswith(f"{live_admin.url}/ui/")]
    authed = [r for r in data if not r.url.endswith("/healthz")]
    assert {r.url.removeprefix(live_admin.url) for r in authed} >= {
        "/readyz", "/tools", "/breakers", "/faults", "/metrics"
    }  # fmt: skip
    sent = {r.headers.get("authorization") for r in authed}
    assert sent <= {f"Bearer {TOKEN}", "Bearer not-the-token"}
    assert all("authorization" not in r.headers for r in data if r.url.endswith("/healthz"))

    # Faults injected through the admin API: the page shows the breaker open, and the fault.
    put = live_admin.put_faults(
        {"kind": "error", "tool": "crm_lookup", "message": "503 (injected)"}
    )
    assert put.status_code == 200, put.text
    expect(state).to_have_text("open", timeout=15_000)
    expect(page.locator("#faults tbody tr")).to_have_count(1)
    expect(page.locator("#faults tbody tr")).to_contain_text("tool crm_lookup")
    expect(tool.locator(".outcomes")).to_contain_text("circuit_open")
    expect(page.locator("#breakers tr[data-key=crm] .trial")).to_have_text(re.compile(r"\d"))
    # Three failures in a row opened it: a consecutive breaker has no failure rate to show.
    expect(page.locator("#breakers tr[data-key=crm] .rate")).to_have_text("—")
    expect(page.locator("#upstream")).to_contain_text("crm")
    page.screenshot(path=str(ARTIFACTS / "status-open.png"), full_page=True)
    assert live_admin.state.dispatcher.breakers.state("crm") == "open"

    # Forgetting the token hides everything again.
    page.click("#forget")
    expect(page.locator("#status")).to_be_hidden()
    assert page.evaluate("sessionStorage.length") == 0
    assert watched.errors == []


# Tool names an upstream may offer that are also names of every JavaScript object's members,
# and (through the routes below, as no registry accepts them) markup and a 10 KB name.
HOSTILE = {"__proto__": 2, "constructor": 3, "toString": 4, "hasOwnProperty": 5}
UNREGISTRABLE = {
    "<script>window.pwned = 1</script>": 6,
    '<img src=x onerror="window.pwned = 1">': 7,
    "n" * 10_240: 8,
}


@pytest.fixture
def hostile_admin() -> Iterator[LiveAdmin]:
    """The admin API over tools with hostile names, each called a known number of times."""
    registry = ToolRegistry()
    for name in ["crm_lookup", *HOSTILE]:
        registry.tool(
            name=name,
            description="A tool.",
            parameters={"type": "object"},
            breaker_key=name,
        )(_answer)
    metrics = CollectorRegistry()
    dispatcher = Dispatcher(registry, metrics_registry=metrics, audit=None)
    state = AdminState(dispatcher, metrics, TOKEN, ready=True)

    async def calls() -> None:
        for name, times in {"crm_lookup": 1, **HOSTILE}.items():
            for _ in range(times):
                assert (await dispatcher.dispatch(name, "{}")).ok

    yield from served(state, dispatcher, before=calls)


async def _answer(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
    return {}


def _with_unregistrable(route: Any) -> None:
    """The real answer of ``/tools`` or ``/metrics``, with the unregistrable names added."""
    response = route.fetch()
    if route.request.url.endswith("/tools"):
        body = response.json()
        body["tools"] += [
            {**body["tools"][0], "name": name, "breaker_key": name} for name in UNREGISTRABLE
        ]
        route.fulfill(response=response, json=body)
        return
    quoted = {
        name.replace("\\", "\\\\").replace('"', '\\"'): n for name, n in UNREGISTRABLE.items()
    }
    lines = [
        f'toolrelay_tool_calls_total{{tool="{name}",outcome="ok"}} {times}.0'
        for name, times in quoted.items()  # escaped as Prometheus does
    ]
    route.fulfill(response=response, body=response.text() + "\n".join(lines) + "\n")


def test_status_page_shows_every_tool_whatever_its_name(
    watched: Watched, hostile_admin: LiveAdmin
) -> None:
    from playwright.sync_api import expect

    page = watched.page
    page.route(re.compile(r".*/(tools|metrics)$"), _with_unregistrable)
    open_status(page, hostile_admin)
    log_in(page)
    expected = {"crm_lookup": 1, **HOSTILE, **UNREGISTRABLE}
    rows = page.locator("#tools tbody tr")
    expect(rows).to_have_count(len(expected))
    shown = page.evaluate(
        """() => [...document.querySelectorAll("#tools tbody tr")].map(
             (row) => [row.dataset.tool, row.cells[0].textContent,
                       row.querySelector(".calls").textContent])"""
    )
    assert {name: int(calls) for name, _, calls in shown} == expected
    assert all(name == text for name, text, _ in shown)  # the name shown as text
    expect(page.locator("#breakers tbody tr")).to_have_count(1 + len(HOSTILE))
    assert page.evaluate("window.pwned") is None  # no markup ran
    assert page.locator("#tools script, #tools img").count() == 0
    # Nothing was written onto the objects every other object inherits from.
    assert page.evaluate("Object.keys(Object.prototype).concat(Object.keys(Object))") == []
    page.screenshot(path=str(ARTIFACTS / "status-hostile-names.png"), full_page=True)
    page.unroute_all(behavior="ignoreErrors")  # a refresh may be on its way as the page closes
    assert watched.errors == []
