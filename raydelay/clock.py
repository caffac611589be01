"""Clocks. All times are integer milliseconds since the epoch.

Pure code takes a :class:`Clock` as an argument; tests drive a
:class:`ManualClock` instead of monkeypatching ``time.time``.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

from raydelay.errors import InvalidArgument


@runtime_checkable
class Clock(Protocol):
    def now_ms(self) -> int:
        """The current time in integer milliseconds since the epoch."""
        ...


def now_ms() -> int:
    """The wall-clock time in integer milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


class SystemClock:
    """Wall-clock time in milliseconds since the epoch."""

    def now_ms(self) -> int:
        return now_ms()

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock that moves only when told to. Thread-safe."""

    def __init__(self, now_ms: int = 0) -> None:
        self._now_ms = _check_ms("now_ms", now_ms)
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        return self._now_ms

    def set(self, ms: int) -> None:
        """Set the time to ``ms`` (epoch milliseconds). Time may not go backwards."""
        ms = _check_ms("ms", ms)
        with self._lock:
            if ms < self._now_ms:
                raise InvalidArgument(f"ms: {ms} is before the current time {self._now_ms}")
            self._now_ms = ms

    def advance(self, ms: int) -> int:
        """Move time forward by ``ms`` milliseconds; returns the new time."""
        ms = _check_ms("ms", ms)
        with self._lock:
            self._now_ms += ms
            return self._now_ms

    def __repr__(self) -> str:
        return f"ManualClock(now_ms={self._now_ms})"


def _check_ms(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(
            f"{field}: expected an int of milliseconds, got {type(value).__name__}"
        )
    if value < 0:
        raise InvalidArgument(f"{field}: must be >= 0, got {value}")
    return value
