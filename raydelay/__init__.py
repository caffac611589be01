"""raydelay: a durable dispatcher for delayed and scheduled messages, on Ray."""

from raydelay.clock import Clock, ManualClock, SystemClock
from raydelay.errors import CodecError, InvalidArgument, NotFound, RaydelayError, StorageError

__version__ = "0.1.0"

__all__ = [
    "Clock",
    "ManualClock",
    "SystemClock",
    "RaydelayError",
    "InvalidArgument",
    "NotFound",
    "StorageError",
    "CodecError",
    "__version__",
]
