"""One subscription's view of its partition's sealed buckets (pure: no Ray, no store).

The topic seals each range of ledgers once (:mod:`raydelay.delayed.sealed`); every shared
subscription reads the same buckets. A bucket is one or more *runs* (the segments one seal
wrote; a merged bucket owns the runs of the buckets it merged) read a *group* at a time
(a few segments, in deliver_at order). Per subscription and run, this keeps only:

- ``done``: the segments before it have every row acknowledged (persisted through the
  coordinator, so a restart reloads from there, and the bucket can go once every
  subscription is done with all of it);
- ``next``: the segments before it were loaded (or skipped);
- ``taken``: (position, deliver_at): the subscription had already taken every row below
  that position due at or before that time from the topic's unsealed index, before the
  run was sealed; those rows are left out.

and per bucket the groups loaded, each with its rows still to deliver in (deliver_at,
position) order, carrying their payloads. Neighbouring groups of a merged bucket may
overlap in time, so due rows are taken from every loaded group, the earliest first.

A group is loaded only when its earliest deliver_at comes within ``lookahead_ms``, at most
``max_loaded_rows`` rows ahead per run and ``max_loaded_total`` rows over all buckets (the
earliest first), so the memory held grows with neither the number of buckets nor the
pending messages, even when a large backlog is overdue in every bucket at once. The actor
does the loading (I/O); this class says what to load (:meth:`wanted`) and takes it in
(:meth:`install`).

Segments whose every row was taken from the unsealed index (a bucket sealed while the
subscription was reading its ledgers in real time) are not read: only their position keys
are (from their run's index, one small object), so that their acknowledgements still
count towards ``done``. A run of such groups is skipped in one load, so the rows due next
are reached at once, not one load at a time.

**Merges.** When the topic merges buckets this reader holds, :meth:`adopt` of the merged
bucket carries every run's state over (``done``, ``next``, ``taken``, the segments popped
and the groups loaded), so a merge under a reading subscription loses nothing and hands
out nothing twice; a run it did not hold yet starts afresh, as its bucket would have.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from pyroaring import BitMap64

from raydelay.delayed.common import due_window_counts
from raydelay.delayed.index import Membership, smallest_counts
from raydelay.delayed.sealed import RunInfo, SealedMeta
from raydelay.log.entries import Rows, is_run
from raydelay.positions import SHIFT, split_keys

FINISHED = -1  # the progress of a bucket (or of a run) every row of which is acknowledged

Group = tuple[Rows, np.ndarray, np.ndarray]  # (segment rows, row indexes, position keys)
Progress = int | list[int]  # segments done: one number per bucket, or one per run


class PartRead(NamedTuple):
    """One segment of a load: its run's number in the bucket, its number in the run, and
    where it is: the ``data`` (or ``index``) object of bucket ``run_key``, bytes
    ``offset`` .. ``offset + length``."""

    run: int
    segment: int
    run_key: str
    offset: int
    length: int


class SegmentLoad(NamedTuple):
    """What to read from the store for bucket ``key``, from its group ``no`` on (``groups``
    of them): the rows of the segments in ``reads``, and only the position keys of those
    in ``keys_only`` (their every row was taken from the unsealed index already)."""

    key: str
    no: int
    reads: tuple[PartRead, ...]
    keys_only: tuple[PartRead, ...] = ()
    groups: int = 1


@dataclass
class _Run:
    info: RunInfo
    done: int
    next: int
    taken: tuple[int, int]
    last_key: int  # its largest position key
    popped: dict[int, np.ndarray] = field(default_factory=dict)  # segment -> its keys

    def left(self) -> int:
        return self.info.rows_from[min(self.next, len(self.info.segments))]


@dataclass(eq=False)
class _Segment:
    """Loaded rows: ``rows`` those to deliver (not taken from the unsealed index already)
    in (deliver_at, position) order, ``idx`` their indexes (0, 1, ...), with their ``d``,
    ``keys`` and ``part`` (which of ``parts`` each comes from), from ``pos`` on. A part is
    popped once ``left`` says none of its rows is still to deliver."""

    rows: Rows
    idx: np.ndarray
    d: np.ndarray
    keys: np.ndarray
    part: np.ndarray
    parts: list[tuple[int, int]]  # (run, segment)
    part_keys: list[np.ndarray]
    left: np.ndarray
    pos: int = 0

    def __len__(self) -> int:
        return len(self.keys) - self.pos


@dataclass(eq=False)
class _Bucket:
    meta: SealedMeta
    runs: list[_Run]
    next_group: int = 0
    loading: SegmentLoad | None = None
    loaded: list[_Segment] = field(default_factory=list)

    def loaded_rows(self) -> int:
        return sum(len(s) for s in self.loaded)

    def needed(self, g: int) -> list[tuple[int, int]]:
        """The segments of group ``g`` not loaded yet."""
        return [(r, no) for r, no in self.meta.groups[g] if no >= self.runs[r].next]

    def skip_loaded(self) -> None:
        groups = self.meta.groups
        while self.next_group < len(groups) and not self.needed(self.next_group):
            self.next_group += 1

    def next_min_d(self) -> int | None:
        """The earliest deliver_at of the next group's segments to load (None: none)."""
        if self.next_group >= len(self.meta.groups):
            return None
        runs = self.runs
        return min(runs[r].info.segments[no].min_d for r, no in self.needed(self.next_group))


def _last_key_in(keys: BitMap64, run: RunInfo) -> int:
    """The largest position key of ``keys`` in the run's ledger range (-1: none)."""
    lo, hi = run.ledgers
    below_end = keys.rank(((hi + 1) << SHIFT) - 1)
    if below_end > (keys.rank((lo << SHIFT) - 1) if lo > 0 else 0):
        return int(keys[below_end - 1])
    return -1


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
            "merged": 0,
            "segments_loaded": 0,
            "segments_skipped": 0,
            "rows_loaded": 0,
            "finished": 0,
        }

    # --- the set of buckets ---------------------------------------------------------------

    def held_runs(self, meta: SealedMeta) -> set[str]:
        """The keys of ``meta``'s runs a bucket held here already reads."""
        mine = {r.info.key for b in self.buckets.values() for r in b.runs}
        return {r.key for r in meta.runs} & mine

    def adopt(
        self,
        meta: SealedMeta,
        *,
        done: Progress = 0,
        taken: tuple[int, int] = (0, -1),
        later: tuple[int, tuple[int, int]] | None = None,
    ) -> list[str]:
        """Start reading a bucket from its progress ``done`` (``FINISHED``: it is done
        with), leaving out the rows ``taken`` says were taken already. ``later`` =
        (ledger, taken after): its runs past that ledger leave out the rows ``taken
        after`` says instead (sealed after the due query whose answer took them). A merged
        bucket takes the place of the buckets held here whose runs it owns, with their
        state; returns their keys."""
        self.sealed_through = max(self.sealed_through, meta.end_ledger)
        if meta.key in self.buckets:
            return []
        taken = (int(taken[0]), int(taken[1]))
        by_run = {r.info.key: (key, r) for key, b in self.buckets.items() for r in b.runs}
        starts = _starts(meta, done)
        runs = []
        for info, start in zip(meta.runs, starts, strict=True):
            old = by_run.get(info.key)
            if old is not None:
                r = old[1]
                runs.append(_Run(info, r.done, r.next, r.taken, r.last_key, r.popped))
            else:
                run_taken = taken
                if later is not None and info.ledgers[1] > later[0]:
                    run_taken = (int(later[1][0]), int(later[1][1]))
                runs.append(_Run(info, start, start, run_taken, _last_key_in(meta.keys, info)))
        b = _Bucket(meta, runs)
        replaced = sorted({by_run[info.key][0] for info in meta.runs if info.key in by_run})
        number = {info.key: i for i, info in enumerate(meta.runs)}
        for key in replaced:
            old_b = self.buckets.pop(key)
            for s in old_b.loaded:
                s.parts = [(number[old_b.runs[r].info.key], no) for r, no in s.parts]
                b.loaded.append(s)
            # (a load of it in flight is dropped: its install finds no bucket, and
            # ``next`` never moved for it)
        b.skip_loaded()
        self.buckets[meta.key] = b
        self.covered |= meta.positions()
        self.counters["merged" if replaced else "adopted"] += 1
        return replaced

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
        """When :meth:`wanted` will next want a load (epoch ms): its lookahead before the
        earliest deliver_at of a next group not loading yet; None: nothing left to load."""
        times = [
            t - self.lookahead_ms
            for b in self.buckets.values()
            if b.loading is None and (t := b.next_min_d()) is not None
        ]
        return min(times) if times else None

    def wanted(self, now_ms: int, max_loads: int = 4) -> list[SegmentLoad]:
        """Loads to do now: the next group of each bucket whose deliver_at comes within the
        lookahead, while the bucket holds few rows loaded (or a run of groups taken
        already, at once). Marks them as loading."""
        out: list[SegmentLoad] = []
        horizon = now_ms + self.lookahead_ms
        held = 0
        for b in self.buckets.values():
            held += b.loaded_rows()
            if b.loading is not None:
                held += sum(self._count(b, p) for p in b.loading.reads)
        if held >= self.max_loaded_total:
            return out  # (an overdue backlog at the cap: most steps; no need to sort)
        for key, b in sorted(self.buckets.items(), key=lambda kv: self._next_d(kv[1])):
            if len(out) >= max_loads or held >= self.max_loaded_total:
                break
            if b.loading is not None or b.next_group >= len(b.meta.groups):
                continue
            skipped = self._taken_groups(b)
            if skipped:
                g, parts = skipped
                b.loading = SegmentLoad(key, b.next_group, (), parts, g - b.next_group)
                out.append(b.loading)
                continue
            needed = b.needed(b.next_group)
            first = min(b.runs[r].info.segments[no].min_d for r, no in needed)
            if first > horizon or b.loaded_rows() >= self.max_loaded_rows * len(b.runs):
                continue
            reads = tuple(self._part(b, r, no) for r, no in needed if not self._taken(b, r, no))
            keys_only = tuple(self._part(b, r, no) for r, no in needed if self._taken(b, r, no))
            b.loading = SegmentLoad(key, b.next_group, reads, keys_only)
            held += sum(self._count(b, p) for p in reads)
            out.append(b.loading)
        return out

    @staticmethod
    def _part(b: _Bucket, r: int, no: int) -> PartRead:
        info = b.runs[r].info
        seg = info.segments[no]
        return PartRead(r, no, info.key, seg.offset, seg.length)

    @staticmethod
    def _count(b: _Bucket, p: PartRead) -> int:
        return b.runs[p.run].info.segments[p.segment].count

    @staticmethod
    def _taken(b: _Bucket, r: int, no: int) -> bool:
        """Whether every row of segment ``no`` of run ``r`` was taken already (all the
        run's positions are below its ``taken`` position, and the segment's deliver_at at
        or before its time)."""
        run = b.runs[r]
        below, through = run.taken
        return 0 <= run.last_key < below and run.info.segments[no].max_d <= through

    def _taken_groups(self, b: _Bucket) -> tuple[int, tuple[PartRead, ...]] | None:
        """The groups from ``next_group`` on whose segments to load were all taken
        already: (the group after them, those segments), or None."""
        g, parts = b.next_group, []
        while g < len(b.meta.groups):
            needed = b.needed(g)
            if not all(self._taken(b, r, no) for r, no in needed):
                break
            parts += [self._part(b, r, no) for r, no in needed]
            g += 1
        return (g, tuple(parts)) if g > b.next_group else None

    def install(
        self,
        key: str,
        no: int,
        rows: list[Rows] | tuple[Rows, ...] = (),
        keys: list[np.ndarray] | tuple[np.ndarray, ...] = (),
    ) -> None:
        """A load the actor did: the rows of its ``reads`` (each sorted by deliver_at,
        then position) and the position keys of its ``keys_only``, in their order."""
        b = self.buckets.get(key)
        if b is None or b.loading is None or b.loading.no != no:
            return  # forgotten (or merged) meanwhile
        ld, b.loading = b.loading, None
        for p, ks in zip(ld.keys_only, keys, strict=True):
            run = b.runs[p.run]
            run.popped[p.segment] = np.asarray(ks, dtype=np.int64)
            run.next = max(run.next, p.segment + 1)
        self.counters["segments_skipped"] += len(ld.keys_only)
        if ld.reads:
            self._take_in(b, ld.reads, list(rows))
        b.next_group = max(b.next_group, no + ld.groups)
        b.skip_loaded()

    def _take_in(self, b: _Bucket, reads: tuple[PartRead, ...], rows: list[Rows]) -> None:
        if len(rows) != len(reads):
            raise ValueError(f"install: {len(rows)} row blocks for {len(reads)} reads")
        joined = Rows.join(rows)
        sizes = [len(r) for r in rows]
        part = np.repeat(np.arange(len(reads), dtype=np.int64), sizes)
        d, keys = joined.entries.deliver_at_ms, joined.positions
        # rows taken from the unsealed index before their run was sealed: left out now,
        # so that the next row to deliver is always a head (its wake-up time)
        below = np.repeat([b.runs[p.run].taken[0] for p in reads], sizes)
        through = np.repeat([b.runs[p.run].taken[1] for p in reads], sizes)
        idx = np.flatnonzero(~((keys < below) & (d <= through)))
        idx = idx[np.lexsort((keys[idx], d[idx]))]
        left = np.bincount(part[idx], minlength=len(reads))
        parts = [(p.run, p.segment) for p in reads]
        starts = np.cumsum([0] + sizes)
        part_keys = [keys[starts[i] : starts[i + 1]] for i in range(len(reads))]
        for p in reads:
            run = b.runs[p.run]
            run.next = max(run.next, p.segment + 1)
        # the rows to deliver are kept in delivery order (one take, here, unless they are
        # in it already: one segment with no row left out): a due window is then a slice
        # of them, never a take per receive
        in_order = len(idx) == len(joined) and is_run(idx)  # (then it is 0, 1, .. n-1)
        s = _Segment(
            joined if in_order else joined.take(idx),
            np.arange(len(idx), dtype=np.int64),
            d[idx],
            keys[idx],
            part[idx],
            parts,
            part_keys,
            left,
        )
        for i in np.flatnonzero(left == 0).tolist():
            r, no = parts[i]
            b.runs[r].popped[no] = part_keys[i]
        if len(s):
            b.loaded.append(s)
        self.counters["segments_loaded"] += len(reads)
        self.counters["rows_loaded"] += len(joined)

    def load_failed(self, key: str, no: int) -> None:
        b = self.buckets.get(key)
        if b is not None and b.loading is not None and b.loading.no == no:
            b.loading = None

    # --- taking due rows --------------------------------------------------------------------

    def take_due(self, now_ms: int, max_rows: int, *, earliest_first: bool = True) -> list[Group]:
        """Pop up to ``max_rows`` due rows (deliver_at <= now) from the loaded groups: the
        earliest first, or, with ``earliest_first`` False and more due than that, the due
        rows of whole loaded groups, the group whose first due row is the earliest first.

        The second is for a backlog: the groups of a merged bucket overlap in time, so the
        earliest rows over all of them are a few of each group's, and the groups left
        behind pile up (hundreds of small heads, each a slice per take); whole groups keep
        the loaded ones few, at the cost of order within what is overdue anyway."""
        out: list[Group] = []
        room = max_rows
        while room > 0:
            heads = [(b, s) for b in self.buckets.values() for s in b.loaded if len(s)]
            dues = [int(np.searchsorted(s.d, now_ms, "right")) - s.pos for _, s in heads]
            total = sum(max(0, n) for n in dues)
            if total == 0:
                break
            if total <= room:
                counts = [max(0, n) for n in dues]
            elif not earliest_first:
                counts, left = [0] * len(heads), room
                for i in sorted(
                    range(len(heads)), key=lambda i: int(heads[i][1].d[heads[i][1].pos])
                ):
                    if dues[i] > 0:
                        counts[i] = min(dues[i], left)
                        left -= counts[i]
                        if not left:
                            break
            else:
                parts, owners = [], []
                for (_, s), n in zip(heads, dues, strict=True):
                    if n > 0:
                        ks = s.keys[s.pos : s.pos + n]
                        parts.append((s.d[s.pos : s.pos + n], *split_keys(ks)))
                        owners.append(s)
                took = dict(zip(map(id, owners), smallest_counts(parts, room), strict=True))
                counts = [took.get(id(s), 0) for _, s in heads]
            for (b, s), c in zip(heads, counts, strict=True):
                if c <= 0:
                    continue
                out.append((s.rows, s.idx[s.pos : s.pos + c], s.keys[s.pos : s.pos + c]))
                self._pop(b, s, c)
                room -= c
        return out

    @staticmethod
    def _pop(b: _Bucket, s: _Segment, n: int) -> None:
        """``n`` rows of ``s`` went out: a part none of whose rows is left is popped."""
        hit = np.bincount(s.part[s.pos : s.pos + n], minlength=len(s.parts))
        s.pos += n
        s.left -= hit
        for i in np.flatnonzero((hit > 0) & (s.left == 0)).tolist():
            r, no = s.parts[i]
            b.runs[r].popped[no] = s.part_keys[i]
        if not len(s):
            b.loaded.remove(s)

    def has_due(self, now_ms: int) -> bool:
        """Whether a loaded row is due at ``now_ms``."""
        return any(
            int(s.d[s.pos]) <= now_ms for b in self.buckets.values() for s in b.loaded if len(s)
        )

    def next_time(self) -> int | None:
        """The earliest deliver_at of a row not popped yet (loaded or not)."""
        times = [t for t in map(self._next_d, self.buckets.values()) if t < _NEVER]
        return min(times) if times else None

    @staticmethod
    def _next_d(b: _Bucket) -> int:
        times = [int(s.d[s.pos]) for s in b.loaded if len(s)]
        nxt = b.next_min_d()
        if nxt is not None:
            times.append(nxt)
        return min(times) if times else _NEVER

    # --- peeking --------------------------------------------------------------------------

    def peek_parts(
        self, unknown: Sequence[SealedMeta] = (), taken: tuple[int, int] = (0, -1)
    ) -> tuple[list[Rows], list[tuple[int, int, str, int, int, int, int]]]:
        """What is still to deliver, for a peek (nothing changes): the loaded rows not
        popped, and each segment not loaded as (min_d, max_d, run key, offset, length,
        taken below, taken through) (see ``raydelay.dispatch.peek.SegmentRef``). The
        buckets ``unknown`` are sealed and not adopted yet: all of their segments count,
        but for the rows ``taken`` says were taken from the unsealed index."""
        loaded = [s.rows.slice(s.pos, len(s.keys)) for b in self.buckets.values() for s in b.loaded]
        refs = [
            (seg.min_d, seg.max_d, r.info.key, seg.offset, seg.length, *r.taken)
            for b in self.buckets.values()
            for r in b.runs
            for seg in r.info.segments[r.next :]
            if seg.count and not (0 <= r.last_key < r.taken[0] and seg.max_d <= r.taken[1])
        ]
        held = {r.info.key for b in self.buckets.values() for r in b.runs}
        refs += [
            (seg.min_d, seg.max_d, info.key, seg.offset, seg.length, *taken)
            for meta in unknown
            if meta.key not in self.buckets
            for info in meta.runs
            if info.key not in held
            for seg in info.segments
            if seg.count
        ]
        return [x for x in loaded if len(x)], refs

    # --- progress -----------------------------------------------------------------------------

    def advance(self, all_acked) -> list[str]:
        """Move each run's ``done`` over popped segments whose rows ``all_acked(keys)`` says
        are acknowledged; returns the keys of buckets that became finished."""
        finished = []
        for key, b in self.buckets.items():
            moved = False
            for run in b.runs:
                while run.done in run.popped and all_acked(run.popped[run.done]):
                    del run.popped[run.done]
                    run.done += 1
                    moved = True
            if moved and all(r.done >= len(r.info.segments) for r in b.runs):
                finished.append(key)
        self.counters["finished"] += len(finished)
        return finished

    def progress(self) -> dict[str, Progress]:
        """Per bucket: segments done (one number per run for a merged bucket), or
        FINISHED."""
        out: dict[str, Progress] = {}
        for k, b in self.buckets.items():
            per_run = [FINISHED if r.done >= len(r.info.segments) else r.done for r in b.runs]
            if all(x == FINISHED for x in per_run):
                out[k] = FINISHED
            else:
                out[k] = per_run[0] if len(per_run) == 1 else per_run
        return out

    def short_of_finished(self, key: str) -> Progress:
        """Bucket ``key``'s progress as if the last segment of each run were not done yet
        (a restart from it reads those again; what they hold was acknowledged)."""
        per_run = [max(0, len(r.info.segments) - 1) for r in self.buckets[key].runs]
        return per_run[0] if len(per_run) == 1 else per_run

    def remaining(self) -> int:
        """Rows not popped yet (cancelled ones included until they are reached)."""
        return sum(b.loaded_rows() + sum(r.left() for r in b.runs) for b in self.buckets.values())

    def loaded_rows(self) -> int:
        return sum(b.loaded_rows() for b in self.buckets.values())

    def nbytes(self) -> int:
        """Memory held by the loaded rows (an estimate)."""
        return sum(
            s.rows.entries.nbytes() + s.rows.positions.nbytes * 6
            for b in self.buckets.values()
            for s in b.loaded
        )

    def due_histogram(self, edges: np.ndarray) -> list[int]:
        """Rows not popped yet per due window, as the trackers count them
        (``len(edges) + 1`` counts); a segment not loaded is spread over its span."""
        loaded = [s.d[s.pos :] for b in self.buckets.values() for s in b.loaded]
        spans = [
            (seg.min_d, seg.max_d, seg.count)
            for b in self.buckets.values()
            for r in b.runs
            for seg in r.info.segments[r.next :]
        ]
        out = np.asarray(due_window_counts(edges, [], Membership(), spans), dtype=np.int64)
        for d in loaded:
            out += np.bincount(np.searchsorted(edges, d, side="right"), minlength=len(out))
        return out.tolist()


_NEVER = 2**63 - 1


def _starts(meta: SealedMeta, done: Progress) -> list[int]:
    """Each run's first segment not done, from a bucket's progress."""
    sizes = [len(r.segments) for r in meta.runs]
    if isinstance(done, (list, tuple)):
        if len(done) != len(sizes):  # (a progress from before a merge: start afresh)
            return [0] * len(sizes)
        return [n if d == FINISHED else max(0, min(int(d), n)) for d, n in zip(done, sizes)]
    if done == FINISHED:
        return sizes
    if len(sizes) != 1:
        return [0] * len(sizes)
    return [max(0, min(int(done), sizes[0]))]
