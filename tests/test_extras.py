"""``pip install toolrelay`` is the library and what the pipeline needs; the first-party
plugins (httpx, feedparser) and the stand-in upstream (h11) are extras, and a missing one
is named in one line."""

from __future__ import annotations

import subprocess
import sys
import textwrap

OPTIONAL = {"feedparser", "h11", "httpx", "httpx2", "mcp", "starlette", "uvicorn", "griffe"}


def _run(code: str, *, hide: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where the modules in ``hide`` cannot be imported."""
    prelude = "".join(f"sys.modules[{name!r}] = None\n" for name in hide)
    script = "import sys\n" + prelude + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_core_import_needs_no_extra() -> None:
    done = _run(
        f"""
        import toolrelay
        print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(OPTIONAL)!r}))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_core_import_works_without_the_extras() -> None:
    done = _run("import toolrelay; print('ok')", hide=tuple(sorted(OPTIONAL)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_plugin_without_its_extra_names_it() -> None:
    code = """
        from toolrelay import ToolRegistry
        from toolrelay.loading import PluginLoadError, load_entry_points
        try:
            load_entry_points(ToolRegistry(), [{name!r}])
        except PluginLoadError as exc:
            print(exc)
        """
    done = _run(code.format(name="feeds"), hide=("feedparser",))
    assert done.stdout.strip() == (
        "plugin 'feeds' could not be imported: ModuleNotFoundError: "
        "the feeds plugin needs feedparser: pip install 'toolrelay[plugins]'"
    ), done.stderr
    done = _run(code.format(name="weather"), hide=("httpx",))
    assert done.stdout.strip() == (
        "plugin 'weather' could not be imported: ModuleNotFoundError: "
        "the first-party plugins need httpx: pip install 'toolrelay[plugins]'"
    ), done.stderr


def test_the_command_line_works_without_h11_until_the_upstream_is_asked_for() -> None:
    code = """
        from toolrelay.cli import main
        print(main({argv!r}))
        """
    done = _run(code.format(argv=["config", "schema"]), hide=("h11",))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("0")
    done = _run(code.format(argv=["chaos", "upstream", "--port", "0"]), hide=("h11",))
    assert done.stdout.strip() == "2", done.stderr
    assert done.stderr == (
        "toolrelay: ModuleNotFoundError: "
        "the stand-in upstream needs h11: pip install 'toolrelay[chaos]'\n"
    )


def test_the_chaos_toolkit_activities_without_httpx_name_the_extra() -> None:
    done = _run("import toolrelay.chaos.chaostoolkit", hide=("httpx",))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "ModuleNotFoundError: the Chaos Toolkit activities need httpx: "
        "pip install 'toolrelay[chaos]'"
    )
