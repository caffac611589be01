"""Sealed buckets (pure): the topic's mutable bucket, sealing into segments that carry
their payloads, the meta format (golden bytes), and one subscription's reading of them."""

from __future__ import annotations

import asyncio

import hypothesis.strategies as st
import msgpack
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from pyroaring import BitMap64

from raydelay.clock import ManualClock
from raydelay.delayed import InMemoryDelayedDeliveryTracker
from raydelay.delayed.reader import FINISHED, SealedReader
from raydelay.delayed.sealed import (
    SealedMeta,
    SegmentInfo,
    TopicIndex,
    decode_index,
    decode_meta,
    decode_segment,
    encode_index,
    encode_meta,
    registry_name,
    seal,
    segment_of,
)
from raydelay.delayed.store import SealedStore
from raydelay.dispatch.subscription import TAIL_IDLE_POLL_MS, TAIL_POLL_MS, Subscription
from raydelay.errors import CodecError, InvalidArgument
from raydelay.log.entries import NO_DELAY, DelayedRun, Entries, LedgerObject, Rows
from raydelay.positions import key_of, position_keys
from raydelay.storage.counting import CountingObjectStore
from raydelay.storage.memory import MemoryObjectStore


def _object(
    ledger: int, first: int, deliver_at: list[int], publish_ms: int = 1_000
) -> LedgerObject:
    n = len(deliver_at)
    entries = Entries.build(
        [b"p%d-%d" % (ledger, first + i) for i in range(n)],
        np.asarray(deliver_at, dtype=np.int64),
        keys=[f"k{i}" for i in range(n)],
    )
    return LedgerObject(ledger, first, publish_ms, entries, {})


def test_the_topic_index_keeps_only_entries_not_due_at_commit():
    index = TopicIndex(min_index_count=3)
    # immediate, due at commit (deliver_at <= publish time), and two delayed
    taken = index.add(_object(1, 0, [NO_DELAY, 900, 5_000, 2_000]))
    assert taken == 2 and index.count == 2
    assert index.rows().positions.tolist() == [key_of(1, 2), key_of(1, 3)]


def test_a_bucket_is_sealed_at_a_ledger_boundary_once_it_holds_enough():
    index = TopicIndex(min_index_count=3)
    index.add(_object(1, 0, [5_000, 4_000]))
    assert index.ledger_closed(1) is None  # 2 < 3: the range grows
    index.add(_object(2, 0, [3_000]))
    job = index.ledger_closed(2)
    assert (job.start_ledger, job.end_ledger, len(job.rows)) == (0, 2, 3)
    assert index.count == 0 and index.sealed_through == 2
    # a range without delayed entries is indexed at once, with no bucket
    index.add(_object(3, 0, [NO_DELAY]))
    empty = index.ledger_closed(3)
    assert (empty.start_ledger, empty.end_ledger, empty.rows) == (3, 3, None)
    # objects of sealed ledgers are not taken again (a rebuild after a restart)
    assert index.add(_object(2, 0, [9_000])) == 0


def test_seal_sorts_by_deliver_at_then_position_and_cuts_segments():
    index = TopicIndex(min_index_count=1)
    index.add(_object(1, 0, [5_000, 2_000, 2_000, 9_000, 400_000]))
    job = index.ledger_closed(1)
    meta, data, index_raw = seal(
        job.rows, start_ledger=1, end_ledger=1, bucket_id=7, max_indexes=2, max_step_ms=300_000
    )
    assert [(s.min_d, s.max_d, s.count) for s in meta.segments] == [
        (2_000, 2_000, 2),
        (5_000, 9_000, 2),
        (400_000, 400_000, 1),  # beyond the time step
    ]
    segs = [decode_segment(data[s.offset : s.offset + s.length]) for s in meta.segments]
    assert [seg.positions.tolist() for seg in segs][0] == [key_of(1, 1), key_of(1, 2)]
    assert segs[1].entries.payloads == [b"p1-0", b"p1-3"]
    assert segs[1].entries.keys == ["k0", "k3"]
    assert meta.count == 5 and meta.key == "00000000000000000001_00000000000000000001_7"
    assert sorted(meta.positions()) == [key_of(1, e) for e in range(5)]
    segment_keys = decode_index(index_raw)
    where = segment_of(segment_keys, np.array([key_of(1, 3), key_of(1, 4), key_of(2, 0)]))
    assert where.tolist() == [1, 2, -1]
    with pytest.raises(InvalidArgument, match="rows"):
        seal(
            job.rows.__class__(
                np.zeros(0, np.int64), np.zeros(0, np.int64), job.rows.entries.slice(0, 0)
            ),
            start_ledger=1,
            end_ledger=1,
            bucket_id=1,
            max_indexes=2,
            max_step_ms=1,
        )


GOLDEN_META = (
    "88a17602a57374617274cd0102a3656e64cd0104a269640ba76c6564"
    "676572739292cd01020592cd010407a76d61726b65727391920702a4"
    "6b657973c4220100000000000000000000003a300000010000000000"
    "020010000000020003000900a87365676d656e747392950a14020010"
    "951e1e011009"
)
GOLDEN_INDEX = (
    "82a17601a87365676d656e747392c4200100000000000000000000003a"
    "30000001000000000001001000000002000300c41e01000000000000000000"
    "00003a3000000100000000000000100000000900"
)
# format 1 (stores written before the index object): the segment keys inline
GOLDEN_META_V1 = (
    "87a17601a57374617274cd0102a3656e64cd0104a269640ba76c6564"
    "676572739292cd01020592cd010407a76d61726b65727391920702a8"
    "7365676d656e747391960a14020010c4200100000000000000000000"
    "003a30000001000000000001001000000002000300"
)


def test_the_meta_and_index_formats_are_pinned():
    meta = SealedMeta(
        258,
        260,
        11,
        (SegmentInfo(10, 20, 2, 0, 16), SegmentInfo(30, 30, 1, 16, 9)),
        ((258, 5), (260, 7)),
        ((7, 2),),
        BitMap64([2, 3, 9]),
    )
    raw = encode_meta(meta)
    assert decode_meta(raw) == meta
    assert raw.hex() == GOLDEN_META
    index = (BitMap64([2, 3]), BitMap64([9]))
    assert encode_index(index).hex() == GOLDEN_INDEX
    assert decode_index(bytes.fromhex(GOLDEN_INDEX)) == index
    with pytest.raises(CodecError):
        decode_meta(b"\x81\xa1v\x09")
    with pytest.raises(CodecError, match="format 9"):
        decode_index(b"\x81\xa1v\x09")


def test_a_format_1_meta_still_decodes_with_its_segment_keys():
    meta = decode_meta(bytes.fromhex(GOLDEN_META_V1))
    assert (meta.start_ledger, meta.end_ledger, meta.bucket_id) == (258, 260, 11)
    assert meta.segments == (SegmentInfo(10, 20, 2, 0, 16),)
    assert meta.ledgers == ((258, 5), (260, 7)) and meta.markers == ((7, 2),)
    assert meta.segment_keys == (BitMap64([2, 3]),)
    assert meta.positions() == BitMap64([2, 3])


def _meta(
    start: int, rows: list[tuple[int, int]], *, max_indexes: int = 2
) -> tuple[SealedMeta, dict]:
    """A bucket of rows (position key, deliver_at) and its segments' rows by number."""
    index = TopicIndex(min_index_count=1, sealed_through=start - 1)
    by_ledger: dict[int, list] = {}
    for k, d in rows:
        by_ledger.setdefault(k >> 32, []).append((k & 0xFFFFFFFF, d))
    for ledger, items in sorted(by_ledger.items()):
        ds = [NO_DELAY] * (max(e for e, _ in items) + 1)
        for e, d in items:
            ds[e] = d
        index.add(_object(ledger, 0, ds, publish_ms=0))
    end = max(by_ledger)
    job = index.ledger_closed(end)
    meta, data, _ = seal(
        job.rows,
        start_ledger=start,
        end_ledger=end,
        bucket_id=1,
        max_indexes=max_indexes,
        max_step_ms=10**9,
    )
    segs = {
        i: decode_segment(data[s.offset : s.offset + s.length]) for i, s in enumerate(meta.segments)
    }
    return meta, segs


def _do(reader: SealedReader, ld, segs_by_run: dict) -> None:
    """One load, as the actor does it: the rows of its reads, the keys of its keys_only
    (``segs_by_run``: each run's segments' rows by number, under the run's key)."""
    rows = [segs_by_run[p.run_key][p.segment] for p in ld.reads]
    keys = [segs_by_run[p.run_key][p.segment].positions for p in ld.keys_only]
    reader.install(ld.key, ld.no, rows, keys)


def _load_all(reader: SealedReader, segs_by_run: dict, now: int, max_loads: int = 4) -> list:
    """Do every load the reader asks for at ``now``, as the actor would; returns them."""
    done = []
    while True:
        wanted = reader.wanted(now, max_loads=max_loads)
        if not wanted:
            return done
        for ld in wanted:
            _do(reader, ld, segs_by_run)
        done += wanted


def test_the_reader_loads_segments_near_their_time_and_pops_the_earliest_first():
    a, sa = _meta(1, [(key_of(1, 0), 100), (key_of(1, 1), 300), (key_of(1, 2), 50_000)])
    b, sb = _meta(2, [(key_of(2, 0), 200), (key_of(2, 1), 400)])
    reader = SealedReader(lookahead_ms=1_000, max_loaded_rows=2)
    reader.adopt(a)
    reader.adopt(b)
    assert key_of(1, 1) in reader.covered and key_of(3, 0) not in reader.covered
    segs = {a.key: sa, b.key: sb}
    _load_all(reader, segs, now=0)
    # the segment due at 50,000 is beyond the lookahead: not loaded, and the reader says
    # when it will want it (the driver sleeps until then)
    assert reader.loaded_rows() == 4 and reader.remaining() == 5
    assert reader.next_load_ms() == 50_000 - 1_000
    assert reader.wanted(48_999) == []
    groups = reader.take_due(350, 3)
    keys = np.concatenate([g[2] for g in groups]).tolist()
    assert sorted(keys) == [key_of(1, 0), key_of(1, 1), key_of(2, 0)]
    assert [g[0].entries.payloads for g in groups][0][0] == b"p1-0"
    assert reader.next_time() == 400
    assert reader.take_due(350, 10) == []
    # all popped from a and acknowledged: a is finished once its last segment is
    assert reader.advance(lambda keys: True) == []
    assert reader.progress()[a.key] == 1
    _load_all(reader, segs, now=49_500)
    reader.take_due(60_000, 10)
    assert reader.advance(lambda keys: True) == [a.key, b.key]
    assert reader.progress() == {a.key: FINISHED, b.key: FINISHED}
    assert reader.due_histogram(np.array([1_000])) == [0, 0]


def test_the_reader_resumes_at_its_progress_and_skips_rows_it_was_told_to():
    a, sa = _meta(1, [(key_of(1, i), 100 + i) for i in range(6)])
    reader = SealedReader()
    # segments of two rows; the first is done; rows below 1:4 due by 102 were taken
    reader.adopt(a, done=1, taken=(key_of(1, 4), 102))
    _load_all(reader, {a.key: sa}, now=0)
    keys = np.concatenate([g[2] for g in reader.take_due(1_000, 10)]).tolist()
    assert keys == [key_of(1, 3), key_of(1, 4), key_of(1, 5)]
    histogram_reader = SealedReader()
    histogram_reader.adopt(a)
    _load_all(histogram_reader, {a.key: sa}, now=0)  # loaded rows count exactly
    assert histogram_reader.due_histogram(np.array([103, 200])) == [3, 3, 0]


def _subscription(reader: SealedReader, clock: ManualClock) -> Subscription:
    tracker = InMemoryDelayedDeliveryTracker(clock=clock, tick_time_ms=1, strict=True)
    return Subscription(
        name="t/0/s", subscription_type="shared", tracker=tracker, clock=clock, sealed=reader
    )


def test_the_unsealed_index_answers_each_due_row_once_per_subscription():
    index = TopicIndex(min_index_count=10)
    index.add(_object(1, 0, [100, 300, 200], publish_ms=0))
    # nothing taken yet: everything due at 250
    rows, below, next_d, waiting = index.due(0, -1, 250)
    assert rows.positions.tolist() == [key_of(1, 0), key_of(1, 2)]
    assert (below, next_d, waiting) == (key_of(1, 2) + 1, 300, 1)
    # a row committed after the answer, due earlier than the last answer's time, is not lost
    index.add(_object(1, 3, [150, 400], publish_ms=0))
    rows, below2, next_d, _ = index.due(below, 250, 350)
    assert rows.positions.tolist() == [key_of(1, 1), key_of(1, 3)]
    assert (below2, next_d) == (key_of(1, 4) + 1, 400)
    # rows handed to a seal stay visible until their bucket is published
    assert index.ledger_closed(1) is None  # 5 rows < 10: not yet
    index.min_index_count = 1
    job = index.ledger_closed(1)
    assert job is not None and len(job.rows) == 5
    rows, _, _, _ = index.due(below2, 350, 500)
    assert rows.positions.tolist() == [key_of(1, 4)]
    index.published(1)
    rows, below3, next_d, waiting = index.due(0, -1, 500)
    assert len(rows) == 0 and (next_d, waiting) == (-1, 0) and below3 == 0


def test_small_commits_are_held_in_few_parts_and_every_due_row_is_answered_once():
    # Given 3,000 commits of one delayed entry each, and some of two to five, due at
    # scattered times, interleaved with due queries as a subscription makes them
    rng = np.random.default_rng(7)
    index = TopicIndex(min_index_count=1_000_000)
    model: dict[int, int] = {}  # position key -> deliver_at
    answered: list[int] = []
    below, through, entry = 0, -1, 0
    for now in range(0, 3_000):
        n = 1 if now % 7 else int(rng.integers(2, 6))
        ds = (now + rng.integers(1, 2_000, n)).tolist()
        index.add(_object(1, entry, ds, publish_ms=now))
        model.update({key_of(1, entry + i): d for i, d in enumerate(ds)})
        entry += n
        if now % 50 == 0:
            rows, below, next_d, waiting = index.due(below, through, now)
            through = now
            answered += rows.positions.tolist()
            # Then each answer holds what is due and not answered yet; the rest waits
            later = [d for d in model.values() if d > now]
            assert waiting == len(later) and next_d == min(later)
    # Then the rows sit in a few dozen parts, not one per commit
    assert index.part_count <= 40 and index.count == len(model)
    rows, _, next_d, waiting = index.due(below, through, 10**9)
    answered += rows.positions.tolist()
    assert sorted(answered) == sorted(model) and len(answered) == len(set(answered))
    assert (next_d, waiting) == (-1, 0)
    # and a seal of the ledger takes every row, in position order, with its payload
    index.min_index_count = 1
    job = index.ledger_closed(1)
    assert job is not None and job.rows is not None
    assert job.rows.positions.tolist() == sorted(model)
    assert job.rows.entries.deliver_at_ms.tolist() == [model[k] for k in sorted(model)]
    assert job.rows.entries.payloads[:2] == [b"p1-0", b"p1-1"]


def test_parts_of_bulk_commits_are_never_merged():
    # Given commits of 2,000 delayed entries each, and a small one after them
    index = TopicIndex(min_index_count=1_000_000)
    for i in range(3):
        index.add(_object(1, 2_000 * i, [5_000 + i] * 2_000))
    index.add(_object(1, 6_000, [4_000]))
    # Then each bulk commit stays a part of its own (none is copied again)
    assert index.part_count == 4
    rows, _, next_d, waiting = index.due(0, -1, 4_500)
    assert rows.positions.tolist() == [key_of(1, 6_000)] and (next_d, waiting) == (5_000, 6_000)


def _subscription(
    reader: SealedReader, clock: ManualClock, cursor=None, lookahead_ms: int = 0
) -> Subscription:
    tracker = InMemoryDelayedDeliveryTracker(clock=clock, tick_time_ms=1, strict=True)
    return Subscription(
        name="t/0/s",
        subscription_type="shared",
        tracker=tracker,
        clock=clock,
        sealed=reader,
        cursor=cursor,
        lookahead_ms=lookahead_ms,
    )


def test_a_subscription_takes_the_tail_from_the_topic_and_the_rest_from_the_bucket():
    clock = ManualClock(0)
    reader = SealedReader()
    sub = _subscription(reader, clock)
    sub.add_consumer("c")
    # the subscription reads ledger 1 from the log: an immediate entry and four delayed
    obj = _object(1, 0, [NO_DELAY, 100, 200, 300, 400], publish_ms=0)
    sub.on_read([obj], [(1, 5), (2, None)], (1, 4))
    # the delayed ones are not tracked here: the topic's index has them
    assert sub.tracker.number_of_delayed_messages() == 0 and sub.ready_count() == 1
    assert sub.unsealed.dirty and sub.unsealed.next_ms == 100
    # the topic answers the due query the step at 250 asks with the two due rows
    index = TopicIndex(min_index_count=1)
    index.add(obj)
    query = sub.step(250).tail_query
    assert query is not None and query.now_ms == 250  # (no lookahead)
    rows, below, next_d, waiting = index.due(query.below, query.through_ms, query.now_ms)
    assert sub.take_unsealed(rows, below, 250, next_d, waiting) == 2
    assert sub.unsealed.next_ms == 300 and sub.stats()["delayed"] == 2
    # When the topic seals ledger 1 and the subscription adopts the bucket
    meta, segs = _meta(1, [(key_of(1, i), 100 * i) for i in range(1, 5)])
    sub.adopt(meta)
    _load_all(reader, {meta.key: segs}, now=0)
    clock.set(1_000)
    sub.collect_due(1_000, 10)
    # Then the two taken from the index and the two from the bucket are staged once each
    keys = sub.keys_to_fetch(10)
    groups, need = sub.staged(keys)
    assert len(need) == 0  # all four staged (the immediate entry waits in the read-ahead)
    got = sorted(np.concatenate([g[2] for g in groups]).tolist())
    assert got == [key_of(1, 1), key_of(1, 2), key_of(1, 3), key_of(1, 4)]
    sub.marks.dispatch_mark = sub.wanted_mark()  # the actor persists it first
    out = sub.deliver("c", groups, 10, 1_000)
    assert sum(map(len, out)) == 5
    # and ledger 1 of the log is needed no more but for the immediate entry
    assert sub.marks.log_cursor.mark_delete == (1, -1)
    sub.ack("c", position_keys(np.array([1]), np.array([0])))
    assert sub.marks.log_cursor.mark_delete == (2, -1)
    assert sub.cursor.mark_delete == (1, 0)


def test_rows_due_before_the_persisted_delayed_mark_come_back_counted():
    from raydelay.dispatch.cursor import Cursor

    cursor = Cursor()
    cursor.delayed_mark = 250
    back, _ = Cursor.decode(cursor.encode((-1, -1)))
    assert back.delayed_mark == 250
    reader = SealedReader()
    sub = _subscription(reader, ManualClock(1_000), cursor=back)
    sub.add_consumer("c")
    index = TopicIndex(min_index_count=1)
    obj = _object(1, 0, [200, 300], publish_ms=0)
    index.add(obj)
    rows, below, next_d, waiting = index.due(*sub.unsealed.taken, 1_000)
    sub.take_unsealed(rows, below, 1_000, next_d, waiting)
    sub.collect_due(1_000, 10)  # (as receive does: answered rows go out once due)
    groups, _ = sub.staged(sub.keys_to_fetch(10))
    out = sub.deliver("c", groups, 10, 1_000)
    counts = dict(
        zip(
            np.concatenate([d.keys for d in out]).tolist(),
            np.concatenate([d.counts for d in out]).tolist(),
        )
    )
    assert counts == {key_of(1, 0): 1, key_of(1, 1): 0}  # only the first may have gone out
    assert sub.needs_delayed_mark(1_000)


def test_cancel_markers_travel_with_the_bucket_that_covers_them():
    index = TopicIndex(min_index_count=3)
    index.add(_object(1, 0, [5_000, 6_000], publish_ms=0))
    assert index.ledger_closed(1) is None
    cancels = Entries.build([b""], np.array([NO_DELAY]), cancels={0: (1, 1)})
    index.add(LedgerObject(2, 0, 0, cancels, {}))
    # a range holding only markers is not passed over: they wait for a bucket
    index.add(_object(2, 1, [7_000], publish_ms=0))
    job = index.ledger_closed(2)
    assert job.markers == ((key_of(2, 0), key_of(1, 1)),)
    meta, segs, _ = seal(job.rows, start_ledger=0, end_ledger=2, bucket_id=1, max_indexes=10,
                      max_step_ms=10**9, markers=job.markers)  # fmt: skip
    # a subscription that never read those ledgers learns the cancel on adoption
    clock = ManualClock(10_000)
    reader = SealedReader()
    sub = _subscription(reader, clock)
    sub.add_consumer("c")
    sub.adopt(meta)
    _load_all(reader, {meta.key: {0: decode_segment(segs)}}, now=10_000)
    sub.collect_due(10_000, 10)
    groups, _ = sub.staged(sub.keys_to_fetch(10))
    keys = sorted(np.concatenate([g[2] for g in groups]).tolist())
    assert keys == [key_of(1, 0), key_of(2, 1)]  # 1:1 was cancelled


def _jobs_with_a_cancel_in_the_second():
    """The seal jobs of ledger 1 (1:0 and 1:1, due at 9 s) and of ledger 2 (the cancel
    marker 2:0 of 1:1, and 2:1 due at 5 s)."""
    index = TopicIndex(min_index_count=1)
    index.add(_object(1, 0, [9_000, 9_000], publish_ms=0))
    job1 = index.ledger_closed(1)
    cancels = Entries.build([b""], np.array([NO_DELAY]), cancels={0: (1, 1)})
    index.add(LedgerObject(2, 0, 0, cancels, {}))
    index.add(_object(2, 1, [5_000], publish_ms=0))
    return job1, index.ledger_closed(2)


def test_a_bucket_holding_a_cancel_is_not_finished_until_its_target_is_acked_in_the_cursor():
    # Given bucket 1 with the cancelled message 1:1 (and 1:0), and bucket 2 with the cancel
    # marker 2:0 of 1:1 and a row of its own, 2:1, due first
    job1, job2 = _jobs_with_a_cancel_in_the_second()
    metas = []
    for job, (lo, hi, bid) in ((job1, (0, 1, 1)), (job2, (2, 2, 2))):
        meta, segs, _ = seal(job.rows, start_ledger=lo, end_ledger=hi, bucket_id=bid,
                             max_indexes=10, max_step_ms=10**9, markers=job.markers)  # fmt: skip
        metas.append((meta, segs))
    reader = SealedReader()
    sub = _subscription(reader, ManualClock(5_000))
    sub.add_consumer("c")
    for meta, _ in metas:
        sub.adopt(meta)  # (the marker is learnt here, ahead of the log read)
    segs = {m.key: {0: decode_segment(s)} for m, s in metas}
    _load_all(reader, segs, now=5_000)
    sub.collect_due(5_000, 10)
    groups, _ = sub.staged(sub.keys_to_fetch(10))
    assert np.concatenate([g[2] for g in groups]).tolist() == [key_of(2, 1)]
    sub.ack("c", [key_of(2, 1)])
    sub.advance_buckets()
    b2 = metas[1][0].key
    # When every row of bucket 2 is acknowledged but 1:1 is cancelled only ahead of the
    # read (not in the cursor a restart loads), bucket 2 is not reported finished: every
    # subscription finishing it would let retention delete the marker with it
    assert reader.progress()[b2] == FINISHED
    assert sub.buckets.progress()[b2] == 0
    # Then once the read passes 1:1 and the cursor holds its ack, it is
    sub.on_read([DelayedRun(1, 0, 2, 9_000)], [(1, 2), (2, 2), (3, None)], (2, 1))
    assert sub.cursor.is_acked(1, 1)
    assert sub.buckets.progress()[b2] == FINISHED


def test_a_restart_acks_the_targets_of_the_markers_its_buckets_carry_as_it_resumes_past_them():
    # Given, as a restarted subscription finds them, bucket 1 holding 1:0 and the cancelled
    # 1:1, and bucket 2 holding the marker 2:0 of 1:1 and the row 2:1
    job1, job2 = _jobs_with_a_cancel_in_the_second()
    reader = SealedReader()
    sub = _subscription(reader, ManualClock(0))
    for job, lo, hi, bid in ((job1, 0, 1, 1), (job2, 2, 2, 2)):
        meta, _, _ = seal(job.rows, start_ledger=lo, end_ledger=hi, bucket_id=bid,
                          max_indexes=10, max_step_ms=10**9, markers=job.markers,
                          ledgers=((lo if lo else 1, 2),))  # fmt: skip
        sub.adopt(meta)
    assert key_of(1, 1) in sub.cancels.ahead  # (learnt on adoption, ahead of the read)
    # When its read resumes after the buckets (it will never pass 1:1)
    reader.sealed_through = 2
    sub.resume_after_buckets([(1, 2), (2, 2), (3, None)])
    # Then the cancelled target is acknowledged in the cursor, not held ahead forever
    assert sub.reading.read_position == (3, 0)
    assert sub.cursor.is_acked(1, 1) and not sub.cursor.is_acked(1, 0)
    assert key_of(1, 1) not in sub.cancels.ahead


def test_a_subscription_made_after_a_bucket_ledger_was_deleted_waits_only_for_the_bucket():
    index = TopicIndex(min_index_count=1)
    index.add(_object(1, 0, [NO_DELAY, 5_000, NO_DELAY], publish_ms=0))
    job = index.ledger_closed(1)
    meta, _, _ = seal(job.rows, start_ledger=1, end_ledger=1, bucket_id=1, max_indexes=10,
                   max_step_ms=10**9, ledgers=((1, 3),))  # fmt: skip
    sub = _subscription(SealedReader(), ManualClock(0))
    sub.adopt(meta)
    # ledger 1 is gone from the log; ledger 2 is open
    sub.resume_after_buckets([(2, None)])
    # its immediate entries are gone for good (acknowledged); the bucket's one is not
    assert sub.cursor.is_acked(1, 0) and sub.cursor.is_acked(1, 2)
    assert not sub.cursor.is_acked(1, 1)
    assert sub.cursor.mark_delete == (1, 0)


def test_a_new_subscription_adopting_buckets_first_still_delivers_an_earlier_unsealed_ledger():
    # Given ledger 1 committed after its entries fell due (so no bucket holds it) and
    # ledger 3 sealed in a bucket: what a bulk load's slow first chunk leaves behind
    index = TopicIndex(min_index_count=1)
    index.add(_object(1, 0, [500, 500, 500], publish_ms=1_000))
    assert index.ledger_closed(1).rows is None
    index.add(_object(3, 0, [5_000, 6_000], publish_ms=1_000))
    job = index.ledger_closed(3)
    meta, _, _ = seal(job.rows, start_ledger=2, end_ledger=3, bucket_id=1, max_indexes=10,
                      max_step_ms=10**9, ledgers=((3, 2),))  # fmt: skip
    # When a subscription made afterwards adopts the bucket before it learns the log's
    # ledgers, then resumes after the bucket and re-reads the loose positions
    sub = _subscription(SealedReader(), ManualClock(10_000))
    sub.add_consumer("c")
    sub.adopt(meta)
    sub.resume_after_buckets([(1, 3), (3, 2), (5, None)])
    # Then ledger 1 is neither acknowledged nor skipped: its entries are re-read and go out
    assert not any(sub.cursor.is_acked(1, e) for e in range(3))
    loose = sub.next_unread(10)
    assert loose == [key_of(1, e) for e in range(3)]
    obj = _object(1, 0, [500, 500, 500], publish_ms=1_000)
    rows = Rows(np.array(loose, dtype=np.int64), np.full(3, 1_000, dtype=np.int64), obj.entries)
    assert sub.on_reread(rows, loose) == 3
    assert all(sub.reading.queued(k) for k in loose)
    asyncio.run(sub.persist(force=True, mark=sub.wanted_mark()))  # (as a receive does)
    assert _delivered(sub, 10_000) == loose


def test_a_cancel_ahead_of_a_skipped_run_of_delayed_entries_is_acknowledged():
    from raydelay.log.entries import DelayedRun

    sub = _subscription(SealedReader(), ManualClock(0))
    # a cancel of 1:1 arrives before the log read reaches it
    assert sub.cancel(1, 1, (2, 0))
    # the read passes it as a run of delayed entries only (the topic's index delivers it)
    sub.on_read([DelayedRun(1, 0, 3, 5_000)], [(1, 3), (2, None)], (1, 2))
    assert sub.cursor.is_acked(1, 1) and not sub.cursor.is_acked(1, 0)
    assert sub.reading.read_position == (2, 0) and sub.unsealed.next_ms == 5_000


def test_the_store_finds_positions_through_the_index_or_a_format_1_meta():
    index = TopicIndex(min_index_count=1)
    index.add(_object(1, 0, [5_000, 2_000, 2_000, 9_000, 400_000]))
    job = index.ledger_closed(1)
    meta, data, index_raw = seal(
        job.rows, start_ledger=1, end_ledger=1, bucket_id=7, max_indexes=2, max_step_ms=300_000
    )
    store = CountingObjectStore(MemoryObjectStore())
    sealed = SealedStore(store, "t", 0)
    sealed.write(meta, data, index_raw)
    assert sorted(k.rsplit("/", 1)[1] for k in store.list("")) == ["data", "index", "meta"]
    buckets = [(1, 1, meta.key)]
    wanted = np.array([key_of(1, 4), key_of(1, 0), key_of(1, 9)])  # 1:9 is in no bucket
    rows = sealed.read_positions(wanted, buckets)
    assert rows.positions.tolist() == [key_of(1, 0), key_of(1, 4)]
    assert rows.entries.payloads == [b"p1-0", b"p1-4"]
    # keys of no bucket do not even read the index
    fresh = SealedStore(store, "t", 0)
    before = store.bytes_read
    assert len(fresh.read_positions(np.array([key_of(1, 9)]), buckets)) == 0
    assert store.bytes_read - before == len(encode_meta(meta))  # the meta only
    # a bucket written before the index object: its meta carries the segment keys
    v1 = msgpack.unpackb(encode_meta(meta))
    v1["v"] = 1
    v1["segments"] = [
        seg + [k.serialize()] for seg, k in zip(v1["segments"], decode_index(index_raw))
    ]
    del v1["keys"]
    store.put(f"{registry_name('t', 0)}/{meta.key}/meta", msgpack.packb(v1))
    store.delete(f"{registry_name('t', 0)}/{meta.key}/index")
    old = SealedStore(store, "t", 0)
    rows = old.read_positions(wanted, buckets)
    assert rows.entries.payloads == [b"p1-0", b"p1-4"]
    assert old.delete(meta.key) == 3 and store.list("") == []


def test_key_rows_of_a_bucket_are_read_once_then_kept():
    index = TopicIndex(min_index_count=1)
    index.add(_object(1, 0, [5_000, 2_000, 2_000, 9_000, 400_000]))
    job = index.ledger_closed(1)
    meta, data, index_raw = seal(
        job.rows, start_ledger=1, end_ledger=1, bucket_id=7, max_indexes=2, max_step_ms=300_000
    )
    store = CountingObjectStore(MemoryObjectStore())
    sealed = SealedStore(store, "t", 0)
    sealed.write(meta, data, index_raw)
    buckets = [(1, 1, meta.key)]
    wanted = np.array([key_of(1, 4), key_of(1, 9), key_of(1, 1), key_of(1, 2)])
    rows = sealed.key_rows(wanted, buckets)
    got = sorted(zip(rows.positions.tolist(), rows.keys, rows.deliver_at_ms.tolist()))
    assert got == [(key_of(1, 1), "k1", 2_000), (key_of(1, 2), "k2", 2_000),
                   (key_of(1, 4), "k4", 400_000)]  # fmt: skip
    # the segments' keys are kept: asking again reads nothing more
    before = store.bytes_read
    again = sealed.key_rows(wanted, buckets)
    assert sorted(again.keys) == ["k1", "k2", "k4"] and store.bytes_read == before


def test_the_reader_holds_a_bounded_number_of_rows_however_many_buckets_are_overdue():
    # Given 30 buckets, each with 6 rows overdue (segments of 2), and a total cap of 10 rows
    metas = {}
    for ledger in range(1, 31):
        meta, segs = _meta(ledger, [(key_of(ledger, e), 100 + ledger * 10 + e) for e in range(6)])
        metas[meta.key] = (meta, segs)
    reader = SealedReader(lookahead_ms=1_000, max_loaded_rows=4, max_loaded_total=10)
    for meta, _ in metas.values():
        reader.adopt(meta)
    # When the loader asks what to load, again and again, and nothing is taken
    segs = {key: m[1] for key, m in metas.items()}
    for _ in range(10):
        for ld in reader.wanted(10_000, max_loads=100):
            _do(reader, ld, segs)
    # Then at most the cap is loaded, and it is the earliest segments
    assert reader.loaded_rows() == 10
    first = reader.take_due(10_000, 100)
    assert sorted(int(k) for g in first for k in g[2])[:2] == [key_of(1, 0), key_of(1, 1)]
    # and taking them frees room for the next ones, until every row went out, earliest first
    taken = [int(k) for g in first for k in g[2]]
    while True:
        for ld in reader.wanted(10_000, max_loads=100):
            _do(reader, ld, segs)
        assert reader.loaded_rows() <= 10
        more = reader.take_due(10_000, 100)
        if not more:
            break
        taken += [int(k) for g in more for k in g[2]]
    assert sorted(taken) == sorted(key_of(lg, e) for lg in range(1, 31) for e in range(6))


def _lookahead_subscription(clock: ManualClock, lookahead_ms: int = 300) -> Subscription:
    return _subscription(SealedReader(), clock, lookahead_ms=lookahead_ms)


def _answer(sub: Subscription, index: TopicIndex, now: int) -> int:
    """Step at ``now``; when the step asks the unsealed index, answer it from ``index``
    as the topic actor would. Returns the rows taken (-1: no query was asked)."""
    query = sub.step(now).tail_query
    if query is None:
        return -1
    rows, below, next_d, waiting = index.due(query.below, query.through_ms, query.now_ms)
    return sub.take_unsealed(rows, below, query.now_ms, next_d, waiting)


def _delivered(sub: Subscription, now: int) -> list[int]:
    sub.collect_due(now, 100)
    groups, need = sub.staged(sub.keys_to_fetch(100))
    assert len(need) == 0
    return sorted(int(k) for dv in sub.deliver("c", groups, 100, now) for k in dv.keys)


def test_rows_answered_ahead_wait_for_their_due_instant_and_a_cancel_still_holds():
    # Given a subscription with a 300 ms lookahead, reading three delayed entries
    clock = ManualClock(0)
    sub = _lookahead_subscription(clock)
    sub.add_consumer("c")
    obj = _object(1, 0, [1_000, 1_100, 1_140], publish_ms=0)
    sub.on_read([obj], [(1, None)], (1, 2))
    index = TopicIndex(min_index_count=10)
    index.add(obj)
    # When it first steps, it asks at once (rows were read): none is due within 300 ms
    assert _answer(sub, index, 600) == 0 and sub.unsealed.next_ms == 1_000
    # then not again until half a lookahead before the first is due ...
    assert sub.step(849).tail_query is None
    # ... when it asks for everything due by 1,150
    assert _answer(sub, index, 850) == 3
    assert sub.stats()["delayed"] == 3
    # Then the rows wait here: nothing is deliverable a millisecond before the first is due
    assert not sub.has_deliverable(999) and _delivered(sub, 999) == []
    assert sub.next_wakeup_ms() == 1_000
    assert _delivered(sub, 1_000) == [key_of(1, 0)]
    # and a cancel that comes while a row waits here keeps it from going out
    assert sub.cancel(1, 2, (1, 5)) is True
    assert _delivered(sub, 1_139) == [key_of(1, 1)]
    assert _delivered(sub, 5_000) == []
    assert sub.stats()["delayed"] == 0


def test_a_row_read_while_a_due_query_is_out_does_not_wait_for_the_next_poll():
    # Given a due query asked at 850 (for rows due by 1,150) ...
    clock = ManualClock(0)
    sub = _lookahead_subscription(clock)
    sub.add_consumer("c")
    first = _object(1, 0, [1_000], publish_ms=0)
    sub.on_read([first], [(1, None)], (1, 0))
    index = TopicIndex(min_index_count=10)
    index.add(first)
    query = sub.step(850).tail_query
    rows, below, next_d, waiting = index.due(query.below, query.through_ms, query.now_ms)
    # ... when an entry due at 1,100 is committed and read before the answer comes back
    late = _object(1, 1, [1_100], publish_ms=0)
    sub.on_read([late], [(1, None)], (1, 1))
    index.add(late)
    sub.take_unsealed(rows, below, query.now_ms, next_d, waiting)
    # Then the answer (which did not hold it) does not hide it: it is asked for half a
    # lookahead before it is due (not at the next poll, a second after the last query)
    assert sub.unsealed.next_ms == 1_100
    assert sub.step(949).tail_query is None
    assert _answer(sub, index, 950) == 1
    assert _delivered(sub, 1_100) == [key_of(1, 0), key_of(1, 1)]


def test_a_bucket_sealed_under_a_reading_subscription_skips_what_it_took_and_goes_on_at_once():
    # Given a subscription that took the rows due by 2,000 from the topic's unsealed index
    clock = ManualClock(0)
    reader = SealedReader(lookahead_ms=1_000)
    sub = _subscription(reader, clock)
    sub.add_consumer("c")
    rows = [(key_of(1, i), 1_000 + 100 * i) for i in range(16)]  # due 1,000 .. 2,500
    obj = _object(1, 0, [d for _, d in rows], publish_ms=0)
    index = TopicIndex(min_index_count=1)
    index.add(obj)
    sub.on_read([obj], [(1, 16), (2, None)], (1, 15))
    taken_rows, below, next_d, waiting = index.due(*sub.unsealed.taken, 2_000)
    assert sub.take_unsealed(taken_rows, below, 2_000, next_d, waiting) == 11
    # When the topic seals ledger 1 in segments of 2 rows and the subscription adopts it
    meta, segs = _meta(1, rows)
    sub.adopt(meta)
    loads = _load_all(reader, {meta.key: segs}, now=2_000)
    # Then the 5 segments every row of which it took are skipped in one load, not read
    assert [(ld.no, ld.groups, len(ld.keys_only), ld.reads) for ld in loads[:1]] == [(0, 5, 5, ())]
    assert reader.counters["segments_skipped"] == 5
    # and the rows it did not take are the next ones due: none taken stands in front
    assert reader.next_time() == 2_100
    assert not reader.has_due(2_099)
    sub.collect_due(2_000, 100)  # the taken rows, due by now, go out from the index
    out = _delivered(sub, 2_500)
    assert out == sorted(k for k, _ in rows)  # each row once
    sub.ack("c", np.asarray(out, dtype=np.int64))
    assert sub.advance_buckets() == [meta.key]  # done, the skipped segments too


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dues=st.lists(st.integers(1, 2_000), min_size=1, max_size=40),  # (committed before due)
    lookahead_ms=st.sampled_from([0, 50, 250, 1_000]),
    steps=st.lists(st.integers(1, 120), min_size=5, max_size=60),
    answer_lag=st.integers(0, 3),
)
def test_with_any_lookahead_no_row_goes_out_early_and_each_goes_out_once(
    dues, lookahead_ms, steps, answer_lag
):
    # Given delayed entries committed over time (each 1..500 ms before it is due) and due
    # queries answered some steps after they were asked, as a slow topic would
    clock = ManualClock(0)
    sub = _lookahead_subscription(clock, lookahead_ms)
    sub.add_consumer("c")
    index = TopicIndex(min_index_count=10**6)
    commits = sorted((max(0, d - 1 - (d * 7919) % 500), i, d) for i, d in enumerate(dues))
    out: dict[int, int] = {}  # position key -> when it went out
    pending: list = []  # (step number due, query)
    now, n = 0, 0
    tail = [5_000 + i for i in range(4 * (answer_lag + 2))]  # (long after: all can go)
    times = [sum(steps[: i + 1]) for i in range(len(steps))] + tail
    for k, now in enumerate(times):
        while commits and commits[0][0] <= now:
            at, i, d = commits.pop(0)
            obj = _object(1, n, [d], publish_ms=at)
            index.add(obj)
            sub.on_read([obj], [(1, None)], (1, n))
            n += 1
        step = sub.step(now)
        if step.tail_query is not None:
            pending.append((k + answer_lag, step.tail_query))
        for due_k, q in [p for p in pending if p[0] <= k]:
            pending.remove((due_k, q))
            rows, below, next_d, waiting = index.due(q.below, q.through_ms, q.now_ms)
            sub.take_unsealed(rows, below, q.now_ms, next_d, waiting)
        # When a consumer receives at this instant
        for key in _delivered(sub, now):
            # Then nothing goes out before it is due, and nothing twice
            assert key not in out
            out[key] = now
            sub.ack("c", np.asarray([key], dtype=np.int64))
    due_of = {key_of(1, e): d for e, (_, _, d) in enumerate(sorted(
        (max(0, d - 1 - (d * 7919) % 500), i, d) for i, d in enumerate(dues)))}  # fmt: skip
    assert all(out[k] >= due_of[k] for k in out)
    # and every entry went out in the end
    assert sorted(out) == sorted(due_of)


def test_the_delayed_mark_moves_ahead_in_the_background_only_when_rows_come_due():
    # Given a subscription with nothing delayed
    clock = ManualClock(0)
    sub = _lookahead_subscription(clock)
    sub.add_consumer("c")
    sub.step(0)
    sub.step(100_000)
    assert sub.cursor.delayed_mark == -1  # idle: the mark stays where it is
    # When rows come due within half a step of the mark, the step moves it ahead itself
    obj = _object(1, 0, [101_000], publish_ms=0)
    sub.on_read([obj], [(1, None)], (1, 0))
    step = sub.step(100_000)
    assert step.persist and sub.cursor.delayed_mark == 101_000 + 5_000
    # and a receive finds it durable once the write was made: no write on its path
    assert sub.needs_delayed_mark(101_000)  # (written by the driver, not yet here)
    asyncio.run(sub.persist())
    assert not sub.needs_delayed_mark(101_000)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3), st.integers(0, 4)), max_size=12),
        min_size=1,
        max_size=5,
    ),
    st.integers(1, 40),
)
def test_smallest_counts_takes_exactly_the_n_smallest_rows_of_all_parts(raw, n):
    from raydelay.delayed.index import smallest_counts

    # parts sorted by (deliver_at, ledger, entry), copies of one position allowed
    parts = []
    for rows in raw:
        rows = sorted(rows)
        parts.append(tuple(np.array([r[i] for r in rows], dtype=np.int64) for i in range(3)))
    total = sum(len(p[0]) for p in parts)
    n = min(n, total)
    if n == 0:
        return
    counts = smallest_counts(parts, n)
    assert sum(counts) == n and all(0 <= c <= len(p[0]) for c, p in zip(counts, parts))
    taken = sorted(tuple(int(a[i]) for a in p) for p, c in zip(parts, counts) for i in range(c))
    everything = sorted(tuple(int(a[i]) for a in p) for p in parts for i in range(len(p[0])))
    assert taken == everything[:n]


def test_an_overdue_backlog_goes_out_a_window_of_whole_groups_at_a_time(monkeypatch):
    import raydelay.dispatch.due as due_module

    monkeypatch.setattr(due_module, "SEALED_WINDOW", 25)
    # Given three buckets of one segment each, whose rows interleave in time, all overdue
    rng = np.random.default_rng(7)
    metas, segs = [], {}
    for ledger in (1, 2, 3):
        dues = rng.integers(100, 1_000, 20).tolist()
        meta, s = _meta(
            ledger, [(key_of(ledger, e), d) for e, d in enumerate(dues)], max_indexes=20
        )
        metas.append(meta)
        segs[meta.key] = s
    due_of = {
        int(k): int(d)
        for s in segs.values()
        for rows in s.values()
        for k, d in zip(rows.positions, rows.entries.deliver_at_ms)
    }
    clock = ManualClock(5_000)
    reader = SealedReader(lookahead_ms=1_000)
    sub = _subscription(reader, clock)
    sub.add_consumer("c")
    for meta in metas:
        sub.adopt(meta)
    _load_all(reader, segs, now=5_000, max_loads=100)
    # When a consumer receives 10 at a time
    windows = []
    while True:
        sub.collect_due(5_000, 10)
        groups, need = sub.staged(sub.keys_to_fetch(10))
        assert len(need) == 0  # every payload came with its row
        got = [int(k) for dv in sub.deliver("c", groups, 10, 5_000) for k in dv.keys]
        if not got:
            break
        sub.ack("c", np.array(got, dtype=np.int64))
        windows.append(got)
        _load_all(reader, segs, now=5_000, max_loads=100)
    # Then every row goes out once, each receive gets 10, and the rows go out a window
    # at a time, each window whole loaded groups (one per bucket here), the group whose
    # earliest row is due first first: the first two receives hand out 20 of the first
    # window (the group due first and the 5 earliest of the next); the third the 5 left
    # of it and the top-up (the next 5 rows of whichever group is now due first)
    out = [k for w in windows for k in w]
    assert sorted(out) == sorted(due_of) and len(out) == len(set(out)) == 60
    assert [len(w) for w in windows] == [10] * 6
    a, b, c = sorted(
        (sorted(s[0].positions.tolist(), key=lambda k: (due_of[k], k)) for s in segs.values()),
        key=lambda g: (due_of[g[0]], g[0]),
    )
    first = a + b[:5]
    assert set(out[:20]) < set(first)
    after = b[5:] if (due_of[b[5]], b[5]) < (due_of[c[0]], c[0]) else c
    assert sorted(out[:30]) == sorted(first + after[:5])
    # which is not the earliest 25 overall: the rows of the groups interleave in time
    by_due = sorted(due_of, key=lambda k: (due_of[k], k))
    assert set(first) != set(by_due[:25])


def test_rows_of_a_bucket_sealed_beyond_what_the_subscription_read_can_be_acked():
    # Given a subscription that read the log only up to 1:1 (it lags behind the topic)
    clock = ManualClock(0)
    reader = SealedReader()
    sub = _subscription(reader, clock)
    sub.add_consumer("c")
    sub.on_read([_object(1, 0, [NO_DELAY, NO_DELAY], publish_ms=0)], [(1, None)], (1, 1))
    # When the topic sealed ledgers 1 and 2 meanwhile, and their rows fall due
    meta, segs = _meta(1, [(key_of(1, 5), 100), (key_of(2, 3), 200)])
    sub.adopt(meta)
    _load_all(reader, {meta.key: segs}, now=0)
    clock.set(1_000)
    sub.collect_due(1_000, 10)
    groups, need = sub.staged(sub.keys_to_fetch(10))
    sub.marks.dispatch_mark = sub.wanted_mark() or sub.marks.dispatch_mark
    out = [int(k) for dv in sub.deliver("c", groups, 10, 1_000) for k in dv.keys]
    assert key_of(2, 3) in out
    # Then the consumer's ack of them is taken (they exist), and a position past
    # everything known is still refused
    assert sub.ack("c", np.array([key_of(1, 5), key_of(2, 3)], dtype=np.int64)) == 2
    with pytest.raises(InvalidArgument, match="past the end"):
        sub.ack("c", np.array([key_of(3, 0)], dtype=np.int64))


def test_a_key_shared_subscription_learns_each_staged_rows_own_hash_slot():
    from raydelay.dispatch.keyshared import slots_of
    from raydelay.log.entries import Rows, is_run

    # a shuffle of a run is not a run (its slice would pair keys with other rows' slots)
    assert is_run(np.array([3, 4, 5])) and is_run(np.array([7]))
    assert not is_run(np.array([0, 2, 1, 3])) and not is_run(np.array([], dtype=np.int64))
    clock = ManualClock(0)
    tracker = InMemoryDelayedDeliveryTracker(clock=clock, tick_time_ms=1, strict=True)
    sub = Subscription(
        name="t/0/s", subscription_type="key_shared", tracker=tracker, clock=clock,
        sealed=SealedReader(),
    )  # fmt: skip
    # Given four due rows whose position order is not their deliver_at order
    names = ["alpha", "bravo", "charlie", "delta"]
    entries = Entries.build([b"p"] * 4, np.array([10, 30, 20, 40]), keys=names)
    positions = np.array([key_of(1, 0), key_of(1, 2), key_of(1, 1), key_of(1, 3)])
    rows = Rows(positions, np.zeros(4, dtype=np.int64), entries)
    # When they are staged (the subscription sorts them by position)
    assert sub.due.stage(rows, np.arange(4), positions) == 4
    # Then each position's slot is the slot of its own key
    expected = slots_of(pa.array(names, type=pa.string()), {})
    for i, k in enumerate(positions.tolist()):
        assert sub.key_pool.slot[k] == int(expected[i])


def _shipped(batch: pa.RecordBatch) -> int:
    """Bytes a batch takes when pickled as Ray pickles it (protocol 5, buffers out of band)."""
    import pickle

    buffers: list = []
    wire = pickle.dumps(batch, protocol=5, buffer_callback=buffers.append)
    return len(wire) + sum(len(b.raw()) for b in buffers)


def test_rows_compacted_hold_only_their_own_buffers():
    from raydelay.log.entries import Rows, compact

    n = 20_000
    entries = Entries.build([b"y" * 100] * n, np.full(n, NO_DELAY, dtype=np.int64))
    rows = Rows(np.arange(n, dtype=np.int64), np.zeros(n, dtype=np.int64), entries)
    whole = rows.to_batch()
    # a batch that owns its buffers is not copied
    assert compact(whole) is whole
    # a slice of it is: its pickle holds its 50 rows, not the 20,000 beside them
    part = compact(rows.slice(1_000, 1_050).to_batch())
    assert _shipped(part) < 50 * 200 < _shipped(whole.slice(1_000, 50)) // 100
    assert part.equals(whole.slice(1_000, 50))
    assert part.column("position").to_pylist() == list(range(1_000, 1_050))
    # and an empty one stays as it is
    empty = whole.slice(0, 0)
    assert compact(empty) is empty


# --- the delayed count and the due queries of a stream of stand-ins ---------------------------

HOUR_MS = 3_600_000


def _stand_in(*objects: LedgerObject) -> DelayedRun:
    """What a log read brings for consecutive objects of delayed entries only."""
    first = objects[0]
    return DelayedRun(
        first.ledger_id,
        first.first_entry,
        sum(o.count for o in objects),
        min(int(o.entries.deliver_at_ms.min()) for o in objects),
    )


def _delayed(sub: Subscription) -> int:
    return int(sub.stats()["delayed"])


def test_rows_read_as_stand_ins_count_as_delayed_at_once_and_an_answer_never_twice():
    # Given a subscription that read 100 delayed rows (one stand-in), no answer yet
    clock = ManualClock(0)
    sub = _subscription(SealedReader(), clock, lookahead_ms=1_000)
    index = TopicIndex(min_index_count=10**9)
    a = _object(1, 0, [HOUR_MS] * 100, publish_ms=0)
    b = _object(1, 100, [HOUR_MS] * 50, publish_ms=0)
    c = _object(1, 150, [HOUR_MS + 5] * 30, publish_ms=0)
    index.add(a)
    sub.on_read([_stand_in(a)], [(1, None)], (1, 99))
    # Then they count before any due query is answered
    assert _delayed(sub) == 100
    query = sub.step(0).tail_query
    assert query is not None
    # When the answer is made after b is committed, and c is committed and read (one
    # stand-in for b and c) before the answer arrives
    index.add(b)
    answer = index.due(query.below, query.through_ms, query.now_ms)
    index.add(c)
    sub.on_read([_stand_in(b, c)], [(1, None)], (1, 179))
    assert _delayed(sub) == 180
    rows, below, next_d, waiting = answer
    assert (below, waiting) == (key_of(1, 150), 150)
    sub.take_unsealed(rows, below, query.now_ms, next_d, waiting)
    # Then the answer's 150 and the 30 read past it count, none twice
    assert _delayed(sub) == 180
    # And the next answer (all due beyond the lookahead: the idle poll) counts all 180
    assert sub.step(TAIL_POLL_MS).tail_query is None
    query = sub.step(TAIL_IDLE_POLL_MS).tail_query
    assert query is not None
    rows, below, next_d, waiting = index.due(query.below, query.through_ms, query.now_ms)
    sub.take_unsealed(rows, below, query.now_ms, next_d, waiting)
    assert waiting == 180 and _delayed(sub) == 180


def test_rows_read_as_stand_ins_then_sealed_count_once_when_the_bucket_is_adopted():
    # Given a subscription that read 100 delayed rows of ledger 1 (one stand-in)
    clock = ManualClock(0)
    sub = _subscription(SealedReader(), clock, lookahead_ms=1_000)
    index = TopicIndex(min_index_count=1)
    a = _object(1, 0, [HOUR_MS] * 100, publish_ms=0)
    index.add(a)
    sub.on_read([_stand_in(a)], [(1, None)], (1, 99))
    query = sub.step(0).tail_query
    assert query is not None
    # When the ledger is sealed into a bucket and published before the query is answered
    job = index.ledger_closed(1)
    assert job is not None
    index.published(1)
    meta, _ = _meta(1, [(key_of(1, i), HOUR_MS) for i in range(100)])
    rows, below, next_d, waiting = index.due(query.below, query.through_ms, query.now_ms)
    assert waiting == 0 and below == query.below  # (the index holds nothing any more)
    # and the subscription adopts the bucket, then takes the answer (as the actor does)
    sub.adopt(meta)
    sub.take_unsealed(rows, below, query.now_ms, next_d, waiting)
    # Then the 100 count once: in the bucket, not also as read
    assert _delayed(sub) == 100


def test_a_stream_of_rows_due_later_is_asked_for_seldom_but_a_new_bucket_or_a_due_row_at_once():
    # Given a subscription whose last due query was answered at 0
    clock = ManualClock(0)
    sub = _subscription(SealedReader(), clock, lookahead_ms=1_000)
    index = TopicIndex(min_index_count=10**9)

    def answer(now: int) -> bool:
        query = sub.step(now).tail_query
        if query is None:
            return False
        rows, below, next_d, waiting = index.due(query.below, query.through_ms, query.now_ms)
        sub.take_unsealed(rows, below, query.now_ms, next_d, waiting)
        return True

    first = _object(1, 0, [HOUR_MS] * 10, publish_ms=0)
    index.add(first)
    sub.on_read([_stand_in(first)], [(1, None)], (1, 9))
    assert answer(0)
    # When more rows due in an hour are read
    more = _object(1, 10, [HOUR_MS] * 10, publish_ms=0)
    index.add(more)
    sub.offer_read([_stand_in(more)], [(1, None)], (1, 19))
    # Then they count at once, and no query goes until the idle poll
    assert not answer(100) and _delayed(sub) == 20
    assert not answer(TAIL_POLL_MS) and not answer(TAIL_IDLE_POLL_MS - 1)
    assert answer(TAIL_IDLE_POLL_MS) and _delayed(sub) == 20
    # When a read says the topic sealed a bucket since, a query goes at the next poll
    t = TAIL_IDLE_POLL_MS
    sub.offer_read([], [(1, None)], (1, 19), buckets_changed=True)
    assert not answer(t + TAIL_POLL_MS - 1) and answer(t + TAIL_POLL_MS)
    # When a row due within the lookahead is read, the query goes at its refill time
    t += TAIL_POLL_MS
    soon = _object(1, 20, [t + 3_000], publish_ms=0)
    index.add(soon)
    sub.offer_read([_stand_in(soon)], [(1, None)], (1, 20))
    assert not answer(t + 2_499) and answer(t + 2_500)


def test_a_runs_rows_from_each_segment_on_are_its_suffix_sums():
    from raydelay.delayed.sealed import RunInfo

    run = RunInfo("1-1-1", tuple(SegmentInfo(0, 0, n, 0, 0) for n in (5, 0, 7, 2)))
    assert run.rows_from == (14, 9, 9, 2, 0)
    assert RunInfo("1-1-1", ()).rows_from == (0,)


def _answered_ahead(dues: list[int], *consumers: str) -> tuple[Subscription, TopicIndex]:
    """A subscription (lookahead 300 ms) with ``consumers``, holding the rows of one object
    due at ``dues`` that its due queries at 600 and 850 brought (due by 1,150)."""
    sub = _lookahead_subscription(ManualClock(0))
    for c in consumers:
        sub.add_consumer(c)
    obj = _object(1, 0, dues, publish_ms=0)
    sub.on_read([obj], [(1, None)], (1, len(dues) - 1))
    index = TopicIndex(min_index_count=10)
    index.add(obj)
    _answer(sub, index, 600)
    _answer(sub, index, 850)
    return sub, index


def _received(sub: Subscription, consumer: str, now: int, ahead_ms: int = 0) -> list[int]:
    async def fetch(*_args):  # (every row here comes staged, with its payload)
        raise AssertionError("nothing is read from the log")

    out = asyncio.run(sub.receive(consumer, fetch, 100, now, ahead_ms))
    return sorted(int(k) for dv in out for k in dv.keys)


def test_a_receive_that_asks_ahead_gets_the_rows_due_within_it_and_no_other_receive_does():
    # Given rows due at 1,000, 1,030 and 1,200 answered ahead (lookahead 300 ms), and two
    # consumers: one that asks 50 ms ahead, one that asks for nothing early (an earlier
    # client)
    sub, index = _answered_ahead([1_000, 1_030, 1_200], "c", "old")
    assert sub.stats()["delayed"] == 3 and len(sub.unsealed.held_rows()[0]) == 2  # (by 1,150)
    # Before anyone asked ahead, the driver wakes at the first row's instant
    assert sub.step(900).wake_at_ms == 1_000 and not sub.has_deliverable(900)
    assert _received(sub, "old", 949) == []
    # When "c" asks 50 ms ahead at 960, it gets the row due at 1,000, not the one at 1,030
    assert _received(sub, "c", 960, ahead_ms=50) == [key_of(1, 0)]
    # Then the driver wakes 50 ms before the next row, and finds it deliverable then
    assert sub.step(961).wake_at_ms == 980
    assert sub.has_deliverable(980) and not sub.has_deliverable(979)
    # and a row let in by a receive that asks ahead ...
    sub.collect_due(985, 100, 985 + 50)
    # ... does not go to a receive that asks for nothing early before it is due
    assert _received(sub, "old", 1_029) == []
    assert _received(sub, "old", 1_030) == [key_of(1, 1)]
    # and nothing goes to anyone more than its ahead before its time
    _answer(sub, index, 1_060)
    assert _received(sub, "c", 1_149, ahead_ms=50) == []
    assert _received(sub, "c", 1_150, ahead_ms=50) == [key_of(1, 2)]


def test_the_driver_wakes_ahead_only_while_a_consumer_that_asks_ahead_is_there():
    sub, _ = _answered_ahead([1_000], "c")
    assert _received(sub, "c", 900, ahead_ms=40) == []
    assert sub.step(901).wake_at_ms == 960
    # When the consumer that asked ahead is gone, the driver wakes at the row's instant
    sub.remove_consumer("c")
    assert sub.ahead_ms == 0 and sub.step(902).wake_at_ms == 1_000


def test_rows_handed_back_before_they_are_due_wait_for_a_receive_that_may_take_them():
    # Given a consumer that asked ahead and got a row 40 ms before it is due
    sub, _ = _answered_ahead([1_000], "c", "old")
    assert _received(sub, "c", 960, ahead_ms=50) == [key_of(1, 0)]
    # When it is gone before the row is due (its row handed back)
    assert sub.remove_consumer("c") == 1
    # Then a receive that asks for nothing early does not get the row before its time
    assert _received(sub, "old", 970) == []
    # and the driver wakes at that time (nothing else would wake a standing receive then)
    assert sub.wake_needed and sub.step(971).wake_at_ms == 1_000
    assert _received(sub, "old", 1_000) == [key_of(1, 0)]
