"""One unit of a subscription in its subscription host: a
:class:`~raydelay.actors.subscription.shell.SubscriptionShell` per partition it serves.

A :class:`SubscriptionUnit` serves every partition of a subscription (or, with
``subscription.partitions_per_actor``, a group of them), recovered in parallel when its
host opens it. Each call is a method of its own that names the partition first
(``ack(partition, consumer_id, keys)``); calls for several partitions come once per unit
(``receive_many``, ``ack_many``, ``heartbeat_many``, ``cancel_many``). One loop per unit
reports every partition's metrics once a second. The host
(:class:`~raydelay.actors.subscription.host.SubscriptionHost`) runs these methods for
its callers, the unit first.

A unit never blocks its host's event loop: recovery runs on threads, and handle lookups go
through :class:`~raydelay.cluster.handles.Peer` off the loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.metrics import SubscriptionMetrics
from raydelay.actors.protocol import ReceiveReply
from raydelay.actors.subscription.cursor_io import Fence
from raydelay.actors.subscription.receives import PartitionReceives
from raydelay.actors.subscription.shell import SubscriptionShell
from raydelay.clock import now_ms
from raydelay.cluster import rpc
from raydelay.cluster.handles import Peer
from raydelay.cluster.names import Unit, subscription_groups
from raydelay.config import config_from_dict
from raydelay.dispatch.wire import delivery_batch, pack_delivery
from raydelay.errors import InvalidArgument, Unavailable

log = logging.getLogger(__name__)

_REPORT_S = 1.0  # how often metrics are reported
_IDLE_REPORT_S = 8.0  # ... and at most how seldom, while nothing changes
_OPEN_THREADS = 8  # partitions recovered at once


class SubscriptionUnit:
    """A subscription (or one group of its partitions) in its host: a
    :class:`SubscriptionShell` per partition it serves. Made on a thread (it asks the
    coordinator), used on the host's event loop: :meth:`open_partitions` recovers its
    partitions there, in parallel on threads, and each serves as soon as it is recovered
    (a partition whose own host was lost too does not hold the others up). A call at a
    partition still recovering waits for it; a receive at several gets what the recovered
    ones have, and the others join it as they come."""

    def __init__(
        self,
        unit: Unit,
        config: dict,
        coordinator: Peer[CoordinatorActor],
        fence: Fence | None = None,
    ) -> None:
        started = time.monotonic()
        topic, subscription, group = unit
        self._name = f"sub/{unit.key}"
        mine, self._options = _group_partitions(coordinator, topic, subscription, group, config)
        if not mine:
            raise InvalidArgument(f"group: {topic}/{subscription} has no partition group {group}")

        self._mine = mine
        self._started_at = started
        self._parts: dict[int, SubscriptionShell] = {}  # the partitions recovered so far
        self._opening: dict[int, asyncio.Future] = {}  # the partitions being recovered
        self._pool = ThreadPoolExecutor(
            min(_OPEN_THREADS, len(mine)), thread_name_prefix="raydelay-open"
        )
        # set whenever a partition may have something for a receive (then replaced):
        # receive_many waits on it for all the partitions it asks
        self._available: asyncio.Event | None = None
        self._started = False
        self.closed = False
        self._topic, self._subscription, self._config = topic, subscription, config
        self._coordinator = coordinator
        self._fence = fence
        self._resetting: dict[int, asyncio.Event] = {}  # partitions whose cursor is reset now
        self._reset_lock = asyncio.Lock()
        self._receives = PartitionReceives()

    def open_partitions(self) -> None:
        """Start recovering every partition (on the event loop: each registers there once
        recovered)."""
        loop = asyncio.get_running_loop()
        for p in self._mine:
            # (the options read to open the unit: a reset later reads them again)
            fut = loop.run_in_executor(self._pool, self._open_one, p, self._options)
            self._opening[p] = fut
            fut.add_done_callback(functools.partial(self._recovered, p))

    def _open_one(self, p: int, options: dict | None = None) -> SubscriptionShell:
        """Recover partition ``p`` from the store (blocking: on a thread); ``options``: the
        subscription's, read just now (else the shell reads them)."""
        return rpc.recover(
            SubscriptionShell,
            self._topic,
            p,
            self._subscription,
            self._config,
            self._coordinator,
            self._fence,
            options,
            what=f"sub/{self._topic}/{p}/{self._subscription}",
        )

    def _recovered(self, p: int, fut: asyncio.Future) -> None:
        """A partition's recovery ended: it serves from now on (its loops start if the
        unit's have), and receives standing here take it in."""
        if fut.cancelled() or fut.exception() is not None or self.closed:
            return  # (a failed recovery is raised to the calls that wait for it)
        shell = fut.result()
        shell.on_available = self._changed
        self._parts[p] = shell
        if self._started:
            shell.ensure_started()
        self._changed()
        if len(self._parts) == len(self._mine):
            self._pool.shutdown(wait=False)
            log.info(
                "%s: %d partitions recovered in %.2f s",
                self._name,
                len(self._mine),
                time.monotonic() - self._started_at,
            )

    async def _ready(self, partition: int) -> None:
        """Wait until the partition is recovered (its recovery's error is raised)."""
        if partition not in self._parts and partition in self._opening:
            await asyncio.shield(self._opening[partition])

    def _part(self, partition: int) -> SubscriptionShell:
        part = self._parts.get(partition)
        if part is None:
            if partition in self._mine:  # (callers wait for _ready first)
                raise Unavailable(f"{self._name}: partition {partition} is still recovering")
            raise InvalidArgument(
                f"partition: {self._name} serves partitions {self._mine}, not {partition!r}"
            )
        if self.closed:
            raise Unavailable(f"{self._name}: closed (its host stops serving it)")
        if not self._started:  # every partition starts its loops with the first call
            self._started = True
            for each in self._parts.values():
                each.ensure_started()
            MetricsLoop.of_loop().add(self)
        return part

    def metrics_snapshots(self) -> list[tuple[SubscriptionMetrics, dict, list]]:
        """What each partition has to report to Ray's metrics (those where something
        changed; see :meth:`PartitionReport.snapshot`)."""
        return [m for m in (p.metrics_snapshot() for p in self._parts.values()) if m]

    async def _serving(self, partition: int) -> SubscriptionShell:
        """The partition, once no reset of its cursor is under way."""
        await self._not_resetting(partition)
        return self._part(partition)

    # Each call at one partition it serves, the partition first (see SubscriptionShell
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

    async def states(self, partition: int, positions: list[tuple[int, int]]) -> list[str]:
        return await (await self._serving(partition)).states(positions)

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
        packed: bool = False,
        ahead_ms: int = 0,
    ) -> ReceiveReply:
        """One receive at several partitions this actor serves (those of a consumer's that
        share it: one call for all, where one each would cost a call each): up to
        ``max_messages`` from each (see :meth:`receive`). It returns as
        soon as one has something (or fails, or answers at once), or after ``timeout_s``:
        (partition, record batch) of those with messages, and (partition, error) of those
        whose receive failed (see ReceiveReply): what the others handed out still reaches
        the consumer. A partition still recovering joins the receive once it is. With
        ``packed``, each record batch goes as :func:`~raydelay.dispatch.wire.pack_delivery`
        makes it (a client of an earlier version asks without). ``ahead_ms``: delayed
        messages due within that many ms go out too, for a client that holds each until its
        due time (0, as an earlier version asks: none before it is due)."""
        if not partitions:
            raise InvalidArgument("partitions: at least one is needed")
        ahead_ms = check_ahead_ms(ahead_ms)
        failed: dict[int, BaseException] = {}
        live: list[int] = []
        waiting = list(dict.fromkeys(int(x) for x in partitions))  # not begun yet
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        while True:
            if self._available is None:
                self._available = asyncio.Event()
            available = self._available  # (taken before looking: no change is missed)
            for p in list(waiting):
                opening = self._opening.get(p)
                if p not in self._parts and opening is not None and not opening.done():
                    continue  # (still recovering: it joins when it is)
                waiting.remove(p)
                try:
                    await self._not_resetting(p)
                    self._part(p).begin_receive(consumer_id)
                    live.append(p)
                except Exception as exc:  # noqa: BLE001 - handed back with that partition
                    failed[p] = exc
            got, done = [], bool(failed)
            # (each partition on a task of its own: a slow one does not hold the others)
            answers, errors, running = await self._receives.collect(
                consumer_id,
                live,
                functools.partial(
                    self._receive_one, consumer_id, int(max_messages), rewinds, ahead_ms
                ),
            )
            for p in live:
                if p in errors:  # handed back with that partition
                    failed[p] = errors[p]
                    done = True
                elif p in answers:
                    out, answer = answers[p]
                    if out:
                        rb = delivery_batch(out)
                        got.append((p, pack_delivery(rb) if packed else rb))
                    done = done or answer
            live = [p for p in live if p not in failed]
            remaining = deadline - time.monotonic()
            if done or remaining <= 0:
                return ReceiveReply(got, list(failed.items()), now_ms() if got else 0)
            changed = asyncio.ensure_future(available.wait())
            try:  # (until something may be there, or a slow partition's receive ends)
                await asyncio.wait(
                    [changed, *running], timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                changed.cancel()

    async def _receive_one(
        self, consumer_id: str, max_messages: int, rewinds: int, ahead_ms: int, partition: int
    ) -> tuple[list, bool]:
        await self._not_resetting(partition)
        part = self._part(partition)
        return await part.receive_now(consumer_id, max_messages, rewinds, ahead_ms)

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
        """Wait until the partition is recovered, and while its cursor is reset (the
        state a call would reach is being replaced)."""
        await self._ready(int(partition))
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
            await self._ready(p)
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
            new = await asyncio.to_thread(self._open_one, partition)
            new.take_over(old)
            self._parts[partition] = new
            new.ensure_started()

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
        """Persist every partition's cursor and stop their loops, and the metrics loop;
        receives standing here return (their partitions answer Unavailable: closed)."""
        self.closed = True
        self._changed()
        self._receives.forget_all()
        self._pool.shutdown(wait=False, cancel_futures=True)  # (recoveries not begun)
        await asyncio.gather(*[p.close() for p in self._parts.values()])
        MetricsLoop.of_loop().discard(self)

    async def abandon(self) -> None:
        """Stop every partition's loops, writing nothing (fenced: another host serves the
        unit now), and the metrics loop; receives standing here return."""
        self.closed = True
        self._changed()
        self._receives.forget_all()
        self._pool.shutdown(wait=False, cancel_futures=True)  # (recoveries not begun)
        await asyncio.gather(*[p.abandon() for p in self._parts.values()])
        MetricsLoop.of_loop().discard(self)

    def partitions(self) -> list[int]:
        return list(self._mine)


MAX_AHEAD_MS = 60_000  # the most a receive may ask to be handed ahead of due


def check_ahead_ms(ahead_ms: object) -> int:
    """A receive's ``ahead_ms``: an int of 0..MAX_AHEAD_MS, else InvalidArgument."""
    if isinstance(ahead_ms, bool) or not isinstance(ahead_ms, int):
        raise InvalidArgument(f"ahead_ms: expected an int, got {type(ahead_ms).__name__}")
    if not 0 <= ahead_ms <= MAX_AHEAD_MS:
        raise InvalidArgument(f"ahead_ms: must be 0..{MAX_AHEAD_MS}, got {ahead_ms}")
    return ahead_ms


def _group_partitions(
    coordinator: Peer[CoordinatorActor], topic: str, subscription: str, group: int, config: dict
) -> tuple[list[int], dict]:
    """The partitions the actor of partition group ``group`` of a subscription serves (by
    its ``partitions_per_actor``, the config's when it has none), and the subscription's
    options."""
    n = coordinator.call_from_thread(CoordinatorActor.partitions, topic)
    options = coordinator.call_from_thread(CoordinatorActor.subscription, topic, subscription)
    per_actor = options.get(
        "partitions_per_actor", config_from_dict(config).subscription.partitions_per_actor
    )
    return subscription_groups(n, per_actor).get(group, []), options


class MetricsLoop:
    """One loop per process (per event loop) that reports every started unit's metrics
    once a second: what changed in each partition goes to Ray's metrics, recorded on a
    thread (hundreds of histogram samples, recorded on the event loop, held a due delivery
    up by 10-20 ms). While nothing changes it looks half as often each time, down to once
    every _IDLE_REPORT_S: a host of a hundred idle units wakes that seldom for them all,
    and not at all once the last one closed."""

    _loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, MetricsLoop] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self) -> None:
        self._units: dict[SubscriptionUnit, None] = {}  # (in the order they started)
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def of_loop(cls) -> MetricsLoop:
        loop = asyncio.get_running_loop()
        found = cls._loops.get(loop)
        if found is None:
            found = cls._loops[loop] = cls()
        return found

    def add(self, unit: SubscriptionUnit) -> None:
        self._units[unit] = None
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def discard(self, unit: SubscriptionUnit) -> None:
        self._units.pop(unit, None)

    async def _run(self) -> None:
        wait_s = _REPORT_S
        while self._units:
            await asyncio.sleep(wait_s)
            batch = [m for unit in list(self._units) for m in unit.metrics_snapshots()]
            if not batch:  # all idle: look less often (a change waits up to _IDLE_REPORT_S)
                wait_s = min(wait_s * 2, _IDLE_REPORT_S)
                continue
            wait_s = _REPORT_S
            try:
                await asyncio.to_thread(_record_all, batch)
            except Exception:  # noqa: BLE001 - metrics must never stop the subscriptions
                log.exception("reporting subscription metrics failed")


def _record_all(batch: list[tuple[SubscriptionMetrics, dict, list]]) -> None:
    for metrics, stats, ops in batch:
        metrics.report(stats, ops)
