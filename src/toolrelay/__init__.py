"""toolrelay: run an agent's tool calls through one resilient pipeline.

Every call gets a deadline, a per-key circuit breaker, bounded retries and a concurrency
limit, and always comes back as an answer the model can act on.
"""

from ._version import __version__ as __version__
from .breakers import BreakerConfig, Breakers
from .contract import AuthContext, CallContext, ErrorType, ToolDeclaration, ToolError, ToolPlugin
from .dispatcher import Dispatcher
from .faults import Fault
from .pipeline.faults import FaultInjector
from .policy import Profile
from .registry import RegistrationError, ToolRegistry
from .result import ToolCall, ToolResult
from .serve import settings as _gateway_settings  # noqa: F401 - toolrelay.toml's [serve]
from .slot import ModelSlot, SlotLease
from .sync import CallCancelled, DispatcherClosed, SyncDispatcher

__all__ = [
    "AuthContext",
    "BreakerConfig",
    "Breakers",
    "CallCancelled",
    "CallContext",
    "Dispatcher",
    "DispatcherClosed",
    "ErrorType",
    "Fault",
    "FaultInjector",
    "ModelSlot",
    "Profile",
    "RegistrationError",
    "SlotLease",
    "SyncDispatcher",
    "ToolCall",
    "ToolDeclaration",
    "ToolError",
    "ToolPlugin",
    "ToolRegistry",
    "ToolResult",
]
