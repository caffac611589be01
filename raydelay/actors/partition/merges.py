"""BucketMerger: keeps a partition's sealed buckets at most ``delayed.max_num_buckets``,
merging adjacent ones, the smallest first (:func:`raydelay.delayed.store.merge` writes the
merged bucket; the coordinator swaps the registry records in one journaled call). It runs
on the partition's seal thread, after each seal and each retention pass."""

from __future__ import annotations

import logging
import time

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.partition.context import PartitionContext
from raydelay.delayed.sealed import THROUGH_KEY, SealedMeta, registry_name
from raydelay.delayed.store import merge, merge_window

log = logging.getLogger(__name__)


class BucketMerger:
    """Merges of one partition's sealed buckets (see the module docstring)."""

    def __init__(self, ctx: PartitionContext) -> None:
        self._ctx = ctx
        self._topic, self._partition = ctx.topic, ctx.partition
        self._config = ctx.config
        self._buckets = ctx.buckets
        self._sealed = ctx.sealed

    def over_limit(self) -> bool:
        limit = self._config.delayed.max_num_buckets
        return 0 < limit < len(self._buckets.entries)

    def merge_soon(self) -> None:
        """Merge on the seal thread when there are too many buckets (a merge that failed is
        tried again here)."""
        if self.over_limit():
            self._ctx.threads.seal.submit(self.merge_buckets)

    def merge_buckets(self) -> None:
        """On the seal thread: merge adjacent buckets, the smallest first, until at most
        ``max_num_buckets`` remain. A merge that fails is tried again after the next seal
        or retention pass."""
        while self.over_limit():
            window = merge_window(
                [self._buckets.rows.get(k, 0) for _, _, k in self._buckets.entries],
                len(self._buckets.entries) - self._config.delayed.max_num_buckets,
            )
            keys = [self._buckets.entries[i][2] for i in window]
            try:
                self._merge(keys)
            except Exception as exc:  # noqa: BLE001 - the sources stay valid
                log.warning(
                    "%s/%d: merging buckets %s failed (%s); tried again later",
                    self._topic,
                    self._partition,
                    keys,
                    exc,
                )
                try:
                    self.resync()
                except Exception:  # noqa: BLE001 - the next merge resyncs again
                    log.exception("%s/%d: reloading the bucket list", self._topic, self._partition)
                return

    def _merge(self, keys: list[str]) -> None:
        """Merge the adjacent buckets ``keys`` (see :func:`raydelay.delayed.store.merge`)."""
        started = time.monotonic()
        d = self._config.delayed
        done = merge(
            self._sealed,
            keys,
            bucket_id=time.time_ns() // 1000,
            group_rows=d.max_indexes_per_segment if d.max_indexes_per_segment > 0 else 5_000,
            register=self._register_merge,
        )
        if done is None:  # a source went meanwhile (retention): this merge is void
            self.resync()
            return
        merged, written = done
        gone = set(keys)
        b = self._buckets
        with b.lock:
            b.entries = sorted(
                [e for e in b.entries if e[2] not in gone]
                + [(merged.start_ledger, merged.end_ledger, merged.key)]
            )
            for k in keys:
                b.rows.pop(k, None)
            b.rows[merged.key] = merged.count
            b.version += 1
        c = self._ctx.counters
        c["merged"] += 1
        c["merged_bytes"] += written
        self._ctx.metrics.bucket_op("merge", time.monotonic() - started, written)
        log.info(
            "%s/%d: merged %d buckets into %s: %d runs, %d groups, %d rows (%d bytes written)",
            self._topic,
            self._partition,
            len(keys),
            merged.key,
            len(merged.runs),
            len(merged.groups),
            merged.count,
            written,
        )

    def _register_merge(
        self, keys: list[str], merged: SealedMeta, record: bytes, runs: list[int]
    ) -> bool:
        name = registry_name(self._topic, self._partition)
        try:
            return bool(
                self._ctx.coordinator.call_from_thread(
                    CoordinatorActor.merge_buckets,
                    self._topic,
                    self._partition,
                    name,
                    keys,
                    merged.key,
                    record,
                    runs,
                )
            )
        except Exception:
            # registered or not? (if this fails too, the merged meta is an orphan that
            # the partition's next recovery deletes)
            if merged.key in self.resync():
                return True
            self._sealed.delete_meta(merged.key)
            raise

    def resync(self) -> set[str]:
        """After a merge whose outcome is not known: the bucket list as registered; returns
        the keys registered."""
        name = registry_name(self._topic, self._partition)
        records = self._ctx.registry.list(name)
        records.pop(THROUGH_KEY, None)
        self._buckets.take_records(records)
        return set(records)
