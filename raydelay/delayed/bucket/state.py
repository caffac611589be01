"""What the bucket tracker holds in memory: each immutable bucket's record and lifecycle
state (:class:`Bucket`, :class:`BucketState`), the mutable bucket still taking adds
(:class:`MutableBucket`), the columns of a bucket being sealed (:class:`FrozenColumns`),
and the per-ledger exclusion bitmaps that keep handed-out copies from coming back."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np
from pyroaring import BitMap

from raydelay.delayed import codec
from raydelay.delayed.columns import Run, bitmap_of, bitmap_values, concat, ledger_groups
from raydelay.delayed.common import Cols
from raydelay.errors import RaydelayError

Exclusions = dict[int, BitMap]  # entry ids by ledger


class BucketState(enum.Enum):
    """Where an immutable bucket is in its life. A bucket leaves the tracker (retired,
    trimmed, downgraded to memory or replaced by a merge) from any state but merging."""

    SEALING = "sealing"  # being sorted and written; its frozen columns serve due positions
    PERSISTED = "persisted"  # in the store; its segments load as they come near
    MERGING = "merging"  # a source of a merge under way: no loads, no other merge

    def can_move_to(self, new: BucketState) -> bool:
        return new in _MOVES[self]


_MOVES: dict[BucketState, frozenset[BucketState]] = {
    BucketState.SEALING: frozenset({BucketState.PERSISTED}),
    BucketState.PERSISTED: frozenset({BucketState.MERGING}),
    BucketState.MERGING: frozenset({BucketState.PERSISTED}),  # the merge failed or was moot
}


@dataclass(eq=False)
class Bucket:
    """An immutable bucket: ledgers ``start``..``end``, its segments' deliver_at bounds
    (ms) and counts, the next segment to load and the runs loaded from it."""

    start: int
    end: int
    bucket_id: int
    seg_min: list[int]
    seg_count: list[int]
    seg_max: list[int]
    next_seg: int
    state: BucketState
    holder: FrozenColumns | None = None  # while sealing: the unsorted columns, still served
    # (ledger_ids, entry_ids) handed out by the holder while sealing
    taken: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    loading: bool = False
    want_next: bool = False
    load_retry_at_ms: int = 0  # the tracker's clock, before which a failed load waits
    exclude: Exclusions | None = None

    @staticmethod
    def from_meta(
        meta: codec.BucketMeta,
        next_seg: int,
        *,
        runs: list[Run] | None = None,
        exclude: Exclusions | None = None,
    ) -> Bucket:
        """A persisted bucket as its meta object describes it."""
        return Bucket(
            start=meta.start_ledger,
            end=meta.end_ledger,
            bucket_id=meta.bucket_id,
            seg_min=[s.min_deliver_at_ms for s in meta.segments],
            seg_count=[s.count for s in meta.segments],
            seg_max=[s.max_deliver_at_ms for s in meta.segments],
            next_seg=next_seg,
            state=BucketState.PERSISTED,
            runs=runs if runs is not None else [],
            exclude=exclude,
        )

    def move_to(self, new: BucketState) -> None:
        """Change state; a move the lifecycle does not have is a bug and raises."""
        if not self.state.can_move_to(new):
            raise RaydelayError(
                f"bucket {self.key}: no move from {self.state.value} to {new.value}"
            )
        self.state = new

    @property
    def key(self) -> str:
        return codec.bucket_key(self.start, self.end, self.bucket_id)

    @property
    def segments(self) -> int:
        return len(self.seg_count)

    def unloaded_count(self) -> int:
        return sum(self.seg_count[self.next_seg :])

    def remaining_count(self) -> int:
        held = self.holder.count if self.holder is not None else 0
        return held + self.unloaded_count() + sum(len(r) for r in self.runs)


class MutableBucket:
    """The last, mutable bucket: sorted runs consumed from their heads as they fall due,
    plus chunks of recent adds that are sorted only once something in them is due.
    Many small runs are merged into one, so a pop costs what is due, not the bucket's size."""

    _MAX_RUNS = 8

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.runs: list[Run] = []
        self.pending: list[Cols] = []
        self.pending_min: int | None = None
        self.count = 0
        self.start = -1
        self.end = -1

    @property
    def min_d(self) -> int | None:
        best = self.pending_min
        for r in self.runs:
            v = r.first_d()
            best = v if best is None or v < best else best
        return best

    def append(self, d: np.ndarray, l: np.ndarray, e: np.ndarray, ledger: int) -> None:  # noqa: E741
        self.pending.append((d, l, e))
        self.count += len(d)
        self.start = ledger if self.start < 0 else min(self.start, ledger)
        self.end = max(self.end, ledger)
        m = int(d.min())
        self.pending_min = m if self.pending_min is None else min(self.pending_min, m)

    def parts(self) -> list[Cols]:
        return [r.remaining() for r in self.runs] + list(self.pending)

    def columns(self) -> Cols:
        """Every position held, unsorted (for a seal or a trim)."""
        return concat(self.parts())

    def _sort_pending(self) -> None:
        if self.pending:
            self.runs.append(Run.from_unsorted(*concat(self.pending)))
            self.pending, self.pending_min = [], None
        if len(self.runs) > self._MAX_RUNS:
            self.runs = [Run.from_unsorted(*concat([r.remaining() for r in self.runs]))]

    def take_due(self, cutoff: int) -> Cols | None:
        m = self.min_d
        if m is None or m > cutoff:
            return None
        if self.pending_min is not None and self.pending_min <= cutoff:
            self._sort_pending()
        parts = []
        for r in self.runs:
            k = r.due_count(cutoff)
            if k:
                h = r.head
                parts.append((r.d[h : h + k], r.l[h : h + k], r.e[h : h + k]))
                r.head += k
        self.runs = [r for r in self.runs if len(r)]
        out = concat(parts)
        self.count -= len(out[0])
        return out

    def drop_below(self, ledger: int) -> None:
        if not self.count:
            return
        d, l, e = self.columns()  # noqa: E741
        keep = l >= ledger
        if not keep.all():
            start, end = self.start, self.end
            self.clear()
            if keep.any():
                self.append(d[keep], l[keep], e[keep], start)
                self.end = end

    def nbytes(self) -> int:
        return sum(r.nbytes() for r in self.runs) + sum(c[0].nbytes * 3 for c in self.pending)


class FrozenColumns:
    """A sealing bucket's columns, unsorted, while the I/O thread sorts and writes them.
    Due positions are handed out by a mask scan: no sort on the caller's path."""

    def __init__(self, d: np.ndarray, l: np.ndarray, e: np.ndarray) -> None:  # noqa: E741
        self.d, self.l, self.e = d, l, e
        self.taken = np.zeros(len(d), dtype=bool)
        self.count = len(d)
        self.min_d: int | None = int(d.min()) if len(d) else None

    def take_due(self, cutoff: int) -> Cols | None:
        if self.min_d is None or self.min_d > cutoff:
            return None
        due = (self.d <= cutoff) & ~self.taken
        self.taken |= due
        self.count -= int(due.sum())
        rest = self.d[~self.taken]
        self.min_d = int(rest.min()) if len(rest) else None
        return self.d[due], self.l[due], self.e[due]

    def columns(self) -> Cols:
        keep = ~self.taken
        return self.d[keep], self.l[keep], self.e[keep]

    def nbytes(self) -> int:
        return self.d.nbytes + self.l.nbytes + self.e.nbytes + self.taken.nbytes


def without(cols: Cols, exclude: Exclusions | None) -> Cols:
    """The columns minus the positions in ``exclude``."""
    if not exclude:
        return cols
    d, l, e = cols  # noqa: E741
    keep = np.ones(len(l), dtype=bool)
    for ledger, idx in ledger_groups(l):
        ex = exclude.get(ledger)
        if ex:
            keep[idx] = ~np.isin(e[idx], bitmap_values(ex))
    return (d, l, e) if keep.all() else (d[keep], l[keep], e[keep])


def add_exclusions(exclude: Exclusions, l: np.ndarray, e: np.ndarray) -> None:  # noqa: E741
    """Add the positions (ledger and entry columns) to ``exclude``."""
    for ledger, idx in ledger_groups(l):
        exclude.setdefault(ledger, BitMap()).update(bitmap_of(e[idx]))
