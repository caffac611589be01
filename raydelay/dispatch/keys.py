"""Position keys of the dispatch layer: ``ledger_id << 32 | entry_id`` as one int64 (pure).

The same layout as the delayed index's keys (:func:`raydelay.delayed.index.position_keys`),
so positions move between the two without translation.
"""

from __future__ import annotations

import numpy as np

SHIFT = 32
LOW = (1 << SHIFT) - 1

Position = tuple[int, int]


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
