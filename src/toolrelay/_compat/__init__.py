"""The only place toolrelay touches a third-party library's private names.

One module per library: :mod:`.mcp_server` and :mod:`.mcp_client` (the MCP SDK's server and
client sides), :mod:`.httpcore` (DNS pinning under httpx), :mod:`.prometheus_client` (the
metrics hot path). Each private name is one small named function or constant with a line
saying what it relies on and why toolrelay needs it; ``tests/test_compat.py`` fails on a
private name used anywhere else and checks that every name relied on here still exists in
the installed release (the upper bounds in ``pyproject.toml`` hold the releases checked).
The requests that would make each unnecessary are in docs/architecture.md, "Third-party
internals".
"""
