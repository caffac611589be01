"""The partition log (pure), through PartitionLog: group commits, ledger rolls, dedup of
re-sent batches, reads and their caches, recovery and retention, and the formats.

The parts on their own: test_log_ledgers.py (counts and positions), test_log_dedup.py
(the producer table and its snapshots), test_log_cache.py (the LRU cache)."""

from __future__ import annotations

import msgpack
import numpy as np
import pyarrow as pa
import pytest

from raydelay.clock import ManualClock
from raydelay.errors import CodecError, Conflict, InvalidArgument, StorageError
from raydelay.log.entries import (
    NO_DELAY,
    AppendBatch,
    Entries,
    LedgerObject,
    decode_batch,
    decode_index,
    decode_object,
    encode_batch,
    encode_object,
    index_length,
)
from raydelay.log.partition import LedgerInfo, PartitionLog, StaleSequence
from raydelay.storage import FaultyObjectStore, MemoryObjectStore


class Ledgers:
    """A stand-in for the coordinator's ledger bookkeeping."""

    def __init__(self) -> None:
        self.next_id = 1
        self.infos: list[LedgerInfo] = []

    def roll(self, closed: int | None, count: int) -> int:
        self.infos = [
            LedgerInfo(i.ledger_id, count if i.ledger_id == closed else i.count) for i in self.infos
        ]
        new = self.next_id
        self.next_id += 1
        self.infos.append(LedgerInfo(new, None))
        return new


def batch(n: int, producer: str = "", seq: int = 0, start: int = 0) -> AppendBatch:
    entries = Entries.build(
        [b"m%d" % (start + i) for i in range(n)], np.full(n, NO_DELAY, np.int64)
    )
    return AppendBatch(producer, seq, entries)


def make_log(store=None, ledgers: Ledgers | None = None, max_entries=10, cache_bytes=1 << 20):
    ledgers = ledgers or Ledgers()
    log = PartitionLog(
        store=store if store is not None else MemoryObjectStore(),
        topic="t",
        partition=0,
        ledgers=list(ledgers.infos),
        roll=ledgers.roll,
        clock=ManualClock(1_000),
        max_entries_per_ledger=max_entries,
        cache_bytes=cache_bytes,
    )
    return log, ledgers


def payloads(log: PartitionLog, start=(0, 0)) -> list[bytes]:
    out = []
    for data in log.read(start, 10_000).objects:
        obj = decode_object(data)
        out.extend(obj.entries.payloads)
    return out


def test_a_group_commit_writes_one_object_and_positions_follow_each_other():
    store = MemoryObjectStore()
    log, _ = make_log(store)
    results = log.commit([batch(3, start=0), batch(2, start=3)])
    assert results == [[(1, 0, 3)], [(1, 3, 2)]]
    assert store.list("topics/t/0/ledgers/") == [
        "topics/t/0/ledgers/00000000000000000001/00000000000000000000.entries"
    ]
    assert log.tail() == (1, 4)
    assert payloads(log) == [b"m0", b"m1", b"m2", b"m3", b"m4"]


def test_a_batch_never_spans_ledgers_and_a_full_ledger_is_closed_with_its_count():
    log, ledgers = make_log(max_entries=10)
    results = log.commit([batch(6), batch(6, start=6)])
    assert results == [[(1, 0, 6)], [(2, 0, 6)]]
    assert ledgers.infos[0] == LedgerInfo(1, 6)
    assert log.count_of(2) == 6
    log.commit([batch(4, start=12)])  # fills ledger 2 exactly: it rolls at once
    assert [i.count for i in ledgers.infos] == [6, 10, None]
    assert payloads(log) == [b"m%d" % i for i in range(16)]


def test_a_batch_larger_than_a_ledger_is_refused_alone():
    log, _ = make_log(max_entries=10)
    results = log.commit([batch(11), batch(2)])
    assert isinstance(results[0], InvalidArgument) and "max_entries_per_ledger" in str(results[0])
    assert results[1] == [(1, 0, 2)]


def test_a_re_sent_batch_gets_its_positions_back_and_is_not_appended_again():
    log, _ = make_log()
    first = log.commit([batch(3, "p", 1)])[0]
    assert log.commit([batch(3, "p", 1)])[0] == first
    assert log.tail() == (1, 2)
    assert log.stats_counters["duplicates"] == 1


def test_batches_arriving_out_of_order_are_all_appended():
    log, _ = make_log(max_entries=100)
    log.commit([batch(1, "p", 2, start=2)])
    log.commit([batch(1, "p", 1, start=1)])  # sent first, arrived second
    assert log.commit([batch(1, "p", 1)])[0] == [(1, 1, 1)]  # and a re-send is still known
    assert sorted(payloads(log)) == [b"m1", b"m2"]


def test_a_sequence_older_than_the_remembered_history_is_refused():
    log, _ = make_log(max_entries=1_000)
    for seq in range(1, 40):
        log.commit([batch(1, "p", seq)])
    [result] = log.commit([batch(1, "p", 3)])
    assert isinstance(result, StaleSequence)
    assert log.last_sequence("p") == 39
    assert log.last_sequence("nobody") == 0


def test_a_failed_write_fails_its_batches_and_leaves_nothing_visible():
    store = FaultyObjectStore(MemoryObjectStore())
    log, _ = make_log(store)
    log.commit([batch(2, "p", 1)])
    store.fail_next("put")
    results = log.commit([batch(2, "p", 2, start=2), batch(1, start=4)])
    assert all(isinstance(r, StorageError) for r in results)
    assert log.tail() == (1, 1)
    # the producer's retry lands where the failed batch would have
    assert log.commit([batch(2, "p", 2, start=2)]) == [[(1, 2, 2)]]
    assert payloads(log) == [b"m0", b"m1", b"m2", b"m3"]


class LostRollAnswer(Ledgers):
    """The coordinator records its next close, then the answer is lost (it restarted)."""

    lose_next = False
    asked: list[tuple[int | None, int]] = []

    def roll(self, closed: int | None, count: int) -> int:
        self.asked = [*self.asked, (closed, count)]
        done = next((i for i in self.infos if i.ledger_id == closed and i.count is not None), None)
        if done is not None:  # asked again: the ledger it opened then (or a refusal)
            if done.count != count:
                raise InvalidArgument(f"count: ledger {closed} was closed at {done.count}")
            return self.infos[-1].ledger_id
        new = super().roll(closed, count)
        if self.lose_next:
            self.lose_next = False
            raise StorageError("the coordinator restarted before it answered", retriable=True)
        return new


def test_a_close_whose_answer_was_lost_is_asked_again_before_anything_more_is_written():
    # Given a ledger of 10 entries holding 8, whose close the coordinator records but does
    # not answer
    ledgers = LostRollAnswer()
    log, _ = make_log(ledgers=ledgers)
    log.commit([batch(8)])
    ledgers.lose_next = True
    # When a batch that does not fit fails on that close
    assert isinstance(log.commit([batch(3, start=8)])[0], StorageError)
    # Then a batch that would still fit is not written to the closed ledger: the close is
    # asked again at the same count first, and the batch goes to the next ledger
    assert log.commit([batch(1, start=11)]) == [[(2, 0, 1)]]
    assert ledgers.asked == [(None, 0), (1, 8), (1, 8)]  # (the first: the log opened)
    assert log.ledgers[0] == LedgerInfo(1, 8) and log.tail() == (2, 0)
    # and what every reader after a restart sees holds it
    again, _ = make_log(log._store, ledgers)  # noqa: SLF001 - the same store
    assert again.ledgers[0] == LedgerInfo(1, 8)
    assert payloads(again)[-1] == b"m11"


class LostAnswers(MemoryObjectStore):
    """Its next create-only write lands, then fails as if its answer was lost."""

    lose_next = False

    def put_new(self, key: str, data: bytes) -> None:
        super().put_new(key, data)
        if self.lose_next:
            self.lose_next = False
            raise StorageError("connection reset after the write", retriable=True)


def test_a_second_writer_of_a_ledger_gets_a_conflict_and_overwrites_nothing():
    # Given two logs over one store that both think ledger 1 is theirs (two clusters)
    store = MemoryObjectStore()
    first, ledgers = make_log(store)
    second, _ = make_log(store)
    first.commit([batch(3)])
    # When the second writes where the first did
    results = second.commit([batch(2, start=100)])
    # Then it fails loudly, and the acknowledged messages are intact
    assert isinstance(results[0], Conflict) and "second raydelay cluster" in str(results[0])
    assert payloads(first) == [b"m0", b"m1", b"m2"]


def test_a_write_whose_answer_was_lost_is_replaced_by_the_next_attempt():
    store = LostAnswers()
    log, _ = make_log(store)
    store.lose_next = True
    [result] = log.commit([batch(2, "p", 1)])
    assert isinstance(result, StorageError) and log.tail() is None or log.tail() == (0, -1)
    # the retry, grouped with another batch, writes other bytes at the same key: allowed
    assert log.commit([batch(2, "p", 1), batch(1, start=2)]) == [[(1, 0, 2)], [(1, 2, 1)]]
    assert payloads(log) == [b"m0", b"m1", b"m2"]


def test_a_restarted_log_keeps_dedup_and_never_appends_to_a_ledger_it_did_not_open():
    store = MemoryObjectStore()
    log, ledgers = make_log(store, max_entries=10)
    log.commit([batch(6, "p", 1)])
    log.commit([batch(6, "p", 2, start=6)])  # rolls to ledger 2
    log.commit([batch(1, "p", 3, start=12)])
    # When a new instance starts over the same store and ledger list
    again, _ = make_log(store, ledgers, max_entries=10)
    # Then re-sends of batches from both ledgers are recognised
    assert again.commit([batch(6, "p", 1)])[0] == [(1, 0, 6)]
    assert again.commit([batch(1, "p", 3)])[0] == [(2, 6, 1)]
    # and new entries go to a fresh ledger, after the old one was closed at its size
    assert again.commit([batch(1, "p", 4, start=13)])[0] == [(3, 0, 1)]
    assert [(i.ledger_id, i.count) for i in ledgers.infos] == [(1, 6), (2, 7), (3, None)]
    assert payloads(again) == [b"m%d" % i for i in range(14)]


def test_reads_cross_ledgers_start_mid_object_and_serve_redeliveries():
    log, _ = make_log(max_entries=4)
    for i in range(5):
        log.commit([batch(2, start=2 * i)])
    reply = log.read((2, 1), 3)
    objs = [decode_object(d) for d in reply.objects]
    assert (objs[0].ledger_id, objs[0].first_entry) == (2, 0)  # whole object holding (2, 1)
    assert sum(o.count for o in objs) >= 3
    assert reply.tail == log.tail()
    got = log.read_positions([(1, 3), (3, 0), (1, 2), (99, 0)])
    assert got.positions.tolist() == [(1 << 32) | 2, (1 << 32) | 3, 3 << 32]  # sorted
    assert got.entries.payloads == [b"m2", b"m3", b"m8"]
    assert got.publish_time_ms.tolist() == [1_000] * 3


@pytest.mark.parametrize("cached", [False, True])
def test_scattered_positions_come_back_as_taken_rows_from_ranged_reads(cached):
    store = FaultyObjectStore(MemoryObjectStore())
    log, _ = make_log(store, max_entries=10_000, cache_bytes=(1 << 20) if cached else 0)
    big = Entries.build([b"p%04d" % i + b"." * 400 for i in range(1_000)], np.full(1_000, NO_DELAY))
    log.commit([AppendBatch("", 0, big)])
    wanted = [(1, 5), (1, 7), (1, 900), (1, 39), (1, 2_000)]  # 2000: not in the log
    got = log.read_positions(wanted)
    # only the rows asked for, in position order (6, which shares a ranged read, is not)
    assert got.positions.tolist() == [(1 << 32) | e for e in (5, 7, 39, 900)]
    assert [p[:5] for p in got.entries.payloads] == [b"p%04d" % e for e in (5, 7, 39, 900)]
    if not cached:
        # one probe for the index (its 64 KiB hold entries 5..39 too), one for entry 900
        assert store.calls["get"] == 0 and store.calls["get_range"] == 2
        log.read_positions([(1, 300)])  # the index is kept: one more ranged read
        assert store.calls["get_range"] == 3
    assert log.stats_counters["point_reads"] == 5 if not cached else 4
    # most of an object wanted: the object is read whole, once, and the rows taken from it
    gets = store.calls["get"]
    half = log.read_positions(np.array([(1 << 32) | i for i in range(0, 1_000, 2)]))
    assert len(half) == 500 and half.entries.payloads[-1].startswith(b"p0998")
    assert store.calls["get"] - gets == (0 if cached else 1)


def test_the_tail_cache_is_bounded_and_misses_read_the_store():
    store = FaultyObjectStore(MemoryObjectStore())
    log, _ = make_log(store, max_entries=1_000, cache_bytes=200)
    for i in range(20):
        log.commit([batch(5, start=5 * i)])
    assert log.cached_bytes <= 200
    gets = store.calls["get"]
    assert payloads(log)[:3] == [b"m0", b"m1", b"m2"]
    assert store.calls["get"] > gets


class RangeRecorder(MemoryObjectStore):
    """Records the (key, start) of each ranged read: start 0 is an index probe."""

    def __init__(self) -> None:
        super().__init__()
        self.ranges: list[tuple[str, int]] = []

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self.ranges.append((key.rsplit("/", 1)[1], start))
        return super().get_range(key, start, end)

    def probes(self) -> list[str]:
        return [key for key, start in self.ranges if start == 0]


def test_the_index_cache_is_bounded_and_an_evicted_index_is_read_again():
    # Given two objects of 20 entries, and an index cache with room for one index only
    store = RangeRecorder()
    log = PartitionLog(
        store=store,
        topic="t",
        partition=0,
        ledgers=[],
        roll=Ledgers().roll,
        clock=ManualClock(1_000),
        max_entries_per_ledger=1_000,
        cache_bytes=0,  # no whole objects: every point read goes by the index
        index_cache_bytes=1_000,  # room for one index of 20 entries (about 650 B), not two
    )
    log.commit([batch(20)])
    log.commit([batch(20, start=20)])
    first, second = "00000000000000000000.entries", "00000000000000000020.entries"
    # When an entry of the first is read twice, then one of the second, then the first's
    for position in [(1, 1), (1, 2), (1, 21), (1, 3)]:
        assert log.read_positions([position]).entries.payloads == [b"m%d" % position[1]]
    # Then the first's index was probed, kept, evicted by the second's, and probed again
    assert store.probes() == [first, second, first]


def test_deleting_a_ledger_empties_its_share_of_the_tail_cache():
    # Given two closed ledgers whose objects are in the tail cache
    log, _ = make_log(max_entries=4)
    for i in range(2):
        log.commit([batch(4, start=4 * i)])
    assert log.cached_bytes > 0
    # When both are deleted, then nothing of them is cached, nor readable
    log.delete_ledgers([1, 2])
    assert log.cached_bytes == 0
    assert log.read((1, 0), 100).objects == []
    assert not log.contains(1, 0) and log.count_of(2) is None


def test_deleting_ledgers_removes_their_objects_but_never_the_open_one():
    store = MemoryObjectStore()
    log, ledgers = make_log(store, max_entries=4)
    for i in range(3):
        log.commit([batch(4, start=4 * i)])
    open_ledger = log.current_ledger
    deleted = log.delete_ledgers([1, 2, open_ledger])
    assert deleted == 2
    assert not store.list("topics/t/0/ledgers/00000000000000000001/")
    assert [i.ledger_id for i in log.ledgers] == [3, open_ledger]


def golden_entries() -> Entries:
    return Entries.build(
        [b"a", b""], np.array([5, NO_DELAY], np.int64), ["k", None], [{"x": "y"}, None], {1: (7, 8)}
    )


def test_formats_round_trip_and_are_pinned_by_golden_bytes():
    obj = LedgerObject(3, 10, 1_000, golden_entries(), {"p": (2, [(3, 10, 2)])})
    data = encode_object(obj)
    assert data.hex() == GOLDEN_OBJECT
    back = decode_object(data)
    assert (back.ledger_id, back.first_entry, back.publish_time_ms) == (3, 10, 1_000)
    assert back.entries.payloads == [b"a", b""] and back.entries.keys == ["k", None]
    assert back.entries.properties == [{"x": "y"}, None]
    assert back.entries.cancels == {1: (7, 8)} and back.dedup == {"p": (2, [(3, 10, 2)])}
    assert list(back.entries.deliver_at_ms) == [5, NO_DELAY]
    encoded = encode_batch(AppendBatch("p", 4, golden_entries()))
    assert encoded.hex() == GOLDEN_BATCH
    b = decode_batch(encoded)
    assert (b.producer, b.sequence_id, b.entries.payloads) == ("p", 4, [b"a", b""])
    assert b.entries.cancels == {1: (7, 8)}


def test_an_append_batch_of_format_2_from_an_earlier_client_still_decodes():
    b = decode_batch(bytes.fromhex(GOLDEN_BATCH_V2))
    assert (b.producer, b.sequence_id, b.entries.payloads) == ("p", 4, [b"a", b""])
    assert b.entries.keys == ["k", None] and b.entries.properties == [{"x": "y"}, None]
    assert b.entries.cancels == {1: (7, 8)} and list(b.entries.deliver_at_ms) == [5, NO_DELAY]


def test_a_broken_append_batch_of_format_3_is_refused_clearly():
    good = encode_batch(AppendBatch("producer-é", 9, golden_entries()))
    assert decode_batch(good).producer == "producer-é"
    with pytest.raises(InvalidArgument, match="too short"):
        decode_batch(good[:10])
    with pytest.raises(InvalidArgument, match="name runs past"):
        decode_batch(good[:4] + (10_000).to_bytes(4, "little") + good[8:])
    with pytest.raises(InvalidArgument, match="not a valid append batch"):
        decode_batch(good[:40])  # the entries cut off
    with pytest.raises(InvalidArgument, match="not a valid append batch"):
        decode_batch(good[:-24] + b"\xff" * 24)  # broken offsets and values
    with pytest.raises(InvalidArgument, match="not a valid append batch"):
        decode_batch(good[:8] + b"\0" * 8 + b"\xff\xfe" + good[18:])  # a name not UTF-8
    nulls = Entries.build([b"a"], np.array([1], np.int64)).batch
    holed = pa.RecordBatch.from_arrays(
        [pa.array([None], pa.binary()), *nulls.columns[1:]], schema=nulls.schema
    )
    with pytest.raises(InvalidArgument, match="'payload' has nulls"):
        decode_batch(encode_batch(AppendBatch("p", 1, Entries(holed))))


def test_a_format_2_object_written_before_the_arrow_format_still_reads():
    back = decode_object(bytes.fromhex(GOLDEN_OBJECT_V2))
    assert (back.ledger_id, back.first_entry, back.publish_time_ms) == (3, 10, 1_000)
    assert back.entries.payloads == [b"a", b""] and back.entries.keys == ["k", None]
    assert back.entries.properties == [{"x": "y"}, None]
    assert back.entries.cancels == {1: (7, 8)} and back.dedup == {"p": (2, [(3, 10, 2)])}
    assert list(back.entries.deliver_at_ms) == [5, NO_DELAY]
    index = decode_index(bytes.fromhex(GOLDEN_OBJECT_V2))
    lo, hi = index.byte_range(0, 1)
    assert index.run(0, 1, bytes.fromhex(GOLDEN_OBJECT_V2)[lo:hi], lo).entries.payloads == [b"a"]


# Format 3: prefix "RDL\x03" + n + meta length + 0 (uint32 LE), n + 1 int32 payload offsets
# (padded to 8 bytes), an Arrow IPC stream of the other columns (schema metadata: l, f, t,
# dd), then the payloads. Changing the format must change the magic.
GOLDEN_OBJECT = (
    "52444c0302000000a80400000000000000000000010000000100000000000000ffffffff5002000010000000"
    "00000a000e000600050008000a000000000104001000000000000a000c000000040008000a000000a0000000"
    "040000000400000078000000500000002c00000004000000a0ffffff18000000040000000a00000081a17092"
    "029193030a0200000200000064640000c4ffffff140000000400000004000000313030300000000001000000"
    "74000000e4ffffff10000000040000000200000031300000010000006600000008000c000400080008000000"
    "10000000040000000100000033000000010000006c000000040000003c010000000100004000000004000000"
    "e4feffff00000102100000002000000004000000000000000d00000063616e63656c5f746172676574000000"
    "d4feffff00000001400000001cffffff0000011114000000200000000400000001000000180000000a000000"
    "70726f70657274696573000050ffffffa8ffffff0000000d1800000020000000040000000200000050000000"
    "1400000007000000656e74726965730080ffffff7cffffff0000010510000000180000000400000000000000"
    "0500000076616c7565000000a8ffffff100014000800000007000c0000001000100000000000000510000000"
    "140000000400000000000000030000006b657900dcffffffd8ffffff00000105100000001800000004000000"
    "00000000030000006b6579000400040004000000100014000800060007000c00000010001000000000000102"
    "100000002800000004000000000000000d00000064656c697665725f61745f6d7300000008000c0008000700"
    "08000000000000014000000000000000ffffffffc801000014000000000000000c0016000600050008000c00"
    "0c0000000003040018000000780000000000000000000a0018000c00040008000a0000001c01000010000000"
    "0200000000000000000000001000000000000000000000000000000000000000000000000000000010000000"
    "000000001000000000000000010000000000000018000000000000000c000000000000002800000000000000"
    "01000000000000003000000000000000010000000000000038000000000000000c0000000000000048000000"
    "0000000000000000000000004800000000000000000000000000000048000000000000000800000000000000"
    "5000000000000000010000000000000058000000000000000000000000000000580000000000000008000000"
    "0000000060000000000000000100000000000000680000000000000000000000000000006800000000000000"
    "1000000000000000000000000700000002000000000000000000000000000000020000000000000001000000"
    "0000000002000000000000000100000000000000010000000000000000000000000000000100000000000000"
    "0000000000000000010000000000000000000000000000000200000000000000000000000000000005000000"
    "00000000ffffffffffffffff0100000000000000000000000100000001000000000000006b00000000000000"
    "0100000000000000000000000100000001000000000000000000000001000000780000000000000000000000"
    "010000007900000000000000ffffffffffffffff0800000007000000ffffffff0000000061"
)
# An append batch, format 3: magic "RDB\x03", the producer name's length (uint32 LE), the
# sequence id (uint64 LE), the name padded to 8 bytes, then one Arrow IPC record-batch message
# of the entries. Changing the format must change the magic.
GOLDEN_BATCH = (
    "524442030100000004000000000000007000000000000000ffffffff0802000014000000000000000c001600"
    "0600050008000c000c0000000003040018000000900000000000000000000a0018000c00040008000a000000"
    "4c01000010000000020000000000000000000000130000000000000000000000000000000000000000000000"
    "000000000c000000000000001000000000000000010000000000000018000000000000000000000000000000"
    "180000000000000010000000000000002800000000000000010000000000000030000000000000000c000000"
    "0000000040000000000000000100000000000000480000000000000001000000000000005000000000000000"
    "0c00000000000000600000000000000000000000000000006000000000000000000000000000000060000000"
    "0000000008000000000000006800000000000000010000000000000070000000000000000000000000000000"
    "7000000000000000080000000000000078000000000000000100000000000000800000000000000000000000"
    "0000000080000000000000001000000000000000000000000800000002000000000000000000000000000000"
    "0200000000000000000000000000000002000000000000000100000000000000020000000000000001000000"
    "0000000001000000000000000000000000000000010000000000000000000000000000000100000000000000"
    "0000000000000000020000000000000000000000000000000000000001000000010000000000000061000000"
    "000000000500000000000000ffffffffffffffff010000000000000000000000010000000100000000000000"
    "6b00000000000000010000000000000000000000010000000100000000000000000000000100000078000000"
    "0000000000000000010000007900000000000000ffffffffffffffff0800000007000000"
)

# Format 2, which earlier clients send: an Arrow IPC stream of the entries, its schema metadata
# raydelay.v (2), producer and seq. Still decoded.
GOLDEN_BATCH_V2 = (
    "ffffffff600200001000000000000a000e000600050008000a000000000104001000000000000a000c000000"
    "040008000a000000840000000400000003000000540000002400000004000000c0ffffff1000000004000000"
    "01000000340000000300000073657100dcffffff100000000400000001000000700000000800000070726f64"
    "756365720000000008000c000400080008000000100000000400000001000000320000000a00000072617964"
    "656c61792e760000050000007c01000028010000000100004000000004000000a8feffff0000010210000000"
    "2000000004000000000000000d00000063616e63656c5f746172676574000000e8feffff0000000140000000"
    "e0feffff0000011114000000200000000400000001000000180000000a00000070726f706572746965730000"
    "d8feffffa8ffffff0000000d18000000200000000400000002000000500000001400000007000000656e7472"
    "6965730008ffffff40ffffff00000105100000001800000004000000000000000500000076616c7565000000"
    "30ffffff100014000800000007000c0000001000100000000000000510000000140000000400000000000000"
    "030000006b65790064ffffff9cffffff0000010510000000140000000400000000000000030000006b657900"
    "88ffffffc0ffffff00000102100000002800000004000000000000000d00000064656c697665725f61745f6d"
    "7300000008000c0008000700080000000000000140000000100014000800060007000c000000100010000000"
    "00000104100000001c0000000400000000000000070000007061796c6f616400040004000400000000000000"
    "ffffffff0802000014000000000000000c0016000600050008000c000c000000000304001800000090000000"
    "0000000000000a0018000c00040008000a0000004c0100001000000002000000000000000000000013000000"
    "0000000000000000000000000000000000000000000000000c00000000000000100000000000000001000000"
    "0000000018000000000000000000000000000000180000000000000010000000000000002800000000000000"
    "010000000000000030000000000000000c000000000000004000000000000000010000000000000048000000"
    "00000000010000000000000050000000000000000c0000000000000060000000000000000000000000000000"
    "6000000000000000000000000000000060000000000000000800000000000000680000000000000001000000"
    "0000000070000000000000000000000000000000700000000000000008000000000000007800000000000000"
    "0100000000000000800000000000000000000000000000008000000000000000100000000000000000000000"
    "0800000002000000000000000000000000000000020000000000000000000000000000000200000000000000"
    "0100000000000000020000000000000001000000000000000100000000000000000000000000000001000000"
    "0000000000000000000000000100000000000000000000000000000002000000000000000000000000000000"
    "0000000001000000010000000000000061000000000000000500000000000000ffffffffffffffff01000000"
    "00000000000000000100000001000000000000006b0000000000000001000000000000000000000001000000"
    "01000000000000000000000001000000780000000000000000000000010000007900000000000000ffffffff"
    "ffffffff0800000007000000ffffffff00000000"
)
# Format 2 (read only): prefix "RDL\x02" + n + header length + 0 (uint32 LE), n + 1 uint32
# payload offsets, msgpack header {l, f, t, dd, d (int64 LE bytes), k, pr, c}, payloads.
GOLDEN_OBJECT_V2 = (
    "52444c0202000000440000000000000000000000010000000100000088a16c03a1660aa174cd03e8a264648"
    "1a17092029193030a02a164c4100500000000000000ffffffffffffffffa16b92a16bc0a270729281a178a1"
    "79c0a163919301070861"
)


def test_an_object_index_cuts_out_single_entries_from_ranged_reads():
    entries = Entries.build(
        [b"zero", b"one", b"", b"three"],
        np.array([5, 6, NO_DELAY, 8], np.int64),
        cancels={2: (1, 0)},
    )
    data = encode_object(LedgerObject(4, 100, 7, entries, {}))
    index = decode_index(data[: index_length(data)])
    assert (index.ledger_id, index.first_entry, index.count) == (4, 100, 4)
    lo, hi = index.byte_range(1, 3)
    run = index.run(1, 3, data[lo:hi], lo)  # only those bytes were fetched
    assert (run.ledger_id, run.first_entry, run.count) == (4, 101, 2)
    assert run.entries.payloads == [b"one", b""] and run.entries.cancels == {1: (1, 0)}
    assert list(run.entries.deliver_at_ms) == [6, NO_DELAY]
    last = index.run(3, 4, data, 0)
    assert last.entries.payloads == [b"three"] and last.first_entry == 103


def test_corrupt_objects_and_batches_raise_clear_errors():
    good = encode_object(LedgerObject(1, 0, 0, Entries.build([b"x"], np.array([NO_DELAY])), {}))
    with pytest.raises(CodecError, match="too short"):
        decode_object(b"\xc1garbage")
    with pytest.raises(CodecError, match="unknown format"):
        decode_object(b"RDL\x01" + good[4:])
    meta_end = index_length(good)
    broken = good[: meta_end - 40] + b"\xc1" * 30 + good[meta_end - 10 :]
    with pytest.raises(CodecError, match="cannot decode its index") as info:
        decode_object(broken)  # a broken meta
    assert info.value.__cause__ is not None
    with pytest.raises(CodecError, match="truncated"):
        decode_object(good[:-1])
    text = pa.RecordBatch.from_arrays(
        [pa.array(["text"]), pa.array([-1], pa.int64())], names=["payload", "deliver_at_ms"]
    )
    sink = pa.BufferOutputStream()
    schema = text.schema.with_metadata({"raydelay.v": "2", "producer": "p", "seq": "1"})
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(text.replace_schema_metadata(schema.metadata))
    with pytest.raises(InvalidArgument, match="payload"):
        decode_batch(sink.getvalue().to_pybytes())
    old_format = msgpack.packb({"v": 1, "producer": "p", "seq": 1, "p": [b"x"]})
    with pytest.raises(InvalidArgument, match="not a valid append batch"):
        decode_batch(old_format)
    with pytest.raises(InvalidArgument, match="bytes"):
        decode_batch("not bytes")


def test_cancel_markers_are_listed_from_a_position_also_after_a_restart():
    store = MemoryObjectStore()
    log, ledgers = make_log(store, max_entries=10)
    log.commit([batch(4)])
    marker = Entries.build([b""], np.full(1, NO_DELAY, np.int64), cancels={0: (1, 2)})
    [[(lg, first, _)]] = log.commit([AppendBatch("", 0, marker)])
    log.commit([batch(3, start=5)])
    assert log.cancel_markers((1, 0)) == [((lg, first), (1, 2))]
    assert log.cancel_markers((lg, first + 1)) == []
    again, _ = make_log(store, ledgers, max_entries=10)  # decoded from the store this time
    assert again.cancel_markers((1, 0)) == [((lg, first), (1, 2))]
