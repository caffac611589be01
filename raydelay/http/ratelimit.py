"""The HTTP API's rate limit: a token bucket per API token, in one server replica (pure).

A token of ``rate_per_s`` may make that many requests a second on average, and a burst of
up to one second's worth at once. A request past it is refused (HTTP 429) with the seconds
until one would be allowed (``Retry-After``). The buckets live in the replica's memory, so
with N replicas a token may make up to N times its rate in all.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable


class RateLimiter:
    """Token buckets by key (an API token's id); ``rate_per_s`` -1 is no limit."""

    def __init__(self, *, clock_s: Callable[[], float] = time.monotonic) -> None:
        self._clock_s = clock_s
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at_s)

    def take(self, key: str, rate_per_s: float) -> float:
        """0.0 if a request of ``key`` may go now (it is counted), else the seconds to
        wait before one may."""
        if rate_per_s < 0:
            return 0.0
        burst = max(1.0, rate_per_s)
        with self._lock:
            now = self._clock_s()
            tokens, at = self._buckets.get(key, (burst, now))
            tokens = min(burst, tokens + (now - at) * rate_per_s)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / rate_per_s

    @staticmethod
    def retry_after(wait_s: float) -> str:
        """A ``Retry-After`` value: whole seconds, at least 1."""
        return str(max(1, math.ceil(wait_s)))
