"""SubscriptionHost: one process that serves many subscriptions' units, of any topics.

A Ray actor is a whole worker process, so subscriptions are data inside a few hosts, the
way partitions are inside partition hosts (``raydelay.actors.host``). A **unit** is
partition group ``group`` of a subscription (:class:`~raydelay.cluster.names.Unit`). The
coordinator assigns each unit to a subscription host slot (``subhost/<node>/<slot>``,
``placement.subscription_hosts_per_node`` of them per node), by failure domain, journals
the assignment and starts the slot's host when it does not run
(``CoordinatorActor.locate_unit``). Clients find a unit's host through that assignment
(:func:`unit_peer`), and look it up again after a failure.

- **Calls.** Each call is a method of its own, the unit first, that runs the same method
  of the unit's :class:`~raydelay.actors.subscription.unit.SubscriptionUnit`
  (``ack(unit, partition, consumer_id, keys)``).
- **Opening.** A unit is opened on its first call here, after the coordinator confirmed
  that it is this host's (``claim_unit``); a host that is not its host raises
  :class:`~raydelay.errors.PartitionMoved` and the caller looks it up again. Opening
  recovers the unit's partitions from the store, on a thread.
- **Failover.** When a host's node is lost, its units are assigned again to the slots of
  the nodes left, preferring slots already running, and ``placement.warm_subscription_hosts``
  slots of every node run even when idle: the units resume in running processes. On a
  SIGKILLed node the old host is gone with it; on a node that vanished it may run on until
  Ray ends it, but it is fenced: its next cursor write meets the new host's (create-only versions, see
  ``cursor_io``), it learns that the unit moved, stops delivering and drops the unit.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.host import coordinator_peer, log_failed
from raydelay.actors.protocol import ReceiveReply
from raydelay.actors.subscription.cursor_io import Fence
from raydelay.actors.subscription.unit import SubscriptionUnit
from raydelay.cluster import placement, rpc
from raydelay.cluster.handles import Peer
from raydelay.cluster.names import Unit
from raydelay.config import config_from_dict
from raydelay.errors import PartitionMoved, Unavailable
from raydelay.storage import shared_store

log = logging.getLogger(__name__)

OPEN_THREADS = 4  # units opened at once by one host (each recovers its partitions in parallel)


class SubscriptionHost:
    def __init__(self, name: str, config: dict[str, Any]) -> None:
        self._name = name
        self._config_dict = config
        self._coordinator = coordinator_peer(config)
        self._units: dict[Unit, SubscriptionUnit] = {}
        self._opening: dict[Unit, asyncio.Future] = {}
        self._open_pool = ThreadPoolExecutor(OPEN_THREADS, thread_name_prefix="raydelay-unit")
        self.recovery: dict[str, float] = {}  # unit key -> seconds its opening took
        # its store is made now, idle or not: a warm host adopts units without making it
        # (an S3 client, and importing boto3, cost a second of CPU while a failover runs)
        shared_store(config_from_dict(config))
        # What the process holds by now (Ray, pyarrow, the store client: hundreds of
        # thousands of objects, all long-lived) leaves the collector's full passes: one took
        # 52 ms here under a 20k msg/s stream, holding every delivery of this host; after
        # this, none over 5 ms in two such runs
        gc.freeze()

    # --- units --------------------------------------------------------------------------------

    async def _unit(self, unit: Unit | tuple) -> SubscriptionUnit:
        """The unit, opened on its first call here."""
        key = Unit(*unit)
        found = self._units.get(key)
        if found is None:
            found = await self._open(key)
        return found

    async def _open(self, unit: Unit) -> SubscriptionUnit:
        fut = self._opening.get(unit)
        if fut is None:
            fut = asyncio.ensure_future(self._open_now(unit))
            self._opening[unit] = fut
            fut.add_done_callback(lambda _: self._opening.pop(unit, None))
        return await asyncio.shield(fut)

    async def _open_now(self, unit: Unit) -> SubscriptionUnit:
        claimed = await self._coordinator.once(CoordinatorActor.claim_unit, *unit, self._name)
        if claimed != self._name:
            raise PartitionMoved(f"unit {unit.key} is served by {claimed}")
        started = time.monotonic()
        loop = asyncio.get_running_loop()

        def owns() -> bool:  # (asked on a thread when a cursor version is taken)
            here = self._coordinator.call_from_thread(
                CoordinatorActor.claim_unit, *unit, self._name
            )
            return bool(here == self._name)

        def dropped() -> None:  # (called on a thread)
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._fenced(unit)))

        opened = await loop.run_in_executor(
            self._open_pool,
            lambda: rpc.recover(
                SubscriptionUnit,
                unit,
                self._config_dict,
                self._coordinator,
                Fence(owns, dropped),
                what=f"{self._name}: unit {unit.key}",
            ),
        )
        opened.open_partitions()  # (each serves once recovered: see SubscriptionUnit)
        self._units[unit] = opened
        self.recovery[unit.key] = round(time.monotonic() - started, 3)
        log.info("%s: unit %s opened in %.2f s", self._name, unit.key, time.monotonic() - started)
        return opened

    async def adopt(self, units: Sequence[tuple[str, str, int]]) -> int:
        """Open ``units`` now, in the background (they were assigned here when their node
        was lost: ``CoordinatorActor._evacuate``), so that they recover before their
        consumers come back. Each is claimed as on a first call. Returns how many it
        began."""
        began = 0
        for u in units:
            unit = Unit(*u)
            if unit not in self._units:
                began += 1
                asyncio.ensure_future(self._open(unit)).add_done_callback(
                    log_failed(f"{self._name}: adopting unit {unit.key}")
                )
        return began

    async def _fenced(self, unit: Unit) -> None:
        """Another host serves ``unit`` now: stop it here, writing nothing. The next call
        for it finds it moved (``claim_unit``) and its caller looks it up again."""
        found = self._units.pop(unit, None)
        if found is not None:
            log.warning(
                "%s: unit %s is served by another host now; dropped here", self._name, unit.key
            )
            await found.abandon()

    async def drop(self, units: Sequence[tuple[str, str, int]]) -> int:
        """Stop serving ``units`` (their subscription is being deleted): each persists its
        cursors and stops its loops. Returns how many were open here."""
        dropped = [self._units.pop(Unit(*u)) for u in units if Unit(*u) in self._units]
        await asyncio.gather(*[u.close() for u in dropped])
        return len(dropped)

    async def close(self) -> None:
        """Persist every unit's cursors and stop their loops (a clean stop)."""
        units, self._units = list(self._units.values()), {}
        await asyncio.gather(*[u.close() for u in units])

    async def units(self) -> list[str]:
        """The keys of the units open here."""
        return sorted(u.key for u in self._units)

    async def host_stats(self) -> dict:
        return {
            "name": self._name,
            "pid": os.getpid(),
            "units": sorted(u.key for u in self._units),
            "recovery": dict(self.recovery),
        }

    async def pid(self) -> int:
        return os.getpid()

    # --- each call of a unit, the unit first (see SubscriptionUnit for what they do) ---------

    async def add_consumer(self, unit: Unit, partition: int, consumer_id: str) -> None:
        await (await self._unit(unit)).add_consumer(partition, consumer_id)

    async def heartbeat(self, unit: Unit, partition: int, consumer_id: str) -> bool:
        return await (await self._unit(unit)).heartbeat(partition, consumer_id)

    async def heartbeat_many(
        self, unit: Unit, consumer_id: str, partitions: list[int]
    ) -> list[bool]:
        return await (await self._unit(unit)).heartbeat_many(consumer_id, partitions)

    async def remove_consumer(self, unit: Unit, partition: int, consumer_id: str) -> int:
        return await (await self._unit(unit)).remove_consumer(partition, consumer_id)

    async def ack(self, unit: Unit, partition: int, consumer_id: str, keys: Any) -> int:
        return await (await self._unit(unit)).ack(partition, consumer_id, keys)

    async def ack_many(
        self,
        unit: Unit,
        consumer_id: str,
        acks: list[tuple[int, Any]],
        nack: tuple | None = None,
    ) -> dict[int, BaseException]:
        return await (await self._unit(unit)).ack_many(consumer_id, acks, nack)

    async def nack(
        self,
        unit: Unit,
        partition: int,
        consumer_id: str,
        keys: Any,
        delay_s: float,
        nacked_at_ms: int | None = None,
    ) -> int:
        part = await self._unit(unit)
        return await part.nack(partition, consumer_id, keys, delay_s, nacked_at_ms)

    async def redeliver(
        self,
        unit: Unit,
        partition: int,
        consumer_id: str,
        keys: Any = None,
        rewinds: int = 0,
        dry_run: bool = False,
    ) -> int:
        part = await self._unit(unit)
        return await part.redeliver(partition, consumer_id, keys, rewinds, dry_run)

    async def cancel_many(
        self, unit: Unit, work: dict[int, tuple[list[tuple[int, int]], list[tuple[int, int]]]]
    ) -> dict[int, list[bool]]:
        return await (await self._unit(unit)).cancel_many(work)

    async def stats(self, unit: Unit, partition: int) -> dict:
        return await (await self._unit(unit)).stats(partition)

    async def states(
        self, unit: Unit, partition: int, positions: list[tuple[int, int]]
    ) -> list[str]:
        """Where each position of the partition stands in the subscription (see
        ``Cancels.states``): nothing changes."""
        return await (await self._unit(unit)).states(partition, positions)

    async def flush(self, unit: Unit, partition: int) -> None:
        await (await self._unit(unit)).flush(partition)

    async def due_histogram(self, unit: Unit, partition: int, edges: list[int]) -> list[int]:
        return await (await self._unit(unit)).due_histogram(partition, edges)

    async def peek(
        self,
        unit: Unit,
        partition: int,
        limit: int,
        due_after: int | None = None,
        due_before: int | None = None,
        key: str | None = None,
    ) -> pa.RecordBatch:
        part = await self._unit(unit)
        return await part.peek(partition, limit, due_after, due_before, key)

    async def receive(
        self,
        unit: Unit,
        partition: int,
        consumer_id: str,
        max_messages: int,
        timeout_s: float,
        rewinds: int = 0,
    ) -> pa.RecordBatch:
        part = await self._unit(unit)
        return await part.receive(partition, consumer_id, max_messages, timeout_s, rewinds)

    async def receive_many(
        self,
        unit: Unit,
        consumer_id: str,
        partitions: list[int],
        max_messages: int,
        timeout_s: float,
        rewinds: int = 0,
        packed: bool = False,
        ahead_ms: int = 0,
    ) -> ReceiveReply:
        part = await self._unit(unit)
        return await part.receive_many(
            consumer_id, partitions, max_messages, timeout_s, rewinds, packed, ahead_ms
        )

    async def reset(self, unit: Unit, marks: dict[int, list[int]]) -> None:
        await (await self._unit(unit)).reset(marks)

    async def partitions(self, unit: Unit) -> list[int]:
        return (await self._unit(unit)).partitions()


def unit_peer(
    unit: Unit,
    config: dict[str, Any],
    coordinator: Peer[CoordinatorActor] | None = None,
) -> UnitPeer:
    """A unit on whichever subscription host serves it: found through the coordinator's
    assignment (which starts the host if needed), again after a failure. NotFound once the
    subscription is deleted."""
    coordinator = coordinator or coordinator_peer(config)
    peer: UnitPeer

    def resolve() -> Any:
        name = coordinator.call_from_thread(CoordinatorActor.locate_unit, *unit)
        handle = placement.lookup_or_none(name)
        if handle is None:  # (it ended since; the next try looks it up again)
            raise Unavailable(f"subscription host {name} of {unit.key} is not running")
        peer.host = name
        return handle

    peer = UnitPeer(
        unit,
        f"sub/{unit.key}",
        lambda: None,
        f"subscription {unit.subscription} of {unit.topic} (unit {unit.group})",
        resolve=resolve,
        deadline_s=config_from_dict(config).client.retry_deadline_s,
    )
    return peer


class UnitPeer(Peer[SubscriptionHost]):
    """A :class:`Peer` of a unit's host: ``unit`` goes first in its calls
    (``peer.submit(SubscriptionHost.ack, peer.unit, partition, consumer, keys)``), and
    ``host`` is the name of the host it last resolved to."""

    def __init__(self, unit: Unit, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unit = unit
        self.host: str | None = None
