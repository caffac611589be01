"""One subscription's view of its partition's sealed buckets (pure: no Ray, no store).

The topic seals each range of ledgers once (:mod:`raydelay.delayed.sealed`); every shared
subscription reads the same buckets. Per subscription and bucket, this keeps only:

- ``done``: the segments before it have every row acknowledged (persisted through the
  coordinator, so a restart reloads from there, and the bucket can go once every
  subscription is done with all of it);
- the segments loaded and the read position in each (rows come out in (deliver_at,
  position) order, carrying their payloads);
- ``taken``: (position, deliver_at): the subscription had already taken every row below
  that position due at or before that time from the topic's unsealed index, before the
  bucket was sealed; the bucket leaves those out.

A segment is loaded only when its earliest deliver_at comes within ``lookahead_ms``,
at most ``max_loaded_rows`` rows ahead per bucket and ``max_loaded_total`` rows over all
buckets (the earliest segments first), so the memory held grows with neither the number
of buckets nor the pending messages, even when a large backlog is overdue in every
bucket at once. The actor does the loading (I/O);
this class says what to load (:meth:`wanted`) and takes it in (:meth:`install`).

Segments whose every row was taken from the unsealed index (a bucket sealed while the
subscription was reading its ledgers in real time) are not loaded: only their position
keys are (from the bucket's index, one small object), so that their acknowledgements still
count towards ``done``. A run of them is skipped in one load, so the rows due next are
reached at once, not one segment load at a time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from pyroaring import BitMap64

from raydelay.delayed.common import due_window_counts
from raydelay.delayed.index import Membership, smallest_counts
from raydelay.delayed.sealed import SealedMeta
from raydelay.log.entries import Rows
from raydelay.positions import split_keys

FINISHED = -1  # the progress of a bucket every row of which is acknowledged

Group = tuple[Rows, np.ndarray, np.ndarray]  # (segment rows, row indexes, position keys)


class SegmentLoad(NamedTuple):
    """A segment to read from the store: its bucket, number, and byte range there. With
    ``taken`` > 0, the ``taken`` segments from ``no`` on were wholly taken from the
    unsealed index: only their position keys are wanted (:meth:`SealedReader.install_taken`)."""

    key: str
    no: int
    offset: int
    length: int
    taken: int = 0


@dataclass
class _Segment:
    """A loaded segment: ``rows`` as read; ``idx`` the rows still to deliver (those not
    taken from the unsealed index already), with their ``d`` and ``keys``, from ``pos`` on;
    ``all_keys`` every position of the segment (it is done once all are acknowledged)."""

    no: int
    rows: Rows
    idx: np.ndarray
    d: np.ndarray
    keys: np.ndarray
    all_keys: np.ndarray
    pos: int = 0

    def __len__(self) -> int:
        return len(self.keys) - self.pos


@dataclass
class _Bucket:
    meta: SealedMeta
    done: int  # segments before it are fully acknowledged
    next_load: int  # the next segment to load
    taken: tuple[int, int]  # rows below this position due at or before this time: taken
    last_key: int = -1  # its largest position key
    loading: int | None = None  # the segment being loaded
    loaded: deque[_Segment] = field(default_factory=deque)
    popped: deque[tuple[int, np.ndarray]] = field(default_factory=deque)  # (no, keys)

    def loaded_rows(self) -> int:
        return sum(len(s) for s in self.loaded)


def _drop_finished(b: _Bucket) -> None:
    """Move the bucket's leading segments with nothing left to deliver to ``popped`` (in
    segment order: ``done`` advances over them in that order)."""
    while b.loaded and not len(b.loaded[0]):
        s = b.loaded.popleft()
        b.popped.append((s.no, s.all_keys))


class SealedReader:
    def __init__(
        self,
        *,
        lookahead_ms: int = 10_000,
        max_loaded_rows: int = 10_000,
        max_loaded_total: int = 200_000,
    ) -> None:
        self.lookahead_ms = lookahead_ms
        self.max_loaded_rows = max_loaded_rows
        self.max_loaded_total = max_loaded_total
        self.buckets: dict[str, _Bucket] = {}
        self.covered = BitMap64()  # the positions of every bucket held
        self.sealed_through = -1
        self.counters = {
            "adopted": 0,
            "segments_loaded": 0,
            "segments_skipped": 0,
            "rows_loaded": 0,
            "finished": 0,
        }

    # --- the set of buckets ---------------------------------------------------------------

    def adopt(self, meta: SealedMeta, *, done: int = 0, taken: tuple[int, int] = (0, -1)) -> None:
        """Start reading a bucket from segment ``done`` (``FINISHED``: it is done with),
        leaving out the rows ``taken`` says were taken already."""
        self.sealed_through = max(self.sealed_through, meta.end_ledger)
        if meta.key in self.buckets:
            return
        n = len(meta.segments)
        done = n if done == FINISHED else max(0, min(int(done), n))
        last = int(meta.keys.max()) if meta.keys else -1
        self.buckets[meta.key] = _Bucket(meta, done, done, (int(taken[0]), int(taken[1])), last)
        self.counters["adopted"] += 1
        self.covered |= meta.positions()

    def forget(self, key: str) -> None:
        """The bucket is gone from the store (every subscription was done with it)."""
        b = self.buckets.pop(key, None)
        if b is not None:
            self.covered -= b.meta.positions()

    def trim_covered(self, below_key: int) -> None:
        """Positions below ``below_key`` need no lookup any more (the log read is past them)."""
        if self.covered:
            self.covered.remove_range(0, max(0, below_key))

    # --- loading --------------------------------------------------------------------------

    def next_load_ms(self) -> int | None:
        """When :meth:`wanted` will next want a segment (epoch ms): its lookahead before the
        earliest deliver_at of a next segment not loading yet; None: no segment left."""
        times = [
            b.meta.segments[b.next_load].min_d - self.lookahead_ms
            for b in self.buckets.values()
            if b.loading is None and b.next_load < len(b.meta.segments)
        ]
        return min(times) if times else None

    def wanted(self, now_ms: int, max_loads: int = 4) -> list[SegmentLoad]:
        """Segments to load now, as (bucket key, segment no, byte offset, length): the next
        segment of each bucket whose deliver_at comes within the lookahead, while the
        bucket holds few rows loaded. Marks them as loading."""
        out: list[SegmentLoad] = []
        horizon = now_ms + self.lookahead_ms
        held = sum(
            b.loaded_rows() + (b.meta.segments[b.loading].count if b.loading is not None else 0)
            for b in self.buckets.values()
        )
        for key, b in sorted(self.buckets.items(), key=lambda kv: self._next_d(kv[1])):
            if len(out) >= max_loads or held >= self.max_loaded_total:
                break
            if b.loading is not None or b.next_load >= len(b.meta.segments):
                continue
            seg = b.meta.segments[b.next_load]
            skip = self._taken_run(b)
            if skip:
                b.loading = b.next_load
                out.append(SegmentLoad(key, b.next_load, seg.offset, seg.length, taken=skip))
                continue
            if seg.min_d > horizon or b.loaded_rows() >= self.max_loaded_rows:
                continue
            b.loading = b.next_load
            held += seg.count
            out.append(SegmentLoad(key, b.next_load, seg.offset, seg.length))
        return out

    @staticmethod
    def _taken_run(b: _Bucket) -> int:
        """How many segments from ``next_load`` on hold only rows taken already (every
        position of the bucket is below ``taken``'s, and the segment's deliver_at at or
        before its time)."""
        below, through = b.taken
        if b.loaded or b.last_key < 0 or b.last_key >= below:
            return 0  # (behind loaded rows, a skip would pop out of order)
        n = 0
        for seg in b.meta.segments[b.next_load :]:
            if seg.max_d > through:
                break
            n += 1
        return n

    def install_taken(self, key: str, no: int, segment_keys: list[np.ndarray]) -> None:
        """The position keys of the segments from ``no`` on that a load with ``taken``
        skipped: popped at once (their rows went out from the unsealed index)."""
        b = self.buckets.get(key)
        if b is None or b.loading != no:
            return  # forgotten meanwhile
        b.loading = None
        b.next_load = no + len(segment_keys)
        for i, keys in enumerate(segment_keys):
            b.popped.append((no + i, keys))
        self.counters["segments_skipped"] += len(segment_keys)

    def install(self, key: str, no: int, rows: Rows) -> None:
        """A segment the actor loaded (rows sorted by deliver_at, then position)."""
        b = self.buckets.get(key)
        if b is None or b.loading != no:
            return  # forgotten meanwhile
        b.loading = None
        b.next_load = no + 1
        self.counters["segments_loaded"] += 1
        self.counters["rows_loaded"] += len(rows)
        d, keys = rows.entries.deliver_at_ms, rows.positions
        idx = np.arange(len(rows), dtype=np.int64)
        below, through = b.taken
        if below > 0 and through >= 0:
            # rows taken from the unsealed index before the bucket was sealed: left out now,
            # so that the next row to deliver is always the head (its wake-up time)
            idx = idx[~((keys < below) & (d <= through))]
        b.loaded.append(_Segment(no, rows, idx, d[idx], keys[idx], keys))
        _drop_finished(b)

    def load_failed(self, key: str, no: int) -> None:
        b = self.buckets.get(key)
        if b is not None and b.loading == no:
            b.loading = None

    # --- taking due rows --------------------------------------------------------------------

    def take_due(self, now_ms: int, max_rows: int) -> list[Group]:
        """Pop up to ``max_rows`` due rows (deliver_at <= now), earliest first, from the
        loaded segments, leaving out the rows the bucket's ``taken`` covers."""
        out: list[Group] = []
        room = max_rows
        while room > 0:
            heads = [b for b in self.buckets.values() if b.loaded]
            dues = [
                int(np.searchsorted(b.loaded[0].d, now_ms, "right")) - b.loaded[0].pos
                for b in heads
            ]
            total = sum(max(0, n) for n in dues)
            if total == 0:
                break
            if total <= room:
                counts = [max(0, n) for n in dues]
            else:
                parts, owners = [], []
                for b, n in zip(heads, dues, strict=True):
                    if n > 0:
                        s = b.loaded[0]
                        ks = s.keys[s.pos : s.pos + n]
                        parts.append((s.d[s.pos : s.pos + n], *split_keys(ks)))
                        owners.append(b)
                took = dict(zip(map(id, owners), smallest_counts(parts, room), strict=True))
                counts = [took.get(id(b), 0) for b in heads]
            for b, c in zip(heads, counts, strict=True):
                if c <= 0:
                    continue
                s = b.loaded[0]
                out.append((s.rows, s.idx[s.pos : s.pos + c], s.keys[s.pos : s.pos + c]))
                s.pos += c
                room -= c
                _drop_finished(b)
        return out

    def has_due(self, now_ms: int) -> bool:
        """Whether a loaded row is due at ``now_ms`` (the head of each bucket is its next
        row to deliver)."""
        return any(
            b.loaded and int(b.loaded[0].d[b.loaded[0].pos]) <= now_ms
            for b in self.buckets.values()
        )

    def next_time(self) -> int | None:
        """The earliest deliver_at of a row not popped yet (loaded or not)."""
        times = [t for t in map(self._next_d, self.buckets.values()) if t is not None]
        return min(times) if times else None

    @staticmethod
    def _next_d(b: _Bucket) -> int:
        if b.loaded:
            return int(b.loaded[0].d[b.loaded[0].pos])
        if b.next_load < len(b.meta.segments):
            return b.meta.segments[b.next_load].min_d
        return 2**63 - 1

    # --- progress -----------------------------------------------------------------------------

    def advance(self, all_acked) -> list[str]:
        """Move each bucket's ``done`` over popped segments whose rows ``all_acked(keys)``
        says are acknowledged; returns the keys of buckets that became finished."""
        finished = []
        for key, b in self.buckets.items():
            before = b.done
            while b.popped and b.popped[0][0] == b.done and all_acked(b.popped[0][1]):
                b.popped.popleft()
                b.done += 1
            if b.done == len(b.meta.segments) and before < b.done:
                finished.append(key)
        self.counters["finished"] += len(finished)
        return finished

    def progress(self) -> dict[str, int]:
        """Per bucket: segments done, or FINISHED."""
        return {
            k: FINISHED if b.done >= len(b.meta.segments) else b.done
            for k, b in self.buckets.items()
        }

    def remaining(self) -> int:
        """Rows not popped yet (cancelled ones included until they are reached)."""
        n = 0
        for b in self.buckets.values():
            n += b.loaded_rows()
            n += sum(s.count for s in b.meta.segments[b.next_load :])
        return n

    def loaded_rows(self) -> int:
        return sum(b.loaded_rows() for b in self.buckets.values())

    def due_histogram(self, edges: np.ndarray) -> list[int]:
        """Rows not popped yet per due window, as the trackers count them
        (``len(edges) + 1`` counts); a segment not loaded is spread over its span."""
        loaded = [s.d[s.pos :] for b in self.buckets.values() for s in b.loaded]
        spans = [
            (seg.min_d, seg.max_d, seg.count)
            for b in self.buckets.values()
            for seg in b.meta.segments[b.next_load :]
        ]
        out = np.asarray(due_window_counts(edges, [], Membership(), spans), dtype=np.int64)
        for d in loaded:
            out += np.bincount(np.searchsorted(edges, d, side="right"), minlength=len(out))
        return out.tolist()
