"""Looking at one subscription partition's schedule without changing it: a peek at the
next messages to deliver, and the histogram of pending delayed messages by due time.

:class:`Peeks` gives ``Subscription.peek`` the reads it needs (sealed segments from the
store, pages of the host's unsealed index, payloads from the log) and counts what peeks
cost.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pyarrow as pa

from raydelay.actors.host import HostActor
from raydelay.actors.protocol import BucketList
from raydelay.actors.subscription.log_reader import LogReader
from raydelay.actors.subscription.ref import PartitionRef
from raydelay.actors.subscription.sealed_io import SealedIO
from raydelay.clock import Clock
from raydelay.cluster.handles import Peer
from raydelay.delayed.sealed import SealedMeta
from raydelay.dispatch import counts
from raydelay.dispatch.peek import PeekRange, SegmentRef
from raydelay.dispatch.subscription import Delivery, Subscription
from raydelay.dispatch.wire import delivery_batch
from raydelay.errors import NotFound
from raydelay.log.entries import Rows


class Peeks:
    """The peeks and due histograms of one partition's subscription."""

    def __init__(
        self,
        ref: PartitionRef,
        sub: Subscription,
        clock: Clock,
        host: Peer[HostActor],
        sealed_io: SealedIO,
        reader: LogReader,
    ) -> None:
        self._ref = ref
        self._sub = sub
        self._clock = clock
        self._host = host
        self._sealed_io = sealed_io
        self._reader = reader
        # what peeks cost: how many, and the sealed segments they read from the store
        self.counts = {"peeks": 0, "segments_read": 0, "segment_bytes_read": 0}

    async def due_histogram(self, edges: list[int]) -> list[int]:
        """Pending delayed messages per due window (see the trackers' ``due_histogram``),
        cancelled ones left out (:func:`raydelay.dispatch.counts.due_histogram`): the
        deliver_at of settled rows not known yet is read from the log first, once."""
        edges_arr = np.asarray(edges, dtype=np.int64)
        unsealed: list[int] = []
        if self._sub.sealed is not None:
            settled = self._sub.settled
            await settled.learn_unknown(self._reader.read_rows, limit=len(settled))
            unsealed = await self._host.once(
                HostActor.unsealed_histogram,
                self._ref.topic,
                self._ref.partition,
                list(edges),
                self._clock.now_ms(),
            )
        return counts.due_histogram(self._sub, edges_arr, unsealed)

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
        self.counts["peeks"] += 1
        q = PeekRange(int(limit), due_after, due_before, key)
        store = self._sealed_io.store

        def segment(r: SegmentRef) -> Rows:
            try:
                rows = store.segment(r.run_key, r.offset, r.length)
            except NotFound:  # (its bucket was finished and deleted meanwhile)
                return Rows.join([])
            self.counts["segments_read"] += 1
            self.counts["segment_bytes_read"] += r.length
            return rows

        async def read_segments(refs: list[SegmentRef]) -> list[Rows]:
            return list(await asyncio.gather(*(asyncio.to_thread(segment, r) for r in refs)))

        async def read_unsealed(
            below: int, through: int, q: PeekRange, start: tuple[int, int] | None, page: int
        ) -> Rows:
            batch = await self._host.once(
                HostActor.peek_unsealed,
                self._ref.topic,
                self._ref.partition,
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
            info: BucketList = await self._host.once(
                HostActor.buckets, self._ref.topic, self._ref.partition
            )
            new = [k for k in info.buckets if k not in sealed.buckets]
            unknown = await asyncio.to_thread(self._sealed_io.load_metas, new) if new else []
        rows, counts = await self._sub.peek(
            q, self._reader.read_rows, read_segments, read_unsealed, unknown
        )
        n = len(rows)
        return delivery_batch(
            [Delivery(rows, np.arange(n, dtype=np.int64), rows.positions, counts)]
        )
