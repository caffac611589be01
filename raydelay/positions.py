"""The one definition of a **position key**, a leaf every layer imports.

A message's position in a partition's log is ``(ledger_id, entry_id)``; as one value it is
the key ``ledger_id << 32 | entry_id``, a non-negative int64 (:data:`KEY_DTYPE`, Arrow's
int64 on the wire). Keys sort like positions, a column of them is one numpy array, and
64-bit roaring bitmaps take them as they are. The log, the delayed index, dispatch and the
client all use these names; nothing else shifts by 32.

This module imports numpy only, so it sits below every other package.
"""

from __future__ import annotations

import numpy as np

Position = tuple[int, int]  # (ledger_id, entry_id)
KEY_DTYPE = np.dtype(np.int64)  # the wire's type (Arrow int64); a key is never negative
SHIFT = 32  # entry ids take the low 32 bits
LOW = (1 << SHIFT) - 1  # the entry id mask, and the largest entry id
MAX_LEDGER_ID = (1 << (63 - SHIFT)) - 1  # the largest ledger id whose keys stay non-negative


def key_of(ledger_id: int, entry_id: int) -> int:
    """The key of one position."""
    return (ledger_id << SHIFT) | entry_id


def position_of(key: int) -> Position:
    """The (ledger_id, entry_id) of one key."""
    return (key >> SHIFT, key & LOW)


def key_text(key: int | None) -> str:
    """A position key as people read it, ``ledger:entry`` ("nothing" for None)."""
    return "nothing" if key is None else "{}:{}".format(*position_of(int(key)))


def position_keys(ledger_ids: np.ndarray, entry_ids: np.ndarray) -> np.ndarray:
    """The key column (:data:`KEY_DTYPE`) of (ledger id, entry id) columns."""
    ls = np.asarray(ledger_ids).astype(KEY_DTYPE, copy=False)
    return (ls << SHIFT) | np.asarray(entry_ids).astype(KEY_DTYPE, copy=False)


def split_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ledger ids, entry ids) of a key column, as :data:`KEY_DTYPE` columns."""
    ks = np.asarray(keys).astype(KEY_DTYPE, copy=False)
    return ks >> SHIFT, ks & LOW


def position_in_range(ledger_id: object, entry_id: object) -> bool:
    """Whether (ledger_id, entry_id) can be a position (ints that fit a key)."""
    return (
        isinstance(ledger_id, int)
        and isinstance(entry_id, int)
        and 0 <= ledger_id <= MAX_LEDGER_ID
        and 0 <= entry_id <= LOW
    )


__all__ = [
    "KEY_DTYPE",
    "LOW",
    "MAX_LEDGER_ID",
    "SHIFT",
    "Position",
    "key_of",
    "position_in_range",
    "position_keys",
    "position_of",
    "split_keys",
]


def ledger_groups(ledgers: np.ndarray):
    """Yield (ledger_id, index array) per distinct ledger of a column of ledger ids,
    ledgers ascending: one sort, not one pass over the column per ledger."""
    if len(ledgers) == 0:
        return
    first = int(ledgers[0])
    if (ledgers == first).all():
        yield first, np.arange(len(ledgers))
        return
    order = np.argsort(ledgers, kind="stable")
    sorted_ls = ledgers[order]
    cuts = np.flatnonzero(np.diff(sorted_ls)) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [len(ledgers)]))
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        yield int(sorted_ls[s]), order[s:e]
