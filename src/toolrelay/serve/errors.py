"""The exceptions of ``toolrelay serve``: a setup it cannot run, a reload it refused."""

from __future__ import annotations


class ServeError(Exception):
    """``toolrelay serve`` cannot start as configured; the message is one clear line."""


class ReloadRefused(Exception):
    """A reload that was not applied; the old config keeps serving.

    ``status`` and ``error`` are the admin API's answer (422 ``invalid_config``: the file
    cannot be used; 400 ``restart_required`` and ``reload_failed``; 409 ``no_config_file``)."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error, self.message = status, error, message
