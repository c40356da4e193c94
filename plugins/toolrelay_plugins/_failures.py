"""Every upstream failure becomes a :class:`~toolrelay.contract.ToolError` here and nowhere
else: one short sentence naming the service, never a response body, a URL or an exception's
text. The mapping (retryable? counts as a failure?) is tabled in docs/plugins.md.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

from toolrelay.contract import ErrorType, ToolError

MAX_RETRY_AFTER_S = 3600.0


def retry_after_seconds(value: str | None, *, now: datetime | None = None) -> float | None:
    """A ``Retry-After`` header in seconds (delay-seconds or HTTP-date form), capped."""
    if not value:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return min(seconds, MAX_RETRY_AFTER_S)


def status_error(service: str, response: httpx.Response) -> ToolError | None:
    """The answer to a non-2xx response; ``None`` for a success."""
    code = response.status_code
    if 200 <= code < 300:
        return None
    if code in (429, 503):
        retry_after = retry_after_seconds(response.headers.get("retry-after"))
        what = "is limiting requests" if code == 429 else "is unavailable"
        return ToolError(
            f"{service} {what} (HTTP {code})", retryable=True, retry_after_s=retry_after
        )
    if code >= 500:
        return ToolError(f"{service} failed (HTTP {code})", retryable=True)
    if 300 <= code < 400:
        return ToolError(f"{service} answered with a redirect (HTTP {code})")
    if code >= 400:
        return ToolError(f"{service} refused the request (HTTP {code})")
    return ToolError(f"{service} gave an unexpected answer (HTTP {code})", counts_as_failure=True)


def transport_error(service: str, exc: Exception) -> ToolError:
    """The answer to an exception raised by httpx."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.ProxyError):
        return ToolError(f"{service} could not be reached", retryable=True)
    if isinstance(exc, httpx.TimeoutException):
        return ToolError(
            f"{service} did not answer in time", error_type=ErrorType.TIMEOUT, retryable=True
        )
    if isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError):
        return ToolError(f"{service} broke off the connection", retryable=True)
    if isinstance(exc, httpx.DecodingError):
        return malformed(service)
    if isinstance(exc, httpx.TooManyRedirects):
        return ToolError(f"{service} redirected too many times", counts_as_failure=True)
    return ToolError(f"{service} could not be called; check the plugin's configuration")


def malformed(service: str) -> ToolError:
    """A body that cannot be read, or does not have the expected shape."""
    return ToolError(f"{service} sent an answer that could not be read", counts_as_failure=True)


def too_large(service: str, limit: int) -> ToolError:
    """A body over ``max_response_bytes``."""
    return ToolError(f"{service} sent more than {limit} bytes", counts_as_failure=True)
