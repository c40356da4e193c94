"""The first-party plugins: weather (Open-Meteo), websearch (SearXNG) and feeds (RSS/Atom).

They need the ``plugins`` extra (httpx, and feedparser for feeds): ``pip install
'toolrelay[plugins]'``. Without it, loading one fails with one line that says so.
"""

try:
    import httpx  # noqa: F401 - every plugin's client
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError(
        "the first-party plugins need httpx: pip install 'toolrelay[plugins]'", name="httpx"
    ) from exc
