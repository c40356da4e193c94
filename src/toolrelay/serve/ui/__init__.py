"""The admin API's read-only status page, mounted at ``/ui``: ``app.mount("/ui", status_ui())``.

Four static files (``index.html``, ``status.js``, ``status.css``, ``icon.svg``: package
data) served with a strict Content-Security-Policy: scripts, styles and requests from this
origin only, no inline script, no frames, no form submission. The page holds no data: its
script asks the admin API's own endpoints with the token the user typed (kept in
``sessionStorage``, sent as the bearer header). The files are public like ``/healthz``: they
carry nothing secret.
"""

from __future__ import annotations

from importlib.resources import files

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, Router

__all__ = ["CSP", "status_ui"]

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/status.js": ("status.js", "text/javascript; charset=utf-8"),
    "/status.css": ("status.css", "text/css; charset=utf-8"),
    "/icon.svg": ("icon.svg", "image/svg+xml"),
}


def _route(path: str, name: str, media_type: str) -> Route:
    body = files(__name__).joinpath(name).read_bytes()

    async def serve(request: Request) -> Response:
        return Response(body, media_type=media_type, headers=_HEADERS)

    return Route(path, serve, methods=["GET"], name=f"ui-{name}")


def status_ui() -> Router:
    """The page's routes, to mount at ``/ui`` of the admin app."""
    return Router([_route(path, name, media_type) for path, (name, media_type) in _FILES.items()])
