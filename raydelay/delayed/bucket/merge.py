"""Merging adjacent buckets, kept apart from the tracker's state: which buckets to merge
(:func:`pick_window`), what a merge starts from (:func:`plan_merge`), the k-way merge of
sorted sources into segments (:func:`merge_segments`, pure: it reads through the loaders
it is given), the merge job (:func:`write_merged`), and how the foreground's progress
during the merge is reconciled with its result (:func:`reconcile`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from raydelay.delayed import codec
from raydelay.delayed.bucket.state import Bucket, BucketState, Exclusions, add_exclusions, without
from raydelay.delayed.bucket.writer import BucketWriter, Sleep, segment_key
from raydelay.delayed.columns import EMPTY, Run, concat, sort_order
from raydelay.delayed.common import Cols
from raydelay.delayed.registry import BucketRegistry
from raydelay.storage.base import ObjectStore

MAX_MERGE_WINDOW = 4  # buckets merged into one at most


def pick_window(buckets: Sequence[Bucket]) -> tuple[int, int] | None:
    """The widest run of adjacent persisted, idle buckets (up to :data:`MAX_MERGE_WINDOW`),
    as (lo, hi) indexes; among equally wide ones the fewest positions, then the latest
    next deliver_at. None when no two adjacent buckets can merge."""
    n = len(buckets)
    for size in range(min(MAX_MERGE_WINDOW, n), 1, -1):
        best: tuple[tuple[int, int], int] | None = None
        for lo in range(0, n - size + 1):
            window = buckets[lo : lo + size]
            if any(b.state is not BucketState.PERSISTED or b.loading for b in window):
                continue
            total = sum(b.remaining_count() for b in window)
            nexts = [b.seg_min[b.next_seg] for b in window if b.next_seg < b.segments]
            rank = (total, min(nexts) if nexts else 2**63)
            if best is None or rank < best[0]:
                best = (rank, lo)
        if best is not None:
            return best[1], best[1] + size
    return None


@dataclass(frozen=True)
class StoredSource:
    """A source bucket's segments not loaded yet, in order, each read only when the merge
    needs it; ``exclude`` are positions it handed out already (never carried over)."""

    loaders: list[Callable[[], Cols]]
    exclude: Exclusions | None


@dataclass(eq=False)
class MergePlan:
    """What a merge of ``sources`` starts from: the segment keys still in the store, a copy
    of what their loaded runs still hold, and each run's head at the start (by id)."""

    sources: list[Bucket]
    new_bucket: tuple[int, int, int]  # start ledger, end ledger, bucket id
    epoch: int
    stored: list[tuple[list[str], Exclusions | None]]
    memory: list[Cols]
    heads: dict[int, tuple[Run, int]]


def plan_merge(name: str, sources: list[Bucket], new_id: int, epoch: int) -> MergePlan:
    """The plan for merging ``sources`` (adjacent, in ledger order) into bucket ``new_id``."""
    stored: list[tuple[list[str], Exclusions | None]] = []
    memory: list[Cols] = []
    heads: dict[int, tuple[Run, int]] = {}
    for b in sources:
        # a source's own exclusions stay excluded: copies it handed out must not return
        ex = {lg: bm.copy() for lg, bm in b.exclude.items()} if b.exclude else None
        keys = [segment_key(name, b.key, i) for i in range(b.next_seg, b.segments)]
        if keys:
            stored.append((keys, ex))
        for r in b.runs:
            if len(r):
                d, l, e = r.remaining()  # noqa: E741
                memory.append((d.copy(), l.copy(), e.copy()))
            heads[id(r)] = (r, r.head)
    start, end = sources[0].start, sources[-1].end
    return MergePlan(sources, (start, end, new_id), epoch, stored, memory, heads)


class _SortedStream:
    """A sorted source of a merge: in-memory columns, or a bucket's segments read one at a
    time, so a merge holds a few segments, not buckets."""

    def __init__(self, loaders: list[Callable[[], Cols]]) -> None:
        self._loaders = list(loaders)
        self._buf: Cols = (EMPTY, EMPTY, EMPTY)
        self._pos = 0

    def fill(self, n: int) -> int:
        """Buffer at least ``n`` items when the source has them; returns how many are buffered."""
        while len(self._buf[0]) - self._pos < n and self._loaders:
            nxt = self._loaders.pop(0)()
            p = self._pos
            self._buf = concat([(self._buf[0][p:], self._buf[1][p:], self._buf[2][p:]), nxt])
            self._pos = 0
        return len(self._buf[0]) - self._pos

    def nth_d(self, n: int) -> int:
        return int(self._buf[0][self._pos + n - 1])

    def take_upto(self, bound: int) -> Cols:
        """Items with deliver_at <= bound, removed from the front."""
        d, l, e = self._buf  # noqa: E741
        k = int(d.searchsorted(bound, side="right"))
        p = self._pos
        self._pos = max(p, k)
        return d[p : self._pos], l[p : self._pos], e[p : self._pos]

    def put_back(self, count: int) -> None:
        self._pos -= count


def merge_segments(
    stored: Sequence[StoredSource],
    memory: Sequence[Cols],
    max_per_segment: int,
    max_step_ms: int,
) -> Iterator[Cols]:
    """The segments of the merged bucket, in order (same cut rule as a seal): a k-way merge
    of the stored sources (minus their exclusions) and the ``memory`` columns (unsorted).
    The first ``max_per_segment`` positions overall all have deliver_at <= the smallest
    n-th deliver_at among full streams, so only that much is taken and sorted per segment."""

    def minus(load: Callable[[], Cols], ex: Exclusions | None) -> Callable[[], Cols]:
        return lambda: without(load(), ex)

    streams = [_SortedStream([minus(load, s.exclude) for load in s.loaders]) for s in stored]
    if memory:
        held = concat(list(memory))
        order = sort_order(*held)
        d, l, e = held  # noqa: E741
        sorted_held: Cols = (d[order], l[order], e[order])
        streams.append(_SortedStream([lambda: sorted_held]))
    n = max_per_segment
    while True:
        avail = [s.fill(n) for s in streams]
        if not any(avail):
            return
        full = [s.nth_d(n) for s, a in zip(streams, avail) if a >= n]
        bound = min(full) if full else 2**63 - 1
        parts = [s.take_upto(bound) for s in streams]
        tag = np.repeat(np.arange(len(streams)), [len(p[0]) for p in parts])
        d, l, e = concat(parts)  # noqa: E741
        order = sort_order(d, l, e)
        d, l, e, tag = d[order], l[order], e[order], tag[order]  # noqa: E741
        j = int(d.searchsorted(d[0] + max_step_ms, side="right"))
        j = max(1, min(j, n, len(d)))
        yield d[:j], l[:j], e[:j]
        # what was taken but not emitted goes back to its stream (each stream's leftover
        # is its largest items, so a plain count per stream restores it)
        for idx, back in enumerate(np.bincount(tag[j:], minlength=len(streams)).tolist()):
            if back:
                streams[idx].put_back(back)


def write_merged(
    plan: MergePlan,
    store: ObjectStore,
    registry: BucketRegistry,
    name: str,
    max_per_segment: int,
    max_step_ms: int,
    sleep: Sleep,
) -> tuple[codec.BucketMeta, int] | None:
    """The merge job: write the merged bucket; returns its meta and the bytes written, or
    None when nothing was left to merge (everything in the sources was handed out)."""

    def loader(key: str) -> Callable[[], Cols]:
        return lambda: codec.decode_segment(store.get(key), key)

    stored = [StoredSource([loader(k) for k in keys], ex) for keys, ex in plan.stored]
    with BucketWriter(store, registry, name, *plan.new_bucket, sleep) as writer:
        for segment in merge_segments(stored, plan.memory, max_per_segment, max_step_ms):
            writer.add_segment(segment)
        if not writer.nbytes:
            return None
        return writer.finish()


@dataclass
class Reconciled:
    """How the merged bucket takes over from its sources in memory: ``exclude`` are the
    copies it must not bring back; ``keep`` the runs it owns (``new`` among them still
    to be queued); ``dropped`` the source runs its segments replace."""

    exclude: Exclusions
    keep: list[Run]
    new: list[Run]
    dropped: list[Run]


def reconcile(plan: MergePlan, cutoff: int) -> Reconciled:
    """Reconcile the sources' runs as they are now with the merge's result: copies the
    foreground consumed or loaded meanwhile must not come back from the merged bucket,
    and what is due before ``cutoff`` (epoch ms) keeps being served from memory."""
    exclude: Exclusions = {}
    keep: list[Run] = []
    new: list[Run] = []
    soon_parts: list[Cols] = []
    dropped: list[Run] = []
    for b in plan.sources:
        for r in b.runs:
            snap = plan.heads.get(id(r))
            h0 = snap[1] if snap is not None and snap[0] is r else None
            if h0 is None:  # loaded after the merge started: the merged bucket has it too
                add_exclusions(exclude, r.l, r.e)
                if len(r):
                    keep.append(r)
                continue
            add_exclusions(exclude, r.l[h0 : r.head], r.e[h0 : r.head])
            dropped.append(r)  # the merged bucket holds what is left of it...
            k = r.due_count(cutoff)
            if k:  # ...but what is due soon keeps being served from memory
                h = r.head
                soon_parts.append((r.d[h : h + k], r.l[h : h + k], r.e[h : h + k]))
    if soon_parts:  # one run for all of it, so the queue does not collect slivers
        d, l, e = concat(soon_parts)  # noqa: E741
        soon = Run.from_unsorted(d.copy(), l.copy(), e.copy())
        add_exclusions(exclude, soon.l, soon.e)
        keep.append(soon)
        new.append(soon)
    return Reconciled(exclude, keep, new, dropped)
