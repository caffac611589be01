"""An in-process store for tests and for the pure core's deterministic runs."""

from __future__ import annotations

import threading

from raydelay.errors import NotFound
from raydelay.storage.base import check_data, check_range, conflict
from raydelay.storage.keys import validate_key, validate_prefix


class MemoryObjectStore:
    """A dict behind a lock. Nothing survives the process."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes) -> None:
        key = validate_key(key)
        data = check_data(data)
        with self._lock:
            self._data[key] = data

    def put_new(self, key: str, data: bytes) -> None:
        key = validate_key(key)
        data = check_data(data)
        with self._lock:
            there = self._data.setdefault(key, data)
        if there is not data and there != data:
            raise conflict(key)

    def get(self, key: str) -> bytes:
        key = validate_key(key)
        with self._lock:
            try:
                return self._data[key]
            except KeyError:
                raise NotFound(f"no object at key {key!r}") from None

    def get_range(self, key: str, start: int, end: int) -> bytes:
        start, end = check_range(start, end)
        return self.get(key)[start:end]

    def delete(self, key: str) -> None:
        key = validate_key(key)
        with self._lock:
            self._data.pop(key, None)

    def list(self, prefix: str = "") -> list[str]:
        prefix = validate_prefix(prefix)
        with self._lock:
            return sorted(k for k in self._data if k.startswith(prefix))

    def exists(self, key: str) -> bool:
        key = validate_key(key)
        with self._lock:
            return key in self._data

    def total_bytes(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._data.values())

    def __repr__(self) -> str:
        return f"MemoryObjectStore({len(self._data)} objects)"
