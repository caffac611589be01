"""The I/O of a subscription partition's delayed rows: the partition's sealed buckets in
the store and the unsealed index at its host.

:class:`SealedIO` takes up the buckets at recovery (where this subscription's progress
left them), adopts new ones and forgets deleted ones as the due queries report them,
answers the ``Subscription``'s due queries of the host's unsealed index, and does the
segment loads its steps ask for (ranged reads on threads, in parallel).
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.host import HostActor
from raydelay.actors.protocol import BucketList, DueReply
from raydelay.actors.subscription.ref import RETRY_S, PartitionRef
from raydelay.actors.subscription.shared_calls import SHARED
from raydelay.clock import now_ms
from raydelay.cluster.handles import Peer
from raydelay.delayed.reader import SealedReader, SegmentLoad
from raydelay.delayed.sealed import SealedMeta
from raydelay.delayed.store import SealedStore
from raydelay.dispatch.subscription import Subscription, TailQuery
from raydelay.errors import NotFound, Unavailable
from raydelay.log.cache import LruCache
from raydelay.log.entries import Rows, note_arrival
from raydelay.storage import ObjectStore

# Listings of a partition's buckets tried before a refresh gives up for now (each one that
# names a bucket merged or deleted before its meta was read is tried again)
_LIST_TRIES = 5
_CHANGING = "the partition's buckets kept changing while they were read (merges); trying again"
# The process's threads for reading bucket metas, started as first needed and kept: its
# partitions each read the new buckets' metas as a bucket seals, and threads started for
# each listing cost more than the reads. Up to 32 reads at once, for all the partitions
# an actor recovers in parallel (S3 reads wait on the network, not the CPU).
_META_POOL = ThreadPoolExecutor(32, thread_name_prefix="raydelay-meta")
# The bucket metas this process read, per store, for all its units: (topic, partition,
# bucket key) -> meta. A bucket's objects never change once written (a merge writes
# another bucket) and its key is never used again in a store (ledger ids are never
# reused), so the subscriptions of a partition that one host serves adopt a bucket from
# one read of its meta, not one each.
_METAS: weakref.WeakKeyDictionary[Any, LruCache[tuple[str, int, str], SealedMeta]] = (
    weakref.WeakKeyDictionary()
)
_METAS_LOCK = threading.Lock()
_METAS_KEPT = 256


class SealedIO:
    """The reads of one subscription partition's sealed buckets and of its host's
    unsealed index, for its ``Subscription``."""

    def __init__(
        self,
        ref: PartitionRef,
        sub: Subscription,
        store: ObjectStore,
        host: Peer[HostActor],
        coordinator: Peer[CoordinatorActor],
        count_log_bytes: Callable[[int], None],
    ) -> None:
        self._ref = ref
        self._sub = sub
        self._raw_store = store
        self.store = SealedStore(store, ref.topic, ref.partition)
        self._host = host
        self._coordinator = coordinator
        self._count_log_bytes = count_log_bytes
        self.version: int | None = None  # the host's bucket list version last taken in
        # how long segment loads took, for the metrics (taken by the metrics loop)
        self.load_times: deque[tuple[str, float]] = deque(maxlen=10_000)

    def recover(self, sealed: SealedReader) -> None:
        """Take up the partition's sealed buckets where this subscription left them."""
        r = self._ref
        progress = self._coordinator.call_from_thread(
            CoordinatorActor.progress, r.topic, r.partition, r.subscription
        )
        for _ in range(_LIST_TRIES):
            info: BucketList = self._host.call_from_thread(HostActor.buckets, r.topic, r.partition)
            metas = self.load_metas(info.buckets)
            if len(metas) == len(info.buckets):
                break
        else:
            raise Unavailable(_CHANGING)
        for meta in metas:
            self._sub.adopt(meta, done=progress.get(meta.key, 0))
        sealed.sealed_through = max(sealed.sealed_through, info.through)
        self.version = info.version

    def load_metas(self, keys: list[str]) -> list[SealedMeta]:
        """The metas of ``keys`` (read in parallel), in ledger order; a bucket deleted
        meanwhile is left out."""

        base = getattr(self._raw_store, "inner", self._raw_store)  # (not a counting wrapper)
        with _METAS_LOCK:
            try:
                metas = _METAS.get(base)
                if metas is None:
                    metas = _METAS[base] = LruCache(_METAS_KEPT)
            except TypeError:  # (a store that cannot be referred to weakly: no sharing)
                metas = LruCache(_METAS_KEPT)

        def one(key: str) -> SealedMeta | None:
            where = (self._ref.topic, self._ref.partition, key)
            with _METAS_LOCK:
                found = metas.get(where)
            if found is None:
                try:
                    found = self.store.meta(key)
                except NotFound:
                    return None
                with _METAS_LOCK:
                    metas.put(where, found)
            return found

        # (one key, as a bucket seals: no thread for it)
        found = [one(k) for k in keys] if len(keys) <= 1 else list(_META_POOL.map(one, keys))
        return sorted((m for m in found if m is not None), key=lambda m: m.start_ledger)

    async def _refresh(
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
                info = await self._host.once(
                    HostActor.buckets, self._ref.topic, self._ref.partition
                )
            listed = None  # (a second try lists them again)
            new = [k for k in info.buckets if k not in sealed.buckets]
            metas = await asyncio.to_thread(self.load_metas, new)
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
        self.version = info.version

    async def _ask_due(
        self, query: TailQuery, version: int, through: int
    ) -> tuple[DueReply, TailQuery]:
        """One due query at the host: its answer, and the query it answers."""
        reply: DueReply = await self._host.once(
            HostActor.due_unsealed,
            self._ref.topic,
            self._ref.partition,
            query.below,
            query.through_ms,
            query.now_ms,
            version,
            through,
        )
        return reply, query

    async def query_tail(self, sealed: SealedReader, query: TailQuery) -> None:
        """Take the due rows of the host's unsealed index; adopt first the buckets its
        answer reports sealed. Units of this process that ask the same (caught up alike)
        share one query (``SHARED``): each takes its answer in as asked by the first of
        them, a few ms earlier."""
        try:
            version = -1 if self.version is None else self.version
            through = sealed.sealed_through
            r, ahead = self._ref, self._sub.lookahead_ms
            key = (
                "due",
                r.topic,
                r.partition,
                query.below,
                query.through_ms,
                version,
                through,
                ahead,
            )
            reply, query = await SHARED.call(key, self._ask_due, query, version, through)
            if reply.through > sealed.sealed_through or reply.version != self.version:
                below, through = self._sub.unsealed.taken  # (what take_unsealed will make it)
                after = (max(below, int(reply.below)), max(through, int(query.now_ms)))
                await self._refresh(sealed, reply.through, after, reply.buckets)
            rows = Rows.from_batch(reply.rows)
            note_arrival([rows], now_ms())
            self._count_log_bytes(int(reply.rows.nbytes))
            self._sub.take_unsealed(rows, reply.below, query.now_ms, reply.next_d, reply.waiting)
        except Exception:
            await asyncio.sleep(RETRY_S)  # (then a later step asks again)
            self._sub.tail_failed()
            raise

    async def load(self, sealed: SealedReader, loads: list[SegmentLoad]) -> None:
        """Do the reader's loads (each segment one ranged read, on threads, in parallel):
        the rows of the segments to read; of segments whose rows were all taken from the
        unsealed index already, only their position keys."""
        started = time.monotonic()
        results = await asyncio.gather(
            *[self._load_one(sealed, ld) for ld in loads], return_exceptions=True
        )
        self.load_times.extend(("load", time.monotonic() - started) for ld in loads if ld.reads)
        failed: BaseException | None = None
        for ld, got in zip(loads, results, strict=True):
            if isinstance(got, BaseException):
                failed = got
            else:
                sealed.install(ld.key, ld.no, *got)
        if failed is not None:
            await asyncio.sleep(RETRY_S)  # (the failed loads stay marked loading until then)
            for ld, got in zip(loads, results, strict=True):
                if isinstance(got, BaseException):
                    sealed.load_failed(ld.key, ld.no)
            raise failed

    async def _load_one(
        self, sealed: SealedReader, ld: SegmentLoad
    ) -> tuple[list[Rows], list[np.ndarray]]:
        """One load's store reads: the rows of its segments, and the position keys of the
        ones it skips (from their runs' index objects)."""
        store = self.store
        rows = await asyncio.gather(
            *(asyncio.to_thread(store.segment, p.run_key, p.offset, p.length) for p in ld.reads)
        )
        note_arrival(rows, now_ms())
        bucket = sealed.buckets.get(ld.key)
        if not ld.keys_only or bucket is None:
            return list(rows), []  # (forgotten meanwhile: install ignores it)
        return list(rows), await asyncio.to_thread(store.part_keys, bucket.meta, ld.keys_only)
