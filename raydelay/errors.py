"""The one error tree of raydelay.

Every error a caller can see derives from :class:`RaydelayError`. Storage
backends translate their native errors (botocore, OSError) into
:class:`StorageError` with a ``retriable`` flag, so callers decide whether to
retry without knowing which backend is underneath.
"""

from __future__ import annotations


class RaydelayError(Exception):
    """Root of every error raised by raydelay."""


class InvalidArgument(RaydelayError, ValueError):
    """A caller passed a bad value. The message names the field and the problem."""


class NotFound(RaydelayError, KeyError):
    """A key, topic, subscription or object does not exist."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want plain text.
        return str(self.args[0]) if self.args else ""


class StorageError(RaydelayError):
    """The object store failed. ``retriable`` says whether the same call may succeed later."""

    def __init__(self, message: str, *, retriable: bool) -> None:
        super().__init__(message)
        self.retriable = retriable

    def __reduce__(self):  # keep ``retriable`` across pickling (Ray ships errors between processes)
        return (_rebuild_storage_error, (self.args[0] if self.args else "", self.retriable))


def _rebuild_storage_error(message: str, retriable: bool) -> StorageError:
    return StorageError(message, retriable=retriable)


class Conflict(StorageError):
    """A create-only write found another object at its key: something else writes this
    store (a second raydelay cluster on it). Never retriable."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)

    def __reduce__(self):
        return (Conflict, (self.args[0] if self.args else "",))


class KeyPending(RaydelayError):
    """A send with ``on_duplicate="error"`` found a message with its key still scheduled
    in its topic. Nothing of the batch was written."""


class TaskFailed(RaydelayError):
    """``task_result``: the call is dead (its tries ran out, or a runner refused it); the
    message says its last error."""


class TaskCancelled(RaydelayError):
    """``task_result``: the call was cancelled (or, a cron occurrence, passed over) and did
    not run."""


class ConsumerBusy(RaydelayError):
    """An exclusive subscription already has a consumer (until it closes, or its lease
    lapses: ``subscription.consumer_lease_s``)."""


class ProducerQueueIsFull(RaydelayError):
    """``send_async`` found ``max_pending_messages`` sends pending on a producer created with
    ``block_if_queue_full=False`` (Pulsar's ``ProducerQueueIsFull``). Nothing was queued."""


class CodecError(RaydelayError):
    """A stored object could not be decoded (corrupt, truncated, or an unknown version)."""


class Unavailable(RaydelayError):
    """A raydelay actor could not be reached (it died, or is restarting). Retriable."""

    retriable = True


class PartitionMoved(Unavailable):
    """The host that was called does not serve the partition (any more): the coordinator
    assigned it to another host. Retriable: the caller looks the partition up again."""


class StoreOwned(RaydelayError):
    """The store is held by another live raydelay cluster (one owner per store). ``owner``
    describes it: its Ray address, host, pid and epoch."""

    def __init__(self, message: str, owner: dict | None = None) -> None:
        super().__init__(message)
        self.owner = owner or {}

    def __reduce__(self):  # keep ``owner`` across pickling
        return (StoreOwned, (self.args[0] if self.args else "", self.owner))


class MissingExtra(RaydelayError, ImportError):
    """A feature needs an optional part of raydelay that is not installed (Spark for
    ingestion, the web stack for the console). The message names the extra to install:
    ``pip install 'raydelay[spark]'``. It is an ``ImportError`` too, so an import of such a
    module fails the way Python's imports do."""
