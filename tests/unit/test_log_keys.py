"""The key index of a partition's log (raydelay.log.keys): what it holds of keyed delayed
entries, cancels, merges and compactions, its deltas and bases in the store, and a log
restarted from them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from raydelay.errors import CodecError, InvalidArgument, StorageError
from raydelay.log import keys as keys_mod
from raydelay.log.entries import NO_DELAY, AppendBatch, Entries, LedgerObject
from raydelay.log.keys import (
    KeyIndex,
    KeyStore,
    check_on_duplicate,
    decode_keys,
    fingerprint,
    fingerprints,
    keys_prefix,
)
from raydelay.positions import key_of
from raydelay.storage import FaultyObjectStore, MemoryObjectStore
from tests.unit.test_partition_log import Ledgers, make_log

NOW = 1_000  # the ManualClock of make_log: publish time 1,000 ms


def obj(ledger: int, first: int, keys, deliver, cancels=None, publish=NOW) -> LedgerObject:
    n = len(keys)
    entries = Entries.build([b"x"] * n, np.asarray(deliver, np.int64), keys, cancels=cancels)
    return LedgerObject(ledger, first, publish, entries, {})


def keyed(keys, deliver_ms, producer="", seq=0) -> AppendBatch:
    n = len(keys)
    return AppendBatch(
        producer, seq, Entries.build([b"p"] * n, np.full(n, deliver_ms, np.int64), keys)
    )


def test_keyed_delayed_entries_are_found_and_others_are_not():
    index = KeyIndex()
    index.observe(obj(1, 0, ["a", None, "b", "c"], [60_000, 60_000, NO_DELAY, 500]))
    assert index.candidates("a", NOW) == [key_of(1, 0)]
    assert index.candidates("b", NOW) == []  # due at once: no pending life
    assert index.candidates("c", NOW) == []  # due before it was committed
    assert index.candidates("a", 61_000) == []  # fell due since
    assert len(index) == 1


def test_a_cancel_marker_frees_its_target():
    index = KeyIndex()
    index.observe(obj(1, 0, ["a", "a"], [60_000, 70_000]))
    assert index.candidates("a", NOW) == [key_of(1, 0), key_of(1, 1)]
    index.observe(obj(1, 2, [None], [NO_DELAY], cancels={0: (1, 0)}))
    assert index.candidates("a", NOW) == [key_of(1, 1)]


def test_entries_merge_into_the_columns_and_compaction_drops_the_dead(monkeypatch):
    monkeypatch.setattr(keys_mod, "MERGE_AT", 100)
    index = KeyIndex()
    names = [f"k{i}" for i in range(250)]
    due = [10_000 if i % 2 else 90_000 for i in range(250)]
    index.observe(obj(1, 0, names, due))
    index.observe(obj(1, 250, [None], [NO_DELAY], cancels={0: (1, 4)}))
    assert len(index._rpacked) == 0 and len(index._packed) == 250  # merged at 100
    assert index.candidates("k4", NOW) == []
    assert index.candidates("k6", NOW) == [key_of(1, 6)]
    index.compact(20_000)  # the odd ones fell due; k4 was cancelled
    assert len(index) == 124
    assert index.candidates("k6", 20_000) == [key_of(1, 6)]
    assert np.all(np.diff(index._packed.astype(np.int64)) >= 0)  # still sorted


def colliding_keys() -> tuple[str, str]:
    """Two keys that share a fingerprint (32 bits: among 300k keys a pair is all but sure)."""
    names = [f"user-{i}" for i in range(300_000)]
    fps = fingerprints(pa.array(names))
    order = np.argsort(fps, kind="stable")
    same = np.flatnonzero(np.diff(fps[order]) == 0)
    assert len(same), "no two of the keys share a fingerprint"
    return names[order[same[0]]], names[order[same[0] + 1]]


def test_a_shared_fingerprint_gives_both_positions():
    a, b = colliding_keys()
    assert a != b and fingerprint(a) == fingerprint(b)
    index = KeyIndex()
    index.observe(obj(1, 0, [a, b], [60_000, 60_000]))
    # a hint only: the host reads both rows and keeps the one whose key is the same
    assert index.candidates(a, NOW) == [key_of(1, 0), key_of(1, 1)]


def test_fingerprints_of_a_column_are_each_keys_own():
    names = ["", "a", "é", "order-17", "x" * 1_000, "order-17"]
    col = pa.array(["pad", *names]).slice(1)  # (an offset into its buffers)
    fps = fingerprints(col)
    assert fps.tolist() == [fingerprint(n) for n in names]
    assert fps[3] == fps[5] and len(set(fps.tolist())) == 5
    assert all(0 <= f < 2**32 for f in fps.tolist())


def test_deltas_and_a_base_load_back_into_the_same_index():
    store = MemoryObjectStore()
    ks = KeyStore(store, "t", 0)
    index = KeyIndex()
    index.observe(obj(1, 0, ["a", "b"], [60_000, 60_000]))
    ks.cut(index, NOW)
    index.observe(obj(2, 0, ["c", None], [60_000, NO_DELAY], cancels={1: (1, 1)}))
    ks.cut(index, NOW)
    assert len(store.list(keys_prefix("t", 0))) == 2  # two deltas
    again = KeyIndex()
    assert KeyStore(store, "t", 0).load(again) == key_of(2, 1)
    for k in "abc":
        assert again.candidates(k, NOW) == index.candidates(k, NOW)
    assert again.candidates("b", NOW) == []
    # a base replaces them
    ks.write_base(index, NOW)
    listed = store.list(keys_prefix("t", 0))
    assert len(listed) == 1 and listed[0].endswith(".base")
    third = KeyIndex()
    KeyStore(store, "t", 0).load(third)
    assert third.candidates("a", NOW) == [key_of(1, 0)] and third.candidates("b", NOW) == []


def test_a_delta_that_fails_to_write_goes_with_the_next():
    store = FaultyObjectStore(MemoryObjectStore())
    ks = KeyStore(store, "t", 0)
    index = KeyIndex()
    index.observe(obj(1, 0, ["a"], [60_000]))
    store.fail_next("put")
    with pytest.raises(StorageError, match="injected put"):
        ks.cut(index, NOW)
    assert index.persisted_through == -1
    index.observe(obj(2, 0, ["b"], [60_000]))
    ks.cut(index, NOW)
    again = KeyIndex()
    KeyStore(store, "t", 0).load(again)
    assert again.candidates("a", NOW) == [key_of(1, 0)]
    assert again.candidates("b", NOW) == [key_of(2, 0)]


def test_a_restarted_log_knows_its_keys_from_deltas_and_its_open_ledger():
    store = MemoryObjectStore()
    ledgers = Ledgers()
    log, _ = make_log(store, ledgers, max_entries=4)
    log.commit([keyed(["a", "b", "c", "d"], 60_000)])  # ledger 1, full
    log.commit([keyed(["e"], 60_000)])  # rolls: ledger 1's delta is written; e in ledger 2
    assert log.keys_ledger_through == 1
    restarted, _ = make_log(store, ledgers, max_entries=4)
    for k in "abcde":
        assert restarted.keys.candidates(k, NOW) == log.keys.candidates(k, NOW) != []


def test_the_format_is_checked():
    with pytest.raises(CodecError):
        decode_keys(b"\x00not msgpack")
    with pytest.raises(InvalidArgument, match="on_duplicate"):
        check_on_duplicate("overwrite")
    assert check_on_duplicate("replace") == "replace"


def test_key_rows_come_from_the_object_indexes():
    log, _ = make_log(max_entries=100)
    log.commit([keyed(["a", "b", None], 60_000)])
    log.commit([keyed(["c"], 70_000)])
    rows = log.key_rows(np.array([key_of(1, 2), key_of(1, 0), key_of(1, 3), key_of(9, 0)]))
    assert rows.positions.tolist() == [key_of(1, 0), key_of(1, 2), key_of(1, 3)]
    assert rows.keys == ["a", None, "c"]  # (a position not in the log is left out)
    assert rows.deliver_at_ms.tolist() == [60_000, 60_000, 70_000]
