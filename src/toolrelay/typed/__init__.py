"""Typed tools: a function's signature turned, once, into a declaration and a caller.

``ToolRegistry.tool`` asks :func:`is_legacy` which calling convention a function uses and,
for a typed one, :func:`typed_tool` for its JSON Schema (pydantic generates it), its
description (the docstring, read with griffe) and a caller ``call(args, ctx)`` that the
pipeline runs like any ``(args, ctx)`` handler. The arguments were already validated by
the tool's jsonschema-rs validator; the caller only converts the parameters whose Python
type differs from their JSON value (a model, a dataclass, an enum, a datetime, an ``int``
sent as ``1.0``…), with pydantic, and injects the ``AuthContext`` and ``CallContext``
parameters. Everything else is worked out here, at registration.

The modules: :mod:`.signature` (which convention a function uses, and reading its
parameters), :mod:`.docstrings` (descriptions), :mod:`.schema` (pydantic's schema made for a
model to read), :mod:`.convert` (what is converted per call, and the caller) and
:mod:`.tool` (:func:`typed_tool`, which puts them together).
"""

from .signature import SignatureError, is_legacy
from .tool import TypedTool, typed_tool

__all__ = ["SignatureError", "TypedTool", "is_legacy", "typed_tool"]
