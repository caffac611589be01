"""The actor-side shell of one partition of a subscription: the asyncio owner around its
pure :class:`~raydelay.dispatch.subscription.Subscription`, held by a
:class:`~raydelay.actors.subscription.unit.SubscriptionUnit` with the subscription's
other partitions, in a subscription host.

The shell owns the I/O; the subscription decides. It recovers the partition (see
:mod:`~raydelay.actors.subscription.recovery`), wires the parts that do its I/O, and takes
the calls its actor passes on: consumers, receives, acks, nacks, redeliveries, cancels,
stats, peeks, a flush, a close, a reset of the cursor. The parts:

| part | module | concern |
|---|---|---|
| ``_cursor_io`` | :mod:`~raydelay.actors.subscription.cursor_io` | cursor versions in the store, progress reports |
| ``_sealed_io`` | :mod:`~raydelay.actors.subscription.sealed_io` | sealed buckets, due queries of the host's unsealed index |
| ``_dead_letters`` | :mod:`~raydelay.actors.subscription.dead_letters` | publishing dead letters |
| ``_reader`` | :mod:`~raydelay.actors.subscription.log_reader` | reading the log ahead, payload fetches |
| ``_driver`` | :mod:`~raydelay.actors.subscription.driver` | the step loop and the I/O each step asks for |
| ``_peeks`` | :mod:`~raydelay.actors.subscription.peeks` | peeks and due histograms |
| ``_report`` | :mod:`~raydelay.actors.subscription.reporting` | lateness and the metrics snapshot |
| ``_recovery`` | :mod:`~raydelay.actors.subscription.recovery` | what recovery cost |
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.host import partition_peer
from raydelay.actors.metrics import SubscriptionMetrics
from raydelay.actors.subscription.cursor_io import CursorIO, Fence
from raydelay.actors.subscription.dead_letters import DeadLetters
from raydelay.actors.subscription.driver import StepDriver
from raydelay.actors.subscription.log_reader import LogReader
from raydelay.actors.subscription.peeks import Peeks
from raydelay.actors.subscription.recovery import (
    RecoveryCost,
    build_subscription,
    drop_legacy_buckets,
    resume_log,
    seconds_to_ms,
)
from raydelay.actors.subscription.ref import PartitionRef
from raydelay.actors.subscription.reporting import PartitionReport, tracker_stats
from raydelay.actors.subscription.sealed_io import SealedIO
from raydelay.clock import SystemClock
from raydelay.cluster.handles import Peer
from raydelay.cluster.nodes import check_store
from raydelay.config import Config, config_from_dict
from raydelay.dispatch.cursor import Position
from raydelay.dispatch.subscription import Delivery
from raydelay.errors import ConsumerBusy, InvalidArgument
from raydelay.storage import CountingObjectStore, shared_store

log = logging.getLogger(__name__)


class SubscriptionShell:
    """One partition of a subscription, on its subscription actor. The constructor
    recovers it (from its cursor, the partition's buckets and the log) and makes blocking
    calls: the actor runs it on a thread."""

    def __init__(
        self,
        topic: str,
        partition: int,
        subscription: str,
        config: dict,
        coordinator: Peer[CoordinatorActor],
        fence: Fence | None = None,
        options: dict | None = None,
    ) -> None:
        """``options``: the subscription's, when the caller has just read them (else they
        are read from the coordinator)."""
        started = time.monotonic()
        ref = self._ref = PartitionRef(topic, partition, subscription)
        self._config: Config = config_from_dict(config)
        self.on_available: Callable[[], None] | None = None  # its actor's, set by the actor
        check_store(self._config.storage)  # before anything is written where it should not be
        self._recovery = RecoveryCost(started)
        self._clock = SystemClock()
        self._coordinator = coordinator
        host = partition_peer(topic, partition, config, coordinator)
        if options is None:
            options = coordinator.call_from_thread(
                CoordinatorActor.subscription, topic, subscription
            )
        self._store = CountingObjectStore(shared_store(self._config))  # (its host's)
        self._recovery.step("peers")
        self._cursor_io = CursorIO(ref, self._store, coordinator, fence)  # (its host's)
        self._dead_letters = DeadLetters(ref, options, config, coordinator)
        cursor, dispatched_before = self._cursor_io.load()
        self._recovery.step("cursor")
        self._sub = build_subscription(
            ref,
            self._config,
            options,
            self._clock,
            cursor,
            dispatched_before,
            self._cursor_io.write,
            self._dead_letters.publish,
        )
        count = self._recovery.count_log_bytes
        self._sealed_io = SealedIO(ref, self._sub, self._store, host, coordinator, count)
        if self._sub.sealed is not None:
            self._sealed_io.recover(self._sub.sealed)
        self._recovery.step("sealed")
        self._rewinds: dict[str, int] = {}  # consumer -> its redeliver-all calls so far
        self._started = False
        self._closed = False
        loose = resume_log(self._sub, host, ref)
        reading = self._sub.reading
        self._recovery.recovered(
            loose, reading.read_position, self._sub.tracker.number_of_delayed_messages()
        )
        if loose or reading.read_position != reading.start_position:
            log.info(
                "%s: resuming the log at %s after the buckets, %d loose positions to re-read",
                self._sub.name,
                reading.read_position,
                loose,
            )
        wake = asyncio.Event()  # wakes the driver: step again
        self._reader = LogReader(ref, self._sub, host, self._sealed_io, wake, count)
        lease_s = self._config.subscription.consumer_lease_s
        self._driver = StepDriver(
            self._sub,
            self._clock,
            wake,
            self._reader,
            self._sealed_io,
            self._cursor_io,
            self._notify,
            lease_s,
        )
        self._wake = wake
        self._peeks = Peeks(ref, self._sub, self._clock, host, self._sealed_io, self._reader)
        metrics = SubscriptionMetrics(topic, partition, subscription)
        self._report = PartitionReport(metrics, self._sub, self._sealed_io.load_times)

    def ensure_started(self) -> None:
        """Start the driver and the log reader, once (on the actor's event loop)."""
        if self._started:
            return
        self._started = True
        self._driver.start()
        self._driver.spawn(
            self._cleanup_legacy()
        )  # once, at start: deletes old objects off the loop

    async def _cleanup_legacy(self) -> None:
        try:
            await asyncio.to_thread(
                drop_legacy_buckets,
                self._sub.name,
                self._cursor_io.prefix,
                self._store,
                self._coordinator,
            )
        except Exception:  # noqa: BLE001 - the next start tries again
            log.exception("%s: deleting its own old buckets failed", self._sub.name)

    async def _notify(self) -> None:
        """Wake the receive calls waiting at this partition (they wait on its actor's event)."""
        if self.on_available is not None:
            self.on_available()

    # --- consumers --------------------------------------------------------------------------

    async def add_consumer(self, consumer_id: str) -> None:
        self.ensure_started()
        self._sub.add_consumer(consumer_id, self._clock.now_ms())

    async def heartbeat(self, consumer_id: str) -> bool:
        """The consumer's client is alive: its lease starts again. A consumer this actor does
        not know (it restarted, or the lease had lapsed) is added back if it can be; False
        when it cannot (an exclusive subscription that has another consumer now)."""
        self.ensure_started()
        if self._sub.touch(consumer_id, self._clock.now_ms()):
            return True
        try:
            self._sub.add_consumer(consumer_id, self._clock.now_ms())
        except ConsumerBusy:
            return False
        self._wake.set()
        return True

    async def remove_consumer(self, consumer_id: str) -> int:
        self.ensure_started()
        n = self._sub.remove_consumer(consumer_id)
        self._rewinds.pop(consumer_id, None)
        self._wake.set()
        await self._notify()
        return n

    def begin_receive(self, consumer_id: str) -> None:
        """The start of a receive call: a consumer a restarted actor forgot, or whose lease
        lapsed, is added back."""
        self.ensure_started()
        self._recovery.first_receive()
        self._sub.add_consumer(consumer_id, self._clock.now_ms())

    async def receive_now(
        self, consumer_id: str, max_messages: int, rewinds: int, ahead_ms: int = 0
    ) -> tuple[list[Delivery], bool]:
        """What goes to ``consumer_id`` now, and whether its call is answered with it even
        when it is nothing: a call sent before the consumer's latest rewind, a state a
        reset closed, a consumer no longer here. ``ahead_ms``: delayed rows due that soon
        go too (the consumer holds them until they are due)."""
        if rewinds < self._rewinds.get(consumer_id, 0) or self._closed:
            return [], True
        out = await self._deliver(consumer_id, max_messages, ahead_ms)
        # (a standing call does not renew the lease: the client's heartbeats do, and they
        # stop when its process dies)
        return out, bool(out) or consumer_id not in self._sub.consumers()

    async def _deliver(
        self, consumer_id: str, max_messages: int, ahead_ms: int = 0
    ) -> list[Delivery]:
        # (the cursor writes on this path only write ahead: the driver reports progress)
        out = await self._sub.receive(
            consumer_id, self._reader.read_rows, max_messages, self._clock.now_ms(), ahead_ms
        )
        if self._sub.wants_read():  # (key_shared moves read-ahead rows on without delivering)
            self._reader.make_room()
        if self._sub.wake_needed:  # a row left out for now: the driver wakes for it
            self._sub.wake_needed = False
            self._wake.set()
        if out:
            self._report.dispatched(out, self._clock.now_ms())
            self._reader.make_room()
            self._wake.set()
            self._recovery.first_delivery(self._clock.now_ms(), self._store.bytes_read)
        return out

    async def ack(self, consumer_id: str, keys) -> int:
        """Acknowledge positions: one int64 array of keys ``ledger << 32 | entry``."""
        self.ensure_started()
        self._sub.touch(consumer_id, self._clock.now_ms())
        n = await self._sub.acks.ack_learning_tail(_keys(keys), self._reader.tail_key)
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
        self.ensure_started()
        now = self._clock.now_ms()
        self._sub.touch(consumer_id, now)
        since = now if nacked_at_ms is None else min(int(nacked_at_ms), now)
        n = self._sub.nack(consumer_id, _keys(keys), seconds_to_ms(delay_s) or 0, since)
        await self._sub.flush_dead_letters(self._reader.read_rows)
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
        self.ensure_started()
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
        self.ensure_started()
        return [
            self._sub.cancel(int(t[0]), int(t[1]), (int(m[0]), int(m[1])))
            for t, m in zip(targets, markers, strict=True)
        ]

    # --- looking at it ------------------------------------------------------------------------

    async def states(self, positions: list[tuple[int, int]]) -> list[str]:
        """Where each position stands here (see ``Cancels.states``)."""
        self.ensure_started()
        return self._sub.cancels.states(positions)

    async def pid(self) -> int:
        """The process id (tests use it to see a restart)."""
        return os.getpid()

    async def stats(self) -> dict:
        """The subscription's counts, plus ``recovery``: what this actor's start cost until
        its first delivery (init and first-delivery seconds, bytes read from the store by
        this actor and from the log, loose positions re-read, where the log read resumed)."""
        self.ensure_started()
        return self._sub.stats() | {
            "recovery": self._recovery.as_dict(),
            "tracker": tracker_stats(self._sub),
            "peek": dict(self._peeks.counts),
            "consumer_leases": self._sub.consumer_leases(self._clock.now_ms()),
            "lateness_counts": self._report.late_counts.tolist(),
            "lateness_stages": self._report.stages.as_dict(),
        }

    def metrics_snapshot(self) -> tuple[SubscriptionMetrics, dict, list] | None:
        """See :meth:`PartitionReport.snapshot`."""
        return self._report.snapshot()

    async def due_histogram(self, edges: list[int]) -> list[int]:
        """Pending delayed messages per due window (see the trackers' ``due_histogram``)."""
        self.ensure_started()
        return await self._peeks.due_histogram(edges)

    async def peek(
        self,
        limit: int,
        due_after: int | None = None,
        due_before: int | None = None,
        key: str | None = None,
    ) -> pa.RecordBatch:
        """The next scheduled messages not delivered yet (see :meth:`Peeks.peek`)."""
        self.ensure_started()
        return await self._peeks.peek(limit, due_after, due_before, key)

    # --- the cursor, stopping -----------------------------------------------------------------

    async def flush(self) -> None:
        """Persist the cursor now (and report mark-delete)."""
        self.ensure_started()
        report = self._cursor_io.progress_report(self._sub)  # (what this write covers)
        await self._sub.persist(force=True)
        await self._cursor_io.report_progress(report)

    async def close(self) -> None:
        """Persist the cursor, then stop the loops (a standing log read among them)."""
        await self.flush()
        self._closed = True
        if self._started:
            self._driver.close()

    async def abandon(self) -> None:
        """Stop the loops and write nothing (another host serves the partition now: see
        cursor_io on fencing); standing receives here return empty."""
        self._closed = True
        if self._started:
            self._driver.close()
            await self._notify()

    async def stop_for_reset(self, md: Position) -> None:
        """Stop this state for good and write what a start from mark-delete ``md`` needs
        (a reset of the cursor): the progress through the sealed buckets from ``md``'s
        ledger on starts again, then the cursor says ``md``, with no individual acks.
        The I/O under way finishes first, and nothing of this state is written after:
        the caller then recovers a new state from the store (``SubscriptionShell``).
        A crash between the two writes leaves the old cursor, with buckets to read again
        whose rows it acknowledged (they are skipped): nothing is lost, and the reset
        can be asked again."""
        self._closed = True
        if self._started:
            await self._driver.stop()
        async with self._sub.marks.lock:  # (a receive's write-ahead finishes first)
            self._sub.marks.write_cursor = None
            await asyncio.to_thread(self._cursor_io.write_reset, self._sub, md)
        if self._started:
            await self._notify()  # standing receives here return empty

    def take_over(self, old: SubscriptionShell) -> None:
        """After a reset: the consumers of the state this one replaces, as they were."""
        now = self._clock.now_ms()
        for consumer_id in old._sub.consumers():
            try:
                self._sub.add_consumer(consumer_id, now)
            except ConsumerBusy:
                pass
        self._rewinds.update(old._rewinds)
        self.on_available = old.on_available


def _keys(keys: Any) -> np.ndarray:
    """Position keys from a consumer: an int64 array (or a list of ints)."""
    arr = np.asarray(keys)
    if arr.ndim != 1 or (len(arr) and arr.dtype.kind not in "iu"):
        raise InvalidArgument("positions: expected a 1-d array of int64 position keys")
    return arr.astype(np.int64, copy=False)
