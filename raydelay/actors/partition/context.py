"""What every part of a hosted partition shares: its threads, its sealed bucket list, and
the handles (log, store, coordinator, metrics) its owner opened
(:class:`~raydelay.actors.partition.hosted.HostedPartition` wires them)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor

import msgpack

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.metrics import TopicMetrics
from raydelay.actors.protocol import BucketList
from raydelay.actors.registry import CoordinatorRegistry
from raydelay.cluster.handles import Peer
from raydelay.config import Config
from raydelay.delayed.sealed import parse_bucket_key
from raydelay.delayed.store import SealedStore
from raydelay.log.partition import PartitionLog


class PartitionThreads:
    """The partition's threads, one each, so that the event loop never blocks on the store.
    ``log``: all log work, in order (commits, reads, rolls). ``seal``: seals, merges and
    bucket deletes, one after the other. ``query``: due queries of the unsealed index, so
    that a commit's fsync or a ledger roll (a coordinator call) on the log's thread never
    holds one up."""

    def __init__(self) -> None:
        self.log = ThreadPoolExecutor(1, thread_name_prefix="raydelay-log")
        self.seal = ThreadPoolExecutor(1, thread_name_prefix="raydelay-seal")
        self.query = ThreadPoolExecutor(1, thread_name_prefix="raydelay-query")

    async def run(self, fn, *args, on: ThreadPoolExecutor | None = None):
        """``fn(*args)`` on the log's thread (or on the executor ``on``)."""
        return await asyncio.get_running_loop().run_in_executor(on or self.log, fn, *args)

    def shutdown(self) -> None:
        for pool in (self.log, self.seal, self.query):
            pool.shutdown(wait=False)


class SealedBuckets:
    """The partition's sealed buckets as its host holds them: ``entries`` (start ledger,
    end ledger, key) by start, ``rows`` per key (what merges go by), a ``version`` that
    changes with the list, and ``through``, sealed_through as registered. Seals, merges,
    retention and the due queries change or read them under ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: list[tuple[int, int, str]] = []  # (start, end, key), by start
        self.rows: dict[str, int] = {}  # key -> its rows
        self.version = 0
        self.through = -1  # sealed_through as registered

    def take_records(self, records: dict[str, bytes]) -> None:
        """The bucket list from the registry's records (on recovery, or after a merge
        that may or may not have been registered)."""
        with self.lock:
            self.entries = sorted(parse_bucket_key(k)[:2] + (k,) for k in records)
            self.rows = {k: int(msgpack.unpackb(r)[0]) for k, r in records.items()}
            self.version += 1

    def listing(self) -> BucketList:
        """The list as a reply (the caller holds ``lock``)."""
        return BucketList(self.version, self.through, [k for _, _, k in self.entries])


def seal_counters() -> dict[str, float]:
    """The counts of seals and merges a partition reports in its stats."""
    return {
        "sealed": 0,
        "sealed_rows": 0,
        "sealed_bytes": 0,
        "seal_s": 0.0,
        "merged": 0,
        "merged_bytes": 0,
    }


@dataclasses.dataclass(frozen=True)
class PartitionContext:
    """The partition's handles, opened once by its owner and passed to each part."""

    topic: str
    partition: int
    config: Config
    coordinator: Peer[CoordinatorActor]  # its host's
    registry: CoordinatorRegistry
    log: PartitionLog
    sealed: SealedStore
    metrics: TopicMetrics
    threads: PartitionThreads
    buckets: SealedBuckets
    counters: dict[str, float]  # seal_counters(): seals and merges
