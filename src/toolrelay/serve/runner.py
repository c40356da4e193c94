"""``toolrelay serve``: put the pieces together and run them until told to stop.

Start: the dispatcher (plugins loaded), the admin API (``/readyz`` 503 until ready), the
upstream MCP servers, the tool-list watcher, the MCP transport; then ready. Stop: stdin
closing (stdio) or SIGINT/SIGTERM (after ``[serve] drain_s`` not ready but serving),
everything closed in reverse order within a grace period. SIGHUP reloads the config file
(:mod:`toolrelay.serve.reload`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry

from ..catalog import Catalog, LockError
from ..config import load_configured_plugins
from ..dispatcher import Dispatcher
from ..net import is_loopback
from ..registry import ToolRegistry
from ..sources.errors import innermost
from .approvals import ElicitingApprover
from .auth import StaticTokenVerifier, check_bind, resolve_secret, transport_security
from .callers import Callers
from .client_limits import ClientLimits, configured_limits
from .errors import ReloadRefused, ServeError
from .gateway import Gateway
from .health import ConfigInfo, UpstreamHealth
from .http import HttpService
from .metrics import GatewayMetrics
from .observability import meter_provider, metrics_endpoint, tracer_provider
from .reload import ReloadableVerifier, Reloader
from .settings import GatewaySettings, ServeSection, load
from .upstreams import Upstreams
from .watch import ToolListWatcher

if TYPE_CHECKING:
    from .admin import AdminState

EXIT_GRACE_S = 5.0
"""After a signal, how long a graceful stop may take before the process exits anyway."""


class Service:
    """One ``toolrelay serve`` run: a dispatcher behind an MCP transport and an admin API.

    Construction checks the settings, resolves the tokens (from ``environ``) and builds the
    dispatcher; :meth:`run` serves (asyncio only: uvicorn) until :meth:`stop`. Start-up
    lines go to ``out`` (default stderr).
    """

    def __init__(
        self,
        config: GatewaySettings,
        settings: ServeSection,
        *,
        environ: Mapping[str, str] | None = None,
        out: TextIO | None = None,
        handle_signals: bool = True,
        overrides: Mapping[str, Any] | None = None,
    ) -> None:
        self.config = config.model_copy(update={"serve": settings})  # what a reload compares
        self.handle_signals = handle_signals
        self.environ: Mapping[str, str] = os.environ if environ is None else environ
        self.out = out
        settings.check(config)
        http, admin = settings.transport == "http", settings.admin
        remote, names = settings.allow_remote, settings.allowed_hosts
        if http:
            check_bind(settings.http.host, remote, "MCP HTTP transport", names)
        self.admin_token: str | None = None
        if admin.port is not None:
            check_bind(admin.host, remote, "admin API", names)
            env = self.environ
            self.admin_token = resolve_secret(admin.token_env, admin.token, env, "admin API")
        clients = tuple(settings.http.clients.values()) if http else ()
        self.verifier = (
            ReloadableVerifier(StaticTokenVerifier(clients, self.environ)) if clients else None
        )
        self.telemetry = dict(config.telemetry)
        self.tracer_provider = tracer_provider(self.telemetry)
        self.meter_provider = meter_provider(self.telemetry)
        self.metrics_registry = CollectorRegistry()
        self.approvals = (
            ElicitingApprover(timeout_s=settings.approval_timeout_s)
            if settings.approvals == "elicit"
            else None
        )
        reserved = config.dispatcher.reserved_properties
        registry = (
            ToolRegistry() if reserved is None else ToolRegistry(reserved_properties=reserved)
        )
        self.plugins = load_configured_plugins(registry, config)
        """The plugin objects of each ``[plugins.NAME]`` (a reload replaces them by name)."""
        self.dispatcher = Dispatcher.from_config(
            config.model_copy(update={"plugins": {}, "tools": {}}),  # loaded just above
            registry=registry,
            metrics_registry=self.metrics_registry,
            tracer_provider=self.tracer_provider,
            meter_provider=self.meter_provider,
            approver=self.approvals,
        )
        self.metrics = GatewayMetrics(self.metrics_registry)
        self.catalog: Catalog | None = None  # the tool lock of [serve.catalog], when it sets one
        if settings.catalog.active:
            base = "." if config.path is None else config.path.parent
            try:
                self.catalog = Catalog(settings.catalog, base, self.metrics_registry)
            except LockError as exc:
                raise ServeError(f"{exc} (write it with: toolrelay lock)") from None
        registry.gate = self.catalog
        self.callers = Callers(settings.profile, clients)
        self.watcher = ToolListWatcher(
            self.dispatcher,
            {caller.profile for caller in self.callers.all()},
            self.metrics,
            interval_s=settings.watch_interval_s,
        )
        self.limits = ClientLimits(
            *configured_limits(settings),
            names=[caller.name for caller in self.callers.all()],
            metrics=self.metrics,
        )
        if self.dispatcher.storage_link is not None:  # one rate per client for the fleet
            self.limits.share_with(self.dispatcher.storage_link)
        self.gateway = Gateway(
            self.dispatcher, self.callers, self.watcher, self.metrics, limits=self.limits
        )
        self.gateway.catalog = self.catalog
        if self.approvals is not None:  # asks the client of the tools/call being served
            self.approvals.redact = self.dispatcher.redact
            self.gateway.server.middleware.append(self.approvals.middleware)
        self.health = UpstreamHealth(
            self.metrics_registry, ping_interval_s=settings.ping_interval_s
        )
        self.upstreams = Upstreams(self.dispatcher.registry, self.environ, self.health)
        self.reloader = Reloader(self, overrides)
        ConfigInfo(self.metrics_registry, lambda: self.reloader.loaded)
        self.admin_state: AdminState | None = None
        if self.admin_token is not None:  # FastAPI is imported only for an admin API (~0.3 s)
            from .admin import AdminState

            self.admin_state = AdminState(
                self.dispatcher,
                self.metrics_registry,
                self.admin_token,
                upstreams=self.health,
                reload=self.reloader.reload,
                catalog=self.catalog,
                config_hash=lambda: self.reloader.loaded,
            )
        self._stop: anyio.Event | None = None

    @property
    def settings(self) -> ServeSection:
        """The ``[serve]`` section in force."""
        return self.config.serve

    def _say(self, line: str) -> None:
        print(f"toolrelay serve: {line}", file=self.out or sys.stderr, flush=True)

    def stop(self) -> None:
        """Begin a graceful stop (from the event loop): not ready any more, then wind down."""
        if self.admin_state is not None:
            self.admin_state.set_ready(False, "shutting down")
        if self._stop is not None:
            self._stop.set()

    async def run(self) -> None:
        """Serve until stdin closes (stdio) or :meth:`stop` / a signal."""
        self._stop = anyio.Event()
        metrics = metrics_endpoint(
            self.telemetry, self.metrics_registry, self.settings.allow_remote
        )
        try:
            async with anyio.create_task_group() as tg:
                self.reloader.attach(tg)
                if self.handle_signals:
                    tg.start_soon(self._signals)
                    tg.start_soon(self._reload_signals)
                tg.start_soon(self.reloader.watch)
                tg.start_soon(self._sunsets)
                admin = await self._start_admin(tg)
                try:
                    async with self.upstreams as upstreams:
                        names = await upstreams.start(self.settings.upstreams.values())
                        await self.gateway.offerings.start(upstreams.open)
                        if names:
                            self._say(f"upstream MCP servers: {', '.join(names)}")
                        await self._serve_mcp()
                finally:
                    self.stop()  # not ready any more
                    if admin is not None:
                        with anyio.CancelScope(shield=True):
                            await admin.aclose()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.dispatcher.aclose()
            for running in (metrics, self.tracer_provider, self.meter_provider):
                if running is not None:
                    running.shutdown()

    async def _sunsets(self) -> None:
        """At each deprecated tool's sunset, have the catalog's verdicts asked again."""
        while self.catalog is not None and (due := self.catalog.next_sunset()) is not None:
            await anyio.sleep(due + 0.001)
            self.dispatcher.registry.gate = self.catalog

    async def _start_admin(self, tg: anyio.abc.TaskGroup) -> HttpService | None:
        state, admin = self.admin_state, self.settings.admin
        if state is None or admin.port is None:
            return None
        from .admin import admin_app

        hosts = transport_security(admin.host, self.settings.allowed_hosts)
        service = HttpService(admin_app(state, hosts), admin.host, admin.port)
        await service.start(tg)
        self._say(f"admin API on {service.url}")
        return service

    async def _serve_mcp(self) -> None:
        assert self._stop is not None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.watcher.run)
            tg.start_soon(self.health.run)
            tg.start_soon(self.gateway.offerings.run)
            tg.start_soon(self.gateway.rounds.run)
            if self.settings.transport == "stdio":
                tg.start_soon(self._run_stdio)
                self._ready("MCP over stdio")
                await self._stop.wait()
            else:
                await self._run_http()
            tg.cancel_scope.cancel()

    async def _run_stdio(self) -> None:
        try:
            await self.gateway.run_stdio(self.settings.max_request_bytes)
        finally:
            self.stop()

    async def _run_http(self) -> None:
        assert self._stop is not None
        settings = self.settings.http
        app, manager = self.gateway.http_app(
            host=settings.host,
            path=settings.path,
            allowed_hosts=self.settings.allowed_hosts,
            verifier=self.verifier,
            max_request_bytes=self.settings.max_request_bytes,
            max_sessions=settings.max_sessions,
            max_sessions_per_client=settings.client_session_cap,
            session_idle_s=settings.session_idle_s,
            json_response=settings.json_response,
            stateless=settings.stateless,
        )
        proxies = settings.trusted_proxies
        if self.verifier is None:  # who a client is, and who may call, without tokens
            via = f", or the X-Forwarded-For of {', '.join(proxies)}," if proxies else ""
            anyone = "" if is_loopback(settings.host) else f"; anyone reaching {settings.host}"
            self._say(
                f"MCP clients are told apart by their peer address{via} for session limits "
                "(no [serve.http.clients] tokens: every process on one host is one client"
                f"{anyone} can call the tools)"
            )
        async with manager.run(), anyio.create_task_group() as tg:
            tag = [("Toolrelay-Replica", self.gateway.rounds.tag)]
            service = HttpService(app, settings.host, settings.port, proxies, tag)
            await service.start(tg)
            self._ready(f"MCP on {service.url}{settings.path}")
            await self._stop.wait()
            await service.aclose()
            tg.cancel_scope.cancel()

    def _ready(self, where: str) -> None:
        count = len(self.dispatcher.registry)
        profile = self.settings.profile
        whose = "" if profile is None else f", profile {profile!r}"
        auth = "" if self.verifier is None else ", bearer tokens required"
        self._say(f"{where} ({count} tools{whose}{auth})")
        settle_heap()
        if self.admin_state is not None:
            self.admin_state.set_ready(True)

    async def _signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                self._say(f"{signal.Signals(signum).name}: stopping")
                # the process ends even if a stdio reader thread never returns
                grace_s = EXIT_GRACE_S + self.settings.drain_s
                timer = threading.Timer(grace_s, os._exit, args=(0,))
                timer.daemon = True
                timer.start()
                if self.admin_state is not None:  # draining: not ready, still serving
                    self.admin_state.set_ready(False, "shutting down")
                with anyio.move_on_after(self.settings.drain_s):
                    await anext(signals)  # a second signal ends the drain
                self.stop()

    async def _reload_signals(self) -> None:
        """SIGHUP: reload the config file (a refusal is logged; the old config serves)."""
        if not hasattr(signal, "SIGHUP"):  # pragma: no cover - Windows
            return
        with anyio.open_signal_receiver(signal.SIGHUP) as signals:
            async for _ in signals:
                with contextlib.suppress(ReloadRefused):  # logged; the old config serves
                    await self.reloader.reload()


def settle_heap() -> None:
    """Collect what start-up left behind, then freeze the rest out of later collections.

    What start-up built (the SDK, pydantic's validators, uvicorn) lives for the whole run;
    frozen, the full collections the per-call garbage triggers no longer walk it (tens of
    milliseconds each, landing on calls in flight: ``bench/gateway.py``). Safe to call
    again: what was built since is frozen too."""
    gc.collect()
    gc.freeze()


def main(
    config_path: str | None,
    *,
    defaults: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> int:
    """Run ``toolrelay serve`` (the CLI's entry); ``overrides`` are the command line's
    settings (see :meth:`~toolrelay.serve.settings.ServeSection.override`). Raises
    :class:`ServeError`, :class:`~toolrelay.config.ConfigError` or
    :class:`~toolrelay.loading.PluginLoadError`.
    """
    config, settings = load(config_path, defaults, **overrides)
    service = Service(config, settings, overrides=overrides)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
    logging.getLogger("toolrelay").setLevel(logging.INFO)
    try:
        anyio.run(service.run, backend="asyncio")
    except BaseExceptionGroup as group:
        raise innermost(group) from None
    except OSError as exc:
        raise ServeError(f"{exc.strerror or exc}") from None
    return 0
