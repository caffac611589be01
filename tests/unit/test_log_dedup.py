"""Producer dedup of the partition log (pure): what a re-sent batch gets, and snapshots."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from raydelay.errors import StorageError
from raydelay.log.dedup import HISTORY, PRODUCER_IDLE_MS, ProducerDedup, StaleSequence
from raydelay.log.entries import NO_DELAY, AppendBatch, Entries
from raydelay.storage import FaultyObjectStore, MemoryObjectStore

PREFIX = "topics/t/0/dedup/"


def batch(producer: str, seq: int) -> AppendBatch:
    return AppendBatch(producer, seq, Entries.build([b"x"], np.full(1, NO_DELAY, np.int64)))


def test_a_recorded_batch_gets_its_positions_back_and_a_new_one_is_new():
    # Given producer p's batch 1 recorded at (1, 0, 2)
    dedup = ProducerDedup(MemoryObjectStore(), "t", 0)
    dedup.record("p", 1, [(1, 0, 2)], now_ms=1_000)
    # Then a re-send of it gets those positions; batch 2, another producer and an
    # anonymous batch are new
    assert dedup.known(batch("p", 1), {}) == [(1, 0, 2)]
    assert dedup.known(batch("p", 2), {}) is None
    assert dedup.known(batch("q", 1), {}) is None
    assert dedup.known(batch("", 1), {}) is None
    assert dedup.last_sequence("p") == 1 and dedup.last_sequence("q") == 0


def test_a_sequence_sent_twice_in_one_group_commit_is_refused():
    dedup = ProducerDedup(MemoryObjectStore(), "t", 0)
    # Given p's batch 5 already placed in the group commit being built
    result = dedup.known(batch("p", 5), {"p": {5}})
    # Then the second copy is refused
    assert isinstance(result, StaleSequence) and "twice in one group commit" in str(result)


def test_only_the_recent_history_is_remembered_and_older_ones_are_stale():
    # Given more batches of p than the history holds, recorded out of order
    dedup = ProducerDedup(MemoryObjectStore(), "t", 0)
    seqs = list(range(1, HISTORY + 6))
    for seq in seqs[::-1]:
        dedup.record("p", seq, [(1, seq, 1)], now_ms=1_000)
    # Then the newest HISTORY are known, the older ones are stale, and a gap above the
    # floor is new (it never landed)
    newest = seqs[-HISTORY:]
    assert all(dedup.known(batch("p", s), {}) == [(1, s, 1)] for s in newest)
    assert isinstance(dedup.known(batch("p", seqs[0]), {}), StaleSequence)
    assert dedup.known(batch("p", seqs[-1] + 2), {}) is None
    assert dedup.last_sequence("p") == seqs[-1]


def test_a_snapshot_restores_the_table_and_drops_idle_producers():
    # Given an active producer and one idle for longer than PRODUCER_IDLE_MS
    store = MemoryObjectStore()
    dedup = ProducerDedup(store, "t", 0)
    dedup.record("idle", 3, [(1, 0, 1)], now_ms=0)
    dedup.record("p", 9, [(1, 1, 2)], now_ms=PRODUCER_IDLE_MS)
    # When the table is snapshotted at ledger 1's close and a new table loads it
    dedup.write_snapshot(1, now_ms=PRODUCER_IDLE_MS + 1)
    again = ProducerDedup(store, "t", 0)
    # Then the snapshot's ledger comes back, p's records with it, the idle one's not
    assert again.load_snapshot() == 1
    assert again.known(batch("p", 9), {}) == [(1, 1, 2)]
    assert again.last_sequence("idle") == 0


def test_only_the_two_newest_snapshots_are_kept():
    store = MemoryObjectStore()
    dedup = ProducerDedup(store, "t", 0)
    for ledger_id in (1, 2, 3):
        dedup.write_snapshot(ledger_id, now_ms=0)
    assert store.list(PREFIX) == [f"{PREFIX}{i:020d}" for i in (2, 3)]


def test_an_unreadable_snapshot_is_skipped_for_the_one_before():
    # Given snapshots at ledgers 1 and 2, the newer one corrupt
    store = MemoryObjectStore()
    dedup = ProducerDedup(store, "t", 0)
    dedup.record("p", 1, [(1, 0, 1)], now_ms=0)
    dedup.write_snapshot(1, now_ms=0)
    store.put(f"{PREFIX}{2:020d}", msgpack.packb({"v": 99}))
    # When a new table loads, then it starts from ledger 1's snapshot
    again = ProducerDedup(store, "t", 0)
    assert again.load_snapshot() == 1
    assert again.known(batch("p", 1), {}) == [(1, 0, 1)]


def test_a_transient_store_failure_while_loading_is_raised_not_skipped():
    # Given two snapshots, and a store whose next read fails transiently
    store = FaultyObjectStore(MemoryObjectStore())
    dedup = ProducerDedup(store, "t", 0)
    for ledger_id in (1, 2):
        dedup.write_snapshot(ledger_id, now_ms=0)
    store.fail_next("get")
    # When a new table loads, then the failure reaches the caller, whose retry policy
    # tries again (an older snapshot would miss the records of ledgers since deleted)
    again = ProducerDedup(store, "t", 0)
    with pytest.raises(StorageError) as info:
        again.load_snapshot()
    assert info.value.retriable
    assert again.load_snapshot() == 2


def test_the_snapshot_format_is_pinned_by_golden_bytes():
    # Given p's batches 1 and 2 and q's batch 7 (the bytes below were written by the log
    # before it was split into modules)
    store = MemoryObjectStore()
    dedup = ProducerDedup(store, "t", 0)
    dedup.record("p", 1, [(1, 0, 2)], now_ms=1_000)
    dedup.record("q", 7, [(1, 2, 1)], now_ms=1_000)
    # When the table is snapshotted at ledger 1's close
    dedup.write_snapshot(1, now_ms=1_500)
    # Then the bytes are those of format 1
    assert store.get(f"{PREFIX}{1:020d}").hex() == GOLDEN_SNAPSHOT


# msgpack {"v": 1, "ledger": 1, "producers": {name: [floor, last_used_ms, [[seq, ranges]]]}}
GOLDEN_SNAPSHOT = (
    "83a17601a66c656467657201a970726f64756365727382a1709300cd03e89192019193010002a1719300"
    "cd03e89192079193010201"
)
