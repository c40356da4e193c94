"""The built wheel installs, and each framework adapter imports from it with its extra.

`make dist` builds the wheel with hatchling; here it is built the same way into a temporary
folder, installed (without dependencies) into a fresh venv that borrows this venv's packages
through a ``.pth`` line (offline, a few seconds), and each adapter is imported from the
installed copy. Each extra must name the distributions the adapter's documented usage
imports (``toolrelay[langchain]`` brings ``langchain`` for ``create_agent``), at versions the
extra accepts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # 10-40 s on a loaded 2-core machine: the frameworks' imports

# extra → (the adapter module, the modules its docs import)
EXTRAS = {
    "openai-agents": ("toolrelay.integrations.openai_agents", ["agents"]),
    "pydantic-ai": ("toolrelay.integrations.pydantic_ai", ["pydantic_ai"]),
    "langchain": (
        "toolrelay.integrations.langchain",
        ["langchain.agents", "langchain_core.tools", "langgraph.graph"],
    ),
}

CHECK = """
import importlib, importlib.metadata as md, sys
from pathlib import Path
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

extra, adapter, *uses = sys.argv[1:]
import toolrelay
assert toolrelay.__file__.startswith(sys.prefix), f"toolrelay from {toolrelay.__file__}"
dist = md.distribution("toolrelay")
wanted = {}
for text in dist.requires or []:
    req = Requirement(text)
    if req.marker is not None and req.marker.evaluate({"extra": extra}):
        wanted[canonicalize_name(req.name)] = req
assert wanted, f"no extra {extra!r}"
for name, req in sorted(wanted.items()):
    version = md.version(name)
    assert req.specifier.contains(version, prereleases=True), f"{name} {version} not {req}"
importlib.import_module(adapter)
for module in uses:
    path = Path(importlib.import_module(module).__file__).resolve()
    files = (f for n in wanted for f in md.distribution(n).files or [])
    owner = [f for f in files if Path(f.locate()).resolve() == path]
    assert owner, f"{module} ({path}) comes from no distribution [{extra}] names"
print("ok", dist.version, sorted(wanted))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python of a fresh venv holding the built wheel (and borrowing our packages)."""
    dist = tmp_path_factory.mktemp("dist")
    build = [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(dist)]
    subprocess.run(build, cwd=ROOT, check=True, capture_output=True, timeout=120)
    (wheel,) = dist.glob("toolrelay-*-py3-none-any.whl")
    env = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=60
    )
    python = env / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    # Only the folder joins sys.path: its own .pth files (our editable install) are not read.
    Path(purelib, "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps"]
    subprocess.run([*pip, "--no-index", "--quiet", str(wheel)], check=True, timeout=120)
    return python


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_the_wheel_installs_and_the_adapter_imports_with_its_extra(
    installed: Path, extra: str
) -> None:
    adapter, uses = EXTRAS[extra]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the wheel's copy only
    done = subprocess.run(
        [installed, "-c", CHECK, extra, adapter, *uses],
        capture_output=True, text=True, timeout=120, cwd=installed.parent, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ok 0.1.0 "), done.stdout
