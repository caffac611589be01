"""The immutable buckets of one bucket tracker, and the store I/O that moves them.

:class:`ImmutableBuckets` owns the list of sealed buckets (by ledger range) and every job
that touches the store on their behalf: sealing a frozen mutable bucket (sort, cut,
write), loading a bucket's next segment when it runs out or comes due, merging adjacent
buckets above ``max_num_buckets``, deleting a finished bucket, and taking the buckets up
again after a restart. Jobs run through a :class:`~raydelay.delayed.jobs.JobRunner`
(inline, on I/O threads, or when a test says); their completions are applied on the
tracker's thread when it drains the runner, so this object, like the tracker, is used
from one thread only.

Loaded segments go into the tracker's shared :class:`~raydelay.delayed.index.RunQueue`,
each run owned by its bucket; the tracker's :class:`~raydelay.delayed.index.Membership`
decides which popped copies are live. Neither is owned here.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from raydelay.clock import Clock
from raydelay.delayed import codec
from raydelay.delayed.bucket import merge, recovery
from raydelay.delayed.bucket.state import (
    Bucket,
    BucketState,
    Exclusions,
    FrozenColumns,
    add_exclusions,
    without,
)
from raydelay.delayed.bucket.writer import Sleep, segment_key, sort_and_write
from raydelay.delayed.columns import Run
from raydelay.delayed.common import Cols
from raydelay.delayed.index import Membership, RunQueue
from raydelay.delayed.jobs import JobRunner
from raydelay.delayed.registry import BucketRegistry
from raydelay.errors import StorageError
from raydelay.storage.base import ObjectStore
from raydelay.storage.keys import bucket_prefix

log = logging.getLogger(__name__)

T = TypeVar("T")

LOAD_RETRY_MS = 500  # a segment load that failed transiently waits this long (tracker clock)
MERGE_RETRY_MAX_MS = 30_000  # failed merges back off 0.5 s, 1 s, ... up to this


class ImmutableBuckets:
    def __init__(
        self,
        *,
        store: ObjectStore,
        registry: BucketRegistry,
        name: str,
        clock: Clock,
        jobs: JobRunner,
        queue: RunQueue,
        horizon: Callable[[], int],
        prefetch_ms: int,
        max_per_segment: int,
        max_step_ms: int,
        max_buckets: int,
    ) -> None:
        """``queue``: the tracker's run queue, where loaded segments go. ``horizon()``: the
        latest deliver_at a merge must keep loaded (the tracker's cutoff plus prefetch)."""
        self._store = store
        self._registry = registry
        self._name = name
        self._clock = clock
        self._jobs = jobs
        self._queue = queue
        self._horizon = horizon
        self._prefetch_ms = prefetch_ms
        self._max_per_segment = max_per_segment
        self._max_step_ms = max_step_ms
        self._max_buckets = max_buckets
        self.buckets: list[Bucket] = []  # by start ledger
        self._next_id = 1
        self._merging: merge.MergePlan | None = None
        self._merge_failures = 0
        self._merge_retry_at_ms = 0  # the tracker's clock, before which no merge is tried
        self._dirty = True  # bucket state changed: maintain() must look at every bucket
        self._idle_until = 0  # before this cutoff, no segment needs loading
        self._epoch = 0  # bumped by clear(): completions of older jobs are dropped
        self.errors: list[BaseException] = []  # unreadable segments, for flush() to raise
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

    # == what the tracker asks ==========================================================

    def __len__(self) -> int:
        return len(self.buckets)

    @property
    def epoch(self) -> int:
        """Bumped by :meth:`clear`: a job started before it must not apply its result."""
        return self._epoch

    def ranges(self) -> list[tuple[int, int]]:
        """The (start, end) ledger range of each bucket."""
        return [(b.start, b.end) for b in self.buckets]

    def holders(self) -> list[FrozenColumns]:
        """The frozen columns of the buckets being sealed (still served from memory)."""
        return [b.holder for b in self.buckets if b.holder is not None]

    def nbytes(self) -> int:
        return sum(h.nbytes() for h in self.holders())

    def next_times(self) -> list[int]:
        """The earliest deliver_at of each bucket's part not loaded yet."""
        times = [h.min_d for h in self.holders() if h.min_d is not None]
        return times + [b.seg_min[b.next_seg] for b in self.buckets if b.next_seg < b.segments]

    def unloaded_spans(self) -> list[tuple[int, int, int]]:
        """(min deliver_at, max deliver_at, count) of every segment not loaded yet."""
        return [
            (b.seg_min[i], b.seg_max[i], b.seg_count[i])
            for b in self.buckets
            for i in range(b.next_seg, b.segments)
        ]

    def clear(self) -> None:
        """Forget every bucket; completions of jobs started before are dropped."""
        self._epoch += 1
        self.buckets = []
        self._merging = None
        self._dirty = True

    # == sealing ========================================================================

    def seal(self, cols: Cols, start: int, end: int) -> None:
        """Seal the live positions ``cols`` of ledgers start..end: sorting, cutting and
        writing happen as a job; until it is done, the frozen columns keep serving due
        positions (:meth:`move_due`)."""
        d, l, e = cols  # noqa: E741
        bucket = Bucket(
            start=start,
            end=end,
            bucket_id=self._take_id(),
            seg_min=[],
            seg_count=[],
            seg_max=[],
            next_seg=0,
            state=BucketState.SEALING,
            holder=FrozenColumns(d, l, e),
        )
        self.buckets.append(bucket)
        self._dirty = True
        self.counters["sealed"] += 1
        store, registry, name = self._store, self._registry, self._name
        epoch, sleep = self._epoch, self.sleep
        max_per_segment, max_step_ms = self._max_per_segment, self._max_step_ms
        ids = (start, end, bucket.bucket_id)

        def job() -> tuple[codec.BucketMeta, int, Cols]:
            return sort_and_write(
                store, registry, name, ids, (d, l, e), max_per_segment, max_step_ms, sleep
            )

        def done(written: tuple[codec.BucketMeta, int, Cols], error: BaseException | None) -> None:
            if epoch != self._epoch or bucket not in self.buckets:
                return
            if error is not None:
                self._downgrade(bucket, error)
                return
            meta, nbytes, first = written
            described = Bucket.from_meta(meta, 0)
            bucket.seg_min, bucket.seg_count = described.seg_min, described.seg_count
            bucket.seg_max = described.seg_max
            bucket.move_to(BucketState.PERSISTED)
            bucket.holder = None
            if bucket.taken:  # copies handed out while sealing must not come back from the store
                exclude: Exclusions = {}
                for tl, te in bucket.taken:
                    add_exclusions(exclude, tl, te)
                bucket.exclude = exclude
                bucket.taken = []
            self.counters["snapshot_bytes"] += nbytes
            self._install_segment(bucket, 0, first)  # segment 1 goes straight to the shared queue

        self._jobs.submit("write", self._timed("create", job), done)

    def _downgrade(self, bucket: Bucket, error: BaseException) -> None:
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
        self.buckets.remove(bucket)

    def move_due(self, cutoff: int) -> None:
        """Due positions of buckets still being sealed go to the queue (and are remembered,
        so that the written bucket does not bring them back)."""
        for bucket in self.buckets:
            if bucket.holder is not None:
                due = bucket.holder.take_due(cutoff)
                if due is not None and len(due[0]):
                    self._queue.add_loose(*due)
                    bucket.taken.append((due[1], due[2]))

    # == loading and retiring ===========================================================

    def maintain(self, cutoff: int) -> bool:
        """Start segment loads that are needed now or soon, retire finished buckets.
        Returns True when an inline load completed (more may be due)."""
        horizon = cutoff + self._prefetch_ms
        if not self._dirty and not self._queue.emptied and horizon < self._idle_until:
            return False  # nothing to load or retire yet
        loaded = False
        now_ms = self._clock.now_ms()
        if self._queue.emptied:
            for run in self._queue.emptied:
                owner = run.owner
                if isinstance(owner, Bucket) and run in owner.runs:
                    owner.runs.remove(run)
                    if not owner.runs:
                        owner.want_next = True  # the last loaded position was popped
            self._queue.emptied = []
        for bucket in list(self.buckets):
            if bucket.loading or bucket.state is not BucketState.PERSISTED:
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
                and now_ms >= bucket.load_retry_at_ms
                and bucket in self.buckets
            ):
                self._load_next(bucket)
                if self._jobs.background:
                    break
                self._jobs.drain()  # inline: the segment is in the queue now
                loaded = True
        # Finished buckets retire through the emptied-run reports; loads and retries need a look.
        self._dirty = any(b.loading or b.want_next for b in self.buckets)
        nexts = [b.seg_min[b.next_seg] for b in self.buckets if b.next_seg < b.segments]
        self._idle_until = min(nexts) - self._prefetch_ms if nexts else 2**62
        return loaded

    def _load_next(self, bucket: Bucket) -> None:
        """Start loading the bucket's next segment from the store."""
        index = bucket.next_seg
        bucket.want_next = False
        bucket.loading = True
        epoch = self._epoch
        key = segment_key(self._name, bucket.key, index)
        store = self._store

        def job() -> Cols:
            return codec.decode_segment(store.get(key), key)

        def done(cols: Cols, error: BaseException | None) -> None:
            bucket.loading = False
            self._dirty = True
            if epoch != self._epoch or bucket not in self.buckets:
                return
            if error is None:
                self._install_segment(bucket, index, cols)
            elif isinstance(error, StorageError) and error.retriable:
                log.warning(
                    "tracker %s: loading segment %d of %s failed, will retry in %d ms: %s",
                    self._name,
                    index + 1,
                    bucket.key,
                    LOAD_RETRY_MS,
                    error,
                )
                bucket.load_retry_at_ms = self._clock.now_ms() + LOAD_RETRY_MS
                bucket.want_next = True
            else:
                log.error(
                    "tracker %s: segment %d of %s is unreadable: %s",
                    self._name,
                    index + 1,
                    bucket.key,
                    error,
                )
                self.errors.append(error)
                bucket.next_seg = index + 1

        self._jobs.submit("load", self._timed("load", job), done)

    def _install_segment(self, bucket: Bucket, index: int, cols: Cols) -> None:
        d, l, e = without(cols, bucket.exclude)  # noqa: E741
        bucket.next_seg = index + 1
        self._dirty = True
        self.counters["loaded"] += 1
        if len(d):
            run = Run(d, l, e, owner=bucket)
            bucket.runs.append(run)
            self._queue.add_run(run)
        else:
            bucket.want_next = True

    def _retire(self, bucket: Bucket) -> None:
        """Every segment was loaded and popped: delete the bucket (registry entry first)."""
        self.buckets.remove(bucket)
        self._delete_objects(bucket.key)

    def _delete_objects(self, key: str) -> None:
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

    def trim(self, md_ledger: int) -> None:
        """Drop the persisted buckets wholly below mark-delete ledger ``md_ledger``."""
        self._dirty = True
        for bucket in list(self.buckets):
            if (
                bucket.end < md_ledger
                and bucket.state is BucketState.PERSISTED
                and not bucket.loading
            ):
                self._queue.remove_runs(bucket.runs)
                self.buckets.remove(bucket)
                self._delete_objects(bucket.key)

    # == merging ========================================================================

    def maybe_merge(self) -> None:
        """Above max_num_buckets, start merging the best window of adjacent buckets."""
        if self._merging is not None or len(self.buckets) <= self._max_buckets:
            return
        if self._clock.now_ms() < self._merge_retry_at_ms:
            return
        window = merge.pick_window(self.buckets)
        if window is None:
            return
        sources = self.buckets[window[0] : window[1]]
        plan = merge.plan_merge(self._name, sources, self._take_id(), self._epoch)
        for b in sources:
            b.move_to(BucketState.MERGING)
        self._merging = plan
        store, registry, name, sleep = self._store, self._registry, self._name, self.sleep
        max_per_segment, max_step_ms = self._max_per_segment, self._max_step_ms

        def job() -> tuple[codec.BucketMeta, int] | None:
            return merge.write_merged(
                plan, store, registry, name, max_per_segment, max_step_ms, sleep
            )

        def done(written: tuple[codec.BucketMeta, int] | None, error: BaseException | None) -> None:
            self._merged(plan, written, error)

        self._jobs.submit("write", self._timed("merge", job), done)

    def _merged(
        self,
        plan: merge.MergePlan,
        written: tuple[codec.BucketMeta, int] | None,
        error: BaseException | None,
    ) -> None:
        self._merging = None
        self._dirty = True
        meta = written[0] if written else None
        if written:
            self.counters["snapshot_bytes"] += written[1]
        sources = plan.sources
        if plan.epoch != self._epoch:
            if meta is not None:
                self._delete_objects(meta.key)
            return
        alive = all(b in self.buckets for b in sources)
        if error is None and alive and meta is None:
            # Nothing was left to merge: the sources retire; what they still hold in
            # memory keeps being served (after a crash, the log replay brings it back).
            for b in sources:
                for r in b.runs:
                    r.owner = None
                self.buckets.remove(b)
                self._delete_objects(b.key)
            self._merge_failures = 0
            return
        if error is not None or not alive or meta is None:
            for b in sources:
                if b.state is BucketState.MERGING:
                    b.move_to(BucketState.PERSISTED)
            if error is not None:
                # back off: a failure that repeats must not spin flush() or the I/O thread
                self._merge_failures += 1
                wait_ms = min(MERGE_RETRY_MAX_MS, 250 * 2**self._merge_failures)
                self._merge_retry_at_ms = self._clock.now_ms() + wait_ms
                log.warning(
                    "tracker %s: merging %d buckets failed, will retry in %d ms: %s",
                    self._name,
                    len(sources),
                    wait_ms,
                    error,
                    # a storage outage is expected; anything else deserves its traceback
                    exc_info=None if isinstance(error, StorageError) else error,
                )
            elif meta is not None:
                self._delete_objects(meta.key)
            return
        got = merge.reconcile(plan, self._horizon())
        self._queue.remove_runs(got.dropped)
        merged = Bucket.from_meta(meta, 0, runs=got.keep, exclude=got.exclude or None)
        for r in got.keep:
            r.owner = merged
        for r in got.new:
            self._queue.add_run(r)
        at = self.buckets.index(sources[0])
        self.buckets[at : at + len(sources)] = [merged]
        self.counters["merged"] += 1
        for b in sources:
            self._delete_objects(b.key)
        self._merge_failures = 0

    # == recovery =======================================================================

    def recover(self, members: Membership, cutoff: int) -> int:
        """Take up the registered buckets: restore their pending positions into
        ``members``, load each one's first pending segment, and sweep orphan objects.
        Returns the last ledger the buckets cover (-1: none)."""
        threads = self._jobs.background
        live, self._next_id = recovery.read_live_metas(
            self._store, self._registry, self._name, threads=threads
        )
        sealed_end = -1
        to_load = []
        for m in live:
            first = recovery.first_pending_segment(m, cutoff)
            sealed_end = max(sealed_end, m.end_ledger)
            if first is None:  # everything in it is due: the log replay delivers it
                self._delete_objects(m.key)
                continue
            for s in m.segments[first:]:
                for ledger, bm in s.bitmaps.items():
                    members.restore(ledger, bm)
            bucket = Bucket.from_meta(m, first)
            self.buckets.append(bucket)
            to_load.append(bucket)
        self.buckets.sort(key=lambda b: b.start)
        return sealed_end

    def load_first_segments(self) -> None:
        """After :meth:`recover` (and the tombstones): load each bucket's pending segment,
        in parallel, and sweep the objects no registered bucket names."""
        keys = [segment_key(self._name, b.key, b.next_seg) for b in self.buckets]
        store = self._store
        segments = recovery.parallel_map(
            lambda k: codec.decode_segment(store.get(k), k), keys, threads=self._jobs.background
        )
        for bucket, cols in zip(self.buckets, segments):
            self._install_segment(bucket, bucket.next_seg, cols)
        self._sweep_orphans({b.key for b in self.buckets})

    def _sweep_orphans(self, live_keys: set[str]) -> None:
        store, name = self._store, self._name

        def done(count: int | None, error: BaseException | None) -> None:
            if error is not None:
                log.warning("tracker %s: sweeping orphan objects failed: %s", self._name, error)
            elif count:
                log.info("tracker %s: swept %d orphan bucket objects", self._name, count)

        self._jobs.submit("write", lambda: recovery.sweep_orphans(store, name, live_keys), done)

    # == helpers ========================================================================

    def _timed(self, op: str, job: Callable[[], T]) -> Callable[[], T]:
        """``job``, recording how long it really took (seconds, failed ones too) under
        ``op`` in ``op_times``."""
        times = self.op_times

        def run() -> T:
            start = time.monotonic()
            try:
                return job()
            finally:
                times.append((op, time.monotonic() - start))

        return run

    def _take_id(self) -> int:
        bucket_id = self._next_id
        self._next_id += 1
        return bucket_id

    @property
    def sleep(self) -> Sleep:
        """How a store write's retry waits: in real time with real I/O threads, not at
        all inline or in manual mode (deterministic)."""
        return time.sleep if self._jobs.sleeps else None


__all__ = ["ImmutableBuckets", "LOAD_RETRY_MS", "MERGE_RETRY_MAX_MS"]
