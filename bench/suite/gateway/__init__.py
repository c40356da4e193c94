"""The MCP gateway benchmark (``python bench/gateway.py``, and the ``gateway`` rows of
``bench/run.py``): :func:`compare` starts the servers and measures them side by side into a
:class:`Comparison`."""

from .clients import Sample
from .compare import compare
from .figures import Comparison, Ratio
from .servers import CONCURRENCY, against

__all__ = ["CONCURRENCY", "Comparison", "Ratio", "Sample", "against", "compare"]
