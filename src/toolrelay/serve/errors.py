"""The one exception ``toolrelay serve`` raises for a setup it cannot run."""

from __future__ import annotations

__all__ = ["ServeError"]


class ServeError(Exception):
    """``toolrelay serve`` cannot start as configured; the message is one clear line."""
