"""The servers side by side, each its own process on a loopback port: the bare upstream
(bench/gateway_echo.py), ``mcp-proxy`` in its own venv, ``toolrelay serve`` with the
upstream and with the in-process plugin (one pair per variant); their CPU time and RSS."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc
from mcp import ClientSession

HERE = Path(__file__).resolve().parents[2]  # bench/
ECHO = HERE / "gateway_echo.py"
MCP_PROXY_VERSION = "mcp-proxy==0.13.0"
CONCURRENCY = (1, 8)
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
UPSTREAMS = {"upstream": [], "upstream[json]": ["--json"]}
"""The bare server: on the SDK's default HTTP settings (SSE answers), and with JSON answers."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "toolrelay" / "bench-mcp-proxy"


def mcp_proxy() -> tuple[Path | None, str]:
    """The ``mcp-proxy`` executable in its own venv (installed on first use), or why not."""
    venv = cache_dir()
    exe = venv / "bin" / "mcp-proxy"
    if exe.exists():
        return exe, ""
    shutil.rmtree(venv, ignore_errors=True)
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300
        )
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", MCP_PROXY_VERSION]
        proc = subprocess.run(pip, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"cannot create a venv for mcp-proxy: {exc}"
    if proc.returncode != 0 or not exe.exists():
        shutil.rmtree(venv, ignore_errors=True)
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        return None, f"pip install {MCP_PROXY_VERSION} failed: {tail[0]}"
    return exe, ""


@dataclass
class Server:
    name: str
    command: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    tool: str = ""
    progress_tool: str = ""
    sessions: list[ClientSession] = field(default_factory=list)
    progress_seen: list[int] = field(default_factory=list)
    """Per call of the ``progress`` tool: the notifications that reached the client."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def cpu_s(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS

    def children_cpu_s(self) -> float:
        """CPU time of the server's child processes (its upstream), 0 for none."""
        assert self.proc is not None
        total = 0.0
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                with contextlib.suppress(OSError):
                    stat = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
                    total += (int(stat[11]) + int(stat[12])) / TICKS
        return total

    def rss_mb(self) -> float:
        assert self.proc is not None
        pages = int(Path(f"/proc/{self.proc.pid}/statm").read_text().split()[1])
        return pages * PAGE / 1e6


def toolrelay_config(
    workdir: Path, name: str, port: int, upstream: bool, http: str, upstream_toml: str = ""
) -> Path:
    path = workdir / f"{name}.toml"
    lines = []
    if upstream:
        command = [sys.executable, str(ECHO)]
        lines += ["[serve.upstreams.echo]", f"command = {json.dumps(command)}"]
        lines += ['breaker_key = "echo"', "timeout_s = 10", upstream_toml]
    else:
        lines += ["[plugins.echo]", 'module = "gateway_echo"']
    lines += ["[serve]", 'transport = "http"', "[serve.http]", f"port = {port}"]
    lines += ["max_sessions = 100", "max_sessions_per_client = 100", http]
    path.write_text("\n".join(lines) + "\n")
    return path


def toolrelay_command(config: Path, prelude: str) -> list[str]:
    if not prelude:
        return [sys.executable, "-m", "toolrelay", "serve", "--config", str(config)]
    code = f"{prelude}\nimport runpy\nrunpy.run_module('toolrelay', run_name='__main__')"
    return [sys.executable, "-c", code, "serve", "--config", str(config)]


def against(tree: Path, variants: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The default configuration and each variant once more, each gateway run from ``tree``'s
    ``src/`` and ``plugins/`` (put first on its path): ``NAME@TREE``."""
    root = tree.resolve()
    paths = [str(root / "src"), str(root / "plugins")]
    prelude = f"!import sys; sys.path[:0] = {paths!r}"
    return [(f"{name}@{root.name}", f"{prelude}\n{toml}") for name, toml in [("", ""), *variants]]


def plan(workdir: Path, variants: Sequence[tuple[str, str]], proxy: bool) -> list[Server]:
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    echo = [sys.executable, str(ECHO), "--http", "{port}"]
    servers = [Server(name, echo + extra, free_port()) for name, extra in UPSTREAMS.items()]
    if proxy:
        exe, why = mcp_proxy()
        if exe is None:
            print(f"mcp-proxy: skipped ({why})", file=sys.stderr)
        else:
            command = [str(exe), "--host", "127.0.0.1", "--port", "{port}"]
            command += ["--log-level", "WARNING", "--", sys.executable, str(ECHO)]
            servers.append(Server("mcp-proxy", command, free_port()))
    for label, extra in [("", ""), *variants]:
        lines = extra.splitlines()
        prelude = "\n".join(line[1:] for line in lines if line.startswith("!"))
        of_upstream = "\n".join(line[9:] for line in lines if line.startswith("upstream."))
        http = "\n".join(line for line in lines if not line.startswith(("!", "upstream.")))
        for kind, upstream in (("toolrelay", True), ("toolrelay-plugin", False)):
            name = f"{kind}[{label}]" if label else kind
            port = free_port()
            config = toolrelay_config(workdir, name, port, upstream, http, of_upstream)
            servers.append(Server(name, toolrelay_command(config, prelude), port, env))
    return servers


@contextlib.contextmanager
def running(servers: Sequence[Server], workdir: Path) -> Iterator[None]:
    try:
        for server in servers:
            command = [part.replace("{port}", str(server.port)) for part in server.command]
            err = (workdir / f"{server.name}.err").open("wb")
            server.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, **server.env},
                cwd=workdir,
                start_new_session=True,
            )
        yield
    finally:
        for server in servers:
            if server.proc is not None and server.proc.poll() is None:
                server.proc.terminate()
        for server in servers:
            if server.proc is None:
                continue
            try:
                server.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait()


async def wait_listening(server: Server, workdir: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert server.proc is not None
        if server.proc.poll() is not None:
            log = (workdir / f"{server.name}.err").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{server.name} exited ({server.proc.returncode}):\n{log}")
        try:
            stream = await anyio.connect_tcp("127.0.0.1", server.port)
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{server.name} is not listening on {server.port}") from None
            await anyio.sleep(0.05)
        else:
            await stream.aclose()
            return
