"""Plugin sources: places tools come from other than Python functions.

Each source is an ordinary toolrelay plugin (``describe()``, ``declaration(name)``,
``execute(name, args, ctx)``), so its tools run through the whole dispatch pipeline like
any other. Sources with optional dependencies live in their own modules and are imported
explicitly, e.g. :mod:`toolrelay.sources.mcp` (``pip install 'toolrelay[mcp]'``).
"""
