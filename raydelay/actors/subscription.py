"""A subscription's actor, and the asyncio shell around each :class:`Subscription` in it.

One :class:`SubscriptionActor` process serves every partition of a subscription (or, with
``subscription.partitions_per_actor``, a group of them): a
:class:`SubscriptionPartition` per partition, each with its own pure ``Subscription``
state, as a partition actor had. Each call is a method of its own that names the
partition first (``ack(partition, consumer_id, keys)``); consumers' heartbeats come once
per actor (``heartbeat_many``).

A shared subscription indexes no delayed message itself: the partition's host does it once
for every subscription. Due delayed messages come with their payloads from the topic's
unsealed index (``due_unsealed``) and from the partition's sealed buckets (see
:mod:`raydelay.delayed.reader`); the log is read for everything else, and an in-memory
tracker holds only this subscription's delayed nacks.

The actor owns the I/O; the subscription decides. A consumer's ``receive`` is
``Subscription.receive`` given a fetch that reads the partition on its host. Beside the
calls, per partition:

- the **driver** calls ``Subscription.step`` whenever something changed or the step's
  wake time comes, starts the I/O the step asks for (sealed segments to load, a due
  query of the topic's unsealed index, dead letters to publish, the cursor to write
  and report to the coordinator), each as a task that wakes the driver when done, and
  wakes waiting ``receive`` calls; with nothing due it wakes once a second at most;
- the **log reader** reads the log ahead (bounded by ``subscription.read_ahead_entries``)
  and long-polls the host when caught up, 30 s at a time (a shared subscription's poll
  is woken only by entries due within a lookahead); the next step applies what it read.
  Big ledger objects come as references into Ray's object store, put once by the host
  for every reader (``SharedObjects``), and are decoded in place.

One loop per actor reports every partition's metrics once a second.

Delayed rows of the topic's unsealed index are asked for a lookahead ahead
(``subscription.lookahead_ms``) and wait in the subscription; an alarm thread
(:mod:`raydelay.actors.alarm`) wakes the driver at each due instant.

The actor never blocks its event loop: store writes run on a thread, and handle
lookups go through :class:`~raydelay.cluster.handles.Peer` off the loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import ray

from raydelay.actors.alarm import Alarm
from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.host import HostActor, coordinator_peer, partition_peer
from raydelay.actors.metrics import LATENESS_BOUNDARIES_MS, SubscriptionMetrics
from raydelay.actors.protocol import BucketList, DueReply, ReadReply, ReceiveReply
from raydelay.actors.registry import CoordinatorRegistry
from raydelay.clock import SystemClock
from raydelay.cluster import placement, rpc
from raydelay.cluster.handles import Peer
from raydelay.cluster.names import subscription_actor_name, subscription_groups
from raydelay.cluster.nodes import check_store
from raydelay.cluster.rpc import in_thread
from raydelay.config import Config, config_from_dict
from raydelay.delayed import InMemoryDelayedDeliveryTracker
from raydelay.delayed.reader import SealedReader, SegmentLoad
from raydelay.delayed.sealed import SealedMeta, parse_bucket_key
from raydelay.delayed.store import SealedStore
from raydelay.dispatch.cursor import Cursor, Position
from raydelay.dispatch.peek import PeekRange, SegmentRef
from raydelay.dispatch.subscription import (
    Delivery,
    Step,
    Subscription,
    TailQuery,
)
from raydelay.dispatch.wire import delivery_batch
from raydelay.errors import CodecError, ConsumerBusy, InvalidArgument, NotFound, Unavailable
from raydelay.log.entries import (
    NO_DELAY,
    AppendBatch,
    Entries,
    Rows,
    decode_object,
    encode_batch,
)
from raydelay.positions import split_keys
from raydelay.storage import CountingObjectStore, make_store
from raydelay.storage.keys import cursor_key, subscription_prefix
from raydelay.subscription_types import spreads

log = logging.getLogger(__name__)

# The driver's longest sleep: segment loads coming within the lookahead and failed
# loads are looked at again at least this often.
_IDLE_WAIT_S = 1.0
# A log read that is caught up waits at its host this long for new entries (an idle
# partition costs a call per this long); a shared subscription's reads wait only for
# entries due within a lookahead plus this margin (for the call's own trips).
_LONG_POLL_S = 30.0
_POLL_MARGIN_MS = 250
_READ_CHUNK = 5_000
# Payloads read from the topic actor per receive: due delayed messages are scattered over
# the log, so a read costs about one ranged read each; smaller reads reach the consumer
# sooner. Payloads the decoded objects here still hold are not capped.
_FETCH_MAX = 2_000
_REPORT_S = 1.0  # how often metrics are reported
_READ_LINGER_S = 0.005
_DECODED_ENTRIES = 200_000  # entries of decoded ledger objects kept for payload fetches
_STAGED_ROWS = 200_000  # sealed-bucket rows kept for delivery before they are pruned
_RETRY_S = 0.5  # the pause after a failed background call before it is tried again
_ALARM_SLACK_S = 0.002  # the loop's own timer, a fallback should the alarm be late
# Listings of a partition's buckets tried before a refresh gives up for now (each one that
# names a bucket merged or deleted before its meta was read is tried again)
_LIST_TRIES = 5
_CHANGING = "the partition's buckets kept changing while they were read (merges); trying again"


class SubscriptionPartition:
    """One partition of a subscription's actor. The constructor recovers it (from its
    cursor, the partition's buckets and the log) and makes blocking calls: the actor runs
    it on a thread."""

    def __init__(
        self,
        topic: str,
        partition: int,
        subscription: str,
        config: dict,
        coordinator: Peer[CoordinatorActor],
    ) -> None:
        started = time.monotonic()
        self._topic, self._partition, self._name = topic, partition, subscription
        self._config: Config = config_from_dict(config)
        self._config_dict = config
        self._dlq_peers: dict[
            str, Peer[HostActor]
        ] = {}  # dead-letter topic -> its partition 0's actor
        self.on_available: Callable[[], None] | None = None  # its actor's, set by the actor
        check_store(self._config.storage)  # before anything is written where it should not be
        self._metrics = SubscriptionMetrics(topic, partition, subscription)
        # first deliveries of delayed messages by lateness, since this state started: one
        # count per LATENESS_BOUNDARIES_MS bucket (at most that many ms late), then the rest
        self._late_counts = np.zeros(len(LATENESS_BOUNDARIES_MS) + 1, dtype=np.int64)
        self._clock = SystemClock()
        self._coordinator = coordinator
        self._topic_actor = partition_peer(topic, partition, config, coordinator)
        self._options = self._coordinator.call_from_thread(
            CoordinatorActor.subscription, topic, subscription
        )
        self._store = CountingObjectStore(make_store(self._config))
        self._prefix = subscription_prefix(topic, partition, subscription)
        self._sealed_store = SealedStore(self._store, topic, partition)
        cursor, dispatched_before, self._cursor_version = self._load_cursor()
        reader = None
        if spreads(self._options["type"]) and self._config.delayed.tracker == "bucket":
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
            write_cursor=self._write_cursor,
            publish_dead_letters=self._publish_dead_letters,
            cursor_persist_interval_ms=self._config.subscription.cursor_persist_interval_ms,
            consumer_lease_ms=int(self._config.subscription.consumer_lease_s * 1000),
            cached_entries=_DECODED_ENTRIES,
            max_fetch=_FETCH_MAX,
            max_staged_rows=_STAGED_ROWS,
            lookahead_ms=self._config.subscription.lookahead_ms,
        )
        self._rewinds: dict[str, int] = {}  # consumer -> its redeliver-all calls so far
        # what peeks cost: how many, and the sealed segments they read from the store
        self._peeks = {"peeks": 0, "segments_read": 0, "segment_bytes_read": 0}
        self._bucket_version: int | None = None
        self._load_times: deque[tuple[str, float]] = deque(maxlen=10_000)
        self._reported_progress: tuple[Any, ...] | None = None
        self._reported_stats: dict | None = None
        if reader is not None:
            self._recover_buckets(reader)
        self._started = False
        self._closed = False
        ledgers = self._topic_actor.call_from_thread(
            HostActor.ledgers, self._topic, self._partition
        )
        loose = self._sub.resume_after_buckets(ledgers)
        tail = self._topic_actor.call_from_thread(HostActor.tail, self._topic, self._partition)
        self._sub.reading.tail = None if tail is None else (int(tail[0]), int(tail[1]))
        self._learn_cancels()
        # Filled in until the first delivery after this start: what recovery cost.
        self._recovery: dict[str, Any] = {
            "started": started,
            "init_s": round(time.monotonic() - started, 3),
            "loose": loose,
            "read_from": list(self._sub.reading.read_position),
            "delayed": self._sub.tracker.number_of_delayed_messages(),
            "log_bytes": 0,
        }
        if loose or self._sub.reading.read_position != self._sub.reading.start_position:
            log.info(
                "%s: resuming the log at %s after the buckets, %d loose positions to re-read",
                self._sub.name,
                self._sub.reading.read_position,
                loose,
            )

    # --- construction ----------------------------------------------------------------------

    def _make_tracker(self) -> InMemoryDelayedDeliveryTracker:
        """The in-memory tracker: this subscription's delayed nacks (and, with
        ``delayed.tracker = "memory"``, the delayed positions it reads from the log)."""
        d = self._config.delayed
        return InMemoryDelayedDeliveryTracker(
            clock=self._clock,
            tick_time_ms=d.tick_time_ms,
            strict=d.strict,
            fixed_delay_lookahead=d.fixed_delay_lookahead,
        )

    def _recover_buckets(self, sealed: SealedReader) -> None:
        """Take up the partition's sealed buckets where this subscription left them."""
        progress = self._coordinator.call_from_thread(
            CoordinatorActor.progress, self._topic, self._partition, self._name
        )
        for _ in range(_LIST_TRIES):
            info: BucketList = self._topic_actor.call_from_thread(
                HostActor.buckets, self._topic, self._partition
            )
            metas = self._load_metas(info.buckets)
            if len(metas) == len(info.buckets):
                break
        else:
            raise Unavailable(_CHANGING)
        for meta in metas:
            self._sub.adopt(meta, done=progress.get(meta.key, 0))
        sealed.sealed_through = max(sealed.sealed_through, info.through)
        self._bucket_version = info.version

    def _load_metas(self, keys: list[str]) -> list[SealedMeta]:
        """The metas of ``keys`` (read in parallel), in ledger order; a bucket deleted
        meanwhile is left out."""

        def one(key: str) -> SealedMeta | None:
            try:
                return self._sealed_store.meta(key)
            except NotFound:
                return None

        # (one key, as a bucket seals: no thread for it)
        found = [one(k) for k in keys] if len(keys) <= 1 else list(_META_POOL.map(one, keys))
        return sorted((m for m in found if m is not None), key=lambda m: m.start_ledger)

    async def _refresh_buckets(
        self,
        sealed: SealedReader,
        upto: int,
        after: tuple[int, int],
        listed: BucketList | None = None,
    ) -> None:
        """Adopt the new buckets and forget the ones deleted. Only a due query calls it,
        before it takes in an answer that reports the ledgers through ``upto`` sealed (see
        ``Subscription.adopt``). The list is read after that answer was made, so it may
        hold buckets sealed since: their runs past ``upto`` leave out what the answer
        takes (``after``: the taken mark once it is taken in). A bucket merged since may
        hold runs of both kinds; waiting for it to end by ``upto`` would let the taken
        mark pass its older runs' rows, which the answer did not carry (they were sealed).
        ``listed``: the list the answer came with (made with it), tried first."""
        # Every bucket of one listing is adopted before the answer is taken in: a bucket
        # merged away between the listing and the read of its meta is listed again (as
        # the merged one). Adopting the others and taking the answer in would move the
        # taken mark over the missing bucket's rows, which no answer carried (they were
        # sealed before it), and they would never be delivered.
        for _ in range(_LIST_TRIES):
            info = listed
            if info is None:
                info = await self._topic_actor.once(HostActor.buckets, self._topic, self._partition)
            listed = None  # (a second try lists them again)
            new = [k for k in info.buckets if k not in sealed.buckets]
            metas = await asyncio.to_thread(self._load_metas, new)
            if len(metas) == len(new):
                break
        else:
            raise Unavailable(_CHANGING)  # (the answer is not taken in; asked again later)
        keys = set(info.buckets)
        for meta in metas:
            # (a merged bucket takes over its sources held here)
            self._sub.adopt(meta, later=(upto, after))
        sealed.sealed_through = max(sealed.sealed_through, min(info.through, upto))
        for gone in [k for k in sealed.buckets if k not in keys]:
            sealed.forget(gone)
        self._bucket_version = info.version

    async def _query_tail(self, sealed: SealedReader, query: TailQuery) -> None:
        """Take the due rows of the topic's unsealed index; adopt first the buckets its
        answer reports sealed."""
        try:
            reply: DueReply = await self._topic_actor.once(
                HostActor.due_unsealed,
                self._topic,
                self._partition,
                query.below,
                query.through_ms,
                query.now_ms,
                -1 if self._bucket_version is None else self._bucket_version,
                sealed.sealed_through,
            )
            if reply.through > sealed.sealed_through or reply.version != self._bucket_version:
                below, through = self._sub.unsealed.taken  # (what take_unsealed will make it)
                after = (max(below, int(reply.below)), max(through, int(query.now_ms)))
                await self._refresh_buckets(sealed, reply.through, after, reply.buckets)
            rows = Rows.from_batch(reply.rows)
            self._count_log_bytes(int(reply.rows.nbytes))
            self._sub.take_unsealed(rows, reply.below, query.now_ms, reply.next_d, reply.waiting)
        except Exception:
            await asyncio.sleep(_RETRY_S)  # (then a later step asks again)
            self._sub.tail_failed()
            raise

    def _drop_legacy_buckets(self) -> int:
        """Delete the buckets this subscription indexed by itself before the topic did it
        for all (stores written before sealed buckets): the topic re-indexed every retained
        ledger when it came up, so they are not needed. Returns objects deleted."""
        registry = CoordinatorRegistry(self._coordinator)
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
            CoordinatorActor.mark_delete, self._topic, self._partition, self._name
        )
        return Cursor((md[0], md[1])), (-1, -1), 0

    def _learn_cancels(self) -> None:
        """Before delivering anything, learn every cancel marker ahead of the read position:
        a cancel this subscription applied before it died stays applied."""
        pairs = self._topic_actor.call_from_thread(
            HostActor.cancel_markers, self._topic, self._partition, self._sub.reading.read_position
        )
        learned = self._sub.learn_cancels(pairs)
        if learned:
            log.info("%s: %d cancel markers ahead of the read position", self._sub.name, learned)

    def _ensure_started(self) -> None:
        if self._started:
            return
        self._started = True
        self._wake = asyncio.Event()  # wakes the driver: step again
        self._alarm = Alarm(
            asyncio.get_running_loop(), self._wake, f"raydelay-alarm-{self._sub.name}"
        )
        self._space = asyncio.Event()  # wakes the log reader when read-ahead has room
        self._tasks: set[asyncio.Task[None]] = set()  # strong references until done
        self._busy: set[str] = set()  # kinds of background I/O under way
        self._retries = {
            kind: rpc.Retries(log, f"{self._sub.name}: {kind}")
            for kind in (
                "step",
                "loading sealed segments",
                "querying the unsealed index",
                "publishing dead letters",
                "persisting the cursor",
            )
        }
        self._loops = [
            self._spawn(self._drive()),
            # The log reader long-polls the topic actor for up to _LONG_POLL_S: beside the
            # driver.
            self._spawn(self._read_log()),
        ]
        self._spawn(self._cleanup_legacy())  # once, at start: deletes old objects off the loop

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _notify(self) -> None:
        """Wake the receive calls waiting at this partition (they wait on its actor's event)."""
        if self.on_available is not None:
            self.on_available()

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
        self._wake.set()
        return True

    async def remove_consumer(self, consumer_id: str) -> int:
        self._ensure_started()
        n = self._sub.remove_consumer(consumer_id)
        self._rewinds.pop(consumer_id, None)
        self._wake.set()
        await self._notify()
        return n

    def begin_receive(self, consumer_id: str) -> None:
        """The start of a receive call: a consumer a restarted actor forgot, or whose lease
        lapsed, is added back."""
        self._ensure_started()
        if "first_receive_s" not in self._recovery:
            self._recovery["first_receive_s"] = round(
                time.monotonic() - self._recovery["started"], 3
            )
        self._sub.add_consumer(consumer_id, self._clock.now_ms())

    async def receive_now(
        self, consumer_id: str, max_messages: int, rewinds: int
    ) -> tuple[list[Delivery], bool]:
        """What goes to ``consumer_id`` now, and whether its call is answered with it even
        when it is nothing: a call sent before the consumer's latest rewind, a state a
        reset closed, a consumer no longer here."""
        if rewinds < self._rewinds.get(consumer_id, 0) or self._closed:
            return [], True
        out = await self._deliver(consumer_id, max_messages)
        # (a standing call does not renew the lease: the client's heartbeats do, and they
        # stop when its process dies)
        return out, bool(out) or consumer_id not in self._sub.consumers()

    async def _deliver(self, consumer_id: str, max_messages: int) -> list[Delivery]:
        # (the cursor writes on this path only write ahead: the driver reports progress)
        out = await self._sub.receive(
            consumer_id, self._read_rows, max_messages, self._clock.now_ms()
        )
        if self._sub.wants_read():  # (key_shared moves read-ahead rows on without delivering)
            self._space.set()
        if out:
            late = _lateness(out, self._clock.now_ms())
            self._metrics.dispatched(sum(map(len, out)), late)
            if len(late):
                self._late_counts += np.bincount(
                    np.searchsorted(_LATE_EDGES, late, side="left"),
                    minlength=len(self._late_counts),
                )
            self._space.set()
            self._wake.set()
            if "first_delivery_s" not in self._recovery:
                self._close_recovery()
        return out

    def _close_recovery(self) -> None:
        r = self._recovery
        r["first_delivery_s"] = round(time.monotonic() - r.pop("started"), 3)
        r["first_delivery_at_ms"] = self._clock.now_ms()
        r["store_bytes"] = self._store.bytes_read

    async def _read_rows(self, keys: np.ndarray) -> Rows:
        """The fetch given to the subscription: the topic actor's rows at ``keys``."""
        batch = await self._topic_actor.once(
            HostActor.read_positions, self._topic, self._partition, keys.astype(np.int64)
        )
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
        if n and self._sub.type == "key_shared" and self._sub.redelivery.redeliver:
            await self._notify()  # the acks may free keys another consumer waits for
        return n

    async def nack(
        self, consumer_id: str, keys, delay_s: float, nacked_at_ms: int | None = None
    ) -> int:
        """Give positions (int64 keys) back for redelivery ``delay_s`` seconds after
        ``nacked_at_ms`` (the consumer's clock when it nacked; now when None, and never
        later than now). Calls to an async actor may run out of the order they were sent
        in; counting from the consumer's time keeps nacks made in a row in their order."""
        self._ensure_started()
        now = self._clock.now_ms()
        self._sub.touch(consumer_id, now)
        since = now if nacked_at_ms is None else min(int(nacked_at_ms), now)
        n = self._sub.nack(consumer_id, _keys(keys), _ms(delay_s) or 0, since)
        await self._sub.flush_dead_letters(self._read_rows)
        self._wake.set()
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
            self._wake.set()
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
            "peek": dict(self._peeks),
            "consumer_leases": self._sub.consumer_leases(self._clock.now_ms()),
            "lateness_counts": self._late_counts.tolist(),
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
        await self._sub.persist(force=True)
        await self._report_progress()

    async def close(self) -> None:
        """Persist the cursor, then stop the loops (a standing log read among them)."""
        await self.flush()
        self._closed = True
        if self._started:
            self._alarm.close()
            for task in list(self._tasks):
                task.cancel()

    async def stop_for_reset(self, md: Position) -> None:
        """Stop this state for good and write what a start from mark-delete ``md`` needs
        (a reset of the cursor): the progress through the sealed buckets from ``md``'s
        ledger on starts again, then the cursor says ``md``, with no individual acks.
        The I/O under way finishes first, and nothing of this state is written after:
        the caller then recovers a new state from the store (``SubscriptionPartition``).
        A crash between the two writes leaves the old cursor, with buckets to read again
        whose rows it acknowledged (they are skipped): nothing is lost, and the reset
        can be asked again."""
        self._closed = True
        if self._started:
            self._alarm.close()
            for task in self._loops:
                task.cancel()
            rest = [t for t in self._tasks if t not in self._loops]
            await asyncio.gather(*rest, return_exceptions=True)
        async with self._sub.marks.lock:  # (a receive's write-ahead finishes first)
            self._sub.marks.write_cursor = None
            await asyncio.to_thread(self._write_reset, md)
        if self._started:
            await self._notify()  # standing receives here return empty

    def _write_reset(self, md: Position) -> None:
        progress = self._coordinator.call_from_thread(
            CoordinatorActor.progress, self._topic, self._partition, self._name
        )
        progress = {
            k: v for k, v in progress.items() if parse_bucket_key(k)[1] < md[0]
        }  # (a bucket not listed starts from its first segment)
        self._coordinator.call_from_thread(
            CoordinatorActor.set_progress,
            self._topic,
            self._partition,
            self._name,
            list(md),
            list(md),
            progress,
        )
        cursor = Cursor(md)
        cursor.delayed_mark = self._sub.cursor.delayed_mark  # (what may have gone out: counted)
        key = cursor_key(self._topic, self._partition, self._name, self._cursor_version + 1)
        self._put_cursor(key, cursor.encode(max(self._sub.marks.dispatch_mark, md)))
        log.info("%s: cursor reset to mark-delete %s", self._sub.name, md)

    def take_over(self, old: SubscriptionPartition) -> None:
        """After a reset: the consumers of the state this one replaces, as they were."""
        now = self._clock.now_ms()
        for consumer_id in old._sub.consumers():
            try:
                self._sub.add_consumer(consumer_id, now)
            except ConsumerBusy:
                pass
        self._rewinds.update(old._rewinds)
        self.on_available = old.on_available

    # --- the driver ---------------------------------------------------------------------------

    async def _drive(self) -> None:
        """Step the subscription whenever something changed or its wake time comes; start
        the I/O the step asks for; wake receivers. It never spins: with nothing scheduled
        it waits for a change (or _IDLE_WAIT_S)."""
        retries = self._retries["step"]
        while not self._closed:
            self._wake.clear()  # (a change while this step runs makes the next one at once)
            wait_s = _IDLE_WAIT_S
            try:
                now = self._clock.now_ms()
                step = self._sub.step(now)
                self._start_io(step)
                if step.wants_read:
                    self._space.set()
                if step.deliverable:
                    await self._notify()
                retries.ok()
                if step.wake_at_ms is not None:
                    wait_s = min(step.wake_at_ms / 1000 - time.time(), _IDLE_WAIT_S)
            except Exception as exc:  # noqa: BLE001 - reported and retried
                retries.failed(exc)
                wait_s = _RETRY_S
            if wait_s < _IDLE_WAIT_S:
                # a due instant: the alarm thread wakes the loop on the dot (the loop's own
                # timer, a whole-ms epoll timeout rounded up, would be up to 1 ms late)
                self._alarm.at(time.time() + max(wait_s, 0.0))
                wait_s += _ALARM_SLACK_S
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=wait_s)
            except asyncio.TimeoutError:
                pass

    def _start_io(self, step: Step) -> None:
        """Start the I/O ``step`` asks for, each as a task that wakes the driver when done
        (a slow store or peer never holds up a due delivery)."""
        for consumer_id, handed_back in step.expired:
            log.warning(
                "%s: consumer %s not heard from for %.0f s (subscription.consumer_lease_s): "
                "removed, %d unacknowledged messages go back for redelivery",
                self._sub.name,
                consumer_id,
                self._config.subscription.consumer_lease_s,
                handed_back,
            )
        sealed = self._sub.sealed
        if step.loads and sealed is not None:
            self._start("loading sealed segments", self._load(sealed, step.loads), once=False)
        if step.tail_query is not None and sealed is not None:
            # (one at a time already: the subscription asks again only once it is answered)
            query = self._query_tail(sealed, step.tail_query)
            self._start("querying the unsealed index", query, once=False)
        if step.dead_letters:
            self._start("publishing dead letters", self._sub.flush_dead_letters(self._read_rows))
        if step.persist:
            self._start("persisting the cursor", self._persist_and_report())

    def _start(self, kind: str, coro: Coroutine[Any, Any, Any], once: bool = True) -> None:
        """Run ``coro`` as a task reported under ``kind``; with ``once``, not while another
        of its kind is under way."""
        if once and kind in self._busy:
            coro.close()
            return
        self._busy.add(kind)
        self._spawn(self._io(kind, coro))

    async def _io(self, kind: str, coro: Coroutine[Any, Any, Any]) -> None:
        """Run one piece of I/O; then the driver steps again, unless it returned False (it
        changed nothing: an idle cursor check, which would otherwise wake it twice a
        second)."""
        changed: Any = True
        try:
            changed = await coro
            self._retries[kind].ok()
        except Exception as exc:  # noqa: BLE001 - reported and retried by a later step
            self._retries[kind].failed(exc)
            await asyncio.sleep(_RETRY_S)  # (still busy: the next step does not retry at once)
        finally:
            self._busy.discard(kind)
            if changed is not False:
                self._wake.set()

    async def _load(self, sealed: SealedReader, loads: list[SegmentLoad]) -> None:
        """Do the reader's loads (each segment one ranged read, on threads, in parallel):
        the rows of the segments to read; of segments whose rows were all taken from the
        unsealed index already, only their position keys."""
        started = time.monotonic()
        results = await asyncio.gather(
            *[self._load_one(sealed, ld) for ld in loads], return_exceptions=True
        )
        self._load_times.extend(("load", time.monotonic() - started) for ld in loads if ld.reads)
        failed: BaseException | None = None
        for ld, got in zip(loads, results, strict=True):
            if isinstance(got, BaseException):
                failed = got
            else:
                sealed.install(ld.key, ld.no, *got)
        if failed is not None:
            await asyncio.sleep(_RETRY_S)  # (the failed loads stay marked loading until then)
            for ld, got in zip(loads, results, strict=True):
                if isinstance(got, BaseException):
                    sealed.load_failed(ld.key, ld.no)
            raise failed

    async def _load_one(
        self, sealed: SealedReader, ld: SegmentLoad
    ) -> tuple[list[Rows], list[np.ndarray]]:
        """One load's store reads: the rows of its segments, and the position keys of the
        ones it skips (from their runs' index objects)."""
        store = self._sealed_store
        rows = await asyncio.gather(
            *(asyncio.to_thread(store.segment, p.run_key, p.offset, p.length) for p in ld.reads)
        )
        bucket = sealed.buckets.get(ld.key)
        if not ld.keys_only or bucket is None:
            return list(rows), []  # (forgotten meanwhile: install ignores it)
        return list(rows), await asyncio.to_thread(store.part_keys, bucket.meta, ld.keys_only)

    async def _persist_and_report(self) -> bool:
        """The periodic cursor write, then the progress report to the coordinator; whether
        either wrote anything."""
        wrote = await self._sub.persist()
        return await self._report_progress() or wrote

    def metrics_snapshot(self) -> tuple[SubscriptionMetrics, dict, list] | None:
        """What this partition has to report to Ray's metrics (its gauges' values and the
        bucket operations since the last time), or None when nothing changed: its actor
        records every partition's at once, on a thread, once a second."""
        try:
            stats = self._sub.stats() | self._tracker_stats()
            times = self._load_times
            ops = [times.popleft() for _ in range(len(times))]
        except Exception:  # noqa: BLE001 - metrics must never stop the subscription
            log.exception("%s: reporting metrics failed", self._sub.name)
            return None
        if not ops and stats == self._reported_stats:
            return None
        self._reported_stats = stats
        return self._metrics, stats, ops

    # --- the log reader -------------------------------------------------------------------------

    async def _read_log(self) -> None:
        """Read the log ahead while the subscription wants more; the next step applies it."""
        retries = rpc.Retries(log, f"{self._sub.name}: reading the log")
        while not self._closed:
            try:
                if not self._sub.wants_read():
                    self._space.clear()
                    await self._space.wait()
                    continue
                room = min(
                    self._sub.reading.read_ahead_entries - self._sub.ready_count(), _READ_CHUNK
                )
                if self._sub.reading.unread:
                    keys = np.asarray(self._sub.next_unread(room), dtype=np.int64)
                    self._sub.offer_reread(await self._read_rows(keys), keys)
                    retries.ok()
                    self._wake.set()
                    continue
                sealed = self._sub.sealed is not None
                # Wake only for entries due at once or within a lookahead (the host wakes
                # the read when one it passed over comes that close): a steady stream of
                # messages due later does not wake the reader at every commit.
                within = self._sub.lookahead_ms + _POLL_MARGIN_MS if sealed else None
                reply: ReadReply = await self._topic_actor.once(
                    HostActor.read,
                    self._topic,
                    self._partition,
                    self._sub.reading.read_position,
                    room,
                    _LONG_POLL_S,
                    sealed,
                    within,
                )
                retries.ok()
                raw = await _fetch_shared(reply.objects)
                self._count_log_bytes(
                    sum(len(b) for b in raw if isinstance(b, (bytes, np.ndarray)))
                )
                objects = [
                    decode_object(b) if isinstance(b, (bytes, np.ndarray)) else b for b in raw
                ]
                self._sub.offer_read(
                    objects,
                    reply.ledgers,
                    reply.tail,
                    buckets_changed=sealed and reply.version != self._bucket_version,
                )
                self._wake.set()
                if sum(obj.count for obj in objects) < _READ_CHUNK // 4:
                    # A trickle: let a few group commits gather before the next call.
                    await asyncio.sleep(_READ_LINGER_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - reported and retried
                if self._closed:
                    # a planned stop: the hosts may be stopping too, and nothing is retried
                    log.debug("%s: a log read ended by the close: %s", self._sub.name, exc)
                    return
                retries.failed(exc)
                await asyncio.sleep(_RETRY_S)

    # --- dead letters and the cursor ------------------------------------------------------------

    async def _publish_dead_letters(self, keys: np.ndarray, entries: Entries) -> None:
        """Append dead letters to the DLQ topic (partition 0), each with its origin in its
        properties, through the DLQ topic's handle."""
        dlq = self._options.get("dead_letter_topic") or f"{self._topic}-{self._name}-DLQ"
        ledger_ids, entry_ids = split_keys(keys)
        props = [
            dict(p or {})
            | {
                "raydelay.original_message_id": f"{self._topic}/{self._partition}/{lg}:{e}",
                "raydelay.subscription": self._name,
            }
            for p, lg, e in zip(
                entries.properties or [None] * len(entries),
                ledger_ids.tolist(),
                entry_ids.tolist(),
                strict=True,
            )
        ]
        out = Entries.build(
            entries.batch.column(0),
            np.full(len(entries), NO_DELAY, dtype=np.int64),
            entries.batch.column(2),
            props,
        )
        target = self._dlq_peers.get(dlq)
        if target is None:
            target = self._dlq_peers[dlq] = partition_peer(
                dlq, 0, self._config_dict, self._coordinator
            )
        await target.once(HostActor.append, dlq, 0, encode_batch(AppendBatch("", 0, out)))
        log.info("%s: %d messages dead-lettered to %s", self._sub.name, len(keys), dlq)

    async def _write_cursor(self, data: bytes) -> None:
        """The subscription's cursor writer: the next cursor version, written on a thread."""
        version = self._cursor_version + 1
        key = cursor_key(self._topic, self._partition, self._name, version)
        await asyncio.to_thread(self._put_cursor, key, data)
        self._cursor_version = version

    async def _cleanup_legacy(self) -> None:
        try:
            await asyncio.to_thread(self._drop_legacy_buckets)
        except Exception:  # noqa: BLE001 - the next start tries again
            log.exception("%s: deleting its own old buckets failed", self._sub.name)

    async def due_histogram(self, edges: list[int]) -> list[int]:
        """Pending delayed messages per due window (see the trackers' ``due_histogram``)."""
        self._ensure_started()
        edges_arr = np.asarray(edges, dtype=np.int64)
        out = np.asarray(self._sub.tracker.due_histogram(edges_arr), dtype=np.int64)
        if self._sub.sealed is not None:
            out += np.asarray(self._sub.sealed.due_histogram(edges_arr), dtype=np.int64)
            unsealed = await self._topic_actor.once(
                HostActor.unsealed_histogram,
                self._topic,
                self._partition,
                list(edges),
                self._clock.now_ms(),
            )
            out += np.asarray(unsealed, dtype=np.int64)
        return out.tolist()

    async def peek(
        self,
        limit: int,
        due_after: int | None = None,
        due_before: int | None = None,
        key: str | None = None,
    ) -> pa.RecordBatch:
        """The next scheduled messages not delivered yet (see ``Subscription.peek``), as
        one record batch of :data:`raydelay.dispatch.wire.DELIVERY_SCHEMA` in delivery
        order. Nothing changes."""
        self._ensure_started()
        self._peeks["peeks"] += 1
        q = PeekRange(int(limit), due_after, due_before, key)
        store = self._sealed_store

        def segment(r: SegmentRef) -> Rows:
            try:
                rows = store.segment(r.run_key, r.offset, r.length)
            except NotFound:  # (its bucket was finished and deleted meanwhile)
                return Rows.join([])
            self._peeks["segments_read"] += 1
            self._peeks["segment_bytes_read"] += r.length
            return rows

        async def read_segments(refs: list[SegmentRef]) -> list[Rows]:
            return list(await asyncio.gather(*(asyncio.to_thread(segment, r) for r in refs)))

        async def read_unsealed(
            below: int, through: int, q: PeekRange, start: tuple[int, int] | None, page: int
        ) -> Rows:
            batch = await self._topic_actor.once(
                HostActor.peek_unsealed,
                self._topic,
                self._partition,
                below,
                through,
                q,
                start,
                page,
            )
            return Rows.from_batch(batch)

        unknown: list[SealedMeta] = []
        sealed = self._sub.sealed
        if sealed is not None:  # (buckets sealed since the last due query)
            info: BucketList = await self._topic_actor.once(
                HostActor.buckets, self._topic, self._partition
            )
            new = [k for k in info.buckets if k not in sealed.buckets]
            unknown = await asyncio.to_thread(self._load_metas, new) if new else []
        rows, counts = await self._sub.peek(
            q, self._read_rows, read_segments, read_unsealed, unknown
        )
        n = len(rows)
        return delivery_batch(
            [Delivery(rows, np.arange(n, dtype=np.int64), rows.positions, counts)]
        )

    async def _report_progress(self) -> bool:
        """Tell the coordinator mark-delete, the log mark and the progress through each
        sealed bucket (what retention goes by), when they changed."""
        self._sub.advance_buckets()
        sealed = self._sub.sealed
        progress = sealed.progress() if sealed is not None else {}
        md, lm = self._sub.cursor.mark_delete, self._sub.marks.log_cursor.mark_delete
        report = (md, lm, tuple(sorted(progress.items())))
        if report == self._reported_progress:
            return False
        await self._coordinator.once(
            CoordinatorActor.set_progress,
            self._topic,
            self._partition,
            self._name,
            list(md),
            list(lm),
            progress,
        )
        self._reported_progress = report
        return True

    def _put_cursor(self, key: str, data: bytes) -> None:
        self._store.put(key, data)
        for old in self._store.list(f"{self._prefix}/cursor/"):
            if old != key:
                self._store.delete(old)


def _record_all(batch: list[tuple[SubscriptionMetrics, dict, list]]) -> None:
    for metrics, stats, ops in batch:
        metrics.report(stats, ops)


async def _fetch_shared(objects: list) -> list:
    """The objects of a log read, with the shared ones (references into Ray's object store,
    see ``SharedObjects``) fetched: read-only numpy views of the shared memory."""
    refs = [i for i, o in enumerate(objects) if isinstance(o, ray.ObjectRef)]
    if not refs:
        return objects
    got = await asyncio.gather(*(objects[i] for i in refs))
    out = list(objects)
    for i, value in zip(refs, got, strict=True):
        out[i] = value
    return out


_LATE_EDGES = np.asarray(LATENESS_BOUNDARIES_MS, dtype=np.int64)


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


_OPEN_THREADS = 8  # partitions recovered at once
# The process's threads for reading bucket metas, started as first needed and kept: its
# partitions each read the new buckets' metas as a bucket seals, and threads started for
# each listing cost more than the reads. Up to 32 reads at once, for all the partitions
# an actor recovers in parallel (S3 reads wait on the network, not the CPU).
_META_POOL = ThreadPoolExecutor(32, thread_name_prefix="raydelay-meta")


class SubscriptionActor:
    """The actor of a subscription (or of one group of its partitions): one process, a
    :class:`SubscriptionPartition` per partition it serves, recovered in parallel."""

    def __init__(self, topic: str, subscription: str, group: int, config: dict) -> None:
        # Recovery makes blocking calls; off the event loop's thread they block nothing else.
        in_thread(self._init, topic, subscription, group, config)

    def _init(self, topic: str, subscription: str, group: int, config: dict) -> None:
        started = time.monotonic()
        self._name = subscription_actor_name(topic, subscription, group)
        coordinator = coordinator_peer(config)
        mine = _group_partitions(coordinator, topic, subscription, group, config)
        if not mine:
            raise InvalidArgument(f"group: {topic}/{subscription} has no partition group {group}")

        def open_one(p: int) -> SubscriptionPartition:
            return rpc.recover(
                SubscriptionPartition,
                topic,
                p,
                subscription,
                config,
                coordinator,
                what=f"sub/{topic}/{p}/{subscription}",
            )

        with ThreadPoolExecutor(min(_OPEN_THREADS, len(mine))) as pool:
            self._parts = dict(zip(mine, pool.map(open_one, mine), strict=True))
        # set whenever a partition may have something for a receive (then replaced):
        # receive_many waits on it for all the partitions it asks
        self._available: asyncio.Event | None = None
        for part in self._parts.values():
            part.on_available = self._changed
        self._started = False
        self._reporter: asyncio.Task[None] | None = None  # the metrics loop, once started
        self._topic, self._subscription, self._config = topic, subscription, config
        self._coordinator = coordinator
        self._resetting: dict[int, asyncio.Event] = {}  # partitions whose cursor is reset now
        self._reset_lock = asyncio.Lock()
        log.info(
            "%s: %d partitions recovered in %.2f s",
            self._name,
            len(mine),
            time.monotonic() - started,
        )

    def _part(self, partition: int) -> SubscriptionPartition:
        part = self._parts.get(partition)
        if part is None:
            raise InvalidArgument(
                f"partition: {self._name} serves partitions {sorted(self._parts)}, not {partition!r}"
            )
        if not self._started:  # every partition starts its loops with the first call
            self._started = True
            for each in self._parts.values():
                each._ensure_started()
            self._reporter = asyncio.get_running_loop().create_task(self._report_metrics())
        return part

    async def _report_metrics(self) -> None:
        """Once a second, one loop for the process: what changed in each partition goes to
        Ray's metrics, recorded on a thread (hundreds of histogram samples, recorded on the
        event loop, held a due delivery up by 10-20 ms)."""
        while True:
            await asyncio.sleep(_REPORT_S)
            batch = [m for m in (p.metrics_snapshot() for p in self._parts.values()) if m]
            if not batch:
                continue
            try:
                await asyncio.to_thread(_record_all, batch)
            except Exception:  # noqa: BLE001 - metrics must never stop the subscription
                log.exception("%s: reporting metrics failed", self._name)

    async def _serving(self, partition: int) -> SubscriptionPartition:
        """The partition, once no reset of its cursor is under way."""
        await self._not_resetting(partition)
        return self._part(partition)

    # Each call at one partition it serves, the partition first (see SubscriptionPartition
    # for what they do).

    async def add_consumer(self, partition: int, consumer_id: str) -> None:
        await (await self._serving(partition)).add_consumer(consumer_id)

    async def heartbeat(self, partition: int, consumer_id: str) -> bool:
        return await (await self._serving(partition)).heartbeat(consumer_id)

    async def remove_consumer(self, partition: int, consumer_id: str) -> int:
        return await (await self._serving(partition)).remove_consumer(consumer_id)

    async def ack(self, partition: int, consumer_id: str, keys: Any) -> int:
        return await (await self._serving(partition)).ack(consumer_id, keys)

    async def nack(
        self,
        partition: int,
        consumer_id: str,
        keys: Any,
        delay_s: float,
        nacked_at_ms: int | None = None,
    ) -> int:
        part = await self._serving(partition)
        return await part.nack(consumer_id, keys, delay_s, nacked_at_ms)

    async def redeliver(
        self,
        partition: int,
        consumer_id: str,
        keys: Any = None,
        rewinds: int = 0,
        dry_run: bool = False,
    ) -> int:
        part = await self._serving(partition)
        return await part.redeliver(consumer_id, keys, rewinds, dry_run)

    async def cancel(
        self, partition: int, targets: list[tuple[int, int]], markers: list[tuple[int, int]]
    ) -> list[bool]:
        return await (await self._serving(partition)).cancel(targets, markers)

    async def stats(self, partition: int) -> dict:
        return await (await self._serving(partition)).stats()

    async def flush(self, partition: int) -> None:
        await (await self._serving(partition)).flush()

    async def due_histogram(self, partition: int, edges: list[int]) -> list[int]:
        return await (await self._serving(partition)).due_histogram(edges)

    async def peek(
        self,
        partition: int,
        limit: int,
        due_after: int | None = None,
        due_before: int | None = None,
        key: str | None = None,
    ) -> pa.RecordBatch:
        part = await self._serving(partition)
        return await part.peek(limit, due_after, due_before, key)

    async def receive(
        self,
        partition: int,
        consumer_id: str,
        max_messages: int,
        timeout_s: float,
        rewinds: int = 0,
    ) -> pa.RecordBatch:
        """A receive at one partition: up to ``max_messages`` for ``consumer_id`` as one
        record batch (see :data:`raydelay.dispatch.wire.DELIVERY_SCHEMA`), waiting up to
        ``timeout_s`` seconds; :meth:`receive_many` for that partition alone, its error
        raised. ``rewinds``: how many redeliver-all calls the consumer had made when it sent
        this one; a call sent before the latest returns empty (its client drops what it
        holds)."""
        reply = await self.receive_many(consumer_id, [partition], max_messages, timeout_s, rewinds)
        if reply.failed:
            raise reply.failed[0][1]
        return reply.got[0][1] if reply.got else delivery_batch([])

    def _changed(self) -> None:
        if self._available is not None:
            self._available.set()
            self._available = None

    async def receive_many(
        self,
        consumer_id: str,
        partitions: list[int],
        max_messages: int,
        timeout_s: float,
        rewinds: int = 0,
    ) -> ReceiveReply:
        """One receive at several partitions this actor serves (those of a consumer's that
        share it: one call for all, where one each would cost a call each): up to
        ``max_messages`` from each (see :meth:`receive`). It returns as
        soon as one has something (or fails, or answers at once), or after ``timeout_s``:
        (partition, record batch) of those with messages, and (partition, error) of those
        whose receive failed (see ReceiveReply): what the others handed out still reaches
        the consumer."""
        if not partitions:
            raise InvalidArgument("partitions: at least one is needed")
        failed: dict[int, BaseException] = {}
        live = []
        for p in dict.fromkeys(int(x) for x in partitions):
            try:
                await self._not_resetting(p)
                self._part(p).begin_receive(consumer_id)
                live.append(p)
            except Exception as exc:  # noqa: BLE001 - handed back with that partition
                failed[p] = exc
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        while True:
            if self._available is None:
                self._available = asyncio.Event()
            available = self._available  # (taken before looking: no change is missed)
            got, done = [], bool(failed)
            for p in live:
                try:
                    await self._not_resetting(p)
                    out, answer = await self._part(p).receive_now(
                        consumer_id, int(max_messages), rewinds
                    )
                except Exception as exc:  # noqa: BLE001 - handed back with that partition
                    failed[p] = exc
                    done = True
                    continue
                if out:
                    got.append((p, delivery_batch(out)))
                done = done or answer
            live = [p for p in live if p not in failed]
            remaining = deadline - time.monotonic()
            if done or remaining <= 0:
                return ReceiveReply(got, list(failed.items()))
            try:
                await asyncio.wait_for(available.wait(), timeout=remaining)
            except asyncio.TimeoutError:
                pass

    async def ack_many(
        self, consumer_id: str, acks: list[tuple[int, Any]], nack: tuple | None = None
    ) -> dict[int, BaseException]:
        """A consumer's acks (``nack`` None) or nacks (``nack``: (delay_s, nacked_at_ms))
        at several partitions this actor serves, one call for all: (partition, int64 keys)
        each. Returns the error of each partition whose ack failed ({}: none did)."""
        failed: dict[int, BaseException] = {}
        for p, keys in acks:
            try:
                await self._not_resetting(int(p))
                part = self._part(int(p))
                if nack is None:
                    await part.ack(consumer_id, keys)
                else:
                    await part.nack(consumer_id, keys, *nack)
            except Exception as exc:  # noqa: BLE001 - handed back with that partition
                failed[int(p)] = exc
        return failed

    async def _not_resetting(self, partition: int) -> None:
        """Wait while the partition's cursor is reset (the state a call would reach is
        being replaced)."""
        resetting = self._resetting.get(int(partition))
        if resetting is not None:
            await resetting.wait()

    async def reset(self, marks: dict[int, list[int]]) -> None:
        """Reset the cursors of some partitions it serves: partition -> the new
        mark-delete position (every entry at or before it counts as acknowledged). Each
        partition's state is stopped, its cursor and bucket progress written anew, and a
        new state recovered from them, as after a restart ("rebuild from mark-delete"):
        the entries after the position are read again and delayed ones delivered when
        due; cancels stay applied. Calls to those partitions wait meanwhile."""
        wanted = {int(p): (int(md[0]), int(md[1])) for p, md in marks.items()}
        for p in wanted:
            self._part(p)  # (InvalidArgument for a partition it does not serve)
        async with self._reset_lock:  # (one reset at a time: a second one follows it)
            waits = {p: asyncio.Event() for p in wanted}
            self._resetting.update(waits)
            try:
                await asyncio.gather(*(self._reset_one(p, md) for p, md in wanted.items()))
            finally:
                for p, event in waits.items():
                    del self._resetting[p]
                    event.set()

    async def _reset_one(self, partition: int, md: tuple[int, int]) -> None:
        """Stop the partition's state, write the reset, and recover a new state from the
        store. Should the writes fail, the new state recovers from what the store holds
        (the old cursor: nothing lost) and the failure goes to the caller, who may ask
        again; the partition is never left without a running state."""
        old = self._parts[partition]
        try:
            await old.stop_for_reset(md)
        finally:
            new = await asyncio.to_thread(
                rpc.recover,
                SubscriptionPartition,
                self._topic,
                partition,
                self._subscription,
                self._config,
                self._coordinator,
                what=f"sub/{self._topic}/{partition}/{self._subscription}",
            )
            new.take_over(old)
            self._parts[partition] = new
            new._ensure_started()

    async def heartbeat_many(self, consumer_id: str, partitions: list[int]) -> list[bool]:
        """A consumer's heartbeat to several partitions in one call (see ``heartbeat``)."""
        out = []
        for p in partitions:
            await self._not_resetting(p)
            out.append(await self._part(int(p)).heartbeat(consumer_id))
        return out

    async def cancel_many(
        self, work: dict[int, tuple[list[tuple[int, int]], list[tuple[int, int]]]]
    ) -> dict[int, list[bool]]:
        """``cancel`` on several partitions in one call: partition -> (targets, markers)."""
        out = {}
        for p, (t, m) in work.items():
            await self._not_resetting(p)
            out[int(p)] = await self._part(int(p)).cancel(t, m)
        return out

    async def close(self) -> None:
        """Persist every partition's cursor and stop their loops, and the metrics loop (left
        pending, asyncio reports it as destroyed when the process ends)."""
        await asyncio.gather(*[p.close() for p in self._parts.values()])
        if self._reporter is not None:
            self._reporter.cancel()

    async def partitions(self) -> list[int]:
        return sorted(self._parts)

    async def pid(self) -> int:
        return os.getpid()


def _group_partitions(
    coordinator: Peer[CoordinatorActor], topic: str, subscription: str, group: int, config: dict
) -> list[int]:
    """The partitions the actor of partition group ``group`` of a subscription serves (by
    its ``partitions_per_actor``, the config's when it has none)."""
    n = coordinator.call_from_thread(CoordinatorActor.partitions, topic)
    options = coordinator.call_from_thread(CoordinatorActor.subscription, topic, subscription)
    per_actor = options.get(
        "partitions_per_actor", config_from_dict(config).subscription.partitions_per_actor
    )
    return subscription_groups(n, per_actor).get(group, [])


def spawn_subscription(topic: str, subscription: str, group: int, config: dict) -> Any:
    """A subscription's actor for partition group ``group``, started if it does not run, on
    the node whose hosts serve most of its partitions (they are its busiest callees)."""
    name = subscription_actor_name(topic, subscription, group)
    near = None
    if placement.lookup_or_none(name) is None:
        coordinator = coordinator_peer(config)
        mine = _group_partitions(coordinator, topic, subscription, group, config)
        hosts = Counter(
            coordinator.call_from_thread(CoordinatorActor.locate, topic, p) for p in mine
        )
        if hosts:
            # the host serving most of its partitions; among equals, the one on the node
            # with the fewest subscription actors (a node's loss then stops fewer of them)
            top = max(hosts.values())
            tied = sorted(h for h, c in hosts.items() if c == top)
            live = placement.actors()
            node = {a["name"]: a["node"] for a in live}
            subs_on = Counter(a["node"] for a in live if a["class"] == "SubscriptionActor")
            near = min(tied, key=lambda h: subs_on[node.get(h)])
    return (
        ray.remote(SubscriptionActor)
        .options(**placement.actor_options(name, config, near=near))
        .remote(topic, subscription, group, config)
    )
