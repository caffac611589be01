"""HostActor: one process that holds the logs of many partitions, of any topics.

A Ray actor is a whole worker process (about 68 MiB and 7 ms of CPU a second while
idle here), so partitions are data inside a few hosts rather than an actor each, the way
a Pulsar broker owns bundles of topics. The coordinator assigns each partition to a
host slot (``host/<node>/<slot>``, ``placement.hosts_per_node`` of them per node),
journals the assignment, and starts the slot's host when it is not running
(``CoordinatorActor.locate``). Clients find a partition's host through that assignment
(:func:`partition_peer`), and look it up again after a failure.

- **Calls.** Each partition call is a method of its own, the topic and partition first
  (``append(topic, partition, batch)``), that runs the same method of the partition's
  :class:`~raydelay.actors.partition.hosted.HostedPartition`. A partition is opened on its
  first call, after the coordinator confirmed that it is this host's
  (``claim_partition``); a host that is not its host raises
  :class:`~raydelay.errors.PartitionMoved`, and the caller looks it up again.
- **Recovery.** A restarted host reopens every partition assigned to it, in parallel, on
  its first call (``host.open_threads`` at a time): each rebuilds its log and its delayed
  index from the store.
- **One loop per process.** Retention runs once per ``topic.retention_interval_ms`` over
  every partition the host holds, not as a loop per partition.
- **Fencing** is the log's own: ledger objects are written create-only and ledgers are
  rolled through the coordinator, so a host that lost a partition cannot write over what
  its new host writes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import ray

from raydelay.actors.coordinator import CoordinatorActor, spawn_coordinator
from raydelay.actors.partition.hosted import HostedPartition
from raydelay.actors.partition.keyed import KeyedReply
from raydelay.actors.protocol import BucketList, DueReply, ReadReply
from raydelay.actors.standby import FoundCoordinator, find_coordinator
from raydelay.cluster import placement, rpc
from raydelay.cluster.handles import Peer
from raydelay.cluster.names import COORDINATOR, SUBHOST_PREFIX
from raydelay.cluster.nodes import check_store
from raydelay.config import config_from_dict
from raydelay.dispatch.peek import PeekRange
from raydelay.errors import NotFound, PartitionMoved, Unavailable
from raydelay.log.reader import KeyRows
from raydelay.positions import Position

log = logging.getLogger(__name__)

OPEN_THREADS = 8  # partitions recovered at once by one host


class HostActor:
    def __init__(self, name: str, config: dict[str, Any]) -> None:
        self._name = name
        self._config_dict = config
        self._config = config_from_dict(config)
        check_store(self._config.storage)  # before anything is written where it should not be
        self._coordinator = coordinator_peer(config)
        self._parts: dict[tuple[str, int], HostedPartition] = {}
        self._opening: dict[tuple[str, int], asyncio.Future] = {}
        self._open_pool = ThreadPoolExecutor(OPEN_THREADS, thread_name_prefix="raydelay-open")
        self._started = False
        self.recovery: dict[str, Any] = {}

    # --- partitions -----------------------------------------------------------------------

    async def _partition(self, topic: str, partition: int) -> HostedPartition:
        """The partition, opened on its first call here."""
        self._ensure_started()
        part = self._parts.get((topic, partition))
        if part is None:
            part = await self._open(topic, int(partition))
        return part

    # Each of the partition's calls (see HostedPartition and its parts for what they do).

    async def append(self, topic: str, partition: int, batch: bytes | list[bytes]) -> list:
        return await (await self._partition(topic, partition)).append(batch)

    async def cancel(
        self,
        topic: str,
        partition: int,
        positions: list[tuple[int, int]],
        producer: str = "",
        sequence_id: int = 0,
    ) -> list[tuple[int, int]]:
        part = await self._partition(topic, partition)
        return await part.cancel(positions, producer, sequence_id)

    async def check_cancel(
        self, topic: str, partition: int, positions: list[tuple[int, int]]
    ) -> None:
        """NotFound for a target a cancel would refuse; nothing is written (a cancel of
        several partitions checks them all before it writes any marker)."""
        await (await self._partition(topic, partition)).check_cancel(positions)

    async def append_keyed(
        self, topic: str, partition: int, batch: bytes, on_duplicate: str
    ) -> KeyedReply:
        """Append a batch whose keys are its messages' identities; see
        ``raydelay.actors.partition.keyed``."""
        return await (await self._partition(topic, partition)).append_keyed(batch, on_duplicate)

    async def cancel_keys(
        self, topic: str, partition: int, keys: list[str], producer: str = "", sequence_id: int = 0
    ) -> list[list]:
        """Cancel markers for the messages pending under ``keys``: per key, its [(target,
        marker)]."""
        part = await self._partition(topic, partition)
        return await part.cancel_keys(keys, producer, sequence_id)

    async def pending_keys(self, topic: str, partition: int, keys: list[str]) -> dict:
        """The position keys of the messages pending under each of ``keys``."""
        return await (await self._partition(topic, partition)).pending_keys(keys)

    async def read(
        self,
        topic: str,
        partition: int,
        from_position: tuple[int, int],
        max_entries: int,
        wait_s: float = 0.0,
        skip_delayed: bool = False,
        due_within_ms: int | None = None,
    ) -> ReadReply:
        part = await self._partition(topic, partition)
        return await part.read(from_position, max_entries, wait_s, skip_delayed, due_within_ms)

    async def key_rows(self, topic: str, partition: int, keys: Any) -> KeyRows:
        """The keys and ``deliver_at`` of the entries at position ``keys`` (no payloads;
        from the sealed buckets for a ledger retention deleted)."""
        return await (await self._partition(topic, partition)).key_rows(keys)

    async def read_positions(self, topic: str, partition: int, keys: Any) -> pa.RecordBatch:
        return await (await self._partition(topic, partition)).read_positions(keys)

    async def wait_for_entries(
        self, topic: str, partition: int, after_position: Any, timeout_s: float
    ) -> Position | None:
        part = await self._partition(topic, partition)
        return await part.wait_for_entries(after_position, timeout_s)

    async def cancel_markers(
        self, topic: str, partition: int, from_position: tuple[int, int]
    ) -> list:
        return await (await self._partition(topic, partition)).cancel_markers(from_position)

    async def position_at(self, topic: str, partition: int, time_ms: int) -> Position | None:
        return await (await self._partition(topic, partition)).position_at(time_ms)

    async def last_sequence(self, topic: str, partition: int, producer: str) -> int:
        return await (await self._partition(topic, partition)).last_sequence(producer)

    async def tail(self, topic: str, partition: int) -> Position | None:
        return await (await self._partition(topic, partition)).tail()

    async def close_ledger(self, topic: str, partition: int) -> bool:
        return await (await self._partition(topic, partition)).close_ledger()

    async def ledgers(self, topic: str, partition: int) -> list[tuple[int, int | None]]:
        return await (await self._partition(topic, partition)).ledgers()

    async def stats(self, topic: str, partition: int) -> dict:
        return await (await self._partition(topic, partition)).stats()

    async def trim(self, topic: str, partition: int) -> list[int]:
        return await (await self._partition(topic, partition)).trim()

    async def due_unsealed(
        self,
        topic: str,
        partition: int,
        taken_below: int,
        taken_through: int,
        now_ms: int,
        known_version: int = -1,
        known_through: int = -1,
    ) -> DueReply:
        part = await self._partition(topic, partition)
        return await part.due_unsealed(
            taken_below, taken_through, now_ms, known_version, known_through
        )

    async def unsealed_histogram(
        self, topic: str, partition: int, edges: list[int], now_ms: int
    ) -> list[int]:
        return await (await self._partition(topic, partition)).unsealed_histogram(edges, now_ms)

    async def peek_unsealed(
        self,
        topic: str,
        partition: int,
        taken_below: int,
        taken_through: int,
        q: PeekRange,
        start: tuple[int, int] | None,
        page: int,
    ) -> pa.RecordBatch:
        part = await self._partition(topic, partition)
        return await part.peek_unsealed(taken_below, taken_through, q, start, page)

    async def buckets(self, topic: str, partition: int) -> BucketList:
        return await (await self._partition(topic, partition)).buckets()

    # --- opening and recovery ---------------------------------------------------------------

    async def _open(self, topic: str, partition: int) -> HostedPartition:
        key = (topic, partition)
        fut = self._opening.get(key)
        if fut is None:
            fut = asyncio.ensure_future(self._open_now(topic, partition))
            self._opening[key] = fut
            fut.add_done_callback(lambda _: self._opening.pop(key, None))
        return await asyncio.shield(fut)

    async def _open_now(self, topic: str, partition: int) -> HostedPartition:
        owner = await self._coordinator.once(
            CoordinatorActor.claim_partition, topic, partition, self._name
        )
        if owner != self._name:
            raise PartitionMoved(f"partition {topic}/{partition} is served by {owner}")
        loop = asyncio.get_running_loop()
        part = await loop.run_in_executor(
            self._open_pool,
            lambda: rpc.recover(
                HostedPartition,
                topic,
                partition,
                self._config_dict,
                self._coordinator,
                what=f"{self._name}: partition {topic}/{partition}",
            ),
        )
        self._parts[(topic, partition)] = part
        return part

    def _ensure_started(self) -> None:
        if self._started:
            return
        self._started = True
        loop = asyncio.get_running_loop()
        loop.create_task(self._recover_assigned())
        loop.create_task(self._retention())

    async def _recover_assigned(self) -> None:
        """Open every partition assigned to this host, in parallel (a restarted host has
        them all to recover; the ones a caller asks for first go first anyway)."""
        started = time.monotonic()
        try:
            assigned = await self._coordinator.once(CoordinatorActor.host_partitions, self._name)
        except Exception as exc:  # noqa: BLE001 - calls open their partitions anyway
            log.warning("%s: cannot list its partitions (%s)", self._name, exc)
            return
        results = await asyncio.gather(
            *[self._open(t, int(p)) for t, p in assigned if (t, int(p)) not in self._parts],
            return_exceptions=True,
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        for err in failed[:3]:
            log.warning("%s: opening a partition failed: %s", self._name, err)
        self.recovery = {
            "partitions": len(assigned),
            "failed": len(failed),
            "seconds": round(time.monotonic() - started, 3),
        }
        if assigned:
            log.info(
                "%s: %d partitions opened in %.2f s",
                self._name,
                len(assigned),
                time.monotonic() - started,
            )

    async def _retention(self) -> None:
        """Every ``topic.retention_interval_ms``: trim each partition this host holds."""
        interval_s = self._config.topic.retention_interval_ms / 1000
        retries: dict[tuple[str, int], rpc.Retries] = {}

        async def topic_exists(topic: str) -> bool:
            return topic in await self._coordinator.once(CoordinatorActor.topics)

        while True:
            await asyncio.sleep(interval_s)
            await retention_pass(self._parts, retries, topic_exists)

    async def adopt(self, partitions: list[tuple[str, int]]) -> int:
        """Open ``partitions`` now, in the background (they were assigned here when their
        node was lost: ``CoordinatorActor._evacuate``), so that they recover before their
        callers come back. Each is claimed as on a first call. Returns how many it began."""
        self._ensure_started()
        began = 0
        for topic, p in partitions:
            if (topic, int(p)) not in self._parts:
                began += 1
                asyncio.ensure_future(self._open(topic, int(p))).add_done_callback(
                    log_failed(f"{self._name}: adopting {topic}/{p}")
                )
        return began

    # --- the host ---------------------------------------------------------------------------

    async def partitions(self) -> list[tuple[str, int]]:
        """The partitions open here."""
        return sorted(self._parts)

    async def drop_topic(self, topic: str) -> int:
        """Close and forget this host's partitions of ``topic`` (it is being deleted); the
        long polls standing at them are answered first (their callers would otherwise wait
        them out, and a process that waits on a call it made cannot end gracefully)."""
        doomed = [k for k in self._parts if k[0] == topic]
        for key in doomed:
            part = self._parts.pop(key)
            await part.stop_reads()
            part.close()
        return len(doomed)

    async def close_ledgers(self) -> int:
        """Close every open ledger here (a clean stop: a restart has nothing to fence)."""
        closed = await asyncio.gather(*[p.close_ledger() for p in self._parts.values()])
        return sum(bool(c) for c in closed)

    async def host_stats(self) -> dict:
        """The host's own counts (``stats`` is a partition's)."""
        return {
            "name": self._name,
            "pid": os.getpid(),
            "partitions": [f"{t}/{p}" for t, p in sorted(self._parts)],
            "recovery": self.recovery,
        }

    async def pid(self) -> int:
        return os.getpid()


def spawn_host(name: str, config: dict[str, Any]) -> Any:
    """The host called ``name`` (``host/<node>/<slot>``, or a subscription host,
    ``subhost/<node>/<slot>``), started if it does not run."""
    if name.startswith(SUBHOST_PREFIX):
        # (imported here: the subscription host's module imports this one)
        from raydelay.actors.subscription.host import SubscriptionHost

        cls: type = SubscriptionHost
    else:
        cls = HostActor
    return ray.remote(cls).options(**placement.actor_options(name, config)).remote(name, config)


def log_failed(what: str) -> Callable[[asyncio.Future], None]:
    """A done callback that logs the failure of a task nobody awaits (an adoption: its
    callers open what it could not)."""

    def done(fut: asyncio.Future) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            log.info("%s failed: %s", what, fut.exception())

    return done


def adopt_on_host(name: str, keys: list) -> None:
    """Have the host called ``name`` open ``keys`` now (a partition host its
    ``(topic, partition)``s, a subscription host its units), without waiting for it: the
    coordinator's ``adopt`` after a node loss. A host that does not run is left alone: it
    opens what it serves on its first calls."""
    peer = Peer.of_running(name)
    if peer is None:
        return
    if name.startswith(SUBHOST_PREFIX):
        from raydelay.actors.subscription.host import SubscriptionHost

        peer.submit(SubscriptionHost.adopt, keys)
    else:
        peer.submit(HostActor.adopt, keys)


def coordinator_peer(
    config: dict[str, Any], found: FoundCoordinator | None = None
) -> Peer[CoordinatorActor]:
    """The cluster's coordinator, which starts this module's hosts: the one that serves
    (``found``, or :func:`find_coordinator` after a failure), or its standby once it was
    lost; created from ``config`` when neither runs."""
    return Peer(
        COORDINATOR,
        lambda: spawn_coordinator(config, spawn_host, adopt_on_host),
        "coordinator",
        None if found is None else found.handle,
        find=find_coordinator,
        actor_name=None if found is None else found.name,
        deadline_s=config_from_dict(config).client.retry_deadline_s,
    )


def partition_peer(
    topic: str,
    partition: int,
    config: dict[str, Any],
    coordinator: Peer[CoordinatorActor] | None = None,
) -> Peer[HostActor]:
    """A partition of a topic, on whichever host serves it: found through the coordinator's
    assignment (which starts the host if needed), again after a failure. NotFound once the
    topic is deleted. Its calls name the topic and partition first
    (``peer.submit(HostActor.append, topic, partition, batch)``)."""
    coordinator = coordinator or coordinator_peer(config)

    def resolve() -> Any:
        name = coordinator.call_from_thread(CoordinatorActor.locate, topic, partition)
        handle = placement.lookup_or_none(name)
        if handle is None:  # (it ended since; the next try looks it up again)
            raise Unavailable(f"host {name} of {topic}/{partition} is not running")
        return handle

    return Peer(
        f"{topic}/{partition}",
        lambda: None,
        f"partition {topic}/{partition}",
        resolve=resolve,
        deadline_s=config_from_dict(config).client.retry_deadline_s,
    )


async def retention_pass(
    parts: dict[tuple[str, int], Any],
    retries: dict[tuple[str, int], rpc.Retries],
    topic_exists: Callable[[str], Awaitable[bool]],
) -> None:
    """Trim each of ``parts`` once (``trim()``), a failure reported by its ``retries``. A
    NotFound of a topic the coordinator no longer has (deleted during the pass; the host's
    ``drop_topic`` takes its partitions off next) is no failure; any other NotFound is. A
    partition that ``drop_topic`` took off and closed while the pass trimmed it is no
    failure either (its thread pools are shut down under the trim)."""
    for key, part in list(parts.items()):
        r = retries.setdefault(key, rpc.Retries(log, f"retention of {key[0]}/{key[1]}"))
        try:
            await part.trim()
            r.ok()
        except NotFound as exc:
            try:
                gone = key not in parts or not await topic_exists(key[0])
            except Exception:  # noqa: BLE001 - unknown: reported as the failure it was
                gone = False
            if not gone:
                r.failed(exc)
        except Exception as exc:  # noqa: BLE001 - reported; retried next interval
            if key not in parts:  # dropped during the pass (its topic deleted): no failure
                continue
            r.failed(exc)
