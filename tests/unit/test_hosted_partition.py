"""The parts of a partition on its host (raydelay/actors/partition/), each against a real
PartitionLog over a memory store, without Ray: the bucket list, the marks long polls go
by, group commits and the long polls they wake, the delayed index and its seals,
retention's bucket deletes, and when merges start."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import msgpack
import numpy as np
import pytest

from raydelay.actors.partition.appender import Appender, positions_of
from raydelay.actors.partition.context import (
    PartitionContext,
    PartitionThreads,
    SealedBuckets,
    seal_counters,
)
from raydelay.actors.partition.index import PartitionIndex
from raydelay.actors.partition.merges import BucketMerger
from raydelay.actors.partition.reads import LogReads, next_due_at, urgent_in_marks
from raydelay.actors.partition.retention import Retention
from raydelay.clock import SystemClock
from raydelay.config import config_from_dict
from raydelay.delayed.sealed import THROUGH_KEY, bucket_key, registry_name
from raydelay.delayed.store import SealedStore
from raydelay.errors import NotFound, Unavailable
from raydelay.log.entries import NO_DELAY, AppendBatch, Entries, encode_batch
from raydelay.log.partition import PartitionLog
from raydelay.positions import key_of
from raydelay.storage import MemoryObjectStore


class RollingLedgers:
    """The coordinator's ledger bookkeeping, in memory: each roll opens the next id."""

    def __init__(self) -> None:
        self.next_id = 1

    def roll(self, closed: int | None, count: int) -> int:
        new = self.next_id
        self.next_id += 1
        return new


class Registry:
    """The coordinator's bucket registry, in memory."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, bytes]] = {}

    def list(self, name: str) -> dict[str, bytes]:
        return dict(self.records.get(name, {}))

    def apply(self, ops: list[tuple[str, str, str, bytes | None]]) -> None:
        for op, name, key, record in ops:
            if op == "put":
                assert record is not None
                self.records.setdefault(name, {})[key] = record
            else:
                self.records.get(name, {}).pop(key, None)


class Metrics:
    def __init__(self) -> None:
        self.ops: list[str] = []
        self.published_n = 0

    def published(self, n: int) -> None:
        self.published_n += n

    def bucket_op(self, op: str, seconds: float, nbytes: int = 0) -> None:
        self.ops.append(op)


def context(**sections: dict[str, Any]) -> tuple[PartitionContext, Registry]:
    cfg = config_from_dict({"storage": {"kind": "memory"}, **sections})
    store = MemoryObjectStore()
    plog = PartitionLog(
        store=store,
        topic="t",
        partition=0,
        ledgers=[],
        roll=RollingLedgers().roll,
        clock=SystemClock(),
        max_entries_per_ledger=cfg.topic.max_entries_per_ledger,
        cache_bytes=1 << 20,
    )
    registry = Registry()
    ctx = PartitionContext(
        topic="t",
        partition=0,
        config=cfg,
        coordinator=cast(Any, None),  # (the parts tested here make no coordinator call)
        registry=cast(Any, registry),
        log=plog,
        sealed=SealedStore(store, "t", 0),
        metrics=cast(Any, Metrics()),
        threads=PartitionThreads(),
        buckets=SealedBuckets(),
        counters=seal_counters(),
    )
    return ctx, registry


class Parts:
    """The parts as HostedPartition wires them."""

    def __init__(self, **sections: dict[str, Any]) -> None:
        self.ctx, self.registry = context(**sections)
        self.merger = BucketMerger(self.ctx)
        self.index = PartitionIndex(self.ctx, self.merger)
        if self.ctx.config.delayed.tracker == "bucket":
            self.index.recover()
        self.reads = LogReads(self.ctx, self.index)
        self.appender = Appender(self.ctx, self.reads)
        self.retention = Retention(self.ctx, self.index, self.merger)

    def close(self) -> None:
        self.appender.close()
        self.ctx.threads.shutdown()


def encoded(n: int, deliver_at_ms: int = NO_DELAY, producer: str = "", seq: int = 0) -> bytes:
    entries = Entries.build([b"m%d" % i for i in range(n)], np.full(n, deliver_at_ms, np.int64))
    return encode_batch(AppendBatch(producer, seq, entries))


def wait_for(ready, deadline_s: float = 10.0) -> None:
    end = time.monotonic() + deadline_s
    while not ready():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


# --- the bucket list -----------------------------------------------------------------------


def test_the_bucket_list_from_registry_records_is_sorted_and_versioned():
    buckets = SealedBuckets()
    late, early = bucket_key(5, 6, 100), bucket_key(1, 4, 200)
    buckets.take_records({late: msgpack.packb([30]), early: msgpack.packb([10])})
    assert [k for _, _, k in buckets.entries] == [early, late]
    assert buckets.rows == {early: 10, late: 30}
    with buckets.lock:
        listed = buckets.listing()
    assert listed.version == buckets.version == 1 and listed.through == -1
    assert listed.buckets == [early, late]


# --- the marks long polls go by ----------------------------------------------------------------


def test_marks_tell_whether_an_entry_due_soon_was_committed():
    marks = ((key_of(1, 9), 0), (key_of(1, 19), 5_000), (key_of(1, 29), 9_000))
    assert urgent_in_marks((1, 0), 1_000, marks)  # older than the marks: read to know
    assert not urgent_in_marks((1, 10), 1_000, marks)  # only entries due later
    assert urgent_in_marks((1, 10), 6_000, marks)
    assert not urgent_in_marks((1, 30), 10_000, marks)  # nothing at or after it
    assert urgent_in_marks((1, 5), 10, ())  # no marks: read
    assert next_due_at((1, 10), marks) == 5_000
    assert next_due_at((1, 20), marks) == 9_000
    assert next_due_at((1, 30), marks) is None


# --- appends, group commits and the long polls they wake -------------------------------------


def test_appends_are_committed_in_call_order_and_wake_a_long_poll():
    parts = Parts(delayed={"tracker": "memory"})

    async def run() -> None:
        parts.appender.start()
        poll = asyncio.ensure_future(parts.reads.wait_for_entries(None, 10.0))
        await asyncio.sleep(0)
        first, second = await asyncio.gather(
            parts.appender.append(encoded(2)), parts.appender.append([encoded(1), encoded(3)])
        )
        assert positions_of(first) == [(1, 0), (1, 1)]
        assert [positions_of(r) for r in second] == [[(1, 2)], [(1, 3), (1, 4), (1, 5)]]
        assert await asyncio.wait_for(poll, 5.0) == (1, 5)
        reply = await parts.reads.read((1, 0), 100, wait_s=0.0)
        assert reply.tail == (1, 5) and reply.ledgers == [(1, None)]
        assert parts.appender.queued == 0
        assert cast(Metrics, parts.ctx.metrics).published_n == 6

    try:
        asyncio.run(run())
    finally:
        parts.close()


def test_a_read_waits_for_a_commit_and_a_stop_answers_it_at_once():
    parts = Parts(delayed={"tracker": "memory"})

    async def run() -> None:
        parts.appender.start()
        await parts.appender.append(encoded(1))
        started = time.monotonic()
        read = asyncio.ensure_future(parts.reads.read((1, 1), 10, wait_s=10.0))
        await asyncio.sleep(0.05)
        assert not read.done()
        await parts.appender.append(encoded(1))
        assert (await asyncio.wait_for(read, 5.0)).tail == (1, 1)
        waiting = asyncio.ensure_future(parts.reads.read((1, 2), 10, wait_s=10.0))
        await asyncio.sleep(0.05)
        await parts.reads.stop()
        await asyncio.wait_for(waiting, 5.0)
        assert time.monotonic() - started < 5.0
        await parts.appender.append(encoded(1))  # an append ends the stop
        assert not parts.reads.stopping

    try:
        asyncio.run(run())
    finally:
        parts.close()


def test_a_cancel_of_a_position_not_in_the_log_is_not_found_and_a_close_fails_the_queue():
    parts = Parts(delayed={"tracker": "memory"})

    async def run() -> None:
        parts.appender.start()
        await parts.appender.append(encoded(2))
        markers = await parts.appender.cancel([(1, 1)], producer="p", sequence_id=7)
        assert markers == [(1, 2)]
        assert await parts.appender.cancel([(1, 1)], producer="p", sequence_id=7) == markers
        with pytest.raises(NotFound):
            await parts.appender.cancel([(1, 50)])
        assert await parts.reads.cancel_markers((1, 0)) != []
        # a queued append fails when its partition closes before its commit
        parts.appender.close()
        queued = asyncio.ensure_future(parts.appender.append(encoded(1)))
        await asyncio.sleep(0)
        parts.appender.close()
        with pytest.raises(Unavailable):
            await queued

    try:
        asyncio.run(run())
    finally:
        parts.ctx.threads.shutdown()


# --- the delayed index, its seals, retention's deletes, merges -------------------------------


def test_delayed_entries_are_indexed_then_sealed_at_a_ledger_roll_and_trimmed():
    parts = Parts(
        delayed={"tracker": "bucket", "min_index_count_per_bucket": 2},
        topic={"max_entries_per_ledger": 4},
    )
    later_ms = time.time_ns() // 1_000_000 + 3_600_000

    async def run() -> None:
        parts.appender.start()
        await parts.appender.append(encoded(3, later_ms))
        assert parts.index.enabled and parts.index.count == 3
        assert parts.index.delayed_runs  # an object of delayed entries only: a stand-in
        assert parts.index.marks[-1][1] == later_ms
        histogram = await parts.index.unsealed_histogram([later_ms + 1], later_ms - 10)
        assert sum(histogram) == 3
        due = await parts.index.due_unsealed(0, -1, later_ms + 1)
        assert due.rows.num_rows == 3 and due.buckets is not None
        await parts.appender.append(encoded(2))  # fills ledger 1: it rolls, and is sealed
        wait_for(lambda: parts.ctx.buckets.entries)
        assert parts.ctx.buckets.through >= 1 and parts.ctx.counters["sealed"] == 1
        assert parts.index.count == 0
        records = parts.registry.list(registry_name("t", 0))
        listed = [k for _, _, k in parts.ctx.buckets.entries]
        assert THROUGH_KEY in records and set(listed) <= set(records)
        assert not parts.merger.over_limit()
        version = parts.ctx.buckets.version
        done = parts.retention._delete_buckets([*listed, "not-listed"])
        assert done == listed and parts.ctx.buckets.entries == []
        assert parts.ctx.buckets.version == version + 1
        assert cast(Metrics, parts.ctx.metrics).ops == ["create", "delete"]
        assert set(parts.registry.list(registry_name("t", 0))) == {THROUGH_KEY}
        parts.index.forget_ledgers({1})
        assert not [k for k in parts.index.delayed_runs if k[0] == 1]

    try:
        asyncio.run(run())
    finally:
        parts.close()


def test_merges_start_only_past_max_num_buckets():
    parts = Parts(delayed={"tracker": "memory", "max_num_buckets": 2})
    try:
        parts.ctx.buckets.entries = [(1, 1, "a"), (2, 2, "b")]
        assert not parts.merger.over_limit()
        parts.ctx.buckets.entries.append((3, 3, "c"))
        assert parts.merger.over_limit()
        unlimited = Parts(delayed={"tracker": "memory", "max_num_buckets": -1})
        unlimited.ctx.buckets.entries = [(i, i, str(i)) for i in range(100)]
        assert not unlimited.merger.over_limit()
        unlimited.close()
    finally:
        parts.close()


def test_a_recovered_index_rebuilds_from_the_ledgers_after_the_last_sealed_one():
    parts = Parts(delayed={"tracker": "bucket"})
    try:
        assert parts.index.enabled and parts.index.count == 0
        assert parts.ctx.buckets.through == -1 and parts.ctx.buckets.entries == []
        assert parts.ctx.log.on_object is not None and parts.ctx.log.on_roll is not None
    finally:
        parts.close()
