"""The first-party plugins: weather (Open-Meteo), websearch (SearXNG) and feeds (RSS/Atom).

They need the ``plugins`` extra (httpx, and feedparser for feeds): ``pip install
'toolrelay[plugins]'``. Without it, loading one fails with one line that says so.
"""

import importlib.util

if importlib.util.find_spec("httpx") is None:
    raise ModuleNotFoundError(
        "the first-party plugins need httpx: pip install 'toolrelay[plugins]'", name="httpx"
    )
