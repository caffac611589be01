"""HostActor: one process that holds the logs of many partitions, of any topics.

A Ray actor is a whole worker process (about 68 MiB and 7 ms of CPU a second while
idle here), so partitions are data inside a few hosts rather than an actor each, the way
a Pulsar broker owns bundles of topics. The coordinator assigns each partition to a
host slot (``host/<node>/<slot>``, ``placement.hosts_per_node`` of them per node),
journals the assignment, and starts the slot's host when it is not running
(``CoordinatorActor.locate``). Clients find a partition's host through that assignment
(:func:`partition_peer`), and look it up again after a failure.

- **Calls.** ``call(topic, partition, method, *args)`` runs ``method`` of the partition's
  :class:`~raydelay.actors.topic.TopicPartition`. A partition is opened on its first
  call, after the coordinator confirmed that it is this host's (``claim_partition``); a host that
  is not its host raises :class:`~raydelay.errors.PartitionMoved`, and the caller looks
  it up again.
- **Recovery.** A restarted host reopens every partition assigned to it, in parallel, on
  its first call (``host.open_threads`` at a time): each rebuilds from the store as a
  partition actor did.
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
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray

from raydelay.actors.coordinator import coordinator_peer
from raydelay.actors.topic import TopicPartition
from raydelay.cluster import placement, rpc
from raydelay.cluster.handles import Peer
from raydelay.cluster.nodes import check_store
from raydelay.config import config_from_dict
from raydelay.errors import InvalidArgument, PartitionMoved, Unavailable

log = logging.getLogger(__name__)

OPEN_THREADS = 8  # partitions recovered at once by one host

# What a caller may run on a partition (``call``): TopicPartition's public calls.
PARTITION_METHODS = frozenset(
    {
        "append",
        "cancel",
        "read",
        "read_positions",
        "wait_for_entries",
        "cancel_markers",
        "position_at",
        "last_sequence",
        "pid",
        "tail",
        "close_ledger",
        "ledgers",
        "stats",
        "trim",
        "due_unsealed",
        "unsealed_histogram",
        "peek_unsealed",
        "buckets",
    }
)


class HostActor:
    def __init__(self, name: str, config: dict[str, Any]) -> None:
        self._name = name
        self._config_dict = config
        self._config = config_from_dict(config)
        check_store(self._config.storage)  # before anything is written where it should not be
        self._coordinator = coordinator_peer(config)
        self._parts: dict[tuple[str, int], TopicPartition] = {}
        self._opening: dict[tuple[str, int], asyncio.Future] = {}
        self._open_pool = ThreadPoolExecutor(OPEN_THREADS, thread_name_prefix="raydelay-open")
        self._started = False
        self.recovery: dict[str, Any] = {}

    # --- partitions -----------------------------------------------------------------------

    async def call(self, topic: str, partition: int, method: str, *args: Any) -> Any:
        """Run ``method(*args)`` of partition ``partition`` of ``topic`` on this host."""
        if method not in PARTITION_METHODS:
            raise InvalidArgument(f"method: a partition has no call {method!r}")
        self._ensure_started()
        part = self._parts.get((topic, partition))
        if part is None:
            part = await self._open(topic, int(partition))
        return await getattr(part, method)(*args)

    async def _open(self, topic: str, partition: int) -> TopicPartition:
        key = (topic, partition)
        fut = self._opening.get(key)
        if fut is None:
            fut = asyncio.ensure_future(self._open_now(topic, partition))
            self._opening[key] = fut
            fut.add_done_callback(lambda _: self._opening.pop(key, None))
        return await asyncio.shield(fut)

    async def _open_now(self, topic: str, partition: int) -> TopicPartition:
        owner = await self._coordinator.once("claim_partition", topic, partition, self._name)
        if owner != self._name:
            raise PartitionMoved(f"partition {topic}/{partition} is served by {owner}")
        loop = asyncio.get_running_loop()
        part = await loop.run_in_executor(
            self._open_pool,
            lambda: rpc.recover(
                TopicPartition,
                topic,
                partition,
                self._config_dict,
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
            assigned = await self._coordinator.once("host_partitions", self._name)
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
        while True:
            await asyncio.sleep(interval_s)
            for key, part in list(self._parts.items()):
                r = retries.setdefault(key, rpc.Retries(log, f"retention of {key[0]}/{key[1]}"))
                try:
                    await part.trim()
                    r.ok()
                except Exception as exc:  # noqa: BLE001 - reported; retried next interval
                    r.failed(exc)

    # --- the host ---------------------------------------------------------------------------

    async def partitions(self) -> list[tuple[str, int]]:
        """The partitions open here."""
        return sorted(self._parts)

    async def drop_topic(self, topic: str) -> int:
        """Close and forget this host's partitions of ``topic`` (it is being deleted)."""
        doomed = [k for k in self._parts if k[0] == topic]
        for key in doomed:
            self._parts.pop(key).close()
        return len(doomed)

    async def close_ledgers(self) -> int:
        """Close every open ledger here (a clean stop: a restart has nothing to fence)."""
        closed = await asyncio.gather(*[p.close_ledger() for p in self._parts.values()])
        return sum(bool(c) for c in closed)

    async def stats(self) -> dict:
        return {
            "name": self._name,
            "pid": os.getpid(),
            "partitions": [f"{t}/{p}" for t, p in sorted(self._parts)],
            "recovery": self.recovery,
        }

    async def pid(self) -> int:
        return os.getpid()


def spawn_host(name: str, config: dict[str, Any]) -> Any:
    """The host called ``name`` (``host/<node>/<slot>``), started if it does not run."""
    return (
        ray.remote(HostActor).options(**placement.actor_options(name, config)).remote(name, config)
    )


def partition_peer(
    topic: str, partition: int, config: dict[str, Any], coordinator: Peer | None = None
) -> Peer:
    """A partition of a topic, on whichever host serves it: found through the coordinator's
    assignment (which starts the host if needed), again after a failure. NotFound once the
    topic is deleted."""
    coordinator = coordinator or coordinator_peer(config)
    deadline_s = config_from_dict(config).client.retry_deadline_s

    def resolve() -> Any:
        name = coordinator.call(
            "locate", topic, partition, deadline_s=deadline_s, wait=rpc.get_blocking
        )
        handle = placement.lookup_or_none(name)
        if handle is None:  # (it ended since; the next try looks it up again)
            raise Unavailable(f"host {name} of {topic}/{partition} is not running")
        return handle

    return Peer(
        f"{topic}/{partition}",
        lambda: None,
        f"partition {topic}/{partition}",
        route=(topic, partition),
        resolve=resolve,
    )
