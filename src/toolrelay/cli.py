"""The ``toolrelay`` command: demo, call, specs, check, config, chaos, serve, lock and diff.

Errors are one line on stderr and a non-zero exit status (2 for usage and configuration,
1 for a failed invariant or an answer with ``ok: false``), never a traceback.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

DEFAULT_CONFIG = "toolrelay.toml"
EMBEDDED_DEFAULTS: dict[str, Any] = {"plugins": {"weather": {}}}


class CliError(Exception):
    """A one-line error for the user."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolrelay", description="Run an agent's tool calls through a resilient pipeline."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="an agent that keeps answering while services fail")
    demo.add_argument("--duration", type=float, default=30.0, help="seconds (30; at least 10)")
    demo.add_argument("--seed", type=int, default=1)
    demo.add_argument("--metrics-port", type=int, default=9464, help="0 disables /metrics")
    demo.add_argument("--otlp-endpoint", help="send spans to this OTLP/HTTP endpoint")
    demo.add_argument("--json", type=Path, help="write the report as JSON to this file")
    demo.add_argument("--html", type=Path, help="write the report as HTML (charts) to this file")
    view = demo.add_mutually_exclusive_group()
    view.add_argument("--live", dest="live", action="store_true", default=None)
    view.add_argument("--plain", dest="live", action="store_false")

    call = commands.add_parser("call", help="run one tool call and print the model's answer")
    call.add_argument("tool")
    call.add_argument("args_json", metavar="ARGS_JSON", nargs="?", default="{}")
    call.add_argument("--profile")
    call.add_argument("--config", help=f"config file (default: ./{DEFAULT_CONFIG} if present)")

    specs = commands.add_parser("specs", help="print the tool specs a model is offered")
    specs.add_argument("--profile")
    specs.add_argument("--format", default="openai",
                       choices=["openai", "openai-responses", "anthropic", "mcp"])  # fmt: skip
    specs.add_argument("--config")

    check = commands.add_parser("check", help="validate a config file")
    check.add_argument("config")

    config = commands.add_parser("config", help="config file tools")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="TOOL")
    config_commands.add_parser("schema", help="print the JSON Schema of toolrelay.toml")

    chaos = commands.add_parser("chaos", help="chaos tools")
    chaos_commands = chaos.add_subparsers(dest="chaos_command", required=True, metavar="TOOL")
    upstream = chaos_commands.add_parser(
        "upstream",
        help="the stand-in upstream server",
        description="Serve stand-ins for Open-Meteo, SearXNG and feeds; "
        "misbehave on command (POST /_admin/faults).",
    )
    upstream.add_argument("--host", default="127.0.0.1", help="loopback address (127.0.0.1)")
    upstream.add_argument("--port", type=int, default=8765, help="port, 0 for any (8765)")
    upstream.add_argument("--seed", type=int, default=0, help="seed of the fault dice (0)")
    upstream.add_argument("--live-clock", action="store_true", help="date by the wall clock")
    run = chaos_commands.add_parser("run", help="run a chaos experiment")
    run.add_argument("experiment", type=Path)
    run.add_argument("--json", type=Path, help="write the report as JSON to this file")
    run.add_argument("--html", type=Path, help="write the report as HTML (charts) to this file")
    run.add_argument("--compare", type=Path, metavar="EXPERIMENT",
                     help="run this experiment too, and report both side by side")  # fmt: skip
    run.add_argument("--seed", type=int)

    lock = commands.add_parser("lock", help="pin the tool definitions offered (toolrelay.lock)")
    lock.add_argument("--config", help=f"config file (default: ./{DEFAULT_CONFIG} if present)")
    lock.add_argument("--update", action="store_true", help="accept changed definitions")
    diff = commands.add_parser("diff", help="breaking and compatible changes between catalogs")
    diff.add_argument("old", help="a lock file, or a config file (its live tools)")
    diff.add_argument("new", help="a lock file, or a config file (its live tools)")

    serve = commands.add_parser("serve", help="serve the tools over MCP, with an admin API")
    serve.add_argument("--config", help=f"config file (default: ./{DEFAULT_CONFIG} if present)")
    serve.add_argument("--transport", choices=["stdio", "http"], help="default: stdio")
    serve.add_argument("--host", help="HTTP transport address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="HTTP transport port (default 8000)")
    serve.add_argument("--profile", help="the profile of stdio and token-less HTTP callers")
    serve.add_argument("--admin-host", help="admin API address (default 127.0.0.1)")
    serve.add_argument("--admin-port", type=int, help="serve the admin API on this port")
    serve.add_argument("--admin-token-env", metavar="VAR",
                       help="environment variable holding the admin token "
                       "(default TOOLRELAY_ADMIN_TOKEN)")  # fmt: skip
    serve.add_argument("--allow-remote", action="store_true", default=None,
                       help="allow binding non-loopback addresses")  # fmt: skip
    return parser


def _dispatcher(args: argparse.Namespace) -> Any:
    from .dispatcher import Dispatcher

    config = _settings(args.config)[0]
    return Dispatcher.from_config(config, overrides={"telemetry": False}, audit=None)


async def _call(args: argparse.Namespace) -> int:
    async with _dispatcher(args) as dispatcher:
        result = await dispatcher.dispatch(
            args.tool, args.args_json, profile=args.profile, call_id="cli"
        )
    print(json.dumps(result.to_model(), ensure_ascii=False, indent=2))
    return 0 if result.ok else 1


async def _specs(args: argparse.Namespace) -> int:
    async with _dispatcher(args) as dispatcher:
        print(json.dumps(dispatcher.specs(args.profile, args.format), indent=2))
    return 0


def _check(args: argparse.Namespace) -> int:
    from .config import load_config

    config = load_config(args.config)
    parts = [
        f"{len(config.plugins)} plugins",
        f"{len(config.tools)} tool overrides",
        f"{len(config.keys)} key policies",
        f"{len(config.profiles)} profiles",
        f"{len(config.faults)} faults",
    ]
    print(f"{args.config}: ok ({', '.join(parts)})")
    return 0


def _config(args: argparse.Namespace) -> int:
    from .config import CONFIG_SCHEMA

    print(json.dumps(CONFIG_SCHEMA, indent=2, ensure_ascii=False))
    return 0


async def _demo(args: argparse.Namespace) -> int:
    from . import demo
    from .demo_view import pick_view, print_summary

    if not args.duration >= demo.MIN_DURATION_S:
        raise CliError(
            f"--duration must be at least {demo.MIN_DURATION_S:g} s (the search outage, its "
            f"breaker's break and the recovery after it must fit in the run), not {args.duration:g}"
        )
    options = demo.DemoOptions(
        duration_s=args.duration,
        seed=args.seed,
        metrics_port=args.metrics_port,
        otlp_endpoint=args.otlp_endpoint,
        json_path=args.json,
        html_path=args.html,
        live=args.live,
    )
    view = pick_view(options.live, options.duration_s)
    report = await demo.run_demo(options, view=view)
    print_summary(report)
    return 0 if report.ok else 1


def _chaos(args: argparse.Namespace) -> int:
    if args.chaos_command == "upstream":
        from .chaos.upstream import main as upstream_main

        return upstream_main(args)
    from .chaos.experiment import main as experiment_main

    return experiment_main(
        args.experiment, json_path=args.json, seed=args.seed, html_path=args.html,
        compare=args.compare,
    )  # fmt: skip


def _serve(args: argparse.Namespace) -> int:
    from .serve import ServeError

    try:
        from .serve import main as serve_main
    except ImportError as exc:
        raise CliError(
            f"serve needs the MCP SDK 2.x: pip install 'toolrelay[serve]' ({exc})"
        ) from None

    for name in ("port", "admin_port"):
        value = getattr(args, name)
        if value is not None and not 0 <= value <= 65535:
            raise CliError(f"--{name.replace('_', '-')} must be between 0 and 65535")
    try:
        return serve_main(
            args.config,
            defaults=EMBEDDED_DEFAULTS,
            transport=args.transport,
            host=args.host,
            port=args.port,
            profile=args.profile,
            admin_host=args.admin_host,
            admin_port=args.admin_port,
            admin_token_env=args.admin_token_env,
            allow_remote=args.allow_remote,
        )
    except ServeError as exc:
        raise CliError(str(exc)) from None


def _settings(config_path: str | None) -> tuple[Any, Any, Path]:
    """A config, its ``[serve]``, and where its lock file is (``[serve.catalog] lock``, else
    ``toolrelay.lock`` beside the config file)."""
    from .serve.settings import load

    config, serve = load(config_path, EMBEDDED_DEFAULTS)
    base = Path(".") if config.path is None else config.path.parent
    return config, serve, base / (serve.catalog.lock or "toolrelay.lock")


async def _live(config: Any, serve: Any) -> dict[str, Any]:
    """The lock of the tools a config offers now (its plugins and upstreams)."""
    from .catalog import lock_of
    from .config import load_configured_plugins
    from .registry import ToolRegistry
    from .serve import ServeError
    from .serve.upstreams import Upstreams

    reserved = config.dispatcher.reserved_properties
    registry = ToolRegistry() if reserved is None else ToolRegistry(reserved_properties=reserved)
    load_configured_plugins(registry, config)
    async with Upstreams(registry, os.environ) as upstreams:
        try:
            await upstreams.start(serve.upstreams.values())
        except ServeError as exc:
            raise CliError(str(exc)) from None
        return lock_of(sorted((t.decl for t in registry.tools()), key=lambda d: d.name))


async def _catalog(where: str) -> dict[str, Any]:
    """The tools of a lock file, or those a config file (``.toml``) offers now."""
    from .catalog import load

    if where.endswith(".toml"):
        return dict((await _live(*_settings(where)[:2]))["tools"])
    return load(where)


async def _lock(args: argparse.Namespace) -> int:
    from .catalog import diff_locks, dumps, load

    config, serve, path = _settings(args.config)
    locked = load(path) if path.exists() else None  # a broken lock fails before connecting
    lock = await _live(config, serve)
    text = dumps(lock)
    if locked is not None:
        for change in diff_locks(locked, lock["tools"]):
            print(change.line())
        if path.read_text(encoding="utf-8") == text:
            print(f"{path}: up to date ({len(lock['tools'])} tools)")
            return 0
        if not args.update:
            print(f"{path}: out of date; run toolrelay lock --update to accept", file=sys.stderr)
            return 1
    path.write_text(text, encoding="utf-8")
    print(f"{path}: {len(lock['tools'])} tools locked")
    return 0


async def _diff(args: argparse.Namespace) -> int:
    from .catalog import diff_locks

    changes = diff_locks(await _catalog(args.old), await _catalog(args.new))
    for change in changes:
        print(change.line())
    breaking = sum(change.breaking for change in changes)
    print(f"{len(changes)} changes, {breaking} breaking")
    return 1 if breaking else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``toolrelay`` command."""
    args = _parser().parse_args(argv)
    from .catalog import LockError
    from .config import ConfigError
    from .loading import PluginLoadError

    commands: dict[str, Callable[[argparse.Namespace], Any]] = {
        "demo": _demo, "call": _call, "specs": _specs, "check": _check,
        "config": _config, "serve": _serve, "chaos": _chaos, "lock": _lock, "diff": _diff,
    }  # fmt: skip
    try:
        run = commands[args.command]
        code: int = anyio.run(run, args) if inspect.iscoroutinefunction(run) else run(args)
        return code
    except (CliError, ConfigError, PluginLoadError, LockError) as exc:
        print(f"toolrelay: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # never a traceback on the terminal
        print(f"toolrelay: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
        if os.environ.get("TOOLRELAY_DEBUG"):
            raise
        return 2


if __name__ == "__main__":
    sys.exit(main())
