"""The layer contracts in pyproject.toml hold, and they can fail.

``make lint`` runs import-linter (``lint-imports``) on the real tree. These tests run it too,
then break a scratch copy of the package on purpose — an upward import, an import between two
stages, a cycle between siblings — and check that the linter refuses each one by the contract
it breaks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter not installed")


def lint(src: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of pyproject.toml and src/toolrelay that a test may break."""
    top = tmp_path_factory.mktemp("layers")
    shutil.copy(ROOT / "pyproject.toml", top / "pyproject.toml")
    shutil.copytree(
        ROOT / "src" / "toolrelay",
        top / "src" / "toolrelay",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    return top


def test_the_real_tree_keeps_every_contract() -> None:
    done = lint(ROOT / "src", ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "broken" not in done.stdout.lower().replace("0 broken", "")


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        # the bottom layer reaching up to the gateway
        ("contract.py", "from toolrelay.serve import errors as _up", "Layers"),
        # a stage importing another stage's insides
        ("pipeline/shape.py", "from toolrelay.pipeline import decode as _side", "Stages"),
        # the core config learning about the gateway's section
        ("config.py", "from toolrelay.serve import settings as _up", "Layers"),
    ],
)
def test_a_broken_scratch_copy_fails_the_lint(
    scratch: Path, module: str, line: str, contract: str
) -> None:
    target = scratch / "src" / "toolrelay" / module
    original = target.read_text()
    target.write_text(original + f"\n{line}\n")
    try:
        done = lint(scratch / "src", scratch)
    finally:
        target.write_text(original)
    assert done.returncode != 0, done.stdout
    assert "BROKEN" in done.stdout, done.stdout
    broken = [row for row in done.stdout.splitlines() if row.rstrip().endswith("BROKEN")]
    assert any(contract in row for row in broken), broken


def test_a_cycle_between_siblings_fails_the_lint(scratch: Path) -> None:
    # registry sits below dispatcher; an import back up closes a cycle (and breaks a layer)
    target = scratch / "src" / "toolrelay" / "registry.py"
    original = target.read_text()
    target.write_text(original + "\nfrom toolrelay import dispatcher as _cycle\n")
    try:
        done = lint(scratch / "src", scratch)
    finally:
        target.write_text(original)
    assert done.returncode != 0, done.stdout
    broken = [row for row in done.stdout.splitlines() if row.rstrip().endswith("BROKEN")]
    assert any("cycle" in row.lower() for row in broken), broken
