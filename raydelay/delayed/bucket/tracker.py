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

This module owns the tracker's public API, its membership, run queue and mutable
bucket; the immutable buckets and their store I/O are :class:`ImmutableBuckets`
(immutable.py), with writing (writer.py), merging (merge.py), tombstones
(tombstones.py) and recovery (recovery.py) beside it. The mutable bucket is never
persisted: after a restart the subscription re-reads the log from mark-delete, and
bitmaps recognise the positions that are already in buckets.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Literal

import numpy as np

from raydelay.clock import Clock
from raydelay.delayed.bucket.immutable import ImmutableBuckets
from raydelay.delayed.bucket.state import MutableBucket
from raydelay.delayed.bucket.tombstones import Tombstones, tombs_prefix, write_tombstones
from raydelay.delayed.columns import check_position, check_positions, ledger_groups
from raydelay.delayed.common import (
    TrackerBase,
    check_clock,
    check_max_messages,
    check_positive_int,
    due_window_counts,
)
from raydelay.delayed.index import Membership, RunQueue
from raydelay.delayed.jobs import JobRunner
from raydelay.delayed.registry import BucketRegistry
from raydelay.errors import InvalidArgument, RaydelayError
from raydelay.limits import check_limit
from raydelay.storage.base import ObjectStore
from raydelay.storage.keys import validate_key

log = logging.getLogger(__name__)

IoMode = Literal["inline", "threads", "manual"]
IO_MODES: tuple[IoMode, ...] = ("inline", "threads", "manual")

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
        self._immutable = ImmutableBuckets(
            store=store,
            registry=registry,
            name=self._name,
            clock=self._clock,
            jobs=self._jobs,
            queue=self._queue,
            horizon=lambda: self._cutoff() + self._prefetch_ms,
            prefetch_ms=self._prefetch_ms,
            max_per_segment=self._max_per_segment,
            max_step_ms=self._max_step_ms,
            max_buckets=self._max_buckets,
        )
        self._sealed_end = -1
        self._tombs = Tombstones(self._name)
        self._trimmed_below = -1
        self._closed = False
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
        self._move_due(cutoff)
        self._immutable.maintain(cutoff)
        out_l, out_e = [], []
        while n > 0:
            got = self._queue.take(cutoff, n)
            if got is None:
                if self._immutable.maintain(cutoff):
                    continue  # an inline load brought in due positions
                break
            (d, l, e), emptied = got  # noqa: E741
            exhausted = len(d) < n  # the queue had no more due copies
            live_l, live_e = self._members.take(d, l, e)
            out_l.append(live_l)
            out_e.append(live_e)
            n -= len(live_l)
            if (emptied or exhausted) and not self._immutable.maintain(cutoff) and exhausted:
                break
        self._settle()
        return out_l, out_e

    def has_message_available(self) -> bool:
        self._check_open()
        self._jobs.drain()
        cutoff = self._cutoff()
        self._move_due(cutoff)
        self._immutable.maintain(cutoff)
        return self._queue.has_live_due(cutoff, self._members)

    def buffer_memory_usage(self) -> int:
        memory = self._queue.nbytes() + self._mutable.nbytes() + self._members.nbytes()
        return memory + self._immutable.nbytes()

    def should_pause_all_deliveries(self) -> bool:
        return False

    def next_delivery_time(self) -> int | None:
        if self._members.count == 0:
            return None
        candidates = [self._queue.min_d(), self._mutable.min_d, *self._immutable.next_times()]
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
        exact += [h.columns() for h in self._immutable.holders()]
        spans = self._immutable.unloaded_spans()
        return due_window_counts(np.asarray(edges, dtype=np.int64), exact, self._members, spans)

    def persisted_through(self) -> int:
        """Every delayed position of the ledgers up to this one was sealed into a bucket
        (a restart finds it there), had fallen due, or was untracked. A restarted
        subscription re-reads only the log after it, plus the positions of these ledgers
        that are neither acknowledged nor tracked (see Subscription.resume_after_buckets)."""
        return self._sealed_end

    def immutable_bucket_count(self) -> int:
        return len(self._immutable)

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
            self._immutable.maybe_merge()
            self._write_tombs()
            if not applied and not self._jobs.busy():
                break
        errors = self._immutable.errors
        if errors:
            first = errors[0]
            errors.clear()
            raise first

    def clear(self) -> None:
        """Forget everything and delete every snapshot object and registry entry."""
        self._check_open()
        self._jobs.wait()
        self._jobs.drain()
        self._immutable.clear()
        for key in self._registry.list(self._name):
            self._registry.remove(self._name, key)
        for key in self._store.list(f"{self._name}/buckets/") + self._store.list(
            tombs_prefix(self._name)
        ):
            self._store.delete(key)
        self._members.clear()
        self._queue.clear()
        self._mutable.clear()
        self._sealed_end = -1
        self._tombs.clear()
        self._trimmed_below = -1

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
            "buckets": len(self._immutable),
            "mutable": self._mutable.count,
            "loaded_runs": len(self._queue.runs),
            "loaded_indexes": sum(len(c[0]) for c in self._queue.columns())
            + self._mutable.count
            + sum(h.count for h in self._immutable.holders()),
            "memory_bytes": self.buffer_memory_usage(),
            **self._immutable.counters,
        }

    @property
    def counters(self) -> dict[str, int]:
        """Buckets sealed, segments loaded, merges, bucket deletions, downgrades to memory
        (a failed write), and bytes written."""
        return self._immutable.counters

    @property
    def op_times(self) -> deque[tuple[str, float]]:
        """(operation, seconds) of finished bucket jobs, for metrics (drain it)."""
        return self._immutable.op_times

    def __repr__(self) -> str:
        return f"BucketDelayedDeliveryTracker(name={self._name!r}, delayed={self._members.count}, buckets={len(self._immutable)})"

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
        """Freeze the mutable bucket and hand its live positions to the immutable buckets."""
        d, l, e = self._mutable.columns()  # noqa: E741
        start, end = self._mutable.start, self._mutable.end
        self._mutable.clear()
        self._sealed_end = max(self._sealed_end, end)
        live = self._members.member_mask(d, l, e)  # cancelled copies are not persisted
        if not live.all():
            d, l, e = d[live], l[live], e[live]  # noqa: E741
        if len(d):
            self._immutable.seal((d, l, e), start, end)

    def _move_due(self, cutoff: int) -> None:
        due = self._mutable.take_due(cutoff)
        if due is not None and len(due[0]):
            self._queue.add_loose(*due)
        self._immutable.move_due(cutoff)

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
        self._members.drop_below(md_ledger)
        self._mutable.drop_below(md_ledger)
        self._immutable.trim(md_ledger)

    def _write_tombs(self) -> None:
        w = self._tombs.next_write(self._immutable.ranges())
        if w is None:
            return
        store, immutable = self._store, self._immutable
        sleep = immutable.sleep
        epoch = immutable.epoch

        def done(_: None, error: BaseException | None) -> None:
            if epoch != immutable.epoch:
                self._tombs.writing = False
            elif error is not None:
                self._tombs.failed(w, error)
            else:
                self._tombs.written(w)

        self._jobs.submit("write", lambda: write_tombstones(store, w, sleep), done)

    # == recovery and helpers ===========================================================

    def _recover(self) -> None:
        self._sealed_end = self._immutable.recover(self._members, self._cutoff())
        self._tombs.recover(self._store, self._members)
        self._immutable.load_first_segments()
        self._jobs.drain()

    def _settle(self) -> None:
        """After a call: inline jobs' completions are applied, merges and tombstones kick off."""
        self._jobs.drain()
        self._immutable.maybe_merge()
        self._write_tombs()
        self._jobs.drain()

    def _check_open(self) -> None:
        if self._closed:
            raise RaydelayError(f"tracker {self._name!r} is closed")
