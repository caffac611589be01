"""A store wrapper that injects failures and latency per operation, for tests and chaos runs."""

from __future__ import annotations

import os
import random
import threading
import time
from collections import defaultdict

from raydelay.errors import InvalidArgument, StorageError

OPS = ("put", "get", "get_range", "delete", "list", "exists")


class FaultyObjectStore:
    """Wraps ``inner``; ``fail_next`` and ``add_latency`` arm faults per operation.

    ``fail_next(op, times=1, error=None)`` makes the next ``times`` calls of ``op``
    raise ``error`` (a retriable StorageError by default) without reaching ``inner``.
    ``add_latency(op, seconds)`` sleeps before every later call of ``op``.
    ``set_failure_rate(rate, seed)`` fails any call at random; ``set_outage_file(path)``
    fails every call while that file exists.
    ``calls`` counts the calls of each op that reached ``inner``.
    """

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self._lock = threading.Lock()
        self._failures: dict[str, list[BaseException]] = defaultdict(list)
        self._latency_s: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.failed: dict[str, int] = defaultdict(int)
        self._rate = 0.0
        self._rng = random.Random()
        self._outage_file: str | None = None

    def fail_next(self, op: str, times: int = 1, error: BaseException | None = None) -> None:
        _check_op(op)
        if isinstance(times, bool) or not isinstance(times, int) or times < 1:
            raise InvalidArgument(f"times: expected an int >= 1, got {times!r}")
        if error is not None and not isinstance(error, BaseException):
            raise InvalidArgument(f"error: expected an exception, got {type(error).__name__}")
        with self._lock:
            for _ in range(times):
                self._failures[op].append(
                    error
                    if error is not None
                    else StorageError(f"injected {op} failure", retriable=True)
                )

    def add_latency(self, op: str, seconds: float) -> None:
        _check_op(op)
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
            raise InvalidArgument(f"seconds: expected a number >= 0, got {seconds!r}")
        with self._lock:
            self._latency_s[op] = float(seconds)

    def set_failure_rate(self, rate: float, seed: int | None = None) -> None:
        """From now on, each call of any op fails (retriably) with probability ``rate``."""
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
            raise InvalidArgument(f"rate: expected a number in [0, 1], got {rate!r}")
        with self._lock:
            self._rate = float(rate)
            self._rng = random.Random(seed)

    def set_outage_file(self, path: str | None) -> None:
        """While the file at ``path`` exists, every call fails retriably (an outage that a
        test in another process can switch on and off)."""
        self._outage_file = path or None

    def reset(self) -> None:
        """Disarm every pending failure and latency."""
        with self._lock:
            self._failures.clear()
            self._latency_s.clear()

    def pending_failures(self, op: str) -> int:
        _check_op(op)
        with self._lock:
            return len(self._failures[op])

    def _before(self, op: str) -> None:
        with self._lock:
            latency = self._latency_s.get(op, 0.0)
            error = self._failures[op].pop(0) if self._failures.get(op) else None
            if error is None and self._rate and self._rng.random() < self._rate:
                error = StorageError(f"injected random {op} failure", retriable=True)
            if error is None and self._outage_file and os.path.exists(self._outage_file):
                error = StorageError(f"injected outage: {op} failed", retriable=True)
            if error is not None:
                self.failed[op] += 1
            else:
                self.calls[op] += 1
        if latency:
            time.sleep(latency)
        if error is not None:
            raise error

    def put(self, key: str, data: bytes) -> None:
        self._before("put")
        self.inner.put(key, data)  # type: ignore[attr-defined]

    def put_new(self, key: str, data: bytes) -> None:
        self._before("put")
        self.inner.put_new(key, data)  # type: ignore[attr-defined]

    def get(self, key: str) -> bytes:
        self._before("get")
        return self.inner.get(key)  # type: ignore[attr-defined]

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self._before("get_range")
        return self.inner.get_range(key, start, end)  # type: ignore[attr-defined]

    def delete(self, key: str) -> None:
        self._before("delete")
        self.inner.delete(key)  # type: ignore[attr-defined]

    def list(self, prefix: str = "") -> list[str]:
        self._before("list")
        return self.inner.list(prefix)  # type: ignore[attr-defined]

    def exists(self, key: str) -> bool:
        self._before("exists")
        return self.inner.exists(key)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"FaultyObjectStore({self.inner!r})"


def _check_op(op: object) -> None:
    if op not in OPS:
        raise InvalidArgument(f"op: must be one of {', '.join(OPS)}; got {op!r}")
