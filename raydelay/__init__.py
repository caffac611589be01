"""raydelay: a durable dispatcher for delayed and scheduled messages, on Ray.

The client API (``connect``, ``Cluster``, ``Producer``, ``Consumer``, ``Message``,
``MessageBatch``, ``MessageId``) is loaded on first use, so that importing the pure core never
imports Ray.
"""

from typing import Any

from raydelay._auth import send_token_by_default
from raydelay.clock import Clock, ManualClock, SystemClock
from raydelay.errors import (
    CodecError,
    Conflict,
    ConsumerBusy,
    InvalidArgument,
    KeyPending,
    NotFound,
    ProducerQueueIsFull,
    RaydelayError,
    StorageError,
    StoreOwned,
    TaskCancelled,
    TaskFailed,
    Unavailable,
)

__version__ = "0.1.0"

send_token_by_default()  # before Ray is imported: see raydelay/_auth.py

_CLIENT = (
    "connect",
    "Cluster",
    "Producer",
    "Consumer",
    "Message",
    "MessageBatch",
    "MessageId",
    "MessageIds",
)

__all__ = [
    *_CLIENT,
    "Clock",
    "ManualClock",
    "SystemClock",
    "RaydelayError",
    "InvalidArgument",
    "NotFound",
    "StorageError",
    "CodecError",
    "Conflict",
    "ConsumerBusy",
    "KeyPending",
    "TaskCancelled",
    "TaskFailed",
    "ProducerQueueIsFull",
    "StoreOwned",
    "Unavailable",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name in _CLIENT:
        from raydelay import client

        return getattr(client, name)
    raise AttributeError(f"module 'raydelay' has no attribute {name!r}")
