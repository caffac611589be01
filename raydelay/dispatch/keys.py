"""Position keys of the dispatch layer: ``ledger_id << 32 | entry_id`` as one int64 (pure).

The same layout as the delayed index's keys (:func:`raydelay.delayed.index.position_keys`),
so positions move between the two without translation.
"""

from __future__ import annotations

import zlib

import numpy as np

SHIFT = 32
LOW = (1 << SHIFT) - 1

Position = tuple[int, int]
MAX_LEDGER_ID = (1 << (63 - SHIFT)) - 1  # a key is a non-negative int64


def position_in_range(ledger_id: object, entry_id: object) -> bool:
    """Whether (ledger_id, entry_id) can be a position (ints that fit a key)."""
    return (
        isinstance(ledger_id, int)
        and isinstance(entry_id, int)
        and 0 <= ledger_id <= MAX_LEDGER_ID
        and 0 <= entry_id <= LOW
    )


def key_of(ledger_id: int, entry_id: int) -> int:
    return (ledger_id << SHIFT) | entry_id


def position_of(key: int) -> Position:
    return (key >> SHIFT, key & LOW)


def split_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ledger ids, entry ids) of an int64 key column."""
    return keys >> SHIFT, keys & LOW


def join_keys(ledger_ids: np.ndarray, entry_ids: np.ndarray) -> np.ndarray:
    """The int64 key column of (ledger id, entry id) columns."""
    return (np.asarray(ledger_ids, dtype=np.int64) << SHIFT) | np.asarray(entry_ids, dtype=np.int64)


def key_hash(key: str) -> int:
    """The one hash of a message key (CRC-32 of its UTF-8): the producer and ingestion
    route a key to partition ``key_hash(key) % partitions`` with it, and a key_shared
    subscription derives its hash slot from it."""
    return zlib.crc32(key.encode("utf-8"))
