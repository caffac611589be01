"""BucketRegistry: where a tracker lists its immutable buckets.

The registry entry of a bucket is written last (after its segments and meta) and
removed first, so a bucket is either fully readable or absent from the registry.
The coordinator actor backs it in production; tests use the in-memory one.
"""

from __future__ import annotations

import threading
from typing import Protocol, runtime_checkable

from raydelay.errors import InvalidArgument


@runtime_checkable
class BucketRegistry(Protocol):
    def list(self, name: str) -> dict[str, bytes]:
        """bucket_key -> record bytes, for the tracker ``name``."""
        ...

    def put(self, name: str, bucket_key: str, record: bytes) -> None: ...

    def remove(self, name: str, bucket_key: str) -> None: ...


class InMemoryBucketRegistry:
    """A thread-safe dict of dicts."""

    def __init__(self) -> None:
        self._data: dict[str, dict[str, bytes]] = {}
        self._lock = threading.Lock()

    def list(self, name: str) -> dict[str, bytes]:
        with self._lock:
            return dict(self._data.get(name, {}))

    def put(self, name: str, bucket_key: str, record: bytes) -> None:
        if not isinstance(record, bytes):
            raise InvalidArgument(f"record: expected bytes, got {type(record).__name__}")
        with self._lock:
            self._data.setdefault(name, {})[bucket_key] = record

    def remove(self, name: str, bucket_key: str) -> None:
        with self._lock:
            entries = self._data.get(name)
            if entries is not None:
                entries.pop(bucket_key, None)
                if not entries:
                    del self._data[name]

    def __repr__(self) -> str:
        return f"InMemoryBucketRegistry({ {k: len(v) for k, v in self._data.items()} })"
