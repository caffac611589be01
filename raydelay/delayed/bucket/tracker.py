"""BucketDelayedDeliveryTracker: a delayed index whose memory does not grow with the backlog.

After Pulsar's PIP-195, re-done in columns. New positions gather in the mutable
bucket (memory only). Once it holds ``min_index_count_per_bucket`` positions and
a position arrives from a later ledger, it is *sealed*: sorted by (deliver_at,
ledger, entry), cut into segments, and written to the store as an immutable
bucket (segments, then meta, then the registry entry). Only one loaded segment
per bucket, the mutable bucket and the membership bitmaps stay resident; the next
segment of a bucket is loaded when its current one runs out or is about to
become due. Above ``max_num_buckets``, adjacent buckets are merged.

Store I/O runs as jobs (see jobs.py): inline, or on I/O threads with ``io="threads"``.
Their results are applied on the caller's thread, so the tracker itself stays
single-threaded and its hot paths (add_messages, get_scheduled_messages) never wait
on the store in threaded mode.

This module owns the tracker's state and its public API; writing (writer.py),
merging (merge.py), tombstones (tombstones.py) and recovery (recovery.py) live
beside it. The mutable bucket is never persisted: after a restart the subscription
re-reads the log from mark-delete, and bitmaps recognise the positions that are
already in buckets.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Literal, TypeVar

import numpy as np

from raydelay.clock import Clock
from raydelay.delayed import codec
from raydelay.delayed.bucket import merge, recovery
from raydelay.delayed.bucket.state import (
    Bucket,
    BucketState,
    Exclusions,
    FrozenColumns,
    MutableBucket,
    add_exclusions,
    without,
)
from raydelay.delayed.bucket.tombstones import Tombstones, tombs_prefix, write_tombstones
from raydelay.delayed.bucket.writer import Sleep, segment_key, sort_and_write
from raydelay.delayed.columns import Run, check_position, check_positions, ledger_groups
from raydelay.delayed.common import (
    Cols,
    TrackerBase,
    check_clock,
    check_max_messages,
    check_positive_int,
    due_window_counts,
)
from raydelay.delayed.index import Membership, RunQueue
from raydelay.delayed.jobs import JobRunner
from raydelay.delayed.registry import BucketRegistry
from raydelay.errors import InvalidArgument, RaydelayError, StorageError
from raydelay.limits import check_limit
from raydelay.storage.base import ObjectStore
from raydelay.storage.keys import bucket_prefix, validate_key

log = logging.getLogger(__name__)

T = TypeVar("T")

IoMode = Literal["inline", "threads", "manual"]
IO_MODES: tuple[IoMode, ...] = ("inline", "threads", "manual")

LOAD_RETRY_MS = 500  # a segment load that failed transiently waits this long (tracker clock)
MERGE_RETRY_MAX_MS = 30_000  # failed merges back off 0.5 s, 1 s, ... up to this
_THREADS_PREFETCH_MS = 2_000


class BucketDelayedDeliveryTracker(TrackerBase):
    def __init__(
        self,
        *,
        store: ObjectStore,
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
        io: IoMode = "inline",
        prefetch_ms: int | None = None,
    ) -> None:
        """``io``: ``"inline"`` runs store I/O on the caller's thread (deterministic; right
        for an in-memory store), ``"threads"`` on background I/O threads (a real store),
        ``"manual"`` (tests) queues it until :meth:`run_background_jobs` runs it, to choose
        exactly when each job lands. ``prefetch_ms`` is how long before a segment's first
        deliver_at it is loaded (default: 0 inline, 2000 ms otherwise). Retry windows
        (failed loads and merges) follow ``clock``."""
        for method in ("put", "get", "delete", "list"):
            if not callable(getattr(store, method, None)):
                raise InvalidArgument(f"store: expected an ObjectStore, it lacks {method}()")
        for method in ("list", "put", "remove"):
            if not callable(getattr(registry, method, None)):
                raise InvalidArgument(f"registry: expected a BucketRegistry, it lacks {method}()")
        if not isinstance(name, str):
            raise InvalidArgument(f"name: expected a str key prefix, got {type(name).__name__}")
        self._name = validate_key(name)
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
        if io not in IO_MODES:
            raise InvalidArgument(f"io: expected one of {IO_MODES}, got {io!r}")
        self._jobs = JobRunner(background=io != "inline", name=self._name, manual=io == "manual")
        if prefetch_ms is None:
            prefetch_ms = 0 if io == "inline" else _THREADS_PREFETCH_MS
        self._prefetch_ms = check_positive_int("prefetch_ms", prefetch_ms, allow_zero=True)

        self._members = Membership()
        self._queue = RunQueue()
        self._mutable = MutableBucket()
        self._buckets: list[Bucket] = []
        self._sealed_end = -1
        self._next_id = 1
        self._tombs = Tombstones(self._name)
        self._merging: merge.MergePlan | None = None
        self._merge_failures = 0
        self._merge_retry_at_ms = 0  # the tracker's clock, before which no merge is tried
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

    def add_messages(
        self, ledger_ids: object, entry_ids: object, deliver_ats: object
    ) -> np.ndarray:
        self._check_open()
        ls, es, ds = check_positions(ledger_ids, entry_ids, deliver_ats)
        result = np.ones(len(ls), dtype=bool)
        if len(ls) == 0:
            return result
        self._jobs.drain()
        (ls, es, ds), untracked = self._split_due(ls, es, ds, result)
        if len(untracked[0]):
            self._tombs.note(untracked[0], untracked[1], self._sealed_end)
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
            self._tombs.note_one(ledger_id, entry_id)
        self._settle()
        return True

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
        """With ``io="manual"``: run up to ``n`` queued jobs (all when None)."""
        if not self._jobs.manual:
            raise InvalidArgument("run_background_jobs: the tracker was not built with io='manual'")
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
            tombs_prefix(self._name)
        ):
            self._store.delete(key)
        self._members.clear()
        self._queue.clear()
        self._mutable.clear()
        self._buckets = []
        self._sealed_end = -1
        self._tombs.clear()
        self._merging = None
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

    def stats(self) -> dict[str, int]:
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

    # == adding and sealing =============================================================

    def _route(self, d: np.ndarray, l: np.ndarray, e: np.ndarray) -> None:  # noqa: E741
        covered = l <= self._sealed_end
        if covered.any():
            # The ledger already belongs to an immutable bucket: straight to the shared queue.
            # A persisted copy with an older deliver_at may exist (a nack re-add): make sure
            # a restart does not bring that copy back.
            self._queue.add_loose(d[covered], l[covered], e[covered])
            self._tombs.note(l[covered], e[covered], self._sealed_end)
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
        self._buckets.append(bucket)
        self._dirty = True
        self.counters["sealed"] += 1
        store, registry, name = self._store, self._registry, self._name
        epoch, sleep = self._epoch, self._sleep
        max_per_segment, max_step_ms = self._max_per_segment, self._max_step_ms
        ids = (start, end, bucket.bucket_id)

        def job() -> tuple[codec.BucketMeta, int, Cols]:
            return sort_and_write(
                store, registry, name, ids, (d, l, e), max_per_segment, max_step_ms, sleep
            )

        def done(written: tuple[codec.BucketMeta, int, Cols], error: BaseException | None) -> None:
            if epoch != self._epoch or bucket not in self._buckets:
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

    # == loading and retiring ===========================================================

    def _maintain(self, cutoff: int) -> bool:
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
        for bucket in list(self._buckets):
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
            if epoch != self._epoch or bucket not in self._buckets:
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
                self._errors.append(error)
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
        if self._merging is not None or len(self._buckets) <= self._max_buckets:
            return
        if self._clock.now_ms() < self._merge_retry_at_ms:
            return
        window = merge.pick_window(self._buckets)
        if window is None:
            return
        sources = self._buckets[window[0] : window[1]]
        plan = merge.plan_merge(self._name, sources, self._take_id(), self._epoch)
        for b in sources:
            b.move_to(BucketState.MERGING)
        self._merging = plan
        store, registry, name, sleep = self._store, self._registry, self._name, self._sleep
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
                self._delete_bucket_objects(meta.key)
            return
        got = merge.reconcile(plan, self._cutoff() + self._prefetch_ms)
        self._queue.remove_runs(got.dropped)
        merged = Bucket.from_meta(meta, 0, runs=got.keep, exclude=got.exclude or None)
        for r in got.keep:
            r.owner = merged
        for r in got.new:
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
            if (
                bucket.end < md_ledger
                and bucket.state is BucketState.PERSISTED
                and not bucket.loading
            ):
                self._queue.remove_runs(bucket.runs)
                self._buckets.remove(bucket)
                self._delete_bucket_objects(bucket.key)

    def _write_tombs(self) -> None:
        w = self._tombs.next_write([(b.start, b.end) for b in self._buckets])
        if w is None:
            return
        store, sleep, epoch = self._store, self._sleep, self._epoch

        def done(_: None, error: BaseException | None) -> None:
            if epoch != self._epoch:
                self._tombs.writing = False
            elif error is not None:
                self._tombs.failed(w, error)
            else:
                self._tombs.written(w)

        self._jobs.submit("write", lambda: write_tombstones(store, w, sleep), done)

    # == recovery =======================================================================

    def _recover(self) -> None:
        threads = self._jobs.background
        live, self._next_id = recovery.read_live_metas(
            self._store, self._registry, self._name, threads=threads
        )
        cutoff = self._cutoff()
        to_load = []
        for m in live:
            first = recovery.first_pending_segment(m, cutoff)
            self._sealed_end = max(self._sealed_end, m.end_ledger)
            if first is None:  # everything in it is due: the log replay delivers it
                self._delete_bucket_objects(m.key)
                continue
            for s in m.segments[first:]:
                for ledger, bm in s.bitmaps.items():
                    self._members.restore(ledger, bm)
            bucket = Bucket.from_meta(m, first)
            self._buckets.append(bucket)
            to_load.append(bucket)
        self._buckets.sort(key=lambda b: b.start)
        self._tombs.recover(self._store, self._members)
        keys = [segment_key(self._name, b.key, b.next_seg) for b in to_load]
        store = self._store
        segments = recovery.parallel_map(
            lambda k: codec.decode_segment(store.get(k), k), keys, threads=threads
        )
        for bucket, cols in zip(to_load, segments):
            self._install_segment(bucket, bucket.next_seg, cols)
        self._sweep_orphans({b.key for b in self._buckets})
        self._jobs.drain()

    def _sweep_orphans(self, live_keys: set[str]) -> None:
        store, name = self._store, self._name

        def done(count: int | None, error: BaseException | None) -> None:
            if error is not None:
                log.warning("tracker %s: sweeping orphan objects failed: %s", self._name, error)
            elif count:
                log.info("tracker %s: swept %d orphan bucket objects", self._name, count)

        self._jobs.submit("write", lambda: recovery.sweep_orphans(store, name, live_keys), done)

    # == helpers ========================================================================

    def _settle(self) -> None:
        """After a call: inline jobs' completions are applied, merges and tombstones kick off."""
        self._jobs.drain()
        self._maybe_merge()
        self._write_tombs()
        self._jobs.drain()

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
    def _sleep(self) -> Sleep:
        """How a store write's retry waits: in real time with real I/O threads, not at
        all inline or in manual mode (deterministic)."""
        return time.sleep if self._jobs.sleeps else None

    def _check_open(self) -> None:
        if self._closed:
            raise RaydelayError(f"tracker {self._name!r} is closed")
