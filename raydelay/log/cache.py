"""The log's one in-memory cache: least recently used, bounded by a total size.

:class:`LruCache` owns that bound and nothing else. The size of a value is what
``size_of`` says: bytes for the partition log's object and index caches, one per value
for the sealed buckets' metas and indexes. ``bench/log_cache_bench.py`` measures it against
``cachetools.LRUCache``: it is faster at hits (about 2x) and at puts that evict (4-6x),
and as fast at misses (one dict lookup in both), so the log keeps it.

Not thread-safe: the partition log uses its caches from the log's one thread only, and
:class:`~raydelay.delayed.store.SealedStore`, whose caches several threads share, holds its
lock around every call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def _one(_value: object) -> int:
    return 1


class LruCache(Generic[K, V]):
    """At most ``max_size`` (in the units of ``size_of``, default: values) of the values
    used last. A value larger than ``max_size`` on its own is not kept."""

    __slots__ = ("_values", "_size_of", "max_size", "size")

    def __init__(self, max_size: int, size_of: Callable[[V], int] = _one) -> None:
        self._values: OrderedDict[K, V] = OrderedDict()
        self._size_of = size_of
        self.max_size = max_size
        self.size = 0  # of the values held, in the units of ``size_of``

    def get(self, key: K) -> V | None:
        """The value under ``key`` (now the most recently used), or None."""
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` under ``key``, evicting the least recently used values over the
        bound."""
        self.pop(key)
        size = self._size_of(value)
        if size > self.max_size:
            return
        self._values[key] = value
        self.size += size
        while self.size > self.max_size:
            _, evicted = self._values.popitem(last=False)
            self.size -= self._size_of(evicted)

    def pop(self, key: K) -> V | None:
        """Remove and return the value under ``key`` (None: there was none)."""
        value = self._values.pop(key, None)
        if value is not None:
            self.size -= self._size_of(value)
        return value

    def discard(self, doomed: Callable[[K], bool]) -> None:
        """Remove the values whose key is ``doomed``."""
        for key in [k for k in self._values if doomed(k)]:
            self.pop(key)

    def __len__(self) -> int:
        return len(self._values)
