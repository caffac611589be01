"""Retention: every ``topic.retention_interval_ms`` a partition's host calls ``trim``: it
asks the coordinator which sealed buckets every shared subscription is done with and which
ledgers no subscription needs any more, deletes their objects, then tells it."""

from __future__ import annotations

import logging
import time

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.partition.context import PartitionContext
from raydelay.actors.partition.index import PartitionIndex
from raydelay.actors.partition.merges import BucketMerger
from raydelay.delayed.sealed import THROUGH_KEY, registry_name

log = logging.getLogger(__name__)


class Retention:
    """The trims of one partition on its host (see the module docstring)."""

    def __init__(self, ctx: PartitionContext, index: PartitionIndex, merger: BucketMerger) -> None:
        self._ctx = ctx
        self._topic, self._partition = ctx.topic, ctx.partition
        self._coordinator = ctx.coordinator
        self._log = ctx.log
        self._index = index
        self._merger = merger

    async def trim(self) -> list[int]:
        """Delete the buckets every shared subscription is done with, and the ledgers no
        subscription needs; returns the ledger ids."""
        await self._trim_buckets()
        ids = await self._coordinator.once(CoordinatorActor.retention, self._topic, self._partition)
        # (a ledger whose keyed entries the key index has not written yet stays: a
        # restarted host reads them from it)
        keys_through = self._log.keys_ledger_through
        ids = [i for i in ids if i != self._log.current_ledger and i <= keys_through]
        if not ids:
            return []
        deleted = await self._ctx.threads.run(self._log.delete_ledgers, ids)
        self._index.forget_ledgers(set(ids))
        await self._coordinator.once(
            CoordinatorActor.drop_ledgers, self._topic, self._partition, ids
        )
        log.info(
            "%s/%d: deleted ledgers %s (%d objects)", self._topic, self._partition, ids, deleted
        )
        return ids

    async def _trim_buckets(self) -> None:
        name = registry_name(self._topic, self._partition)
        keys = await self._coordinator.once(
            CoordinatorActor.bucket_retention, self._topic, self._partition, name, THROUGH_KEY
        )
        if keys:
            threads = self._ctx.threads
            done = await threads.run(self._delete_buckets, keys, on=threads.seal)
            if done:
                log.info(
                    "%s/%d: deleted %d finished buckets", self._topic, self._partition, len(done)
                )
        self._merger.merge_soon()  # (a merge that failed is tried again here)

    def _delete_buckets(self, keys: list[str]) -> list[str]:
        """On the seal thread (after any merge under way): delete the buckets of ``keys``
        still listed (one merged meanwhile is not), objects first, then their registry
        entries; returns the keys deleted."""
        b = self._ctx.buckets
        with b.lock:  # subscriptions stop loading them first
            listed = {k for _, _, k in b.entries}
            doomed = [k for k in keys if k in listed]
            b.entries = [e for e in b.entries if e[2] not in set(doomed)]
            for k in doomed:
                b.rows.pop(k, None)
            b.version += 1
        for key in doomed:
            started = time.monotonic()
            self._ctx.sealed.delete(key)
            self._ctx.metrics.bucket_op("delete", time.monotonic() - started)
        name = registry_name(self._topic, self._partition)
        self._ctx.registry.apply([("remove", name, k, None) for k in doomed])
        return doomed
