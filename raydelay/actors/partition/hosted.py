"""HostedPartition: one partition of a topic on the host that serves it, around its
:class:`~raydelay.log.partition.PartitionLog`. A host (:mod:`raydelay.actors.host`) holds
many; each of the host's partition calls (``HostActor.append(topic, partition, ...)``)
runs the same method here. (The client side of a partition is
:class:`~raydelay.actors.handles.TopicHandles`, or
:class:`~raydelay.actors.handles.HostPartition` to call one directly.)

:class:`HostedPartition` is a thin owner: it opens the log and the store, wires the parts
below (sharing a :class:`~raydelay.actors.partition.context.PartitionContext`), and passes
each call to the part that answers it.

| part | module | concern |
|---|---|---|
| ``appender`` | :mod:`~raydelay.actors.partition.appender` | appends and cancels, in group commits |
| ``reads`` | :mod:`~raydelay.actors.partition.reads` | log reads and their long polls |
| ``index`` | :mod:`~raydelay.actors.partition.index` | the delayed index: sealing, the unsealed index's queries |
| ``merger`` | :mod:`~raydelay.actors.partition.merges` | merging sealed buckets down to ``delayed.max_num_buckets`` |
| ``retention`` | :mod:`~raydelay.actors.partition.retention` | deleting the ledgers and buckets no subscription needs |
| (shared) | :mod:`~raydelay.actors.partition.context` | its threads, its sealed bucket list |

Log work runs on one thread per partition, seals and merges on another, due queries of
the unsealed index on a third (:class:`~raydelay.actors.partition.context.PartitionThreads`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.metrics import TopicMetrics
from raydelay.actors.partition.appender import Appender
from raydelay.actors.partition.context import (
    PartitionContext,
    PartitionThreads,
    SealedBuckets,
    seal_counters,
)
from raydelay.actors.partition.index import PartitionIndex
from raydelay.actors.partition.keyed import KeyedReply
from raydelay.actors.partition.merges import BucketMerger
from raydelay.actors.partition.reads import LogReads
from raydelay.actors.partition.retention import Retention
from raydelay.actors.protocol import BucketList, DueReply, ReadReply
from raydelay.actors.registry import CoordinatorRegistry
from raydelay.clock import SystemClock
from raydelay.cluster.handles import Peer
from raydelay.cluster.nodes import check_store
from raydelay.config import config_from_dict
from raydelay.delayed.store import SealedStore
from raydelay.dispatch.peek import PeekRange
from raydelay.log.partition import LedgerInfo, PartitionLog
from raydelay.log.reader import KeyRows
from raydelay.storage import shared_store


class HostedPartition:
    """One partition on its host. The constructor recovers it from the store and makes
    blocking calls: its host runs it on a thread."""

    def __init__(
        self,
        topic: str,
        partition: int,
        config: dict[str, Any],
        coordinator: Peer[CoordinatorActor],
    ) -> None:
        self._topic, self._partition = topic, partition
        cfg = config_from_dict(config)
        check_store(cfg.storage)  # before anything is written where it should not be
        metrics = TopicMetrics(topic, partition)
        threads = PartitionThreads()
        self._coordinator = coordinator  # its host's
        ledgers = coordinator.call_from_thread(CoordinatorActor.ledgers, topic, partition)
        store = shared_store(cfg)  # (its host's)
        self._log = PartitionLog(
            store=store,
            topic=topic,
            partition=partition,
            ledgers=[LedgerInfo(int(i), c) for i, c in ledgers],
            roll=self._roll,
            clock=SystemClock(),
            max_entries_per_ledger=cfg.topic.max_entries_per_ledger,
            cache_bytes=cfg.topic.tail_cache_bytes,
            index_cache_bytes=cfg.topic.index_cache_bytes,
        )
        ctx = PartitionContext(
            topic=topic,
            partition=partition,
            config=cfg,
            coordinator=coordinator,
            registry=CoordinatorRegistry(coordinator),
            log=self._log,
            sealed=SealedStore(store, topic, partition, meta_cache=64),  # (key checks: all)
            metrics=metrics,
            threads=threads,
            buckets=SealedBuckets(),
            counters=seal_counters(),
        )
        self._threads, self._buckets = threads, ctx.buckets
        self.seal_counters = ctx.counters
        self._merger = BucketMerger(ctx)
        self._index = PartitionIndex(ctx, self._merger)
        if cfg.delayed.tracker == "bucket":
            self._index.recover()
        self._reads = LogReads(ctx, self._index)
        self._appender = Appender(ctx, self._reads)
        self._retention = Retention(ctx, self._index, self._merger)

    def _roll(self, closed: int | None, count: int) -> int:
        return int(
            self._coordinator.call_from_thread(
                CoordinatorActor.roll_ledger, self._topic, self._partition, closed, count
            )
        )

    def _ensure_started(self) -> None:
        self._appender.start()

    def close(self) -> None:
        """Stop its loop and threads (its host drops it: the topic is being deleted, or
        the host is going away). Appends waiting in the queue fail as Unavailable."""
        self._appender.close()
        self._threads.shutdown()

    # --- appending (see Appender) -------------------------------------------------------------

    async def append(self, batch: bytes | list[bytes]) -> list:
        self._ensure_started()
        return await self._appender.append(batch)

    async def cancel(
        self, positions: list[tuple[int, int]], producer: str = "", sequence_id: int = 0
    ) -> list[tuple[int, int]]:
        self._ensure_started()
        return await self._appender.cancel(positions, producer, sequence_id)

    async def check_cancel(self, positions: list[tuple[int, int]]) -> None:
        self._ensure_started()
        self._appender.check_targets(positions)

    async def append_keyed(self, batch: bytes, on_duplicate: str) -> KeyedReply:
        self._ensure_started()
        return await self._appender.append_keyed(batch, on_duplicate)

    async def cancel_keys(self, keys: list[str], producer: str, sequence_id: int) -> list[list]:
        self._ensure_started()
        return await self._appender.cancel_keys(keys, producer, sequence_id)

    async def pending_keys(self, keys: list[str]) -> dict[str, list[int]]:
        self._ensure_started()
        return await self._appender.pending_keys(keys)

    async def last_sequence(self, producer: str) -> int:
        self._ensure_started()
        return await self._appender.last_sequence(producer)

    # --- reading (see LogReads) ---------------------------------------------------------------

    async def read(
        self,
        from_position: tuple[int, int],
        max_entries: int,
        wait_s: float = 0.0,
        skip_delayed: bool = False,
        due_within_ms: int | None = None,
    ) -> ReadReply:
        self._ensure_started()
        return await self._reads.read(
            from_position, max_entries, wait_s, skip_delayed, due_within_ms
        )

    async def key_rows(self, keys) -> KeyRows:
        self._ensure_started()
        return await self._reads.key_rows(np.asarray(keys, dtype=np.int64))

    async def read_positions(self, keys) -> pa.RecordBatch:
        self._ensure_started()
        return await self._reads.read_positions(keys)

    async def wait_for_entries(self, after_position, timeout_s: float):
        self._ensure_started()
        return await self._reads.wait_for_entries(after_position, timeout_s)

    async def cancel_markers(self, from_position: tuple[int, int]) -> list:
        self._ensure_started()
        return await self._reads.cancel_markers(from_position)

    async def position_at(self, time_ms: int):
        self._ensure_started()
        return await self._reads.position_at(time_ms)

    # --- the unsealed index (see PartitionIndex) ----------------------------------------------

    async def due_unsealed(
        self,
        taken_below: int,
        taken_through: int,
        now_ms: int,
        known_version: int = -1,
        known_through: int = -1,
    ) -> DueReply:
        self._ensure_started()
        return await self._index.due_unsealed(
            taken_below, taken_through, now_ms, known_version, known_through
        )

    async def peek_unsealed(
        self,
        taken_below: int,
        taken_through: int,
        q: PeekRange,
        start: tuple[int, int] | None,
        page: int,
    ) -> pa.RecordBatch:
        self._ensure_started()
        return await self._index.peek_unsealed(taken_below, taken_through, q, start, page)

    async def unsealed_histogram(self, edges: list[int], now_ms: int) -> list[int]:
        self._ensure_started()
        return await self._index.unsealed_histogram(edges, now_ms)

    async def buckets(self) -> BucketList:
        """The partition's sealed buckets: their keys, the ledger every ledger up to which
        is indexed (``through``), and a version that changes with the list."""
        self._ensure_started()
        with self._buckets.lock:
            return self._buckets.listing()

    # --- retention (see Retention) ------------------------------------------------------------

    async def trim(self) -> list[int]:
        self._ensure_started()
        return await self._retention.trim()

    # --- the log ------------------------------------------------------------------------------

    async def pid(self) -> int:
        """The process id (tests use it to see a restart)."""
        return os.getpid()

    async def tail(self):
        return self._log.tail()

    async def stop_reads(self) -> None:
        """Answer the long polls standing here now (the partition is going away)."""
        await self._reads.stop()

    async def close_ledger(self) -> bool:
        """Close the open ledger at its size (graceful shutdown); appends go on in a new one.
        Standing long polls are answered now (the host is about to stop)."""
        self._ensure_started()
        await self._reads.stop()
        return await self._threads.run(self._log.close_ledger)

    async def ledgers(self) -> list[tuple[int, int | None]]:
        """The log's ledgers: (id, entry count, or None while open)."""
        self._ensure_started()
        return [(x.ledger_id, x.count) for x in self._log.ledgers]

    async def stats(self) -> dict:
        return {
            "ledgers": [(x.ledger_id, x.count) for x in self._log.ledgers],
            "tail": self._log.tail(),
            "cached_bytes": self._log.cached_bytes,
            "queued": self._appender.queued,
            "buckets": len(self._buckets.entries),
            "sealed_through": self._buckets.through,
            "unsealed_delayed": self._index.count,
            "key_index_entries": len(self._log.keys),
            "key_index_bytes": self._log.keys.nbytes(),
            **self.seal_counters,
            **self._log.stats_counters,
        }
