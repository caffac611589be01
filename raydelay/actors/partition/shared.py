"""SharedObjects: committed ledger objects put once into Ray's object store, so that the
subscriptions on a node map one copy (log reads answer with references)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import ray


class SharedObjects:
    """Committed ledger objects put once into Ray's object store, for every subscription
    that reads them: a read answers with a reference, and the subscriptions on the node
    map the same shared memory (a numpy view, decoded in place) instead of each getting a
    copy in its reply. One per process (a host), bounded by bytes; small objects, cheaper
    to copy than to fetch, go in the reply as they are."""

    MIN_BYTES = 64 * 1024

    def __init__(self, limit_bytes: int) -> None:
        self._limit = limit_bytes
        self._refs: OrderedDict[int, tuple[bytes, Any]] = OrderedDict()  # id(data) -> ref
        self._bytes = 0
        self.puts = 0

    def share(self, objects: list) -> list:
        """``objects`` with each big encoded object replaced by its reference."""
        return [
            self._ref(o) if isinstance(o, bytes) and len(o) >= self.MIN_BYTES else o
            for o in objects
        ]

    def _ref(self, data: bytes) -> Any:
        hit = self._refs.get(id(data))
        if hit is not None and hit[0] is data:  # (the tail cache hands out the same bytes)
            self._refs.move_to_end(id(data))
            return hit[1]
        ref = ray.put(np.frombuffer(data, dtype=np.uint8))
        self.puts += 1
        self._refs[id(data)] = (data, ref)
        self._bytes += len(data)
        while self._bytes > self._limit and len(self._refs) > 1:
            _, (old, _) = self._refs.popitem(last=False)
            self._bytes -= len(old)
        return ref


SHARED = SharedObjects(64 * 1024 * 1024)  # the host process's
