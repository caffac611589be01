"""PartitionIndex: a partition's delayed entries, indexed once, as its host commits them
(:class:`~raydelay.delayed.sealed.TopicIndex`), and the queries shared subscriptions make
of it.

- At a ledger boundary with enough delayed entries, the seal thread sorts them into a
  bucket whose segments carry the payloads, writes it, and registers it in the
  coordinator (then :class:`~raydelay.actors.partition.merges.BucketMerger` merges when
  there are too many). Every shared subscription reads those buckets; a restarted host
  rebuilds the unsealed range from the ledgers after the last sealed one (``recover``).
- The rows not sealed yet are answered from memory: ``due_unsealed``, ``peek_unsealed``,
  ``unsealed_histogram``, on the partition's query thread.
- Per recent committed object it keeps a mark (its last position, its earliest
  deliver_at) and, for an object of delayed entries only, a
  :class:`~raydelay.log.entries.DelayedRun` stand-in: log reads of shared subscriptions
  skip those, and their long polls wait only for entries due soon
  (:mod:`raydelay.actors.partition.reads`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque

import msgpack
import numpy as np
import pyarrow as pa

from raydelay.actors.partition.context import PartitionContext
from raydelay.actors.partition.merges import BucketMerger
from raydelay.actors.protocol import DueReply
from raydelay.delayed.sealed import THROUGH_KEY, SealJob, TopicIndex, registry_name, seal
from raydelay.delayed.store import clean, record_of
from raydelay.dispatch.peek import PeekRange, page_of
from raydelay.errors import InvalidArgument
from raydelay.log.entries import DelayedRun, Rows, compact
from raydelay.positions import key_of
from raydelay.retries import Backoff

log = logging.getLogger(__name__)

MARKS = 4096  # recent committed objects remembered for the long polls of log reads
SEAL_RETRY = Backoff(first_s=0.2, max_s=5.0)  # a seal's writes: until they land


class PartitionIndex:
    """The delayed index of one partition on its host (see the module docstring). Without
    ``delayed.tracker = 'bucket'`` it stays empty and ``recover`` is not called."""

    def __init__(self, ctx: PartitionContext, merger: BucketMerger) -> None:
        self._ctx = ctx
        self._topic, self._partition = ctx.topic, ctx.partition
        self._config = ctx.config
        self._log = ctx.log
        self._sealed = ctx.sealed
        self._registry = ctx.registry
        self._buckets = ctx.buckets
        self._merger = merger
        # the index is guarded by this lock, held only while it is read or changed (due
        # queries run on their own thread, commits on the log's)
        self._lock = threading.Lock()
        self._index: TopicIndex | None = None
        self.delayed_runs: dict[tuple[int, int], DelayedRun] = {}
        # per recent committed object: (its last position key, its earliest deliver_at, or
        # 0 when it holds an entry due at once), for long polls that wait only for
        # entries due soon (see LogReads.read's due_within_ms)
        self.marks: deque[tuple[int, int]] = deque(maxlen=MARKS)

    @property
    def enabled(self) -> bool:
        """Whether the partition indexes its delayed entries (tracker = 'bucket')."""
        return self._index is not None

    @property
    def count(self) -> int:
        """Delayed entries not sealed yet."""
        return self._index.count if self._index is not None else 0

    @property
    def _bucket_index(self) -> TopicIndex:
        if self._index is None:  # (callers check the tracker kind first)
            raise InvalidArgument("delayed.tracker: the partition index needs tracker = 'bucket'")
        return self._index

    def recover(self) -> None:
        """Load the registered buckets, delete orphans of a seal that died half-way, and
        rebuild the unsealed range from the ledgers after the last sealed one."""
        started = time.monotonic()
        name = registry_name(self._topic, self._partition)
        records = self._registry.list(name)
        through = records.pop(THROUGH_KEY, None)
        self._buckets.through = -1 if through is None else int(msgpack.unpackb(through))
        self._buckets.take_records(records)
        for key in clean(self._sealed, records):
            log.warning("%s/%d: cleaned up bucket %s", self._topic, self._partition, key)
        d = self._config.delayed
        self._index = TopicIndex(
            min_index_count=d.min_index_count_per_bucket, sealed_through=self._buckets.through
        )
        rebuilt = 0
        for info in self._log.ledgers:
            if info.ledger_id <= self._buckets.through:
                continue
            for obj in self._log.objects_of(info.ledger_id):
                rebuilt += self._index.add(obj)
            if info.count is not None:
                job = self._index.ledger_closed(info.ledger_id)
                if job is not None:
                    job = self._with_ledgers(job)
                    self._register(job, self._sealed_bucket(job))
        self._log.on_object = self._on_object
        self._log.on_roll = self._on_roll
        self._merger.merge_soon()
        log.info(
            "%s/%d: delayed index recovered in %.2f s: %d buckets, sealed through ledger %d, "
            "%d delayed entries unsealed",
            self._topic,
            self._partition,
            time.monotonic() - started,
            len(self._buckets.entries),
            self._buckets.through,
            rebuilt,
        )

    def forget_ledgers(self, gone: set[int]) -> None:
        """Retention deleted the ledgers ``gone``: drop their delayed-run stand-ins."""
        for key in [k for k in self.delayed_runs if k[0] in gone]:
            del self.delayed_runs[key]

    # --- sealing (on the log's and the seal thread) ------------------------------------------

    def _on_object(self, obj) -> None:
        """A committed object (on the log's thread): into the index; an object of delayed
        entries only is remembered, so that log reads of shared subscriptions skip it."""
        last = key_of(obj.ledger_id, obj.first_entry + obj.count - 1)
        with self._lock:
            delayed = self._bucket_index.add(obj)
        if delayed == obj.count:
            d = int(obj.entries.deliver_at_ms.min())
            self.delayed_runs[(obj.ledger_id, obj.first_entry)] = DelayedRun(
                obj.ledger_id, obj.first_entry, obj.count, d
            )
            self.marks.append((last, d))
        else:
            self.marks.append((last, 0))

    def _on_roll(self, closed: int) -> None:
        """A ledger closed (on the log's thread): seal the range off the append path."""
        with self._lock:
            job = self._bucket_index.ledger_closed(closed)
        if job is not None:
            self._ctx.threads.seal.submit(self._seal_retrying, self._with_ledgers(job))

    def _with_ledgers(self, job: SealJob) -> SealJob:
        """The job with the sizes of the ledgers it covers (a subscription's cursor needs
        them once those ledgers are deleted)."""
        sizes = tuple(
            (x.ledger_id, x.count)
            for x in self._log.ledgers
            if job.start_ledger <= x.ledger_id <= job.end_ledger and x.count is not None
        )
        return dataclasses.replace(job, ledgers=sizes)

    def _seal_retrying(self, job: SealJob) -> None:
        """Seal off the append path; the writes are retried (with the same bucket key, so
        no attempt leaves an orphan behind) until they land."""
        sealed = self._sealed_bucket(job)
        failures = 0
        delays = SEAL_RETRY.delays_s()
        while True:
            try:
                self._register(job, sealed)
                if failures:
                    log.warning(
                        "%s/%d: sealed ledgers %d..%d after %d failed attempts",
                        self._topic,
                        self._partition,
                        job.start_ledger,
                        job.end_ledger,
                        failures,
                    )
                break
            except Exception as exc:  # noqa: BLE001 - the range stays unsealed meanwhile
                failures += 1
                if failures == 1:
                    log.warning(
                        "%s/%d: sealing ledgers %d..%d failed (%s); retrying",
                        self._topic,
                        self._partition,
                        job.start_ledger,
                        job.end_ledger,
                        exc,
                    )
                time.sleep(next(delays))
        self._merger.merge_buckets()

    def _sealed_bucket(self, job: SealJob):
        """The encoded bucket of a job (meta, data, index), or None for a job without rows."""
        if job.rows is None:
            return None
        d = self._config.delayed
        return seal(
            job.rows,
            start_ledger=job.start_ledger,
            end_ledger=job.end_ledger,
            bucket_id=time.time_ns() // 1000,
            max_indexes=d.max_indexes_per_segment,
            max_step_ms=d.max_time_step_per_segment_ms,
            ledgers=job.ledgers,
            markers=job.markers,
        )

    def _register(self, job: SealJob, sealed) -> None:
        """Write a bucket (data, index, then meta), then register it with the new sealed_through
        in one coordinator call; a job without rows only moves sealed_through. Then publish
        it (:meth:`_publish`)."""
        started = time.monotonic()
        name = registry_name(self._topic, self._partition)
        through = ("put", name, THROUGH_KEY, msgpack.packb(job.end_ledger))
        entry = None
        if sealed is None:
            self._registry.apply([through])
        else:
            meta, data, index = sealed
            written = self._sealed.write(meta, data, index)
            record = record_of(meta)
            self._registry.apply([("put", name, meta.key, record), through])
            entry = (meta.start_ledger, meta.end_ledger, meta.key)
            with self._buckets.lock:
                self._buckets.rows[meta.key] = meta.count
        self._publish(job.end_ledger, entry)
        if sealed is None:
            return
        c = self._ctx.counters
        c["sealed"] += 1
        c["sealed_rows"] += meta.count
        c["sealed_bytes"] += written
        c["seal_s"] += time.monotonic() - started
        self._ctx.metrics.bucket_op("create", time.monotonic() - started, written)
        log.info(
            "%s/%d: sealed ledgers %d..%d: %d delayed entries in %d segments (%d bytes)",
            self._topic,
            self._partition,
            job.start_ledger,
            job.end_ledger,
            meta.count,
            len(meta.segments),
            written,
        )

    def _publish(self, end_ledger: int, entry: tuple[int, int, str] | None) -> None:
        # One step under the index lock: a due query sees the rows in the index or the
        # bucket that holds them, never both and never neither.
        b = self._buckets
        with b.lock, self._lock:
            if entry is not None:
                b.entries = sorted(b.entries + [entry])
                b.version += 1
            b.through = max(b.through, end_ledger)
            self._bucket_index.published(end_ledger)

    # --- queries of the unsealed index (on the query thread) ---------------------------------

    async def due_unsealed(
        self,
        taken_below: int,
        taken_through: int,
        now_ms: int,
        known_version: int = -1,
        known_through: int = -1,
    ) -> DueReply:
        """For a shared subscription: the due delayed rows of the ledgers not sealed yet that
        it has not taken (it took every row below position ``taken_below`` due at or before
        ``taken_through``), as of ``now_ms`` (its clock). See ``TopicIndex.due``. When the
        bucket list is not the one it knows (``known_version``, ``known_through``), the
        answer carries the list as of the same moment: no second call to adopt it."""
        b = self._buckets

        def query() -> DueReply:
            # (the answer and the buckets it reports, at one moment)
            with b.lock, self._lock:
                rows, below, next_d, waiting = self._bucket_index.due(
                    int(taken_below), int(taken_through), int(now_ms)
                )
                through, version = b.through, b.version
                listed = None
                if version != int(known_version) or through > int(known_through):
                    listed = b.listing()
            batch = compact(rows.to_batch())
            return DueReply(batch, below, next_d, waiting, through, version, listed)

        return await self._ctx.threads.run(query, on=self._ctx.threads.query)

    async def peek_unsealed(
        self,
        taken_below: int,
        taken_through: int,
        q: PeekRange,
        start: tuple[int, int] | None,
        page: int,
    ) -> pa.RecordBatch:
        """A peek of the unsealed index for a subscription that took every row below
        ``taken_below`` due at or before ``taken_through``: up to ``page`` rows in ``q``'s
        range, in (deliver_at, position) order, after ``start`` (see ``page_of``)."""

        def query() -> Rows:
            with self._lock:
                rows = self._bucket_index.untaken(int(taken_below), int(taken_through))
            return page_of(rows, q, start, int(page))

        threads = self._ctx.threads
        return compact((await threads.run(query, on=threads.query)).to_batch())

    async def unsealed_histogram(self, edges: list[int], now_ms: int) -> list[int]:
        """Rows of the unsealed ledgers not due yet, per due window."""
        edges_arr = np.asarray(edges, dtype=np.int64)

        def histogram() -> np.ndarray:
            with self._lock:
                return self._bucket_index.waiting_histogram(edges_arr, int(now_ms))

        out = await self._ctx.threads.run(histogram, on=self._ctx.threads.query)
        return out.tolist()
