"""The tool catalog: a lock file of tool definitions, drift refused, breaking changes caught.

``docs/catalog.md`` explains it: :mod:`.lock` (the file), :mod:`.diff` (the rules),
:mod:`.drift` (the registry gate that refuses or warns), :mod:`.deprecation` (windows).
"""

from .deprecation import DEPRECATED_TAG, Deprecation
from .diff import Change, diff_entries, diff_locks
from .drift import Catalog, CatalogSettings
from .lock import LockError, dumps, entry, load, lock_of

__all__ = [
    "DEPRECATED_TAG",
    "Catalog",
    "CatalogSettings",
    "Change",
    "Deprecation",
    "LockError",
    "diff_entries",
    "diff_locks",
    "dumps",
    "entry",
    "load",
    "lock_of",
]
