"""SubscriptionActor: the asyncio shell around one :class:`Subscription` (one partition).

A shared subscription indexes no delayed message itself: the topic actor does it once for
every subscription. Due delayed messages come with their payloads from the topic's
unsealed index (``due_unsealed``) and from the partition's sealed buckets (see
:mod:`raydelay.dispatch.sealed`); the log is read for everything else, and an in-memory
tracker holds only this subscription's delayed nacks.

These loops run beside the calls:

- the **pump** reads the log ahead (bounded by ``subscription.read_ahead_entries``)
  and long-polls the topic actor when caught up;
- the **timer** sleeps until the next deliver_at (tracker, sealed buckets, the topic's
  unsealed index) or the next ack deadline, asks the topic for due unsealed rows, then
  wakes waiting ``receive`` calls (it never spins: with nothing scheduled it
  waits for a change);
- the **loader** loads the segments of sealed buckets whose deliver_at comes near;
- the **persister** writes the cursor at most once per
  ``subscription.cursor_persist_interval_ms`` and reports mark-delete, the log mark
  and the progress through each sealed bucket to the coordinator.

The actor never blocks its event loop: store writes run on a thread, and the
bucket tracker does its own I/O on its threads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import ray

from raydelay.actors.coordinator import coordinator_peer
from raydelay.actors.metrics import SubscriptionMetrics
from raydelay.actors.registry import CoordinatorRegistry
from raydelay.actors.topic import spawn_topic, topic_peer
from raydelay.clock import SystemClock
from raydelay.cluster import placement, rpc
from raydelay.cluster.handles import Peer
from raydelay.cluster.names import subscription_actor_name, topic_actor_name
from raydelay.cluster.nodes import check_store
from raydelay.cluster.rpc import in_thread
from raydelay.config import Config, config_from_dict
from raydelay.delayed import InMemoryDelayedDeliveryTracker
from raydelay.delayed.sealed import SealedMeta, parse_bucket_key
from raydelay.dispatch.cursor import Cursor, Position
from raydelay.dispatch.keys import position_of
from raydelay.dispatch.objects import Group, ObjectCache
from raydelay.dispatch.sealed import SealedReader
from raydelay.dispatch.subscription import SPREAD_TYPES, Delivery, Subscription
from raydelay.dispatch.wire import delivery_batch
from raydelay.errors import CodecError, ConsumerBusy, InvalidArgument, NotFound
from raydelay.log.buckets import SealedStore
from raydelay.log.entries import (
    NO_DELAY,
    AppendBatch,
    DelayedRun,
    Entries,
    Rows,
    concat_entries,
    decode_object,
    encode_batch,
)
from raydelay.storage import CountingObjectStore, make_store
from raydelay.storage.keys import cursor_key, subscription_prefix

log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.25  # the timer's longest sleep when nothing is scheduled
_LONG_POLL_S = 5.0
_READ_CHUNK = 5_000
# Payloads read from the topic actor per receive: due delayed messages are scattered over
# the log, so a read costs about one ranged read each; smaller reads reach the consumer
# sooner. Payloads the decoded objects here still hold are not capped.
_FETCH_MAX = 2_000
_REPORT_S = 1.0  # how often metrics are reported
_PUMP_LINGER_S = 0.005
_DECODED_ENTRIES = 200_000  # entries of decoded ledger objects kept for payload fetches
_LOAD_POLL_S = 0.2  # the loader's longest sleep
_STAGED_ROWS = 200_000  # sealed-bucket rows kept for delivery before they are pruned
# How soon the topic's unsealed index is asked after new delayed rows were read (for the
# counts and new buckets; a due row is asked for at its deliver_at, whatever this is).
_TAIL_POLL_S = 1.0
_DELAYED_MARK_STEP_MS = 5_000  # how far ahead the persisted delayed mark moves


class SubscriptionActor:
    def __init__(self, topic: str, partition: int, subscription: str, config: dict) -> None:
        # Recovery makes blocking calls; off the event loop's thread they block nothing else.
        in_thread(
            rpc.recover,
            self._init,
            topic,
            partition,
            subscription,
            config,
            what=f"sub/{topic}/{partition}/{subscription}",
        )

    def _init(self, topic: str, partition: int, subscription: str, config: dict) -> None:
        started = time.monotonic()
        self._topic, self._partition, self._name = topic, partition, subscription
        self._config: Config = config_from_dict(config)
        self._config_dict = config
        self._dlq_peers: dict[str, Any] = {}  # dead-letter topic -> its partition 0's actor
        check_store(self._config.storage)  # before anything is written where it should not be
        self._metrics = SubscriptionMetrics(topic, partition, subscription)
        self._clock = SystemClock()
        self._deadline_s = self._config.client.retry_deadline_s
        self._coordinator = coordinator_peer(config)
        self._topic_actor = topic_peer(topic, partition, config)
        self._options = self._coordinator.call_from_thread(
            "subscription", topic, subscription, deadline_s=self._deadline_s
        )
        self._store = CountingObjectStore(make_store(self._config))
        self._prefix = subscription_prefix(topic, partition, subscription)
        self._sealed_store = SealedStore(self._store, topic, partition)
        cursor, dispatched_before, self._cursor_version = self._load_cursor()
        self._cursor = cursor
        reader = None
        if self._options["type"] in SPREAD_TYPES and self._config.delayed.tracker == "bucket":
            reader = SealedReader()
        self._sub = Subscription(
            name=f"{topic}/{partition}/{subscription}",
            subscription_type=self._options["type"],
            tracker=self._make_tracker(),
            clock=self._clock,
            cursor=cursor,
            dispatched_before=dispatched_before,
            ack_timeout_ms=_ms(self._options.get("ack_timeout_s")),
            max_redeliveries=self._options.get("max_redeliveries"),
            read_ahead_entries=self._config.subscription.read_ahead_entries,
            sealed=reader,
        )
        self._lease_ms = int(self._config.subscription.consumer_lease_s * 1000)
        self._rewinds: dict[str, int] = {}  # consumer -> its redeliver-all calls so far
        self._bucket_version: int | None = None
        self._tail_asked = 0.0
        self._load_times: deque[tuple[str, float]] = deque(maxlen=10_000)
        self._reported_progress: tuple | None = None
        if reader is not None:
            self._recover_buckets()
        self._objects = ObjectCache(_DECODED_ENTRIES)
        self._persisted: tuple[Any, ...] | None = None
        self._started = False
        self._closed = False
        ledgers = self._topic_actor.call_from_thread("ledgers", deadline_s=self._deadline_s)
        loose = self._sub.resume_after_buckets(ledgers)
        tail = self._topic_actor.call_from_thread("tail", deadline_s=self._deadline_s)
        self._sub.tail = None if tail is None else (int(tail[0]), int(tail[1]))
        self._learn_cancels()
        # Filled in until the first delivery after this start: what recovery cost.
        self._recovery: dict[str, Any] = {
            "started": started,
            "init_s": round(time.monotonic() - started, 3),
            "loose": loose,
            "read_from": list(self._sub.read_position),
            "delayed": self._sub.tracker.number_of_delayed_messages(),
            "log_bytes": 0,
        }
        if loose or self._sub.read_position != self._sub.start_position:
            log.info(
                "%s: resuming the log at %s after the buckets, %d loose positions to re-read",
                self._sub.name,
                self._sub.read_position,
                loose,
            )

    # --- construction ----------------------------------------------------------------------

    def _make_tracker(self):
        """The in-memory tracker: this subscription's delayed nacks (and, with
        ``delayed.tracker = "memory"``, the delayed positions it reads from the log)."""
        d = self._config.delayed
        return InMemoryDelayedDeliveryTracker(
            clock=self._clock,
            tick_time_ms=d.tick_time_ms,
            strict=d.strict,
            fixed_delay_lookahead=d.fixed_delay_lookahead,
        )

    def _recover_buckets(self) -> None:
        """Take up the partition's sealed buckets where this subscription left them."""
        info = self._topic_actor.call_from_thread("buckets", deadline_s=self._deadline_s)
        progress = self._coordinator.call_from_thread(
            "progress", self._topic, self._partition, self._name, deadline_s=self._deadline_s
        )
        for meta in self._load_metas(info["buckets"]):
            self._sub.adopt(meta, done=progress.get(meta.key, 0))
        self._sub.sealed.sealed_through = max(self._sub.sealed.sealed_through, info["through"])
        self._bucket_version = info["version"]

    def _load_metas(self, keys: list[str]) -> list[SealedMeta]:
        """The metas of ``keys`` (read in parallel), in ledger order; a bucket deleted
        meanwhile is left out."""

        def one(key: str) -> SealedMeta | None:
            try:
                return self._sealed_store.meta(key)
            except NotFound:
                return None

        if not keys:
            return []
        with ThreadPoolExecutor(min(8, len(keys))) as pool:
            metas = [m for m in pool.map(one, keys) if m is not None]
        return sorted(metas, key=lambda m: m.start_ledger)

    async def _refresh_buckets(self, upto: int) -> None:
        """Adopt the new buckets that end at or before ledger ``upto`` and forget the ones
        deleted. Only the timer calls it, before it takes in a due query's answer that
        reports them sealed (see ``Subscription.adopt``)."""
        info = await self._topic_actor.once("buckets")
        sealed = self._sub.sealed
        keys = set(info["buckets"])
        for gone in [k for k in sealed.buckets if k not in keys]:
            sealed.forget(gone)
        new = [k for k in info["buckets"] if k not in sealed.buckets]
        ready = [k for k in new if parse_bucket_key(k)[1] <= upto]
        for meta in await asyncio.to_thread(self._load_metas, ready):
            self._sub.adopt(meta)
        sealed.sealed_through = max(sealed.sealed_through, min(info["through"], upto))
        if len(ready) == len(new):
            self._bucket_version = info["version"]
        self._load_wake.set()

    async def _query_tail(self, now: int) -> None:
        """Take the due rows of the topic's unsealed index; adopt first the buckets its
        answer reports sealed."""
        self._sub.tail_dirty = False
        self._tail_asked = time.monotonic()
        below, through = self._sub.tail_taken
        reply = await self._topic_actor.once("due_unsealed", below, through, now)
        if (
            reply["through"] > self._sub.sealed.sealed_through
            or reply["version"] != self._bucket_version
        ):
            await self._refresh_buckets(upto=reply["through"])
        rows = Rows.from_batch(reply["rows"])
        self._count_log_bytes(int(reply["rows"].nbytes))
        if self._sub.take_unsealed(rows, reply["below"], now, reply["next_d"], reply["waiting"]):
            await self._notify()

    def _tail_query_due(self, now: int) -> bool:
        sub = self._sub
        if sub.sealed is None:
            return False
        if sub.tail_next is not None and sub.tail_next <= now:
            return True
        return sub.tail_dirty and time.monotonic() - self._tail_asked >= _TAIL_POLL_S

    def _drop_legacy_buckets(self) -> int:
        """Delete the buckets this subscription indexed by itself before the topic did it
        for all (stores written before sealed buckets): the topic re-indexed every retained
        ledger when it came up, so they are not needed. Returns objects deleted."""
        registry = CoordinatorRegistry(
            self._coordinator, deadline_s=self._config.client.retry_deadline_s
        )
        records = registry.list(self._prefix)
        doomed = self._store.list(f"{self._prefix}/buckets/") + self._store.list(
            f"{self._prefix}/tombs/"
        )
        for key in doomed:
            self._store.delete(key)
        if records:
            registry.apply([("remove", self._prefix, k, None) for k in records])
            log.info(
                "%s: deleted %d buckets it had indexed itself (the topic indexes them now)",
                self._sub.name,
                len(records),
            )
        return len(doomed)

    def _load_cursor(self) -> tuple[Cursor, Position, int]:
        keys = self._store.list(f"{self._prefix}/cursor/")
        for key in reversed(keys):
            try:
                cursor, read = Cursor.decode(self._store.get(key), key)
            except (CodecError, NotFound) as exc:
                log.error("cursor %s unusable, trying an older one: %s", key, exc)
                continue
            return cursor, read, int(key.rsplit("/", 1)[1])
        md = self._coordinator.call_from_thread(
            "mark_delete", self._topic, self._partition, self._name, deadline_s=self._deadline_s
        )
        return Cursor((md[0], md[1])), (-1, -1), 0

    def _learn_cancels(self) -> None:
        """Before delivering anything, learn every cancel marker ahead of the read position:
        a cancel this subscription applied before it died stays applied."""
        pairs = self._topic_actor.call_from_thread(
            "cancel_markers", self._sub.read_position, deadline_s=self._deadline_s
        )
        learned = self._sub.learn_cancels(pairs)
        if learned:
            log.info("%s: %d cancel markers ahead of the read position", self._sub.name, learned)

    def _ensure_started(self) -> None:
        if self._started:
            return
        self._started = True
        self._changed = asyncio.Event()  # wakes the timer
        self._space = asyncio.Event()  # wakes the pump when read-ahead has room
        self._available = asyncio.Condition()  # wakes receive calls
        self._persist_lock = asyncio.Lock()
        self._dlq_lock = asyncio.Lock()
        self._load_wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        loops = [self._pump, self._timer, self._persister, self._reporter]
        if self._sub.sealed is not None:
            loops.append(self._loader)
        for loop_fn in loops:
            loop.create_task(loop_fn())
        loop.create_task(self._cleanup_legacy())

    async def _notify(self) -> None:
        async with self._available:
            self._available.notify_all()

    # --- consumers --------------------------------------------------------------------------

    async def add_consumer(self, consumer_id: str) -> None:
        self._ensure_started()
        self._sub.add_consumer(consumer_id, self._clock.now_ms())

    async def heartbeat(self, consumer_id: str) -> bool:
        """The consumer's client is alive: its lease starts again. A consumer this actor does
        not know (it restarted, or the lease had lapsed) is added back if it can be; False
        when it cannot (an exclusive subscription that has another consumer now)."""
        self._ensure_started()
        if self._sub.touch(consumer_id, self._clock.now_ms()):
            return True
        try:
            self._sub.add_consumer(consumer_id, self._clock.now_ms())
        except ConsumerBusy:
            return False
        self._changed.set()
        return True

    async def remove_consumer(self, consumer_id: str) -> int:
        self._ensure_started()
        n = self._sub.remove_consumer(consumer_id)
        self._rewinds.pop(consumer_id, None)
        self._changed.set()
        await self._notify()
        return n

    async def receive(
        self, consumer_id: str, max_messages: int, timeout_s: float, rewinds: int = 0
    ) -> pa.RecordBatch:
        """Up to ``max_messages`` for ``consumer_id`` as one record batch (see
        :data:`raydelay.dispatch.wire.DELIVERY_SCHEMA`); waits up to ``timeout_s`` (seconds).
        ``rewinds``: how many redeliver-all calls the consumer had made when it sent this
        one; a call sent before the latest returns empty (its client drops what it holds)."""
        self._ensure_started()
        if "first_receive_s" not in self._recovery:
            self._recovery["first_receive_s"] = round(
                time.monotonic() - self._recovery["started"], 3
            )
        # a consumer a restarted actor forgot, or whose lease lapsed, is added back
        self._sub.add_consumer(consumer_id, self._clock.now_ms())
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        while True:
            if rewinds < self._rewinds.get(consumer_id, 0):
                return delivery_batch([])
            out = await self._deliver(consumer_id, int(max_messages))
            # (a standing call does not renew the lease: the client's heartbeats do, and
            # they stop when its process dies)
            if out or consumer_id not in self._sub.consumers():
                return delivery_batch(out)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return delivery_batch([])
            async with self._available:
                try:
                    await asyncio.wait_for(self._available.wait(), timeout=remaining)
                except asyncio.TimeoutError:
                    pass

    async def _deliver(self, consumer_id: str, max_messages: int) -> list[Delivery]:
        if not self._sub.can_receive(consumer_id):
            return []
        if self._sub.needs_delayed_mark(self._clock.now_ms()):
            # delayed rows due by then may go out: a restart must know they may have
            self._sub.cursor.delayed_mark = self._clock.now_ms() + _DELAYED_MARK_STEP_MS
            await self._persist(force=True, report=False)
        mark = self._sub.wanted_mark()
        if mark is not None:
            await self._persist(force=True, mark=mark, report=False)
        now = self._clock.now_ms()
        self._sub.collect_due(now, max_messages)
        if self._sub.dead:
            await self._flush_dead_letters()
        fetched = await self._fetch(self._sub.keys_to_fetch(max_messages, consumer_id), _FETCH_MAX)
        delivered_at = self._clock.now_ms()
        out = self._sub.deliver(consumer_id, fetched, max_messages, delivered_at)
        if self._sub.wants_read():  # (key_shared moves read-ahead rows on without delivering)
            self._space.set()
        if out:
            self._metrics.dispatched(sum(map(len, out)), _lateness(out, delivered_at))
            self._space.set()
            self._changed.set()
            if "first_delivery_s" not in self._recovery:
                self._close_recovery()
        return out

    def _close_recovery(self) -> None:
        r = self._recovery
        r["first_delivery_s"] = round(time.monotonic() - r.pop("started"), 3)
        r["first_delivery_at_ms"] = self._clock.now_ms()
        r["store_bytes"] = self._store.bytes_read

    async def _fetch(self, keys: np.ndarray, max_reads: int | None = None) -> list[Group]:
        """Payloads for positions (int64 keys), grouped by source: the decoded objects kept
        here, else rows read from the topic actor (positions it no longer has are dropped).
        With ``max_reads``, at most that many (the lowest) are read from the topic actor;
        the others are left out of the result."""
        if not len(keys):
            return []
        groups, need = self._sub.staged(np.asarray(keys, dtype=np.int64))
        if len(need):
            cached, need = self._objects.lookup(need)
            groups += cached
        if max_reads is not None and len(need) > max_reads:
            need = np.sort(need)[:max_reads]
        if len(need):
            rows = await self._read_rows(need)
            found = np.isin(need, rows.positions)
            if found.any():
                got = need[found]
                groups.append((rows, np.searchsorted(rows.positions, got), got))
            if not found.all():
                self._sub.drop_missing(need[~found])
        return groups

    async def _read_rows(self, keys: np.ndarray) -> Rows:
        batch = await self._topic_actor.once("read_positions", keys.astype(np.int64))
        self._count_log_bytes(int(batch.nbytes))
        return Rows.from_batch(batch)

    def _count_log_bytes(self, nbytes: int) -> None:
        """Bytes read from the log, counted until the first delivery (what recovery read)."""
        if "first_delivery_s" not in self._recovery:
            self._recovery["log_bytes"] += nbytes

    async def ack(self, consumer_id: str, keys) -> int:
        """Acknowledge positions: one int64 array of keys ``ledger << 32 | entry``."""
        self._ensure_started()
        self._sub.touch(consumer_id, self._clock.now_ms())
        n = self._sub.ack(consumer_id, _keys(keys))
        if n and self._sub.type == "key_shared" and self._sub.redeliver:
            await self._notify()  # the acks may free keys another consumer waits for
        return n

    async def nack(self, consumer_id: str, keys, delay_s: float) -> int:
        """Give positions (int64 keys) back for redelivery after ``delay_s`` seconds."""
        self._ensure_started()
        self._sub.touch(consumer_id, self._clock.now_ms())
        n = self._sub.nack(consumer_id, _keys(keys), _ms(delay_s) or 0, self._clock.now_ms())
        if self._sub.dead:
            await self._flush_dead_letters()
        self._changed.set()
        await self._notify()
        return n

    async def redeliver(
        self, consumer_id: str, keys=None, rewinds: int = 0, dry_run: bool = False
    ) -> int:
        """Redeliver now what ``consumer_id`` holds unacked: the int64 ``keys``, or with None
        all of it (see ``Subscription.redeliver_unacked``). ``rewinds`` counts the consumer's
        redeliver-all calls, this one included: receive calls it sent before are answered
        empty. ``dry_run``: only check the keys."""
        self._ensure_started()
        self._sub.touch(consumer_id, self._clock.now_ms())
        if keys is None and not dry_run:
            self._rewinds[consumer_id] = max(self._rewinds.get(consumer_id, 0), int(rewinds))
        n = self._sub.redeliver_unacked(consumer_id, None if keys is None else _keys(keys), dry_run)
        if not dry_run:
            self._changed.set()
            await self._notify()
        return n

    async def cancel(
        self, targets: list[tuple[int, int]], markers: list[tuple[int, int]]
    ) -> list[bool]:
        """Apply cancels of positions of this partition whose markers are already durable in
        the log at ``markers``; True for each one that kept its message from delivery."""
        self._ensure_started()
        return [
            self._sub.cancel(int(t[0]), int(t[1]), (int(m[0]), int(m[1])))
            for t, m in zip(targets, markers, strict=True)
        ]

    async def pid(self) -> int:
        """The process id (tests use it to see a restart)."""
        return os.getpid()

    async def stats(self) -> dict:
        """The subscription's counts, plus ``recovery``: what this actor's start cost until
        its first delivery (init and first-delivery seconds, bytes read from the store by
        this actor and from the log, loose positions re-read, where the log read resumed)."""
        self._ensure_started()
        recovery = {k: v for k, v in self._recovery.items() if k != "started"}
        return self._sub.stats() | {
            "recovery": recovery,
            "tracker": self._tracker_stats(),
            "consumer_leases": self._sub.consumer_leases(self._clock.now_ms()),
        }

    def _tracker_stats(self) -> dict:
        """The counters of the sealed buckets this subscription reads: buckets taken up
        (``sealed``), segments loaded (``loaded``); {} without sealed buckets."""
        sealed = self._sub.sealed
        if sealed is None:
            return {}
        c = sealed.counters
        return {"sealed": c["adopted"], "loaded": c["segments_loaded"], **c}

    async def flush(self) -> None:
        """Persist the cursor now (and report mark-delete)."""
        self._ensure_started()
        await self._persist(force=True)

    async def close(self) -> None:
        await self.flush()
        self._closed = True

    # --- dead letters -----------------------------------------------------------------------

    async def _flush_dead_letters(self) -> None:
        """Publish waiting dead letters to the DLQ topic, then ack them. One flush at a time:
        the timer and a nack both call this, and a second flush running while the first
        awaits its publish would publish the same messages again."""
        if self._dlq_lock.locked():
            return  # the running flush takes what is waiting; the timer comes back
        async with self._dlq_lock:
            await self._flush_dead_letters_locked()

    async def _flush_dead_letters_locked(self) -> None:
        keys = self._sub.dead_letters(1_000)
        if not keys:
            return
        groups = await self._fetch(np.asarray(keys, dtype=np.int64))
        if not groups:
            return
        dlq = self._options.get("dead_letter_topic") or f"{self._topic}-{self._name}-DLQ"
        taken = concat_entries([src.entries.take(idx) for src, idx, _ in groups])
        found = np.concatenate([ks for _, _, ks in groups])
        props = [
            dict(p or {})
            | {
                "raydelay.original_message_id": f"{self._topic}/{self._partition}/{lg}:{e}",
                "raydelay.subscription": self._name,
            }
            for p, (lg, e) in zip(
                taken.properties or [None] * len(taken),
                map(position_of, found.tolist()),
                strict=True,
            )
        ]
        entries = Entries.build(
            taken.batch.column(0),
            np.full(len(taken), NO_DELAY, dtype=np.int64),
            taken.batch.column(2),
            props,
        )
        keys = found.tolist()
        target = self._dlq_peers.get(dlq)
        if target is None:
            target = self._dlq_peers[dlq] = topic_peer(dlq, 0, self._config_dict)
        await target.once("append", encode_batch(AppendBatch("", 0, entries)))
        self._sub.dead_lettered(keys)
        log.info("%s: %d messages dead-lettered to %s", self._sub.name, len(keys), dlq)

    # --- loops ------------------------------------------------------------------------------

    async def _pump(self) -> None:
        retries = rpc.Retries(log, f"{self._sub.name}: reading the log")
        while not self._closed:
            try:
                if not self._sub.wants_read():
                    self._space.clear()
                    await self._space.wait()
                    continue
                room = self._sub.read_ahead_entries - self._sub.ready_count()
                if self._sub.unread:
                    await self._reread(min(room, _READ_CHUNK))
                    continue
                sealed = self._sub.sealed is not None
                reply = await self._topic_actor.once(
                    "read", self._sub.read_position, min(room, _READ_CHUNK), _LONG_POLL_S, sealed
                )
                retries.ok()
                self._count_log_bytes(sum(len(b) for b in reply["objects"] if isinstance(b, bytes)))
                if (
                    self._sub.sealed is not None
                    and reply["buckets_version"] != self._bucket_version
                ):
                    self._sub.tail_dirty = True  # the timer asks the topic, then adopts
                    self._changed.set()
                objects = [
                    decode_object(b) if isinstance(b, bytes) else b for b in reply["objects"]
                ]
                for obj in objects:
                    if isinstance(obj, DelayedRun):
                        continue
                    if not sealed or (obj.entries.deliver_at_ms <= obj.publish_time_ms).any():
                        self._objects.add(obj)  # (delayed rows come from the topic's index)
                taken = self._sub.on_read(objects, reply["ledgers"], reply["tail"])
                if objects:
                    self._changed.set()
                    await self._notify()
                if taken < _READ_CHUNK // 4:
                    # A trickle: let a few group commits gather before the next call.
                    await asyncio.sleep(_PUMP_LINGER_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - reported and retried
                retries.failed(exc)
                await asyncio.sleep(0.5)

    async def _reread(self, max_positions: int) -> None:
        """Re-read a chunk of the loose positions a restart found before the read position."""
        keys = np.asarray(self._sub.next_unread(max_positions), dtype=np.int64)
        rows = await self._read_rows(keys)
        if self._sub.on_reread(rows, keys):
            self._changed.set()
            await self._notify()

    async def _timer(self) -> None:
        retries = rpc.Retries(log, f"{self._sub.name}: timer step")
        while not self._closed:
            try:
                now = self._clock.now_ms()
                self._sub.expire(now)
                self._expire_consumers(now)
                self._sub.prune_staged(_STAGED_ROWS)
                if self._tail_query_due(now):
                    await self._query_tail(now)
                if self._sub.dead:
                    await self._flush_dead_letters()
                if self._sub.has_deliverable():
                    await self._notify()
                retries.ok()
                nxt = self._sub.next_wakeup_ms()
                wait_s = _TAIL_POLL_S if self._sub.tail_dirty else _IDLE_WAIT_S
                if nxt is not None and nxt > now:
                    wait_s = min((nxt - now) / 1000, _IDLE_WAIT_S)
                self._changed.clear()
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout=wait_s)
                except asyncio.TimeoutError:
                    pass
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - reported and retried
                retries.failed(exc)
                await asyncio.sleep(0.5)

    def _expire_consumers(self, now: int) -> None:
        for consumer_id, handed_back in self._sub.expire_consumers(now, self._lease_ms):
            log.warning(
                "%s: consumer %s not heard from for %.0f s (subscription.consumer_lease_s): "
                "removed, %d unacknowledged messages go back for redelivery",
                self._sub.name,
                consumer_id,
                self._lease_ms / 1000,
                handed_back,
            )
            self._changed.set()

    async def _loader(self) -> None:
        """Load the segments of sealed buckets whose deliver_at comes near (a few at a time,
        on threads), then wake the receivers."""
        sealed = self._sub.sealed
        retries = rpc.Retries(log, f"{self._sub.name}: loading sealed segments")
        while not self._closed:
            try:
                wanted = sealed.wanted(self._clock.now_ms())
                if not wanted:
                    self._load_wake.clear()
                    try:
                        await asyncio.wait_for(self._load_wake.wait(), timeout=_LOAD_POLL_S)
                    except asyncio.TimeoutError:
                        pass
                    continue
                started = time.monotonic()
                results = await asyncio.gather(
                    *[
                        asyncio.to_thread(self._sealed_store.segment, key, offset, length)
                        for key, _, offset, length in wanted
                    ],
                    return_exceptions=True,
                )
                took = time.monotonic() - started
                self._load_times.extend(("load", took) for _ in wanted)
                for (key, no, _, _), rows in zip(wanted, results, strict=True):
                    if isinstance(rows, BaseException):
                        sealed.load_failed(key, no)
                        retries.failed(rows)
                        continue
                    sealed.install(key, no, rows)
                    retries.ok()
                if any(not isinstance(r, BaseException) for r in results):
                    self._changed.set()
                    await self._notify()
                else:
                    await asyncio.sleep(0.5)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - reported and retried
                retries.failed(exc)
                await asyncio.sleep(0.5)

    async def _cleanup_legacy(self) -> None:
        try:
            await asyncio.to_thread(self._drop_legacy_buckets)
        except Exception:  # noqa: BLE001 - the next start tries again
            log.exception("%s: deleting its own old buckets failed", self._sub.name)

    async def _reporter(self) -> None:
        """Once a second: gauges, bucket operations and sampled lateness to Ray's metrics."""
        while not self._closed:
            await asyncio.sleep(_REPORT_S)
            try:
                stats = self._sub.stats() | self._tracker_stats()
                times = self._load_times
                ops = [times.popleft() for _ in range(len(times))]
                self._metrics.report(stats, ops)
            except Exception:  # noqa: BLE001 - metrics must never stop the subscription
                log.exception("%s: reporting metrics failed", self._sub.name)

    async def due_histogram(self, edges: list[int]) -> list[int]:
        """Pending delayed messages per due window (see the trackers' ``due_histogram``)."""
        self._ensure_started()
        edges_arr = np.asarray(edges, dtype=np.int64)
        out = np.asarray(self._sub.tracker.due_histogram(edges_arr), dtype=np.int64)
        if self._sub.sealed is not None:
            out += np.asarray(self._sub.sealed.due_histogram(edges_arr), dtype=np.int64)
            unsealed = await self._topic_actor.once(
                "unsealed_histogram", list(edges), self._clock.now_ms()
            )
            out += np.asarray(unsealed, dtype=np.int64)
        return out.tolist()

    async def _persister(self) -> None:
        interval_s = self._config.subscription.cursor_persist_interval_ms / 1000
        retries = rpc.Retries(log, f"{self._sub.name}: persisting the cursor")
        while not self._closed:
            await asyncio.sleep(interval_s)
            try:
                await self._persist()
                retries.ok()
            except Exception as exc:  # noqa: BLE001 - reported and retried
                retries.failed(exc)

    async def _persist(
        self, force: bool = False, mark: Position | None = None, report: bool = True
    ) -> None:
        """Write the cursor (when it changed, or ``force``), then, with ``report``, tell
        the coordinator the progress. Delivery writes the cursor ahead of what it hands out,
        but never waits on the coordinator: the persister reports soon after."""
        async with self._persist_lock:
            if mark is not None and mark <= self._sub.dispatch_mark:
                return  # another call moved it meanwhile
            await self._persist_locked(force, mark or self._sub.dispatch_mark, report)
            if mark is not None:
                self._sub.dispatch_mark = mark

    async def _persist_locked(self, force: bool, mark: Position, report: bool) -> None:
        cursor = self._sub.cursor
        state = (cursor.mark_delete, cursor.individually_acked(), mark)
        if state != self._persisted or force:
            data = cursor.encode(mark)
            version = self._cursor_version + 1
            key = cursor_key(self._topic, self._partition, self._name, version)
            await asyncio.to_thread(self._write_cursor, key, data)
            self._cursor_version, self._persisted = version, state
        if report:
            await self._report_progress()

    async def _report_progress(self) -> None:
        """Tell the coordinator mark-delete, the log mark and the progress through each
        sealed bucket (what retention goes by), when they changed."""
        self._sub.advance_buckets()
        sealed = self._sub.sealed
        progress = sealed.progress() if sealed is not None else {}
        md, lm = self._sub.cursor.mark_delete, self._sub.log_cursor.mark_delete
        report = (md, lm, tuple(sorted(progress.items())))
        if report == self._reported_progress:
            return
        await self._coordinator.once(
            "set_progress", self._topic, self._partition, self._name, list(md), list(lm), progress
        )
        self._reported_progress = report

    def _write_cursor(self, key: str, data: bytes) -> None:
        self._store.put(key, data)
        for old in self._store.list(f"{self._prefix}/cursor/"):
            if old != key:
                self._store.delete(old)


def _lateness(out: list[Delivery], now_ms: int) -> np.ndarray:
    """Dispatch lateness (ms) of the first deliveries of delayed messages in ``out``."""
    parts = []
    for dv in out:
        d = dv.source.entries.deliver_at_ms[dv.indexes]
        first = (d != NO_DELAY) & (dv.counts == 0)
        if first.any():
            parts.append(now_ms - d[first])
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _keys(keys) -> np.ndarray:
    """Position keys from a consumer: an int64 array (or a list of ints)."""
    arr = np.asarray(keys)
    if arr.ndim != 1 or (len(arr) and arr.dtype.kind not in "iu"):
        raise InvalidArgument("positions: expected a 1-d array of int64 position keys")
    return arr.astype(np.int64, copy=False)


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(round(float(seconds) * 1000))


def spawn_subscription(topic: str, partition: int, subscription: str, config: dict) -> Any:
    """A subscription actor, on the node of its partition's topic actor (which is created
    first when it is missing)."""
    name = subscription_actor_name(topic, partition, subscription)
    near = topic_actor_name(topic, partition)
    if placement.lookup_or_none(name) is None and placement.node_of(near) is None:
        spawn_topic(topic, partition, config)
    return (
        ray.remote(SubscriptionActor)
        .options(**placement.actor_options(name, config, near=near))
        .remote(topic, partition, subscription, config)
    )


def subscription_peer(topic: str, partition: int, subscription: str, config: dict) -> Peer:
    return Peer(
        subscription_actor_name(topic, partition, subscription),
        lambda: spawn_subscription(topic, partition, subscription, config),
        f"subscription {subscription} of {topic}/{partition}",
    )
