"""Hot reload of ``toolrelay serve``: SIGHUP, ``POST /reload`` or a changed file; what is
live and what needs a restart: docs/serve.md, "Hot reload".

A reload applies the file **all or nothing**: what can fail (reading and checking it, client
tokens, connecting new upstreams, loading plugins, registering their tools) is done first.
What changed is :meth:`toolrelay.config.Settings.diff` of the config in force (``[serve]``
with the command line's overrides), by key path; :data:`LIVE` says what may change. A call
in flight finishes under the config it started with; a retired upstream or plugin is closed
once its breaker keys have no call in flight, or after the longest deadline of its tools.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.abc
from mcp.server.auth.provider import AccessToken

from ..capabilities import Closeable
from ..config import Settings, load_configured_plugins
from ..dispatcher import Dispatcher
from ..loading import PluginLoadError
from ..registry import RegistrationError
from ..settings import ConfigError, read_bytes
from .admin_models import Reloaded
from .auth import StaticTokenVerifier
from .callers import Callers
from .client_limits import ClientLimit, configured_limits
from .errors import ReloadRefused, ServeError
from .settings import GatewaySettings, ServeSection, load
from .upstreams import Upstreams
from .watch import ToolListWatcher

if TYPE_CHECKING:
    from .gateway import Gateway

log = logging.getLogger("toolrelay.serve")

LIVE = (
    *("profiles.", "keys.", "faults", "plugins.", "serve.upstreams.", "serve.http.clients."),
    *("serve.profile", "serve.watch_interval_s", "serve.reload_watch_s"),
)
"""The keys (and tables: ending in ``.``) of ``toolrelay.toml`` a reload applies live."""
CLOSE_GRACE_S = 1.0
"""Added to the longest deadline of a retired plugin's or upstream's tools."""


class ReloadableVerifier:
    """The gateway's ``TokenVerifier``: the client tokens in force, replaced by a reload."""

    def __init__(self, verifier: StaticTokenVerifier) -> None:
        self.verifier = verifier

    async def verify_token(self, token: str) -> AccessToken | None:
        return await self.verifier.verify_token(token)


class ReloadTarget(Protocol):
    """What a reload reads and replaces: the running gateway (``runner.Service``)."""

    config: GatewaySettings
    """The config in force (``[serve]`` with the command line's overrides)."""
    environ: Mapping[str, str]
    dispatcher: Dispatcher
    plugins: dict[str, list[Any]]
    """The plugin objects of each ``[plugins.NAME]``."""
    callers: Callers
    verifier: ReloadableVerifier | None
    watcher: ToolListWatcher
    upstreams: Upstreams
    gateway: Gateway

    @property
    def settings(self) -> ServeSection:
        """The ``[serve]`` section in force."""


def _names(changed: Iterable[str], table: str) -> set[str]:
    """The names of the ``table`` entries with a changed key (``table``: ``"plugins."``)."""
    return {key[len(table) :].split(".")[0] for key in changed if key.startswith(table)}


def _undo(steps: list[Callable[[], object]]) -> None:
    """Undo the steps of a commit that failed, the latest first."""
    for step in reversed(steps):
        try:
            step()
        except Exception:  # keep undoing: the rest of the old config matters more
            log.exception("toolrelay serve: could not undo a step of a failed reload")


class Reloader:
    """Re-reads and applies a running gateway's config (a :class:`ReloadTarget`).

    :meth:`reload` is serialized (one at a time) and runs on the service's event loop;
    :meth:`watch` polls the file every ``reload_watch_s``.
    """

    def __init__(self, service: ReloadTarget, overrides: Mapping[str, Any] | None = None) -> None:
        self.service = service
        self.overrides = dict(overrides or {})
        self._lock = anyio.Lock()
        self._tg: anyio.abc.TaskGroup | None = None
        self.loaded = _digest(service.config.path)
        """The content hash (SHA-256) of the config file in force (``None``: no file)."""
        self._refused: str | None = None

    def attach(self, tg: anyio.abc.TaskGroup) -> None:
        """The task group retired plugins are closed in (the service's)."""
        self._tg = tg

    async def reload(self) -> Reloaded:
        """Apply the config file as it is now; raises :class:`ReloadRefused` (logged)."""
        async with self._lock:
            try:
                report = await self._reload()
            except ReloadRefused as refused:
                log.error(
                    "toolrelay serve: reload refused, the old config keeps serving: %s",
                    refused.message,
                )
                raise
            log.info(
                "toolrelay serve: reloaded %s: %s",
                self.service.config.path,
                ", ".join(report.changed) or "nothing changed",
            )
            return report

    async def watch(self) -> None:
        """Reload whenever the file's content changes (checked every ``reload_watch_s``;
        a refused version is not tried again until it changes). Runs until cancelled."""
        while True:
            interval = self.service.settings.reload_watch_s
            await anyio.sleep(1.0 if interval is None else interval)
            if interval is None:
                continue
            digest = await anyio.to_thread.run_sync(_digest, self.service.config.path)
            if digest is None or digest in (self.loaded, self._refused):
                continue
            try:
                await self.reload()
            except ReloadRefused:
                self._refused = digest

    # -- the reload ---------------------------------------------------------------------------
    async def _reload(self) -> Reloaded:
        service = self.service
        path = service.config.path
        if path is None:
            raise ReloadRefused(409, "no_config_file", "this gateway has no config file to reload")
        digest = await anyio.to_thread.run_sync(_digest, path)
        try:  # in a thread too: nothing a file does (being a FIFO, say) blocks the loop
            config, settings = await anyio.to_thread.run_sync(partial(load, path, **self.overrides))
            settings.check(config)
        except ConfigError as exc:
            raise ReloadRefused(422, "invalid_config", str(exc)) from None
        changed = list(service.config.diff(config))
        self._check_live(config, settings, changed)
        clients = tuple(settings.http.clients.values()) if settings.transport == "http" else ()
        connected: dict[str, Any] = {}  # the added and changed upstreams (not registered yet)
        undo: list[Callable[[], object]] = []
        try:
            verifier = None
            if clients and _names(changed, "serve.http.clients."):
                verifier = StaticTokenVerifier(clients, service.environ)
            for name in sorted(_names(changed, "serve.upstreams.") & settings.upstreams.keys()):
                source = await service.upstreams.connect(settings.upstreams[name])
                if source is not None:
                    connected[name] = source
            await service.gateway.offerings.prepare(connected.values())  # for collisions
            retired = self._commit(config, settings, changed, connected, undo)
        except (ServeError, ConfigError, PluginLoadError, RegistrationError) as exc:
            _undo(undo)
            for source in connected.values():
                service.upstreams.close(source)
            raise ReloadRefused(400, "reload_failed", str(exc)) from None
        before = service.callers.profiles()
        breakers = service.dispatcher.reconfigure(config.dispatcher_options())
        service.callers.update(settings.profile, clients)
        if verifier is not None and isinstance(service.verifier, ReloadableVerifier):
            service.verifier.verifier = verifier
        service.watcher.interval_s = settings.watch_interval_s
        service.config = config
        self.loaded, self._refused = digest, None
        assert self._tg is not None, "Reloader.attach() first"
        for closer, keys, grace_s in retired:
            self._tg.start_soon(self._drain, closer, keys, grace_s)
        profiles = await service.watcher.reconfigure(before, service.callers.profiles())
        return Reloaded(changed=sorted(changed), breakers=breakers, profiles=profiles)

    def _check_live(self, config: Settings, settings: ServeSection, changed: list[str]) -> None:
        """Refuse (400 ``restart_required``) what cannot change while serving."""
        service = self.service
        fixed = [key for key in changed if not key.startswith(LIVE)]
        if bool(service.settings.http.clients) != bool(settings.http.clients):
            fixed.append("serve.http.clients (turning client tokens on or off)")
        was, now = configured_limits(service.settings)[1], configured_limits(settings)[1]
        fixed += [  # a new client's limits would need ClientLimits rebuilt
            f"serve.http.clients.{name} (rate_per_s/burst/max_concurrent_calls)"
            for name, limit in now.items()
            if was.get(name, ClientLimit()) != limit
        ]
        new = config.dispatcher_options()
        dispatcher = service.dispatcher
        for key in dispatcher.breakers.keys():  # noqa: SIM118 - not a dict
            bound = dispatcher.policy(key).fixed_changes(new.policy(key))
            fixed += [f"keys.{key}.{name} (the key is in use)" for name in bound]
        if fixed:
            shown = ", ".join(fixed[:8]) + (", …" if len(fixed) > 8 else "")
            raise ReloadRefused(400, "restart_required", f"these change only at restart: {shown}")

    def _commit(
        self,
        config: Settings,
        settings: ServeSection,
        changed: list[str],
        connected: Mapping[str, Any],
        undo: list[Callable[[], object]],
    ) -> list[tuple[Callable[[], Any], set[str], float]]:
        """Swap plugins and upstreams in the registry (no await: no call sees half of it);
        returns what to close once drained."""
        service = self.service
        registry = service.dispatcher.registry
        retired: list[tuple[Callable[[], Any], set[str], float]] = []
        for name in sorted(_names(changed, "plugins.")):
            old = service.plugins.pop(name, [])
            undo.append(partial(service.plugins.__setitem__, name, old))
            for plugin in old:
                keys, grace_s = self._drain_terms(plugin)
                registry.unregister(plugin)
                undo.append(partial(registry.register, plugin))
                if isinstance(plugin, Closeable):
                    retired.append((plugin.aclose, keys, grace_s))
            table = config.plugins.get(name)
            if table is not None and table.enabled:
                new = load_configured_plugins(registry, Settings(plugins={name: table}))[name]
                undo.extend(partial(registry.unregister, plugin) for plugin in new)
                service.plugins[name] = new
        upstreams = service.upstreams
        for name in sorted(_names(changed, "serve.upstreams.")):
            entry = upstreams.open.get(name)
            if entry is not None:
                old_settings, old_source = entry
                keys, grace_s = self._drain_terms(old_source)
                upstreams.unregister(name)
                undo.append(partial(upstreams.register, old_settings, old_source))
                retired.append((partial(upstreams.close, old_source), keys, grace_s))
            if name in connected:
                upstreams.register(settings.upstreams[name], connected[name])
                undo.append(partial(upstreams.unregister, name))
        if _names(changed, "serve.upstreams."):  # two upstreams offering one URI or prompt
            service.gateway.offerings.check()
        return retired

    def _drain_terms(self, plugin: Any) -> tuple[set[str], float]:
        """A plugin's breaker keys and the longest deadline of its tools, as declared now."""
        registry = self.service.dispatcher.registry
        keys, longest = set(), 0.0
        for decl in plugin.describe():
            with contextlib.suppress(RegistrationError):  # declared invalidly now: not served
                if (tool := registry.resolve(decl.name)) is not None:
                    keys.add(tool.decl.key)
                    longest = max(longest, tool.decl.timeout_s)
        return keys, longest + CLOSE_GRACE_S

    async def _drain(self, close: Callable[[], Any], keys: set[str], grace_s: float) -> None:
        in_flight = self.service.dispatcher.bulkhead.in_flight
        with anyio.move_on_after(grace_s):
            while any(in_flight().get(key, 0) for key in keys):  # noqa: ASYNC110 - counts
                await anyio.sleep(0.05)
        try:
            result = close()
            if result is not None and hasattr(result, "__await__"):
                await result
        except Exception:
            log.exception("toolrelay serve: closing a retired plugin failed")


def _digest(path: Path | None) -> str | None:
    """The content hash of the config file (``None``: no file now; a file that cannot be
    used, such as a FIFO, is its refusal's text). It never waits on the file; a reload still
    calls it in a thread (a slow file system)."""
    if path is None or not path.exists():
        return None
    try:
        return hashlib.sha256(read_bytes(path)).hexdigest()
    except ConfigError as exc:
        return str(exc)
