"""A store wrapper that counts the bytes read and written through it (recovery figures)."""

from __future__ import annotations

import threading

from raydelay.storage.base import ObjectStore


class CountingObjectStore:
    """Wraps ``inner`` and counts ``bytes_read`` (get, get_range) and ``bytes_written``
    (put). Thread-safe: the bucket tracker's I/O threads share it."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.bytes_written = 0

    def _read(self, data: bytes) -> bytes:
        with self._lock:
            self.bytes_read += len(data)
        return data

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)
        with self._lock:
            self.bytes_written += len(data)

    def put_new(self, key: str, data: bytes) -> None:
        self.inner.put_new(key, data)
        with self._lock:
            self.bytes_written += len(data)

    def get(self, key: str) -> bytes:
        return self._read(self.inner.get(key))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self._read(self.inner.get_range(key, start, end))

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str = "") -> list[str]:
        return self.inner.list(prefix)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)
