"""Key_Shared dispatch: which consumer a message's key belongs to (pure: no Ray).

A ``key_shared`` subscription spreads keys over its consumers and gives all the
messages of one key to one consumer at a time, in order.

- Each key maps to one of :data:`SLOTS` hash slots (:func:`slots_of`). A message
  without a key uses the empty key, as Pulsar does: keyless messages go to one
  consumer.
- Slots belong to consumers by consistent hashing (:class:`Ring`): each consumer
  puts :data:`POINTS_PER_CONSUMER` points on a ring of the slots, and a slot belongs
  to the consumer of the first point at or after it. A consumer that joins or
  leaves moves only the slots next to its points.
- A slot whose messages another consumer still holds unacknowledged is *blocked*
  for its new owner until they are acknowledged (or come back): one key is never in
  flight at two consumers, so a key that moves keeps its order.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raydelay.dispatch.keys import key_hash

SLOTS = 1 << 16
POINTS_PER_CONSUMER = 100
NO_KEY = ""  # the key of a message sent without one
_GOLDEN = np.uint64(0x9E3779B1)
_LOW32 = np.uint64(0xFFFFFFFF)
_SLOT_SHIFT = np.uint64(32 - 16)


def _slot_of_hashes(hashes: np.ndarray) -> np.ndarray:
    """Hash slots of 32-bit key hashes: a multiplicative mix, top 16 bits. (The partition
    is ``hash % partitions``: without the mix, one partition's keys would share the low
    bits of their slots.)"""
    h = hashes.astype(np.uint64)
    return (((h * _GOLDEN) & _LOW32) >> _SLOT_SHIFT).astype(np.int64)


def slot_of(key: str | None) -> int:
    return int(_slot_of_hashes(np.array([key_hash(key or NO_KEY)], dtype=np.uint64))[0])


def slots_of(keys: pa.Array, cache: dict[str, int] | None = None) -> np.ndarray:
    """The hash slot of each key of a string column (null: no key). Hashes each distinct
    key once; with ``cache`` (key -> slot), only keys not in it, which it then holds."""
    if len(keys) == 0:
        return np.zeros(0, dtype=np.int64)
    enc = pc.dictionary_encode(keys)
    distinct = enc.dictionary.to_pylist()
    if cache is None:
        hashes = np.fromiter((key_hash(k) for k in distinct), np.uint64, count=len(distinct))
        slots = _slot_of_hashes(hashes)
    else:
        new = [k for k in distinct if k not in cache]
        if new:
            hashes = np.fromiter((key_hash(k) for k in new), np.uint64, count=len(new))
            cache.update(zip(new, _slot_of_hashes(hashes).tolist()))
        slots = np.fromiter((cache[k] for k in distinct), np.int64, count=len(distinct))
    idx = enc.indices
    if idx.null_count:
        out = np.full(len(keys), slot_of(None), dtype=np.int64)
        valid = np.asarray(idx.is_valid())
        out[valid] = slots[np.asarray(idx.drop_null(), dtype=np.int64)]
        return out
    return slots[np.asarray(idx, dtype=np.int64)]


class Ring:
    """The slot owners of a set of consumers (consistent hashing)."""

    def __init__(self, consumers: list[str]) -> None:
        self.consumers = list(consumers)
        if not self.consumers:
            self.owners = np.full(SLOTS, -1, dtype=np.int64)
            return
        labels = [f"{cid}#{i}" for cid in self.consumers for i in range(POINTS_PER_CONSUMER)]
        points = _slot_of_hashes(
            np.fromiter((key_hash(s) for s in labels), dtype=np.uint64, count=len(labels))
        )
        who = np.repeat(np.arange(len(self.consumers), dtype=np.int64), POINTS_PER_CONSUMER)
        order = np.lexsort((who, points))
        points, who = points[order], who[order]
        at = np.searchsorted(points, np.arange(SLOTS, dtype=np.int64), side="left")
        self.owners = who[at % len(points)]

    def owner_index(self, consumer_id: str) -> int:
        try:
            return self.consumers.index(consumer_id)
        except ValueError:
            return -1

    def owned(self, consumer_id: str, slots: np.ndarray) -> np.ndarray:
        """Which of ``slots`` belong to ``consumer_id``."""
        i = self.owner_index(consumer_id)
        return self.owners[slots] == i if i >= 0 else np.zeros(len(slots), dtype=bool)
