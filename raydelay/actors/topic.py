"""TopicPartition: the asyncio shell around one partition's :class:`PartitionLog`, one of
the many a partition host holds (:mod:`raydelay.actors.host`; calls reach it through
the host's ``call``).

- ``append`` calls wait in a queue. A group commit starts at once when none is in
  flight; what arrives while one is in flight joins the next (the journal pattern of
  BookKeeper and PostgreSQL): alone, a send pays one durable write; under load the
  commits grow, each up to ``topic.group_commit_max_bytes``. ``topic.group_commit_ms``
  > 0 adds a linger before each commit. All log work runs on one thread, in order, so
  the event loop never blocks on the store.
- ``wait_for_entries`` is a long poll woken by each commit.
- It indexes the partition's delayed entries once, as it commits them
  (:class:`~raydelay.delayed.sealed.TopicIndex`): at a ledger boundary with enough of
  them, a seal thread sorts them into a bucket whose segments carry the payloads,
  writes it, and registers it in the coordinator. Every shared subscription reads
  those buckets (``buckets``); a restarted actor rebuilds the unsealed range from the
  ledgers after the last sealed one.
- Every ``topic.retention_interval_ms`` its host calls ``trim``: it asks the coordinator
  which ledgers and buckets no subscription needs any more, deletes their objects, then
  tells it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import ray

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.metrics import TopicMetrics
from raydelay.actors.protocol import BucketList, DueReply, ReadReply
from raydelay.actors.registry import CoordinatorRegistry
from raydelay.clock import SystemClock
from raydelay.cluster.handles import Peer
from raydelay.cluster.nodes import check_store
from raydelay.config import config_from_dict
from raydelay.delayed.sealed import (
    THROUGH_KEY,
    SealedMeta,
    SealJob,
    TopicIndex,
    parse_bucket_key,
    registry_name,
    seal,
)
from raydelay.delayed.store import SealedStore, clean, merge, merge_window, record_of
from raydelay.dispatch.peek import PeekRange, page_of
from raydelay.errors import InvalidArgument, NotFound, Unavailable
from raydelay.log.entries import (
    NO_DELAY,
    AppendBatch,
    DelayedRun,
    Entries,
    Rows,
    compact,
    decode_batch,
)
from raydelay.log.partition import LedgerInfo, PartitionLog
from raydelay.positions import key_of
from raydelay.retries import Backoff
from raydelay.storage import make_store

log = logging.getLogger(__name__)

MAX_WAIT_S = 60.0
# a log read waiting for entries due soon also returns for entries due later, but no sooner
# than this after it began (the reader learns of them, and of new buckets, that often)
TRICKLE_S = 1.0
_MARKS = 4096  # recent committed objects remembered for the long polls of read()


@dataclasses.dataclass(eq=False)
class _Waiter:
    """A standing long poll of a log read (see ``TopicPartition._wait_urgent``): where its
    reader reads from, its horizon (ms, None: any entry), when it began (monotonic s), the
    future that ends it, and its timer (the next moment it may become ready without a
    commit)."""

    position: tuple[int, int]
    within_ms: int | None
    started: float
    future: asyncio.Future
    timer: asyncio.TimerHandle | None = None

    def wake(self) -> None:
        if not self.future.done():
            self.future.set_result(None)

    def arm(self, delay_s: float) -> None:
        """Wake in ``delay_s`` seconds, unless an earlier timer is set already."""
        loop = self.future.get_loop()
        at = loop.time() + delay_s
        if self.timer is not None and not self.timer.cancelled():
            if self.timer.when() <= at:
                return
            self.timer.cancel()
        self.timer = loop.call_at(at, self.wake)


class SharedObjects:
    """Committed ledger objects put once into Ray's object store, for every subscription
    that reads them: a read answers with a reference, and the subscriptions on the node
    map the same shared memory (a numpy view, decoded in place) instead of each getting a
    copy in its reply. One per process (a host), bounded by bytes; small objects, cheaper
    to copy than to fetch, go in the reply as they are."""

    MIN_BYTES = 64 * 1024

    def __init__(self, limit_bytes: int) -> None:
        self._limit = limit_bytes
        self._refs: OrderedDict[int, tuple[bytes, Any]] = OrderedDict()  # id(data) -> ref
        self._bytes = 0
        self.puts = 0

    def share(self, objects: list) -> list:
        """``objects`` with each big encoded object replaced by its reference."""
        return [
            self._ref(o) if isinstance(o, bytes) and len(o) >= self.MIN_BYTES else o
            for o in objects
        ]

    def _ref(self, data: bytes) -> Any:
        hit = self._refs.get(id(data))
        if hit is not None and hit[0] is data:  # (the tail cache hands out the same bytes)
            self._refs.move_to_end(id(data))
            return hit[1]
        ref = ray.put(np.frombuffer(data, dtype=np.uint8))
        self.puts += 1
        self._refs[id(data)] = (data, ref)
        self._bytes += len(data)
        while self._bytes > self._limit and len(self._refs) > 1:
            _, (old, _) = self._refs.popitem(last=False)
            self._bytes -= len(old)
        return ref


SHARED = SharedObjects(64 * 1024 * 1024)
SEAL_RETRY = Backoff(first_s=0.2, max_s=5.0)  # a seal's writes: until they land


class TopicPartition:
    """One partition of a host. The constructor recovers it from the store and makes
    blocking calls: its host runs it on a thread."""

    def __init__(
        self,
        topic: str,
        partition: int,
        config: dict[str, Any],
        coordinator: Peer[CoordinatorActor],
    ) -> None:
        self._topic, self._partition = topic, partition
        self._config = config_from_dict(config)
        check_store(self._config.storage)  # before anything is written where it should not be
        self._metrics = TopicMetrics(topic, partition)
        self._published = 0  # the log's entry count last reported
        self._exec = ThreadPoolExecutor(1, thread_name_prefix="raydelay-log")
        self._coordinator = coordinator  # its host's
        ledgers = self._coordinator.call_from_thread(CoordinatorActor.ledgers, topic, partition)
        store = make_store(self._config)
        self._log = PartitionLog(
            store=store,
            topic=topic,
            partition=partition,
            ledgers=[LedgerInfo(int(i), c) for i, c in ledgers],
            roll=self._roll,
            clock=SystemClock(),
            max_entries_per_ledger=self._config.topic.max_entries_per_ledger,
            cache_bytes=self._config.topic.tail_cache_bytes,
            index_cache_bytes=self._config.topic.index_cache_bytes,
        )
        self._registry = CoordinatorRegistry(self._coordinator)
        self._sealed = SealedStore(store, topic, partition)
        self._buckets: list[tuple[int, int, str]] = []  # (start, end, key), by start
        self._bucket_rows: dict[str, int] = {}  # key -> its rows (what merges go by)
        self._buckets_version = 0
        self._published_through = -1  # sealed_through as registered
        self._seal_exec = ThreadPoolExecutor(1, thread_name_prefix="raydelay-seal")
        self._seal_lock = threading.Lock()
        # Due queries of the unsealed index run on their own thread, so that a commit's
        # fsync or a ledger roll (a coordinator call) on the log's thread never holds one
        # up; the index itself is guarded by this lock, held only while it is read or
        # changed.
        self._query_exec = ThreadPoolExecutor(1, thread_name_prefix="raydelay-query")
        self._index_lock = threading.Lock()
        self.seal_counters = {
            "sealed": 0,
            "sealed_rows": 0,
            "sealed_bytes": 0,
            "seal_s": 0.0,
            "merged": 0,
            "merged_bytes": 0,
        }
        self._index: TopicIndex | None = None
        self._delayed_runs: dict[tuple[int, int], DelayedRun] = {}
        # per recent committed object: (its last position key, its earliest deliver_at, or
        # 0 when it holds an entry due at once), for long polls that wait only for
        # entries due soon (see read's due_before_ms)
        self._marks: deque[tuple[int, int]] = deque(maxlen=_MARKS)
        if self._config.delayed.tracker == "bucket":
            self._recover_index()
        self._queue: list[tuple[AppendBatch, asyncio.Future]] = []
        self._queued_bytes = 0
        self._started = False
        self._stopping = False  # graceful stop: long polls are answered at once
        # (asyncio's primitives bind to the event loop on first use, not here)
        self._tail_changed = asyncio.Condition()
        self._waiters: set[_Waiter] = set()  # standing long polls of reads (_wait_urgent)
        self._work = asyncio.Event()
        self._full = asyncio.Event()

    # --- the partition's delayed index -----------------------------------------------------

    @property
    def _bucket_index(self) -> TopicIndex:
        if self._index is None:  # (callers check the tracker kind first)
            raise InvalidArgument("delayed.tracker: the partition index needs tracker = 'bucket'")
        return self._index

    def _recover_index(self) -> None:
        """Load the registered buckets, delete orphans of a seal that died half-way, and
        rebuild the unsealed range from the ledgers after the last sealed one."""
        started = time.monotonic()
        name = registry_name(self._topic, self._partition)
        records = self._registry.list(name)
        through = records.pop(THROUGH_KEY, None)
        self._published_through = -1 if through is None else int(msgpack.unpackb(through))
        self._take_records(records)
        for key in clean(self._sealed, records):
            log.warning("%s/%d: cleaned up bucket %s", self._topic, self._partition, key)
        d = self._config.delayed
        self._index = TopicIndex(
            min_index_count=d.min_index_count_per_bucket, sealed_through=self._published_through
        )
        rebuilt = 0
        for info in self._log.ledgers:
            if info.ledger_id <= self._published_through:
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
        if self._over_limit():
            self._seal_exec.submit(self._merge_buckets)
        log.info(
            "%s/%d: delayed index recovered in %.2f s: %d buckets, sealed through ledger %d, "
            "%d delayed entries unsealed",
            self._topic,
            self._partition,
            time.monotonic() - started,
            len(self._buckets),
            self._published_through,
            rebuilt,
        )

    def _on_object(self, obj) -> None:
        """A committed object (on the log's thread): into the index; an object of delayed
        entries only is remembered, so that log reads of shared subscriptions skip it."""
        last = key_of(obj.ledger_id, obj.first_entry + obj.count - 1)
        with self._index_lock:
            delayed = self._bucket_index.add(obj)
        if delayed == obj.count:
            d = int(obj.entries.deliver_at_ms.min())
            self._delayed_runs[(obj.ledger_id, obj.first_entry)] = DelayedRun(
                obj.ledger_id, obj.first_entry, obj.count, d
            )
            self._marks.append((last, d))
        else:
            self._marks.append((last, 0))

    def _on_roll(self, closed: int) -> None:
        """A ledger closed (on the log's thread): seal the range off the append path."""
        with self._index_lock:
            job = self._bucket_index.ledger_closed(closed)
        if job is not None:
            self._seal_exec.submit(self._seal_retrying, self._with_ledgers(job))

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
        self._merge_buckets()

    # --- merges ---------------------------------------------------------------------------

    def _take_records(self, records: dict[str, bytes]) -> None:
        """The bucket list from the registry's records (on recovery, or after a merge
        that may or may not have been registered)."""
        with self._seal_lock:
            self._buckets = sorted(parse_bucket_key(k)[:2] + (k,) for k in records)
            self._bucket_rows = {k: int(msgpack.unpackb(r)[0]) for k, r in records.items()}
            self._buckets_version += 1

    def _over_limit(self) -> bool:
        limit = self._config.delayed.max_num_buckets
        return 0 < limit < len(self._buckets)

    def _merge_buckets(self) -> None:
        """On the seal thread: merge adjacent buckets, the smallest first, until at most
        ``max_num_buckets`` remain. A merge that fails is tried again after the next seal
        or retention pass."""
        while self._over_limit():
            window = merge_window(
                [self._bucket_rows.get(k, 0) for _, _, k in self._buckets],
                len(self._buckets) - self._config.delayed.max_num_buckets,
            )
            keys = [self._buckets[i][2] for i in window]
            try:
                self._merge(keys)
            except Exception as exc:  # noqa: BLE001 - the sources stay valid
                log.warning(
                    "%s/%d: merging buckets %s failed (%s); tried again later",
                    self._topic,
                    self._partition,
                    keys,
                    exc,
                )
                try:
                    self._resync_buckets()
                except Exception:  # noqa: BLE001 - the next merge resyncs again
                    log.exception("%s/%d: reloading the bucket list", self._topic, self._partition)
                return

    def _merge(self, keys: list[str]) -> None:
        """Merge the adjacent buckets ``keys`` (see :func:`raydelay.delayed.store.merge`)."""
        started = time.monotonic()
        d = self._config.delayed
        done = merge(
            self._sealed,
            keys,
            bucket_id=time.time_ns() // 1000,
            group_rows=d.max_indexes_per_segment if d.max_indexes_per_segment > 0 else 5_000,
            register=self._register_merge,
        )
        if done is None:  # a source went meanwhile (retention): this merge is void
            self._resync_buckets()
            return
        merged, written = done
        gone = set(keys)
        with self._seal_lock:
            self._buckets = sorted(
                [b for b in self._buckets if b[2] not in gone]
                + [(merged.start_ledger, merged.end_ledger, merged.key)]
            )
            for k in keys:
                self._bucket_rows.pop(k, None)
            self._bucket_rows[merged.key] = merged.count
            self._buckets_version += 1
        c = self.seal_counters
        c["merged"] += 1
        c["merged_bytes"] += written
        self._metrics.bucket_op("merge", time.monotonic() - started, written)
        log.info(
            "%s/%d: merged %d buckets into %s: %d runs, %d groups, %d rows (%d bytes written)",
            self._topic,
            self._partition,
            len(keys),
            merged.key,
            len(merged.runs),
            len(merged.groups),
            merged.count,
            written,
        )

    def _register_merge(
        self, keys: list[str], merged: SealedMeta, record: bytes, runs: list[int]
    ) -> bool:
        name = registry_name(self._topic, self._partition)
        try:
            return bool(
                self._coordinator.call_from_thread(
                    CoordinatorActor.merge_buckets,
                    self._topic,
                    self._partition,
                    name,
                    keys,
                    merged.key,
                    record,
                    runs,
                )
            )
        except Exception:
            # registered or not? (if this fails too, the merged meta is an orphan that
            # the partition's next recovery deletes)
            if merged.key in self._resync_buckets():
                return True
            self._sealed.delete_meta(merged.key)
            raise

    def _resync_buckets(self) -> set[str]:
        """After a merge whose outcome is not known: the bucket list as registered; returns
        the keys registered."""
        name = registry_name(self._topic, self._partition)
        records = self._registry.list(name)
        records.pop(THROUGH_KEY, None)
        self._take_records(records)
        return set(records)

    def _delete_buckets(self, keys: list[str]) -> list[str]:
        """On the seal thread (after any merge under way): delete the buckets of ``keys``
        still listed (one merged meanwhile is not), objects first, then their registry
        entries; returns the keys deleted."""
        with self._seal_lock:  # subscriptions stop loading them first
            listed = {k for _, _, k in self._buckets}
            doomed = [k for k in keys if k in listed]
            self._buckets = [b for b in self._buckets if b[2] not in set(doomed)]
            for k in doomed:
                self._bucket_rows.pop(k, None)
            self._buckets_version += 1
        for key in doomed:
            started = time.monotonic()
            self._sealed.delete(key)
            self._metrics.bucket_op("delete", time.monotonic() - started)
        name = registry_name(self._topic, self._partition)
        self._registry.apply([("remove", name, k, None) for k in doomed])
        return doomed

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
            with self._seal_lock:
                self._bucket_rows[meta.key] = meta.count
        self._publish(job.end_ledger, entry)
        if sealed is None:
            return
        c = self.seal_counters
        c["sealed"] += 1
        c["sealed_rows"] += meta.count
        c["sealed_bytes"] += written
        c["seal_s"] += time.monotonic() - started
        self._metrics.bucket_op("create", time.monotonic() - started, written)
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
        with self._seal_lock, self._index_lock:
            if entry is not None:
                self._buckets = sorted(self._buckets + [entry])
                self._buckets_version += 1
            self._published_through = max(self._published_through, end_ledger)
            self._bucket_index.published(end_ledger)

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
        self._ensure_started()

        def query() -> DueReply:
            # (the answer and the buckets it reports, at one moment)
            with self._seal_lock, self._index_lock:
                rows, below, next_d, waiting = self._bucket_index.due(
                    int(taken_below), int(taken_through), int(now_ms)
                )
                through, version = self._published_through, self._buckets_version
                listed = None
                if version != int(known_version) or through > int(known_through):
                    listed = BucketList(version, through, [k for _, _, k in self._buckets])
            batch = compact(rows.to_batch())
            return DueReply(batch, below, next_d, waiting, through, version, listed)

        return await self._run(query, on=self._query_exec)

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
        self._ensure_started()

        def query() -> Rows:
            with self._index_lock:
                rows = self._bucket_index.untaken(int(taken_below), int(taken_through))
            return page_of(rows, q, start, int(page))

        return compact((await self._run(query, on=self._query_exec)).to_batch())

    async def unsealed_histogram(self, edges: list[int], now_ms: int) -> list[int]:
        """Rows of the unsealed ledgers not due yet, per due window."""
        self._ensure_started()
        edges_arr = np.asarray(edges, dtype=np.int64)

        def histogram() -> np.ndarray:
            with self._index_lock:
                return self._bucket_index.waiting_histogram(edges_arr, int(now_ms))

        out = await self._run(histogram, on=self._query_exec)
        return out.tolist()

    async def buckets(self) -> BucketList:
        """The partition's sealed buckets: their keys, the ledger every ledger up to which
        is indexed (``through``), and a version that changes with the list."""
        self._ensure_started()
        with self._seal_lock:
            return BucketList(
                self._buckets_version, self._published_through, [k for _, _, k in self._buckets]
            )

    def _roll(self, closed: int | None, count: int) -> int:
        return int(
            self._coordinator.call_from_thread(
                CoordinatorActor.roll_ledger, self._topic, self._partition, closed, count
            )
        )

    def _ensure_started(self) -> None:
        if self._started:
            return
        self._started = True
        self._committer_task = asyncio.get_running_loop().create_task(self._committer())

    def close(self) -> None:
        """Stop its loop and threads (its host drops it: the topic is being deleted, or
        the host is going away). Appends waiting in the queue fail as Unavailable."""
        if self._started:
            self._committer_task.cancel()
        for _, fut in self._queue:
            if not fut.done():
                fut.set_exception(Unavailable(f"topic {self._topic}/{self._partition} closed"))
        self._queue = []
        for pool in (self._exec, self._seal_exec, self._query_exec):
            pool.shutdown(wait=False)

    async def _run(self, fn, *args, on: ThreadPoolExecutor | None = None):
        """``fn(*args)`` on the log's thread (or on the executor ``on``)."""
        return await asyncio.get_running_loop().run_in_executor(on or self._exec, fn, *args)

    # --- appending ------------------------------------------------------------------------

    async def append(self, batch: bytes | list[bytes]) -> list:
        """Append one batch (see :func:`raydelay.log.entries.encode_batch`), or a list of
        batches appended in that order; returns the position ranges [(ledger, first_entry,
        count)] of the batch (of each batch, for a list) once they are durable. Every batch
        is checked before any is queued."""
        self._ensure_started()
        many = isinstance(batch, list)
        decoded = [self._check(b) for b in (batch if isinstance(batch, list) else [batch])]
        futures = [self._queue_batch(b) for b in decoded]
        results = await asyncio.gather(*futures)
        return list(results) if many else results[0]

    def _check(self, data: bytes) -> AppendBatch:
        decoded = decode_batch(data)
        limit = self._config.topic.max_message_bytes
        too_big = np.flatnonzero(decoded.entries.payload_lengths() > limit)
        if len(too_big):
            raise InvalidArgument(
                f"payload: message {int(too_big[0])} of the batch is over "
                f"topic.max_message_bytes ({limit} bytes)"
            )
        return decoded

    def _queue_batch(self, batch: AppendBatch) -> asyncio.Future:
        """Queue ``batch`` for the next group commit (in call order); the future is its
        position ranges."""
        fut = asyncio.get_running_loop().create_future()
        self._stopping = False  # (appends go on after a graceful stop: so do long polls)
        self._queue.append((batch, fut))
        self._queued_bytes += batch.entries.nbytes()
        self._work.set()
        if self._queued_bytes >= self._config.topic.group_commit_max_bytes:
            self._full.set()
        return fut

    async def cancel(
        self, positions: list[tuple[int, int]], producer: str = "", sequence_id: int = 0
    ) -> list[tuple[int, int]]:
        """Append one durable cancel marker per target position; returns the markers'
        positions. With a producer name and sequence id the markers are deduplicated like
        any batch: a retried cancel gets the same markers back, also when its targets have
        left the log since (delivered, acknowledged and trimmed while the reply was lost).
        Raises NotFound for a position that is not in this partition's log and not in a
        ledger it deleted."""
        self._ensure_started()
        targets = [(int(lg), int(en)) for lg, en in positions]
        if not targets:
            return []
        if producer and sequence_id:
            known = await self._run(self._log.recorded, producer, int(sequence_id))
            if known is not None:
                return _positions_of(known)
        # A target in a ledger retention deleted is taken too: the ledger went once every
        # subscription had acknowledged it or held its delayed rest in a sealed bucket, so
        # the subscriptions answer whether it was kept from delivery (a cancel held up by a
        # host restart may well arrive after its message was delivered and trimmed).
        first = self._log.ledgers[0].ledger_id if self._log.ledgers else 0
        missing = [t for t in targets if t[0] >= first and not self._log.contains(*t)]
        if missing:
            raise NotFound(
                f"message {self._topic}/{self._partition}/{missing[0][0]}:{missing[0][1]} "
                "is not in the log"
            )
        n = len(targets)
        entries = Entries.build(
            [b""] * n, np.full(n, NO_DELAY, dtype=np.int64), cancels=dict(enumerate(targets))
        )
        return _positions_of(await self._queue_batch(AppendBatch(producer, sequence_id, entries)))

    async def _committer(self) -> None:
        """One commit in flight at a time; each takes what queued while the last was written
        (no timer: with ``topic.group_commit_ms`` = 0, the default, a lone append is
        written at once)."""
        linger_s = self._config.topic.group_commit_ms / 1000
        while True:
            await self._work.wait()
            if linger_s > 0 and not self._full.is_set():
                try:
                    await asyncio.wait_for(self._full.wait(), timeout=linger_s)
                except asyncio.TimeoutError:
                    pass
            batch = self._take()
            self._full.clear()
            if not self._queue:
                self._work.clear()
            try:
                results = await self._run(self._log.commit, [b for b, _ in batch])
            except Exception as exc:  # noqa: BLE001 - every caller gets the failure
                log.exception("group commit failed")
                results = [exc] * len(batch)
            for (_, fut), result in zip(batch, results, strict=True):
                if fut.done():
                    continue
                if isinstance(result, BaseException):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)
            entries = self._log.stats_counters["entries"]  # re-sent batches are not counted
            self._metrics.published(entries - self._published)
            self._published = entries
            self._wake_waiters()
            async with self._tail_changed:
                self._tail_changed.notify_all()

    def _take(self) -> list[tuple[AppendBatch, asyncio.Future]]:
        """The queued batches up to group_commit_max_bytes (at least one)."""
        limit = self._config.topic.group_commit_max_bytes
        taken, size = 0, 0
        for batch, _ in self._queue:
            size += batch.entries.nbytes()
            taken += 1
            if size >= limit:
                break
        out, self._queue = self._queue[:taken], self._queue[taken:]
        self._queued_bytes -= size
        return out

    # --- reading --------------------------------------------------------------------------

    async def read(
        self,
        from_position: tuple[int, int],
        max_entries: int,
        wait_s: float = 0.0,
        skip_delayed: bool = False,
        due_within_ms: int | None = None,
    ) -> ReadReply:
        """Ledger objects with entries at or after ``from_position`` (see ReadReply), the tail,
        and the ledger list. With ``wait_s`` (seconds), a reader that is caught up waits
        that long for new entries first (one call instead of a poll plus a read). With
        ``skip_delayed``, an object of delayed entries only (this actor indexed them) comes
        as a :class:`~raydelay.log.entries.DelayedRun`; and with ``due_within_ms`` too, the
        wait ends at once only for an entry due at once or within that many ms, or when one
        it passed over comes that close to its time; entries due later end it after
        TRICKLE_S: a reader that takes delayed rows from this partition's index wakes once
        a second in a steady stream of messages due later, and an idle one not at all."""
        self._ensure_started()
        position = (int(from_position[0]), int(from_position[1]))
        if not (skip_delayed and self._index is not None):
            due_within_ms = None
        if wait_s > 0:
            await self._wait_urgent(position, due_within_ms, float(wait_s))
        runs = None
        if skip_delayed and self._index is not None:
            runs = lambda ledger_id, first: self._delayed_runs.get((ledger_id, first))  # noqa: E731
        reply = await self._run(
            self._log.read, (int(from_position[0]), int(from_position[1])), int(max_entries), runs
        )
        return ReadReply(
            SHARED.share(reply.objects),
            reply.tail,
            [(x.ledger_id, x.count) for x in self._log.ledgers],
            self._buckets_version,
        )

    async def _wait_urgent(
        self, position: tuple[int, int], within_ms: int | None, wait_s: float
    ) -> None:
        """Wait (up to ``wait_s``) until the log holds an entry at or after ``position`` due
        at once or within ``within_ms`` from the moment it is looked at (None: any entry).
        Entries due later end the wait too, but no sooner than TRICKLE_S after it began: a
        steady stream of them wakes a reader once a TRICKLE_S, and an idle log never.

        A waiter is a future that each commit looks at where it is made (``_wake_waiters``)
        and sets only when its reader has something to read: a commit does not wake every
        standing long poll of the partition (32 subscriptions would be 32 task switches a
        commit, to look and sleep again)."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(position, within_ms, time.monotonic(), loop.create_future())
        if self._stopping or self._ready_to_read(waiter, tuple(self._marks)):
            return
        self._waiters.add(waiter)
        deadline = loop.call_later(min(max(wait_s, 0.0), MAX_WAIT_S), waiter.wake)
        try:
            await waiter.future
        finally:
            self._waiters.discard(waiter)
            deadline.cancel()
            if waiter.timer is not None:
                waiter.timer.cancel()

    def _wake_waiters(self) -> None:
        """After a commit (on the event loop): wake each standing long poll whose reader
        now has something to read; arm the timer of one that has entries due later only."""
        marks = tuple(self._marks)  # (appended on the log's thread; one copy for all)
        for waiter in list(self._waiters):
            if self._stopping or self._ready_to_read(waiter, marks):
                waiter.wake()

    def _ready_to_read(self, waiter: _Waiter, marks: tuple[tuple[int, int], ...]) -> bool:
        """Whether ``waiter``'s read should happen now: the log holds an entry for it due
        at once or within its horizon, or entries due later for TRICKLE_S already. When it
        should not, its timer is set for the earliest moment that changes without a commit:
        TRICKLE_S after it began, or an entry it passed over coming within its horizon.
        ``marks``: a copy of the recent commits' marks."""
        horizon = (
            None if waiter.within_ms is None else time.time_ns() // 1_000_000 + waiter.within_ms
        )
        if self._has_urgent_at(waiter.position, horizon, marks):
            return True
        if not self._has_entries_at(waiter.position):
            return False
        left = waiter.started + TRICKLE_S - time.monotonic()
        if left <= 0:
            return True
        nxt = None if horizon is None else self._next_due_at(waiter.position, marks)
        if nxt is not None:  # an entry passed over comes within the horizon then
            left = min(left, max(0.001, (nxt - horizon) / 1000))  # type: ignore[operator]
        waiter.arm(left)
        return False

    def _has_entries_at(self, position: tuple[int, int]) -> bool:
        tail = self._log.tail()
        return tail is not None and tail >= position

    def _has_urgent_at(
        self,
        position: tuple[int, int],
        due_before_ms: int | None,
        marks: tuple[tuple[int, int], ...],
    ) -> bool:
        """Whether the log holds an entry at or after ``position`` that is due at once or
        before ``due_before_ms`` (None: any entry), as ``marks`` tell."""
        if not self._has_entries_at(position):
            return False
        if due_before_ms is None:
            return True
        start = key_of(*position)
        if not marks or marks[0][0] >= start:
            return True  # older objects than the marks remember: read them
        for last, d in reversed(marks):
            if last < start:
                return False
            if d < due_before_ms:
                return True
        return False

    def _next_due_at(
        self, position: tuple[int, int], marks: tuple[tuple[int, int], ...]
    ) -> int | None:
        """The earliest deliver_at of the delayed-only objects at or after ``position`` that
        ``marks`` remember (None: none)."""
        start = key_of(*position)
        out = None
        for last, d in reversed(marks):
            if last < start:
                break
            if d and (out is None or d < out):
                out = d
        return out

    async def read_positions(self, keys) -> pa.RecordBatch:
        """The entries at ``keys`` (int64 position keys ``ledger << 32 | entry``, one array) as
        one record batch of rows (:data:`raydelay.log.entries.ROWS_SCHEMA`), sorted by
        position; positions not in the log are left out."""
        self._ensure_started()
        keys = np.asarray(keys, dtype=np.int64)
        rows = await self._run(self._log.read_positions, keys)
        if len(rows) < len(keys) and self._buckets:
            # Positions whose ledger is gone: their delayed entries live on in a bucket.
            missing = np.setdiff1d(keys, rows.positions)
            extra = await asyncio.to_thread(self._sealed.read_positions, missing, self._buckets)
            if len(extra):
                rows = Rows.concat([rows, extra])
        return compact(rows.to_batch())

    async def wait_for_entries(self, after_position, timeout_s: float):
        """Return the tail position once it is past ``after_position`` (or None was given
        and any entry exists), or at ``timeout_s`` (seconds) with the tail as it is."""
        self._ensure_started()
        after = None if after_position is None else (int(after_position[0]), int(after_position[1]))

        def moved() -> bool:
            tail = self._log.tail()
            return tail is not None and (after is None or tail > after)

        await self._wait_until(moved, timeout_s)
        return self._log.tail()

    async def _wait_until(self, ready: Callable[[], bool], timeout_s: float) -> None:
        """Wait until ``ready()`` holds after a commit, or ``timeout_s`` (seconds) passed (or
        the partition is stopping)."""
        timeout_s = min(max(float(timeout_s), 0.0), MAX_WAIT_S)
        async with self._tail_changed:
            try:
                await asyncio.wait_for(
                    self._tail_changed.wait_for(lambda: self._stopping or ready()),
                    timeout=timeout_s,
                )
            except asyncio.TimeoutError:
                pass

    async def cancel_markers(self, from_position: tuple[int, int]) -> list:
        """(marker, target) positions of every cancel marker at or after ``from_position``."""
        self._ensure_started()
        position = (int(from_position[0]), int(from_position[1]))
        return await self._run(self._log.cancel_markers, position)

    async def position_at(self, time_ms: int):
        """The first position published at or after ``time_ms`` (epoch ms), or None."""
        self._ensure_started()
        return await self._run(self._log.position_at, int(time_ms))

    async def last_sequence(self, producer: str) -> int:
        self._ensure_started()
        return await self._run(self._log.last_sequence, producer)

    async def pid(self) -> int:
        """The process id (tests use it to see a restart)."""
        return os.getpid()

    async def tail(self):
        return self._log.tail()

    async def close_ledger(self) -> bool:
        """Close the open ledger at its size (graceful shutdown); appends go on in a new one.
        Standing long polls are answered now (the host is about to stop)."""
        self._ensure_started()
        self._stopping = True
        self._wake_waiters()
        async with self._tail_changed:
            self._tail_changed.notify_all()
        return await self._run(self._log.close_ledger)

    async def ledgers(self) -> list[tuple[int, int | None]]:
        """The log's ledgers: (id, entry count, or None while open)."""
        self._ensure_started()
        return [(x.ledger_id, x.count) for x in self._log.ledgers]

    async def stats(self) -> dict:
        return {
            "ledgers": [(x.ledger_id, x.count) for x in self._log.ledgers],
            "tail": self._log.tail(),
            "cached_bytes": self._log.cached_bytes,
            "queued": len(self._queue),
            "buckets": len(self._buckets),
            "sealed_through": self._published_through,
            "unsealed_delayed": self._index.count if self._index is not None else 0,
            **self.seal_counters,
            **self._log.stats_counters,
        }

    # --- retention --------------------------------------------------------------------------

    async def _trim_buckets(self) -> None:
        name = registry_name(self._topic, self._partition)
        keys = await self._coordinator.once(
            CoordinatorActor.bucket_retention, self._topic, self._partition, name, THROUGH_KEY
        )
        if keys:
            done = await self._run(self._delete_buckets, keys, on=self._seal_exec)
            if done:
                log.info(
                    "%s/%d: deleted %d finished buckets", self._topic, self._partition, len(done)
                )
        if self._over_limit():  # (a merge that failed is tried again here)
            self._seal_exec.submit(self._merge_buckets)

    async def trim(self) -> list[int]:
        """Delete the buckets every shared subscription is done with, and the ledgers no
        subscription needs; returns the ledger ids."""
        self._ensure_started()
        await self._trim_buckets()
        ids = await self._coordinator.once(CoordinatorActor.retention, self._topic, self._partition)
        ids = [i for i in ids if i != self._log.current_ledger]
        if not ids:
            return []
        deleted = await self._run(self._log.delete_ledgers, ids)
        gone = set(ids)
        for key in [k for k in self._delayed_runs if k[0] in gone]:
            del self._delayed_runs[key]
        await self._coordinator.once(
            CoordinatorActor.drop_ledgers, self._topic, self._partition, ids
        )
        log.info(
            "%s/%d: deleted ledgers %s (%d objects)", self._topic, self._partition, ids, deleted
        )
        return ids


def _positions_of(ranges: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """The positions of (ledger, first entry, count) ranges, in order."""
    return [(lg, first + i) for lg, first, count in ranges for i in range(count)]
