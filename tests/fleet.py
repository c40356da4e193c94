"""A fleet on loopback, as deploy/ describes it: one redis-server, three ``toolrelay serve``
replicas started with the ExecStart of ``deploy/toolrelay@.service`` and configured by
``deploy/toolrelay.toml``, and HAProxy running ``deploy/haproxy.cfg`` — each file copied
with its addresses, ports, paths and HAProxy's check intervals changed, nothing else.

Plain subprocesses and sockets (no pytest): the fleet tests start one per module, and the
fleet benchmark (bench/suite/fleet.py) starts its own.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from redis_server import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
TESTS = Path(__file__).resolve().parent
ADMIN_TOKEN = "fleet-admin-token-0123456789abcdef"
AGENTS_TOKEN = "fleet-agents-token-0123456789abcdef"
ANNOUNCED = re.compile(r"MCP on http://\S+")
CHECKS = ("inter 1s fastinter 250ms downinter 1s", "inter 100ms fastinter 50ms downinter 100ms")
"""HAProxy's check intervals, deploy's and the tests' (a replica is seen down or up in
0.1-0.2 s instead of 1-2 s)."""
TEST_DRAIN_S = 30.0
"""``[serve] drain_s``: long, so that what a test checks while a replica drains happens
inside the drain however loaded the machine; a test ends the drain when it is done with a
second SIGTERM (:meth:`Replica.end_drain`), as ``close`` does."""


def _replace(text: str, old: str, new: str, where: str) -> str:
    if old not in text:
        raise AssertionError(f"{where} no longer contains {old!r}: update tests/fleet.py")
    return text.replace(old, new)


def exec_start() -> list[str]:
    """The unit's ExecStart, as words."""
    unit = (DEPLOY / "toolrelay@.service").read_text()
    (line,) = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


@dataclass
class Replica:
    """One ``toolrelay serve``: ``rN`` in HAProxy, its two ports fixed for its whole life
    (a restarted replica comes back where HAProxy looks for it)."""

    name: str
    index: int
    port: int
    admin_port: int
    config: Path
    env: dict[str, str]
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def mcp_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def errlog(self) -> Path:
        return self.workdir / f"{self.name}.{self.starts}.err"

    def command(self) -> list[str]:
        words = exec_start()
        assert words[0].endswith("/toolrelay"), words
        out: list[str] = [sys.executable, "-m", "toolrelay"]
        for word in words[1:]:
            word = word.replace("/etc/toolrelay/toolrelay.toml", str(self.config))
            word = word.replace("810%i", str(self.port)).replace("946%i", str(self.admin_port))
            assert "%" not in word and "/etc/" not in word, word
            out.append(word)
        return out

    def launch(self) -> None:
        self.starts += 1
        with self.errlog.open("wb") as err:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=self.env,
                start_new_session=True,
            )

    def wait_announced(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if ANNOUNCED.search(self.errlog.read_text(errors="replace")):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"{self.name} did not start:\n{self.errlog.read_text()[-3000:]}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """``kill -9``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def terminate(self) -> None:
        """SIGTERM: the replica drains and exits by itself."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def end_drain(self, timeout_s: float = 10.0) -> None:
        """After :meth:`terminate`: a second SIGTERM, once the first was handled (the
        replica said so), ends the drain at once."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while "SIGTERM: stopping" not in self.errlog.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return
            time.sleep(0.02)
        self.terminate()

    def wait_exit(self, timeout_s: float = 15.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def log(self) -> str:
        return "".join(
            (self.workdir / f"{self.name}.{n}.err").read_text(errors="replace")
            for n in range(1, self.starts + 1)
        )


@dataclass
class Fleet:
    """Redis, three replicas and HAProxy, started by :meth:`start` (or ``with``)."""

    workdir: Path
    haproxy: str
    redis_binary: str | None = None
    tools: str = ""
    """The TOML that replaces deploy's "your tools" section (plugins, keys, clients)."""
    size: int = 3
    tokens: bool = True
    """False: deploy's client token is left out (every caller is the one client ``default``)."""
    env: dict[str, str] = field(default_factory=dict)
    replicas: list[Replica] = field(default_factory=list)
    redis: RedisServer | None = None
    lb: subprocess.Popen[bytes] | None = None
    port: int = 0
    socket_path: Path | None = None

    @property
    def url(self) -> str:
        """The MCP endpoint, through HAProxy."""
        return f"http://127.0.0.1:{self.port}/mcp"

    # -- start and stop -------------------------------------------------------------------
    def start(self) -> Fleet:
        self.redis = RedisServer(binary=self.redis_binary).start()
        config = self.workdir / "toolrelay.toml"
        config.write_text(self.render_config())
        pythonpath = [str(TESTS), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in pythonpath if p)}
        env |= {"TOOLRELAY_ADMIN_TOKEN": ADMIN_TOKEN, "TOOLRELAY_TOKEN_AGENTS": AGENTS_TOKEN}
        env |= self.env
        for index in range(1, self.size + 1):
            replica = Replica(
                f"r{index}", index, free_port(), free_port(), config, env, self.workdir
            )
            self.replicas.append(replica)
            replica.launch()  # side by side: imports take most of a start
        for replica in self.replicas:
            replica.wait_announced()
        self.start_lb()
        self.wait_states(dict.fromkeys(self.names, "UP"))
        return self

    @property
    def names(self) -> list[str]:
        return [replica.name for replica in self.replicas]

    def render_config(self) -> str:
        text = (DEPLOY / "toolrelay.toml").read_text()
        where = "deploy/toolrelay.toml"
        begin, end = "# --- your tools", "# --- end of your tools"
        start, stop = text.index(begin), text.index(end)
        stop = text.index("\n", stop) + 1
        text = text[:start] + self.tools.strip() + "\n" + text[stop:]
        assert self.redis is not None
        text = _replace(
            text, 'url = "redis://127.0.0.1:6379/0"', f'url = "{self.redis.url}"', where
        )
        if not self.tokens:
            agents = '[serve.http.clients.agents]\ntoken_env = "TOOLRELAY_TOKEN_AGENTS"\n'
            text = _replace(text, agents, "", where)
        return _replace(text, "drain_s = 2.0", f"drain_s = {TEST_DRAIN_S}", where)

    def render_lb(self) -> str:
        text = (DEPLOY / "haproxy.cfg").read_text()
        where = "deploy/haproxy.cfg"
        self.port = self.port or free_port()
        self.socket_path = self.workdir / "haproxy.sock"
        text = _replace(
            text, "log /dev/log local0 notice", "log stderr format raw local0 err", where
        )
        text = _replace(text, "/run/haproxy/toolrelay.sock", str(self.socket_path), where)
        text = _replace(text, "bind 127.0.0.1:8000", f"bind 127.0.0.1:{self.port}", where)
        text = _replace(text, *CHECKS, where)
        servers = re.findall(r"^    server r\d.*\n", text, re.MULTILINE)
        assert len(servers) == 3, servers
        ours = "".join(
            f"    server {r.name} 127.0.0.1:{r.port} check port {r.admin_port}\n"
            for r in self.replicas
        )
        text = _replace(text, "".join(servers), ours, where)
        return text

    def start_lb(self) -> None:
        cfg = self.workdir / "haproxy.cfg"
        cfg.write_text(self.render_lb())
        err = (self.workdir / "haproxy.err").open("wb")
        self.lb = subprocess.Popen(
            [self.haproxy, "-f", str(cfg), "-db"],
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            env={**os.environ, "TOOLRELAY_ADMIN_TOKEN": ADMIN_TOKEN},
            start_new_session=True,
        )
        err.close()
        deadline = time.monotonic() + 10
        while not self._lb_listening():
            if self.lb.poll() is not None or time.monotonic() > deadline:
                log = (self.workdir / "haproxy.err").read_text(errors="replace")
                raise RuntimeError(f"haproxy did not start:\n{log[-3000:]}")
            time.sleep(0.02)

    def _lb_listening(self) -> bool:
        assert self.socket_path is not None
        if not self.socket_path.exists():
            return False
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
            return True
        return False

    def close(self) -> None:
        if self.lb is not None:
            self.lb.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.lb.wait(5)
            if self.lb.poll() is None:
                self.lb.kill()
                self.lb.wait(5)
        running = [r for r in self.replicas if r.proc is not None and r.proc.poll() is None]
        for replica in running:
            replica.terminate()
        for replica in running:
            replica.end_drain()
        for replica in self.replicas:
            if replica.proc is not None:
                try:
                    replica.wait_exit(10)
                except subprocess.TimeoutExpired:
                    replica.kill()
        if self.redis is not None:
            self.redis.kill()
            self.redis.dir.cleanup()

    def __enter__(self) -> Fleet:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- HAProxy's view -------------------------------------------------------------------
    def lb_command(self, command: str) -> str:
        assert self.socket_path is not None
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket_path))
            sock.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def stat(self, column: str) -> dict[str, str]:
        """One column of HAProxy's ``show stat``, by replica."""
        lines = self.lb_command("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        name, wanted = header.index("svname"), header.index(column)
        found = {}
        for line in lines[1:]:
            row = line.split(",")
            if len(row) > wanted and row[0] == "toolrelay" and row[name] in self.names:
                found[row[name]] = row[wanted]
        return found

    def states(self) -> dict[str, str]:
        """Each replica's state as HAProxy's checks see it: ``UP``, ``DOWN``, ``UP 1/2``…"""
        return self.stat("status")

    def picked(self) -> dict[str, int]:
        """How many requests HAProxy has sent to each replica (``lbtot``)."""
        return {name: int(value) for name, value in self.stat("lbtot").items()}

    def wait_states(self, expected: dict[str, str], timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while (states := self.states()) | expected != states:
            if time.monotonic() > deadline:
                raise AssertionError(f"HAProxy sees {states}, not {expected}")
            time.sleep(0.02)

    def replica(self, name: str) -> Replica:
        (found,) = [r for r in self.replicas if r.name == name]
        return found

    def by_pid(self, pid: int) -> str:
        """The name of the replica whose process has this id."""
        for replica in self.replicas:
            if replica.proc is not None and replica.proc.pid == pid:
                return replica.name
        raise KeyError(pid)

    # -- kill, drain, restart -------------------------------------------------------------
    def restart(self, replica: Replica) -> None:
        """Start a replica that has exited again, and wait until HAProxy sees it up."""
        replica.launch()
        replica.wait_announced()
        self.wait_states({replica.name: "UP"})
