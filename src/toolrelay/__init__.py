"""toolrelay: run an agent's tool calls through one resilient pipeline.

Every call gets a deadline, a per-key circuit breaker, bounded retries and a concurrency
limit, and always comes back as an answer the model can act on.
"""

from ._version import __version__ as __version__
from .breakers import BreakerOptions, Breakers
from .budget import BudgetOptions
from .contract import AuthContext, CallContext, ErrorType, ToolDeclaration, ToolError, ToolPlugin
from .dispatcher import Dispatcher
from .faults import Fault
from .options import DispatcherOptions, KeyPolicy, Limits, StorageOptions
from .pipeline.bulkhead import BulkheadOptions
from .pipeline.faults import FaultInjector
from .pipeline.hedge import HedgeOptions
from .pipeline.retry import RetryOptions
from .policy import Profile
from .registry import RegistrationError, ToolRegistry
from .result import ToolCall, ToolResult
from .serve import settings as _gateway_settings  # noqa: F401 - toolrelay.toml's [serve]
from .slot import ModelSlot, SlotLease
from .sync import CallCancelled, DispatcherClosed, SyncDispatcher

__all__ = [
    "AuthContext",
    "BreakerOptions",
    "Breakers",
    "BudgetOptions",
    "BulkheadOptions",
    "CallCancelled",
    "CallContext",
    "Dispatcher",
    "DispatcherClosed",
    "DispatcherOptions",
    "ErrorType",
    "Fault",
    "FaultInjector",
    "HedgeOptions",
    "KeyPolicy",
    "Limits",
    "ModelSlot",
    "Profile",
    "RegistrationError",
    "RetryOptions",
    "SlotLease",
    "StorageOptions",
    "SyncDispatcher",
    "ToolCall",
    "ToolDeclaration",
    "ToolError",
    "ToolPlugin",
    "ToolRegistry",
    "ToolResult",
]
