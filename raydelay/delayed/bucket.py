"""BucketDelayedDeliveryTracker: a delayed index whose memory does not grow with the backlog.

After Pulsar's PIP-195, re-done in columns. New positions gather in the mutable
bucket (memory only). Once it holds ``min_index_count_per_bucket`` positions and
a position arrives from a later ledger, it is *sealed*: sorted by (deliver_at,
ledger, entry), cut into segments, and written to the store as an immutable
bucket (segments, then meta, then the registry entry). Only one loaded segment
per bucket, the mutable bucket and the membership bitmaps stay resident; the next
segment of a bucket is loaded when its current one runs out or is about to
become due. Above ``max_num_buckets``, adjacent buckets are merged.

Store I/O runs in background jobs (see jobs.py). Their results are applied on
the caller's thread, so the tracker itself stays single-threaded and its hot
paths (add_messages, get_scheduled_messages) never wait on the store.

A position untracked or re-added while a persisted copy of it may exist (a
cancel, an expired re-add, a nack-style re-add into a sealed ledger) gets a
tombstone (``<name>/tombs/<seq>``), so a restarted tracker never resurrects the
stale copy. The mutable bucket is never persisted: after a restart the
subscription re-reads the log from mark-delete, and bitmaps recognise the
positions that are already in buckets.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pyroaring import BitMap

from raydelay.clock import Clock
from raydelay.delayed import codec
from raydelay.delayed.columns import (
    I64,
    Run,
    bitmap_of,
    bitmap_values,
    check_position,
    check_positions,
    concat,
    ledger_groups,
    sort_order,
)
from raydelay.delayed.common import (
    TrackerBase,
    check_clock,
    check_max_messages,
    check_positive_int,
    due_window_counts,
)
from raydelay.delayed.index import Membership, RunQueue, sorted_keys, sorted_positions
from raydelay.delayed.jobs import JobRunner
from raydelay.delayed.registry import BucketRegistry
from raydelay.errors import InvalidArgument, NotFound, RaydelayError, StorageError
from raydelay.limits import check_limit
from raydelay.storage.keys import bucket_prefix, validate_key

log = logging.getLogger(__name__)

WRITE_RETRIES = 3  # a snapshot write is tried once and retried this many times
_RETRY_BACKOFF_S = 0.05
_LOAD_RETRY_S = 0.5
_MAX_MERGE_WINDOW = 4
_BACKGROUND_PREFETCH_MS = 2_000
_MAX_TOMB_OBJECTS = 32

Cols = tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclass(eq=False)
class _Bucket:
    start: int
    end: int
    bucket_id: int
    seg_min: list[int]
    seg_count: list[int]
    seg_max: list[int]
    next_seg: int
    state: str  # "sealing" | "persisted" | "merging"
    holder: _Frozen | None = None  # while sealing: the unsorted columns, still served
    # (ledger_ids, entry_ids) handed out by the holder while sealing
    taken: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    loading: bool = False
    want_next: bool = False
    load_retry_at: float = 0.0
    exclude: dict[int, BitMap] | None = None

    @staticmethod
    def from_meta(meta: codec.BucketMeta, next_seg: int, **kw) -> _Bucket:
        """A persisted bucket as its meta object describes it."""
        return _Bucket(
            start=meta.start_ledger,
            end=meta.end_ledger,
            bucket_id=meta.bucket_id,
            seg_min=[s.min_deliver_at_ms for s in meta.segments],
            seg_count=[s.count for s in meta.segments],
            seg_max=[s.max_deliver_at_ms for s in meta.segments],
            next_seg=next_seg,
            state="persisted",
            **kw,
        )

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


class _Mutable:
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


class _Frozen:
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


def cut_segments(d: np.ndarray, max_indexes: int, max_step_ms: int) -> list[tuple[int, int]]:
    """Segment bounds over sorted deliver_ats: a segment ends when it holds ``max_indexes``
    positions or when the next position would stretch its span beyond ``max_step_ms``."""
    bounds = []
    i, n = 0, len(d)
    while i < n:
        j = int(np.searchsorted(d, d[i] + max_step_ms, side="right"))
        j = max(i + 1, min(j, i + max_indexes, n))
        bounds.append((i, j))
        i = j
    return bounds


class BucketDelayedDeliveryTracker(TrackerBase):
    def __init__(
        self,
        *,
        store,
        registry: BucketRegistry,
        name: str,
        clock: Clock,
        tick_time_ms: int = 1000,
        strict: bool = False,
        min_index_count_per_bucket: int = 50_000,
        max_time_step_per_segment_ms: int = 300_000,
        max_indexes_per_segment: int = 5_000,
        max_num_buckets: int = 64,
        mark_delete: Callable[[], tuple[int, int]] | None = None,
        background: bool | str | None = None,
        prefetch_ms: int | None = None,
    ) -> None:
        """``background`` None picks inline I/O for an in-memory store (deterministic) and a
        background thread otherwise; ``"manual"`` (tests) queues background jobs until
        ``run_background_jobs`` runs them, to choose exactly when each one lands. ``prefetch_ms`` is how long before a segment's first
        deliver_at it is loaded (default: 0 inline, 2000 ms in the background)."""
        for method in ("put", "get", "delete", "list"):
            if not callable(getattr(store, method, None)):
                raise InvalidArgument(f"store: expected an ObjectStore, it lacks {method}()")
        for method in ("list", "put", "remove"):
            if not callable(getattr(registry, method, None)):
                raise InvalidArgument(f"registry: expected a BucketRegistry, it lacks {method}()")
        self._name = validate_key(name) if isinstance(name, str) else _bad_name(name)
        self._store = store
        self._registry = registry
        self._clock = check_clock(clock)
        self._tick_time_ms = check_positive_int("tick_time_ms", tick_time_ms)
        self._strict = bool(strict)
        self._min_count = check_positive_int(
            "min_index_count_per_bucket", min_index_count_per_bucket
        )
        self._max_step_ms = check_positive_int(
            "max_time_step_per_segment_ms", max_time_step_per_segment_ms
        )
        self._max_per_segment = check_limit("max_indexes_per_segment", max_indexes_per_segment)
        self._max_buckets = check_limit("max_num_buckets", max_num_buckets)
        if mark_delete is not None and not callable(mark_delete):
            raise InvalidArgument(
                "mark_delete: expected a callable returning (ledger_id, entry_id)"
            )
        self._mark_delete = mark_delete
        if background is None:
            background = not _is_in_memory(store)
        if background not in (True, False, "manual"):
            raise InvalidArgument(
                f"background: expected True, False, None or 'manual', got {background!r}"
            )
        self._jobs = JobRunner(
            background=bool(background), name=self._name, manual=background == "manual"
        )
        if prefetch_ms is None:
            prefetch_ms = _BACKGROUND_PREFETCH_MS if background else 0
        self._prefetch_ms = check_positive_int("prefetch_ms", prefetch_ms, allow_zero=True)

        self._members = Membership()
        self._queue = RunQueue()
        self._mutable = _Mutable()
        self._buckets: list[_Bucket] = []
        self._sealed_end = -1
        self._next_id = 1
        self._tomb_seq = 1
        self._pending_tombs: dict[int, BitMap] = {}
        self._tombs_all: dict[int, BitMap] = {}  # every tombstone written, for compaction
        self._tomb_keys: list[str] = []
        self._tomb_writing = False
        self._merge_ctx: dict | None = None
        self._merge_failures = 0
        self._merge_retry_at = 0.0  # time.monotonic() before which no merge is tried
        self._trimmed_below = -1
        self._dirty = True  # bucket state changed: _maintain must look at every bucket
        self._idle_until = 0  # before this cutoff, no segment needs loading
        self._errors: list[BaseException] = []
        self._closed = False
        self._epoch = 0
        self.counters = {
            "sealed": 0,
            "loaded": 0,
            "merged": 0,
            "deleted": 0,
            "downgraded": 0,
            "snapshot_bytes": 0,
        }
        # (operation, seconds) of finished bucket jobs, for metrics: appended by the I/O
        # threads, drained by whoever reports them (deque appends are thread-safe)
        self.op_times: deque[tuple[str, float]] = deque(maxlen=10_000)
        self._recover()

    # == public API =====================================================================

    def add_messages(self, ledger_ids, entry_ids, deliver_ats) -> np.ndarray:
        self._check_open()
        ls, es, ds = check_positions(ledger_ids, entry_ids, deliver_ats)
        result = np.ones(len(ls), dtype=bool)
        if len(ls) == 0:
            return result
        self._jobs.drain()
        (ls, es, ds), untracked = self._split_due(ls, es, ds, result)
        if len(untracked[0]):
            self._note_tombs(untracked[0], untracked[1])
        md_ledger = self._mark_delete_ledger()
        if md_ledger is not None and len(ls) and int(ls.min()) < md_ledger:
            keep = ls >= md_ledger  # below mark-delete: acknowledged already, dropped
            ls, es, ds = ls[keep], es[keep], ds[keep]
        if len(ls):
            new = self._members.add(ds, ls, es)
            if not new.all():
                ls, es, ds = ls[new], es[new], ds[new]
            if len(ls):
                self._route(ds, ls, es)
        self._settle()
        return result

    def get_scheduled_messages(self, max_messages: int) -> list[tuple[int, int]]:
        return sorted_positions(*self._take_due(max_messages))

    def get_scheduled_keys(self, max_messages: int) -> np.ndarray:
        """:meth:`get_scheduled_messages` as one sorted int64 column of position keys
        (``ledger << 32 | entry``), for callers that work on columns."""
        return sorted_keys(*self._take_due(max_messages))

    def _take_due(self, max_messages: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        self._check_open()
        n = check_max_messages(max_messages)
        self._jobs.drain()
        cutoff = self._cutoff()
        self._trim()
        self._move_due_mutable(cutoff)
        self._maintain(cutoff)
        out_l, out_e = [], []
        while n > 0:
            got = self._queue.take(cutoff, n)
            if got is None:
                if self._maintain(cutoff):
                    continue  # an inline load brought in due positions
                break
            (d, l, e), emptied = got  # noqa: E741
            exhausted = len(d) < n  # the queue had no more due copies
            live_l, live_e = self._members.take(d, l, e)
            out_l.append(live_l)
            out_e.append(live_e)
            n -= len(live_l)
            if (emptied or exhausted) and not self._maintain(cutoff) and exhausted:
                break
        self._settle()
        return out_l, out_e

    def has_message_available(self) -> bool:
        self._check_open()
        self._jobs.drain()
        cutoff = self._cutoff()
        self._move_due_mutable(cutoff)
        self._maintain(cutoff)
        return self._queue.has_live_due(cutoff, self._members)

    def buffer_memory_usage(self) -> int:
        writing = sum(b.holder.nbytes() for b in self._buckets if b.holder is not None)
        return self._queue.nbytes() + self._mutable.nbytes() + self._members.nbytes() + writing

    def should_pause_all_deliveries(self) -> bool:
        return False

    def next_delivery_time(self) -> int | None:
        if self._members.count == 0:
            return None
        candidates = [self._queue.min_d(), self._mutable.min_d]
        candidates += [b.holder.min_d for b in self._buckets if b.holder is not None]
        candidates += [b.seg_min[b.next_seg] for b in self._buckets if b.next_seg < b.segments]
        known = [c for c in candidates if c is not None]
        return min(known) if known else None

    def remove_message(self, ledger_id: int, entry_id: int) -> bool:
        """Cancel a tracked position wherever it lives; True if it was tracked."""
        self._check_open()
        ledger_id, entry_id = check_position(ledger_id, entry_id)
        if not self._members.remove(ledger_id, entry_id):
            return False
        if ledger_id <= self._sealed_end:  # it may sit in a persisted bucket: make the cancel stick
            self._pending_tombs.setdefault(ledger_id, BitMap()).add(entry_id)
        self._settle()
        return True

    def _timed(self, op: str, job: Callable[[], Any]) -> Callable[[], Any]:
        """``job``, recording its duration under ``op`` in ``op_times`` (failed ones too)."""
        times = self.op_times

        def run() -> Any:
            start = time.monotonic()
            try:
                return job()
            finally:
                times.append((op, time.monotonic() - start))

        return run

    def due_histogram(self, edges: np.ndarray) -> list[int]:
        """Pending messages per due window (see :func:`due_window_counts`): exact for
        what is in memory, spread over each unloaded segment's deliver_at range."""
        exact = self._queue.columns() + self._mutable.parts()
        exact += [b.holder.columns() for b in self._buckets if b.holder is not None]
        spans = [
            (b.seg_min[i], b.seg_max[i], b.seg_count[i])
            for b in self._buckets
            for i in range(b.next_seg, b.segments)
        ]
        return due_window_counts(np.asarray(edges, dtype=np.int64), exact, self._members, spans)

    def persisted_through(self) -> int:
        """Every delayed position of the ledgers up to this one was sealed into a bucket
        (a restart finds it there), had fallen due, or was untracked. A restarted
        subscription re-reads only the log after it, plus the positions of these ledgers
        that are neither acknowledged nor tracked (see Subscription.resume_after_buckets)."""
        return self._sealed_end

    def immutable_bucket_count(self) -> int:
        return len(self._buckets)

    def run_background_jobs(self, n: int | None = None) -> int:
        """With ``background="manual"``: run up to ``n`` queued jobs (all when None)."""
        if not self._jobs.manual:
            raise InvalidArgument(
                "run_background_jobs: the tracker was not built with background='manual'"
            )
        return self._jobs.run_queued(n)

    def flush(self) -> None:
        """Wait for every background write, load, merge and delete, and apply them."""
        self._check_open()
        while True:
            self._jobs.wait()
            applied = self._jobs.drain()
            self._maybe_merge()
            self._write_tombs()
            if not applied and not self._jobs.busy():
                break
        if self._errors:
            first = self._errors[0]
            self._errors = []
            raise first

    def clear(self) -> None:
        """Forget everything and delete every snapshot object and registry entry."""
        self._check_open()
        self._jobs.wait()
        self._jobs.drain()
        self._epoch += 1
        for key in self._registry.list(self._name):
            self._registry.remove(self._name, key)
        for key in self._store.list(f"{self._name}/buckets/") + self._store.list(
            f"{self._name}/tombs/"
        ):
            self._store.delete(key)
        self._members.clear()
        self._queue.clear()
        self._mutable.clear()
        self._buckets = []
        self._sealed_end = -1
        self._pending_tombs = {}
        self._tombs_all = {}
        self._tomb_keys = []
        self._merge_ctx = None
        self._trimmed_below = -1
        self._dirty = True

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._jobs.shutdown()

    def stats(self) -> dict:
        return {
            "delayed": self._members.count,
            "buckets": len(self._buckets),
            "mutable": self._mutable.count,
            "loaded_runs": len(self._queue.runs),
            "loaded_indexes": sum(len(c[0]) for c in self._queue.columns())
            + self._mutable.count
            + sum(b.holder.count for b in self._buckets if b.holder is not None),
            "memory_bytes": self.buffer_memory_usage(),
            **self.counters,
        }

    def __repr__(self) -> str:
        return f"BucketDelayedDeliveryTracker(name={self._name!r}, delayed={self._members.count}, buckets={len(self._buckets)})"

    # == adding =========================================================================

    def _route(self, d: np.ndarray, l: np.ndarray, e: np.ndarray) -> None:  # noqa: E741
        covered = l <= self._sealed_end
        if covered.any():
            # The ledger already belongs to an immutable bucket: straight to the shared queue.
            # A persisted copy with an older deliver_at may exist (a nack re-add): make sure
            # a restart does not bring that copy back.
            self._queue.add_loose(d[covered], l[covered], e[covered])
            self._note_tombs(l[covered], e[covered])
            rest = ~covered
            d, l, e = d[rest], l[rest], e[rest]  # noqa: E741
        for ledger, idx in ledger_groups(l):
            if self._mutable.count >= self._min_count and ledger > self._mutable.end:
                self._seal()
            self._mutable.append(d[idx], l[idx], e[idx], ledger)

    def _seal(self) -> None:
        """Freeze the mutable bucket. Sorting, cutting and writing happen on the I/O thread;
        until they are done, the frozen columns keep serving due positions."""
        d, l, e = self._mutable.columns()  # noqa: E741
        start, end = self._mutable.start, self._mutable.end
        self._mutable.clear()
        self._sealed_end = max(self._sealed_end, end)
        live = self._members.member_mask(d, l, e)  # cancelled copies are not persisted
        if not live.all():
            d, l, e = d[live], l[live], e[live]  # noqa: E741
        if len(d) == 0:
            return
        holder = _Frozen(d, l, e)
        bucket = _Bucket(
            start=start,
            end=end,
            bucket_id=self._take_id(),
            seg_min=[],
            seg_count=[],
            seg_max=[],
            next_seg=0,
            state="sealing",
            holder=holder,
        )
        self._buckets.append(bucket)
        self._dirty = True
        self.counters["sealed"] += 1
        name, store, registry, epoch = self._name, self._store, self._registry, self._epoch
        max_per_segment, max_step, sleep_s = self._max_per_segment, self._max_step_ms, self._sleep_s

        def job() -> tuple[codec.BucketMeta, int, Cols]:
            return _sort_and_write(
                store,
                registry,
                name,
                start,
                end,
                bucket.bucket_id,
                (d, l, e),
                max_per_segment,
                max_step,
                sleep_s,
            )

        def done(
            written: tuple[codec.BucketMeta, int, Cols] | None, error: BaseException | None
        ) -> None:
            if epoch != self._epoch or bucket not in self._buckets:
                return
            if error is not None:
                self._downgrade(bucket, error)
                return
            meta, nbytes, first = written  # type: ignore[misc]
            described = _Bucket.from_meta(meta, 0)
            bucket.seg_min, bucket.seg_count = described.seg_min, described.seg_count
            bucket.seg_max = described.seg_max
            bucket.state = "persisted"
            bucket.holder = None
            if bucket.taken:  # copies handed out while sealing must not come back from the store
                exclude: dict[int, BitMap] = {}
                for tl, te in bucket.taken:
                    _add_exclusions(exclude, tl, te)
                bucket.exclude = exclude
                bucket.taken = []
            self.counters["snapshot_bytes"] += nbytes
            self._install_segment(bucket, 0, first)  # segment 1 goes straight to the shared queue

        self._jobs.submit("write", self._timed("create", job), done)

    def _downgrade(self, bucket: _Bucket, error: BaseException) -> None:
        # The write failed after its retries: keep every position in memory, lose nothing.
        log.warning(
            "tracker %s: bucket %s could not be persisted (%s); keeping its %d positions in memory",
            self._name,
            bucket.key,
            error,
            bucket.remaining_count(),
        )
        self.counters["downgraded"] += 1
        self._dirty = True
        if bucket.holder is not None:
            self._queue.add_loose(*bucket.holder.columns())
            bucket.holder = None
        for r in bucket.runs:
            r.owner = None
        self._buckets.remove(bucket)

    def _move_due_mutable(self, cutoff: int) -> None:
        due = self._mutable.take_due(cutoff)
        if due is not None and len(due[0]):
            self._queue.add_loose(*due)
        for bucket in self._buckets:
            if bucket.holder is not None:
                due = bucket.holder.take_due(cutoff)
                if due is not None and len(due[0]):
                    self._queue.add_loose(*due)
                    bucket.taken.append((due[1], due[2]))

    # == loading ========================================================================

    def _maintain(self, cutoff: int) -> bool:
        """Start segment loads that are needed now or soon, retire finished buckets.
        Returns True when an inline load completed (more may be due)."""
        horizon = cutoff + self._prefetch_ms
        if not self._dirty and not self._queue.emptied and horizon < self._idle_until:
            return False  # nothing to load or retire yet
        loaded = False
        now_s = time.monotonic()
        if self._queue.emptied:
            for run in self._queue.emptied:
                owner = run.owner
                if isinstance(owner, _Bucket) and run in owner.runs:
                    owner.runs.remove(run)
                    if not owner.runs:
                        owner.want_next = True  # the last loaded position was popped
            self._queue.emptied = []
        for bucket in list(self._buckets):
            if bucket.loading or bucket.state != "persisted":
                continue
            if bucket.next_seg >= bucket.segments:
                if not bucket.runs:
                    self._retire(bucket)
                continue
            # Inline, load every segment that is needed now, so pops stay earliest-first;
            # in the background, one load per bucket is in flight at a time.
            while (
                not bucket.loading
                and bucket.next_seg < bucket.segments
                and (bucket.want_next or bucket.seg_min[bucket.next_seg] <= horizon)
                and now_s >= bucket.load_retry_at
                and bucket in self._buckets
            ):
                self._load_next(bucket)
                if self._jobs.background:
                    break
                self._jobs.drain()  # inline: the segment is in the queue now
                loaded = True
        # Finished buckets retire through the emptied-run reports; loads and retries need a look.
        self._dirty = any(b.loading or b.want_next for b in self._buckets)
        nexts = [b.seg_min[b.next_seg] for b in self._buckets if b.next_seg < b.segments]
        self._idle_until = min(nexts) - self._prefetch_ms if nexts else 2**62
        return loaded

    def _load_next(self, bucket: _Bucket) -> None:
        """Start loading the bucket's next segment from the store."""
        index = bucket.next_seg
        bucket.want_next = False
        bucket.loading = True
        epoch = self._epoch
        key = f"{bucket_prefix(self._name, bucket.key)}/seg-{index + 1:06d}"
        store = self._store

        def job() -> Cols:
            return codec.decode_segment(store.get(key), key)

        def done(cols: Cols | None, error: BaseException | None) -> None:
            bucket.loading = False
            self._dirty = True
            if epoch != self._epoch or bucket not in self._buckets:
                return
            if error is not None:
                if isinstance(error, StorageError) and error.retriable:
                    log.warning(
                        "tracker %s: loading segment %d of %s failed, will retry: %s",
                        self._name,
                        index + 1,
                        bucket.key,
                        error,
                    )
                    bucket.load_retry_at = time.monotonic() + _LOAD_RETRY_S
                    bucket.want_next = True
                    return
                log.error(
                    "tracker %s: segment %d of %s is unreadable: %s",
                    self._name,
                    index + 1,
                    bucket.key,
                    error,
                )
                self._errors.append(error)
                bucket.next_seg = index + 1
                return
            self._install_segment(bucket, index, cols)  # type: ignore[arg-type]

        self._jobs.submit("load", self._timed("load", job), done)

    def _install_segment(self, bucket: _Bucket, index: int, cols: Cols) -> None:
        d, l, e = _without(cols, bucket.exclude)  # noqa: E741
        bucket.next_seg = index + 1
        self._dirty = True
        self.counters["loaded"] += 1
        if len(d):
            run = Run(d, l, e, owner=bucket)
            bucket.runs.append(run)
            self._queue.add_run(run)
        else:
            bucket.want_next = True

    def _retire(self, bucket: _Bucket) -> None:
        """Every segment was loaded and popped: delete the bucket (registry entry first)."""
        self._buckets.remove(bucket)
        self._delete_bucket_objects(bucket.key)

    def _delete_bucket_objects(self, key: str) -> None:
        store, registry, name = self._store, self._registry, self._name
        self.counters["deleted"] += 1

        def job() -> None:
            registry.remove(name, key)
            for obj in store.list(f"{bucket_prefix(name, key)}/"):
                store.delete(obj)

        def done(_: None, error: BaseException | None) -> None:
            if error is not None:  # orphans are swept at the next recovery
                log.warning(
                    "tracker %s: deleting bucket %s failed (swept on recovery): %s",
                    self._name,
                    key,
                    error,
                )

        self._jobs.submit("write", self._timed("delete", job), done)

    # == merging ========================================================================

    def _maybe_merge(self) -> None:
        if self._merge_ctx is not None or len(self._buckets) <= self._max_buckets:
            return
        if time.monotonic() < self._merge_retry_at:
            return
        window = self._pick_window()
        if window is None:
            return
        lo, hi = window
        sources = self._buckets[lo:hi]
        streams_spec: list[tuple[list[str], dict[int, BitMap] | None]] = []
        parts: list[Cols] = []
        snapshot: dict[int, tuple[Run, int]] = {}  # the runs as they were, and their heads
        for b in sources:
            b.state = "merging"
            prefix = bucket_prefix(self._name, b.key)
            # a source's own exclusions stay excluded: copies it handed out must not return
            ex = {lg: bm.copy() for lg, bm in b.exclude.items()} if b.exclude else None
            keys = [f"{prefix}/seg-{i + 1:06d}" for i in range(b.next_seg, b.segments)]
            if keys:
                streams_spec.append((keys, ex))
            for r in b.runs:
                if len(r):
                    parts.append(tuple(c.copy() for c in r.remaining()))  # type: ignore[arg-type]
                snapshot[id(r)] = (r, r.head)
        start, end = sources[0].start, sources[-1].end
        new_id = self._take_id()
        ctx = {"sources": sources, "snapshot": snapshot, "epoch": self._epoch}
        self._merge_ctx = ctx
        store, registry, name = self._store, self._registry, self._name
        max_per_segment, max_step = self._max_per_segment, self._max_step_ms
        sleep_s = self._sleep_s

        def loader(key: str, ex: dict[int, BitMap] | None) -> Callable[[], Cols]:
            return lambda: _without(codec.decode_segment(store.get(key), key), ex)

        def job() -> tuple[codec.BucketMeta, int, None] | None:
            streams = [_SortedStream([loader(k, ex) for k in keys]) for keys, ex in streams_spec]
            if parts:
                memory = concat(parts)
                order = sort_order(*memory)
                streams.append(_SortedStream([lambda: tuple(c[order] for c in memory)]))  # type: ignore[misc]
            writer = _BucketWriter(store, registry, name, start, end, new_id, sleep_s)
            with writer:
                _merge_streams(streams, max_per_segment, max_step, writer.add_segment)
                if not writer.nbytes:
                    return None  # everything in them was handed out already: nothing to write
                meta, nbytes = writer.finish()
            return meta, nbytes, None

        self._jobs.submit(
            "write",
            self._timed("merge", job),
            lambda written, error: self._merged(ctx, written, error),
        )

    def _pick_window(self) -> tuple[int, int] | None:
        n = len(self._buckets)
        for size in range(min(_MAX_MERGE_WINDOW, n), 1, -1):
            best = None
            for lo in range(0, n - size + 1):
                window = self._buckets[lo : lo + size]
                if any(b.state != "persisted" or b.loading for b in window):
                    continue
                total = sum(b.remaining_count() for b in window)
                nexts = [b.seg_min[b.next_seg] for b in window if b.next_seg < b.segments]
                rank = (total, min(nexts) if nexts else 2**63)
                if best is None or rank < best[0]:
                    best = (rank, lo)
            if best is not None:
                return best[1], best[1] + size
        return None

    def _merged(
        self,
        ctx: dict,
        written: tuple[codec.BucketMeta, int, Cols] | None,
        error: BaseException | None,
    ) -> None:
        self._merge_ctx = None
        self._dirty = True
        meta = written[0] if written else None
        if written:
            self.counters["snapshot_bytes"] += written[1]
        sources: list[_Bucket] = ctx["sources"]
        if ctx["epoch"] != self._epoch:
            if meta is not None:
                self._delete_bucket_objects(meta.key)
            return
        alive = all(b in self._buckets for b in sources)
        if error is None and alive and meta is None:
            # Nothing was left to merge: the sources retire; what they still hold in
            # memory keeps being served (after a crash, the log replay brings it back).
            for b in sources:
                for r in b.runs:
                    r.owner = None
                self._buckets.remove(b)
                self._delete_bucket_objects(b.key)
            self._merge_failures = 0
            return
        if error is not None or not alive or meta is None:
            for b in sources:
                if b.state == "merging":
                    b.state = "persisted"
            if error is not None:
                # back off: a failure that repeats must not spin flush() or the I/O thread
                self._merge_failures += 1
                self._merge_retry_at = time.monotonic() + min(30.0, 0.25 * 2**self._merge_failures)
                log.warning(
                    "tracker %s: merging %d buckets failed, will retry: %s",
                    self._name,
                    len(sources),
                    error,
                    # a storage outage is expected; anything else deserves its traceback
                    exc_info=None if isinstance(error, StorageError) else error,
                )
            elif meta is not None:
                self._delete_bucket_objects(meta.key)
            return
        # Copies that the foreground consumed or loaded meanwhile must not come back from
        # the merged bucket: exclude them when its segments load.
        cutoff = self._cutoff() + self._prefetch_ms
        exclude: dict[int, BitMap] = {}
        keep_runs: list[Run] = []
        new_runs: list[Run] = []
        soon_parts: list[Cols] = []
        dropped: list[Run] = []
        for b in sources:
            for r in b.runs:
                snap = ctx["snapshot"].get(id(r))
                h0 = snap[1] if snap is not None and snap[0] is r else None
                if h0 is None:
                    _add_exclusions(exclude, r.l, r.e)
                    if len(r):
                        keep_runs.append(r)
                    continue
                _add_exclusions(exclude, r.l[h0 : r.head], r.e[h0 : r.head])
                dropped.append(r)  # the merged bucket holds what is left of it...
                k = r.due_count(cutoff)
                if k:  # ...but what is due soon keeps being served from memory
                    h = r.head
                    soon_parts.append((r.d[h : h + k], r.l[h : h + k], r.e[h : h + k]))
        self._queue.remove_runs(dropped)
        if soon_parts:  # one run for all of it, so the queue does not collect slivers
            soon = Run.from_unsorted(*(c.copy() for c in concat(soon_parts)))
            _add_exclusions(exclude, soon.l, soon.e)
            keep_runs.append(soon)
            new_runs.append(soon)
        merged = _Bucket.from_meta(meta, 0, runs=keep_runs, exclude=exclude or None)
        for r in keep_runs:
            r.owner = merged
        for r in new_runs:
            self._queue.add_run(r)
        at = self._buckets.index(sources[0])
        self._buckets[at : at + len(sources)] = [merged]
        self.counters["merged"] += 1
        for b in sources:
            self._delete_bucket_objects(b.key)
        self._merge_failures = 0

    # == trimming, tombstones ===========================================================

    def _mark_delete_ledger(self) -> int | None:
        if self._mark_delete is None:
            return None
        md = self._mark_delete()
        try:
            return int(md[0])
        except (TypeError, ValueError, IndexError):
            raise InvalidArgument(
                f"mark_delete: expected (ledger_id, entry_id), got {md!r}"
            ) from None

    def _trim(self) -> None:
        md_ledger = self._mark_delete_ledger()
        if md_ledger is None or md_ledger <= self._trimmed_below:
            return
        self._trimmed_below = md_ledger
        self._dirty = True
        self._members.drop_below(md_ledger)
        self._mutable.drop_below(md_ledger)
        for bucket in list(self._buckets):
            if bucket.end < md_ledger and bucket.state == "persisted" and not bucket.loading:
                self._queue.remove_runs(bucket.runs)
                self._buckets.remove(bucket)
                self._delete_bucket_objects(bucket.key)

    def _note_tombs(self, l: np.ndarray, e: np.ndarray) -> None:  # noqa: E741
        """Positions whose persisted copies (if any) must stay dead after a restart."""
        mask = l <= self._sealed_end
        if not mask.any():
            return
        l, e = l[mask], e[mask]  # noqa: E741
        for ledger, idx in ledger_groups(l):
            self._pending_tombs.setdefault(ledger, BitMap()).update(bitmap_of(e[idx]))

    def _write_tombs(self) -> None:
        """One tombstone object per batch; past _MAX_TOMB_OBJECTS they are compacted into one."""
        if self._tomb_writing or not (
            self._pending_tombs or len(self._tomb_keys) > _MAX_TOMB_OBJECTS
        ):
            return
        pending, self._pending_tombs = self._pending_tombs, {}
        for ledger, bm in pending.items():
            self._tombs_all.setdefault(ledger, BitMap()).update(bm)
        compact = len(self._tomb_keys) >= _MAX_TOMB_OBJECTS
        if compact:
            ranges = [(b.start, b.end) for b in self._buckets]
            self._tombs_all = {
                lg: bm for lg, bm in self._tombs_all.items() if any(a <= lg <= z for a, z in ranges)
            }
            data = codec.encode_tombstones(self._tombs_all)
            doomed = list(self._tomb_keys)
        else:
            data = codec.encode_tombstones(pending)
            doomed = []
        key = f"{self._name}/tombs/{self._tomb_seq:020d}"
        self._tomb_seq += 1
        self._tomb_writing = True
        store, sleep_s, epoch = self._store, self._sleep_s, self._epoch

        def job() -> None:
            _put_retrying(store, key, data, sleep_s)
            for old in doomed:  # the compacted object is durable first
                store.delete(old)

        def done(_: None, error: BaseException | None) -> None:
            self._tomb_writing = False
            if epoch != self._epoch:
                return
            if error is not None:
                log.warning(
                    "tracker %s: writing cancel tombstones failed, will retry: %s",
                    self._name,
                    error,
                )
                for ledger, bm in pending.items():
                    self._pending_tombs.setdefault(ledger, BitMap()).update(bm)
                return
            self._tomb_keys = [key] if compact else self._tomb_keys + [key]

        self._jobs.submit("write", job, done)

    # == recovery =======================================================================

    def _recover(self) -> None:
        records = self._registry.list(self._name)
        if not records:
            self._apply_recovered_tombs()  # keeps their numbering, so they get compacted
            self._sweep_orphans(set())
            return
        recs = [
            codec.decode_record(raw, f"registry {self._name}/{key}") for key, raw in records.items()
        ]
        found = self._parallel(self._read_meta, recs)
        for rec, meta in zip(recs, found):
            if meta is None:  # a seal that failed after its registry put landed: nothing to load
                log.warning("tracker %s: bucket %s has no meta; dropping it", self._name, rec.key)
                self._registry.remove(self._name, rec.key)
        metas = [m for m in found if m is not None]
        if not metas:
            self._apply_recovered_tombs()
            self._sweep_orphans(set())
            return
        # A crash between a merge's registry write and the removal of its sources leaves
        # both: the newer bucket whose range contains an older one supersedes it.
        live: list[codec.BucketMeta] = []
        for m in sorted(metas, key=lambda m: (m.start_ledger, -m.end_ledger, -m.bucket_id)):
            if any(
                o.start_ledger <= m.start_ledger
                and m.end_ledger <= o.end_ledger
                and o.bucket_id > m.bucket_id
                for o in metas
                if o is not m
            ):
                self._registry.remove(self._name, m.key)
                continue
            live.append(m)
        self._next_id = max(m.bucket_id for m in metas) + 1
        cutoff = self._cutoff()
        to_load = []
        for m in live:
            first = next(
                (i for i, s in enumerate(m.segments) if s.max_deliver_at_ms > cutoff), None
            )
            self._sealed_end = max(self._sealed_end, m.end_ledger)
            if first is None:  # everything in it is due: the log replay delivers it
                self._delete_bucket_objects(m.key)
                continue
            for s in m.segments[first:]:
                for ledger, bm in s.bitmaps.items():
                    self._members.restore(ledger, bm)
            bucket = _Bucket.from_meta(m, first)
            self._buckets.append(bucket)
            to_load.append(bucket)
        self._buckets.sort(key=lambda b: b.start)
        self._apply_recovered_tombs()
        keys = [f"{bucket_prefix(self._name, b.key)}/seg-{b.next_seg + 1:06d}" for b in to_load]
        segments = self._parallel(lambda k: codec.decode_segment(self._store.get(k), k), keys)
        for bucket, cols in zip(to_load, segments):
            self._install_segment(bucket, bucket.next_seg, cols)
        self._sweep_orphans({b.key for b in self._buckets})
        self._jobs.drain()

    def _read_meta(self, rec: codec.RegistryRecord) -> codec.BucketMeta | None:
        key = f"{bucket_prefix(self._name, rec.key)}/meta"
        try:
            return codec.decode_meta(self._store.get(key), key)
        except NotFound:
            return None

    def _apply_recovered_tombs(self) -> None:
        keys = self._store.list(f"{self._name}/tombs/")
        if not keys:
            return
        merged: dict[int, BitMap] = {}
        for key in keys:
            for ledger, bm in codec.decode_tombstones(self._store.get(key), key).items():
                merged.setdefault(ledger, BitMap()).update(bm)
        self._tomb_seq = int(keys[-1].rsplit("/", 1)[1]) + 1
        self._tomb_keys = list(keys)
        self._tombs_all = merged
        for ledger, bm in merged.items():
            ls = np.full(len(bm), ledger, dtype=I64)
            self._members.remove_many(ls, bitmap_values(bm))

    def _sweep_orphans(self, live_keys: set[str]) -> None:
        """Delete bucket objects that no registry entry names (a crash mid-write or mid-delete)."""
        store, prefix = self._store, f"{self._name}/buckets/"

        def job() -> int:
            doomed = [
                k for k in store.list(prefix) if k[len(prefix) :].split("/", 1)[0] not in live_keys
            ]
            for k in doomed:
                store.delete(k)
            return len(doomed)

        def done(count: int | None, error: BaseException | None) -> None:
            if error is not None:
                log.warning("tracker %s: sweeping orphan objects failed: %s", self._name, error)
            elif count:
                log.info("tracker %s: swept %d orphan bucket objects", self._name, count)

        self._jobs.submit("write", job, done)

    def _parallel(self, fn, items: list) -> list:
        if not self._jobs.background or len(items) <= 1:
            return [fn(x) for x in items]
        with ThreadPoolExecutor(min(16, len(items)), thread_name_prefix="raydelay-recover") as pool:
            return list(pool.map(fn, items))

    # == helpers ========================================================================

    def _settle(self) -> None:
        """After a call: inline jobs' completions are applied, merges and tombstones kick off."""
        self._jobs.drain()
        self._maybe_merge()
        self._write_tombs()
        self._jobs.drain()

    def _take_id(self) -> int:
        bucket_id = self._next_id
        self._next_id += 1
        return bucket_id

    @property
    def _sleep_s(self) -> float:
        return _RETRY_BACKOFF_S if self._jobs.sleeps else 0.0

    def _check_open(self) -> None:
        if self._closed:
            raise RaydelayError(f"tracker {self._name!r} is closed")


def _without(cols: Cols, exclude: dict[int, BitMap] | None) -> Cols:
    """The columns minus the positions in ``exclude`` (entry bitmaps by ledger)."""
    if not exclude:
        return cols
    d, l, e = cols  # noqa: E741
    keep = np.ones(len(l), dtype=bool)
    for ledger, idx in ledger_groups(l):
        ex = exclude.get(ledger)
        if ex:
            keep[idx] = ~np.isin(e[idx], bitmap_values(ex))
    return (d, l, e) if keep.all() else (d[keep], l[keep], e[keep])


def _add_exclusions(exclude: dict[int, BitMap], l: np.ndarray, e: np.ndarray) -> None:  # noqa: E741
    for ledger, idx in ledger_groups(l):
        exclude.setdefault(ledger, BitMap()).update(bitmap_of(e[idx]))


def _retrying(what: str, call: Callable[[], None], sleep_s: float) -> None:
    """One try and WRITE_RETRIES retries of a retriable StorageError; anything else raises at once."""
    for attempt in range(WRITE_RETRIES + 1):
        try:
            call()
            return
        except StorageError as exc:
            if not exc.retriable or attempt == WRITE_RETRIES:
                raise
            log.info("%s failed (attempt %d), retrying: %s", what, attempt + 1, exc)
            if sleep_s:
                time.sleep(sleep_s * (attempt + 1))


def _put_retrying(store, key: str, data: bytes, sleep_s: float) -> None:
    _retrying(f"put {key}", lambda: store.put(key, data), sleep_s)


def _sort_and_write(
    store,
    registry,
    name: str,
    start: int,
    end: int,
    bucket_id: int,
    cols: Cols,
    max_per_segment: int,
    max_step_ms: int,
    sleep_s: float,
) -> tuple[codec.BucketMeta, int, Cols]:
    """A seal: sort by (deliver_at, ledger, entry), cut into segments, write the bucket.
    Returns the meta, the bytes written and segment 1's columns."""
    d, l, e = cols  # noqa: E741
    order = sort_order(d, l, e)
    d, l, e = d[order], l[order], e[order]  # noqa: E741
    bounds = cut_segments(d, max_per_segment, max_step_ms)
    writer = _BucketWriter(store, registry, name, start, end, bucket_id, sleep_s)
    with writer:
        for a, b in bounds:
            writer.add_segment((d[a:b], l[a:b], e[a:b]))
        meta, nbytes = writer.finish()
    a, b = bounds[0]
    return meta, nbytes, (d[a:b].copy(), l[a:b].copy(), e[a:b].copy())


class _SortedStream:
    """A sorted source of a merge: in-memory columns, or a bucket's segments read one at a
    time (minus the source's exclusions), so a merge holds a few segments, not buckets."""

    def __init__(self, loaders: list[Callable[[], Cols]]) -> None:
        self._loaders = list(loaders)
        self._buf: Cols = (_EMPTY_I64, _EMPTY_I64, _EMPTY_I64)
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


def _merge_streams(
    streams: list[_SortedStream], max_per_segment: int, max_step_ms: int, emit
) -> None:
    """k-way merge of sorted streams into segments (same cut rule as a seal). The first
    ``max_per_segment`` positions overall all have deliver_at <= the smallest n-th
    deliver_at among full streams, so only that much is taken and sorted per segment."""
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
        emit((d[:j], l[:j], e[:j]))
        # what was taken but not emitted goes back to its stream (each stream's leftover
        # is its largest items, so a plain count per stream restores it)
        for idx, back in enumerate(np.bincount(tag[j:], minlength=len(streams)).tolist()):
            if back:
                streams[idx].put_back(back)


_EMPTY_I64 = np.empty(0, dtype=I64)


class _BucketWriter:
    """Writes a bucket segment by segment, then its meta, then its registry entry (last).
    Leaving the ``with`` block on an error deletes what was written (best effort)."""

    def __init__(
        self, store, registry, name: str, start: int, end: int, bucket_id: int, sleep_s: float
    ) -> None:
        self._store, self._registry, self._name = store, registry, name
        self._start, self._end, self._id = start, end, bucket_id
        self._sleep_s = sleep_s
        self._prefix = bucket_prefix(name, codec.bucket_key(start, end, bucket_id))
        self._metas: list[codec.SegmentMeta] = []
        self._written: list[str] = []
        self._registering: str | None = None  # the key of a registry put under way
        self.nbytes = 0

    def add_segment(self, cols: Cols) -> None:
        key = f"{self._prefix}/seg-{len(self._metas) + 1:06d}"
        data = codec.encode_segment(*cols)
        _put_retrying(self._store, key, data, self._sleep_s)
        self._written.append(key)
        self.nbytes += len(data)
        self._metas.append(codec.segment_meta(*cols))

    def finish(self) -> tuple[codec.BucketMeta, int]:
        meta = codec.BucketMeta(self._start, self._end, self._id, tuple(self._metas))
        data = codec.encode_meta(meta)
        _put_retrying(self._store, f"{self._prefix}/meta", data, self._sleep_s)
        self._written.append(f"{self._prefix}/meta")
        self.nbytes += len(data)
        record = codec.encode_record(
            codec.RegistryRecord(self._start, self._end, self._id, len(self._metas), meta.count)
        )
        self._registering = meta.key
        _retrying(
            f"registry put {meta.key}",
            lambda: self._registry.put(self._name, meta.key, record),
            self._sleep_s,
        )
        self._registering = None
        self._written = []
        return meta, self.nbytes

    def __enter__(self) -> _BucketWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            return
        if self._registering is not None:  # the put may have landed and only its reply was lost
            try:
                self._registry.remove(self._name, self._registering)
            except Exception:  # noqa: BLE001 - recovery drops an entry whose meta is gone
                log.warning("registry entry %s may remain; recovery drops it", self._registering)
        for key in reversed(self._written):  # meta first: a meta never outlives a segment
            try:
                self._store.delete(key)
            except Exception:  # noqa: BLE001 - swept on recovery; the original error matters
                log.warning("cleanup of %s failed; it will be swept on recovery", key)


def _is_in_memory(store) -> bool:
    from raydelay.storage.memory import MemoryObjectStore

    while hasattr(store, "inner"):
        store = store.inner
    return isinstance(store, MemoryObjectStore)


def _bad_name(name: object) -> str:
    raise InvalidArgument(f"name: expected a str key prefix, got {type(name).__name__}")


__all__ = ["BucketDelayedDeliveryTracker", "cut_segments"]
