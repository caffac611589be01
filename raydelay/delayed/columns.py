"""Column helpers shared by the trackers: validation of position batches and sorted runs.

A batch of positions is three int64 numpy columns (deliver_at_ms, ledger_id,
entry_id), never a list of tuples. A :class:`Run` is such a batch sorted by
(deliver_at, ledger, entry) with a head pointer: popping advances the head, it
never copies.
"""

from __future__ import annotations

from array import array

import numpy as np
from pyroaring import BitMap

from raydelay.errors import InvalidArgument
from raydelay.positions import LOW as MAX_ENTRY_ID
from raydelay.positions import MAX_LEDGER_ID, ledger_groups

I64 = np.int64
E_DTYPE = np.int64  # entry ids live in [0, 2**32): roaring bitmaps are 32-bit
# (positions are validated against the key's limits, raydelay.positions)
EMPTY = np.empty(0, dtype=I64)


def as_int_column(field: str, values: object) -> np.ndarray:
    """A 1-d int64 column from a sequence or array of integers; rejects floats, bools, strs."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise InvalidArgument(f"{field}: expected a 1-d sequence of ints, got shape {arr.shape}")
    if arr.size == 0:
        return EMPTY
    if arr.dtype.kind not in "iu":
        raise InvalidArgument(f"{field}: expected ints, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and int(arr.max()) > np.iinfo(I64).max:
        raise InvalidArgument(f"{field}: values must fit in int64")
    return arr.astype(I64, copy=False)


def check_positions(
    ledger_ids: object, entry_ids: object, deliver_ats: object
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ls = as_int_column("ledger_ids", ledger_ids)
    es = as_int_column("entry_ids", entry_ids)
    ds = as_int_column("deliver_ats", deliver_ats)
    if not (len(ls) == len(es) == len(ds)):
        raise InvalidArgument(
            f"ledger_ids, entry_ids, deliver_ats: lengths differ ({len(ls)}, {len(es)}, {len(ds)})"
        )
    if len(ls):
        if int(ls.min()) < 0 or int(ls.max()) > MAX_LEDGER_ID:
            raise InvalidArgument(f"ledger_ids: must be in [0, {MAX_LEDGER_ID}]")
        if int(es.min()) < 0 or int(es.max()) > MAX_ENTRY_ID:
            raise InvalidArgument(f"entry_ids: must be in [0, {MAX_ENTRY_ID}]")
    return ls, es, ds


def _as_int(field: str, value: object, what: str = "an int") -> int:
    """``value`` as an int: a Python or numpy integer, never a bool."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgument(f"{field}: expected {what}, got {type(value).__name__}")
    return int(value)


def check_position(ledger_id: object, entry_id: object) -> tuple[int, int]:
    ledger, entry = _as_int("ledger_id", ledger_id), _as_int("entry_id", entry_id)
    if not 0 <= ledger <= MAX_LEDGER_ID:
        raise InvalidArgument(f"ledger_id: must be in [0, {MAX_LEDGER_ID}], got {ledger}")
    if not 0 <= entry <= MAX_ENTRY_ID:
        raise InvalidArgument(f"entry_id: must be in [0, {MAX_ENTRY_ID}], got {entry}")
    return ledger, entry


def check_deliver_at(value: object) -> int:
    return _as_int("deliver_at_ms", value, "an int of epoch ms")


def bitmap_of(entries: np.ndarray) -> BitMap:
    """A roaring bitmap of entry ids (fast path through a uint32 buffer)."""
    return BitMap(array("I", entries.astype(np.uint32, copy=False).tobytes()))


def bitmap_values(bm: BitMap) -> np.ndarray:
    return np.frombuffer(bm.to_array(), dtype=np.uint32).astype(I64)


def sort_order(ds: np.ndarray, ls: np.ndarray, es: np.ndarray) -> np.ndarray:
    """Indices ordering the columns by (deliver_at, ledger, entry)."""
    return np.lexsort((es, ls, ds))


def is_sorted(d: np.ndarray, l: np.ndarray, e: np.ndarray) -> bool:  # noqa: E741
    """Are the columns in (deliver_at, ledger, entry) order?"""
    if len(d) < 2:
        return True
    dd, dl, de = np.diff(d), np.diff(l), np.diff(e)
    return bool(((dd > 0) | ((dd == 0) & ((dl > 0) | ((dl == 0) & (de >= 0))))).all())


class Run:
    """Positions sorted by (deliver_at, ledger, entry), consumed from ``head``."""

    __slots__ = ("d", "l", "e", "head", "owner")

    def __init__(self, d: np.ndarray, l: np.ndarray, e: np.ndarray, owner: object = None) -> None:  # noqa: E741
        self.d, self.l, self.e = d, l, e
        self.head = 0
        self.owner = owner

    def __len__(self) -> int:
        return len(self.d) - self.head

    def first_d(self) -> int:
        return int(self.d[self.head])

    def due_count(self, cutoff: int) -> int:
        return int(self.d.searchsorted(cutoff, side="right")) - self.head if len(self) else 0

    def remaining(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        h = self.head
        return self.d[h:], self.l[h:], self.e[h:]

    def nbytes(self) -> int:
        return self.d.nbytes + self.l.nbytes + self.e.nbytes

    @staticmethod
    def from_unsorted(d: np.ndarray, l: np.ndarray, e: np.ndarray, owner: object = None) -> Run:  # noqa: E741
        if is_sorted(d, l, e):  # often so: chunks arrive in deliver_at, then log order
            return Run(d, l, e, owner)
        order = sort_order(d, l, e)
        return Run(d[order], l[order], e[order], owner)


def concat(
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not parts:
        return EMPTY, EMPTY, EMPTY
    if len(parts) == 1:
        return parts[0]
    return (
        np.concatenate([p[0] for p in parts]),
        np.concatenate([p[1] for p in parts]),
        np.concatenate([p[2] for p in parts]),
    )


def superseded(l: np.ndarray, e: np.ndarray, due: np.ndarray) -> np.ndarray:  # noqa: E741
    """Mask of not-due items that a later due item of the same position cancels.

    A batch means the same as the adds one by one: a due add untracks its position,
    so a not-due add of that position earlier in the batch has no lasting effect.
    """
    out = np.zeros(len(l), dtype=bool)
    if not due.any() or due.all():
        return out
    for _ledger, idx in ledger_groups(l):
        sub_due = due[idx]
        if not sub_due.any() or sub_due.all():
            continue
        overlap = bitmap_of(e[idx][sub_due]) & bitmap_of(e[idx][~sub_due])
        if not overlap:
            continue
        last_due: dict[int, int] = {}
        for i in idx.tolist():
            if due[i] and int(e[i]) in overlap:
                last_due[int(e[i])] = i
        for i in idx.tolist():
            if not due[i] and last_due.get(int(e[i]), -1) > i:
                out[i] = True
    return out
