"""Peek (pure): what a subscription shows as scheduled is what it then delivers, in that
order, whichever place each row waits in: a sealed segment not loaded, a loaded one, the
rows taken ahead from the topic's unsealed index, the unsealed index itself, or the
subscription's own delayed nacks. Held, acknowledged and cancelled rows are left out."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from raydelay.clock import ManualClock
from raydelay.delayed import InMemoryDelayedDeliveryTracker
from raydelay.delayed.reader import SealedReader
from raydelay.delayed.sealed import TopicIndex
from raydelay.dispatch.peek import PeekRange, SegmentRef, first_rows, page_of
from raydelay.dispatch.subscription import Subscription
from raydelay.errors import InvalidArgument
from raydelay.log.entries import NO_DELAY, Entries, Rows
from raydelay.positions import key_of
from tests.unit.test_sealed import _do, _load_all, _meta, _object
from tests.unit.test_sealed import _subscription as _sealed_subscription


class World:
    """One partition as the actors would serve it: ledger 1 sealed into a bucket
    (segments of 2 rows), ledger 2 in the topic's unsealed index; reads counted."""

    def __init__(self, bucket_rows: list[tuple[int, int]], tail_due: list[int]) -> None:
        self.meta, self.segs = _meta(1, bucket_rows)
        self.tail = _object(2, 0, tail_due, publish_ms=0)
        self.index = TopicIndex(min_index_count=10**9, sealed_through=1)
        self.index.add(self.tail)
        by_pos = {}
        for seg in self.segs.values():
            for i, k in enumerate(seg.positions.tolist()):
                by_pos[k] = seg.take(np.array([i]))
        for i in range(len(tail_due)):
            k = key_of(2, i)
            e = self.tail.entries.take(np.array([i]))
            by_pos[k] = Rows(np.array([k]), np.array([0]), e)
        self.by_pos = by_pos
        self.segment_reads = 0

    async def fetch(self, keys: np.ndarray) -> Rows:
        return Rows.concat([self.by_pos[int(k)] for k in keys if int(k) in self.by_pos])

    async def read_segments(self, refs: list[SegmentRef]) -> list[Rows]:
        self.segment_reads += len(refs)
        offsets = {s.offset: i for i, s in enumerate(self.meta.segments)}
        return [self.segs[offsets[r.offset]] for r in refs]

    async def read_unsealed(self, below, through, q, start, page) -> Rows:
        return page_of(self.index.untaken(below, through), q, start, page)

    def peek(self, sub: Subscription, **kw) -> list[tuple[int, int]]:
        rows, _ = asyncio.run(
            sub.peek(PeekRange(**kw), self.fetch, self.read_segments, self.read_unsealed)
        )
        return list(zip(rows.entries.deliver_at_ms.tolist(), rows.positions.tolist()))

    def answer(self, sub: Subscription, now: int) -> None:
        """One step at ``now``, with its I/O done as the actor would."""
        step = sub.step(now)
        for ld in step.loads:
            _do(sub.sealed, ld, {self.meta.key: self.segs})
        query = step.tail_query
        if query is not None:
            rows, below, next_d, waiting = self.index.due(
                query.below, query.through_ms, query.now_ms
            )
            sub.take_unsealed(rows, below, query.now_ms, next_d, waiting)


def _subscription(clock: ManualClock) -> Subscription:
    reader = SealedReader(lookahead_ms=300, max_loaded_rows=2)
    return _sealed_subscription(reader, clock, lookahead_ms=300)


def _receive(world: World, sub: Subscription, clock: ManualClock, consumer: str, now: int):
    clock.set(now)
    world.answer(sub, now)
    _load_all(sub.sealed, {world.meta.key: world.segs}, now)
    out = asyncio.run(sub.receive(consumer, world.fetch, 1_000, now))
    got = []
    for dv in out:
        d = dv.source.entries.deliver_at_ms[dv.indexes]
        got += zip(d.tolist(), dv.keys.tolist())
    return sorted(got)  # (one receive: all due at once, in no promised order among them)


def test_peek_is_what_is_then_delivered_in_that_order_from_every_place_a_row_waits():
    # Given a bucket of 12 rows due 1,000 .. 3,200 (ledger 1) and an unsealed tail of 8
    # due 1,050 .. 3,850 (ledger 2), read by a subscription with a 300 ms lookahead
    clock = ManualClock(0)
    bucket = [(key_of(1, i), 1_000 + 200 * i) for i in range(12)]
    world = World(bucket, [1_050 + 400 * i for i in range(8)])
    sub = _subscription(clock)
    sub.add_consumer("c")
    sub.on_read(
        [_object(1, 0, [d for _, d in bucket], 0), world.tail], [(1, 12), (2, None)], (2, 7)
    )
    sub.adopt(world.meta)
    # When by 1,300 it received what was due, acked some and nacked one for 2 s, and one
    # row of the future was cancelled (some rows are now loaded, some taken ahead)
    got = _receive(world, sub, clock, "c", 1_300)
    assert [k for _, k in got] == [key_of(1, 0), key_of(2, 0), key_of(1, 1)]
    sub.ack("c", np.array([key_of(1, 0)]))
    sub.nack("c", np.array([key_of(2, 0)]), 2_000, 1_300)
    assert sub.cancel(1, 5, (3, 0)) is True
    held = key_of(1, 1)  # consumer c holds it, unacknowledged
    # Then a peek shows the rest, by (deliver_at, position), the nack at its new time
    seen = world.peek(sub, limit=-1)
    assert (3_300, key_of(2, 0)) in seen
    assert not {k for _, k in seen} & {key_of(1, 0), held, key_of(1, 5)}
    assert seen == sorted(seen) and len(seen) == 17  # 20, less acked, held, cancelled
    # and a limit, a window and a key select from that same list
    assert world.peek(sub, limit=4) == seen[:4]
    assert world.peek(sub, limit=-1, due_after=2_000, due_before=3_000) == [
        x for x in seen if 2_000 <= x[0] < 3_000
    ]
    assert world.peek(sub, limit=-1, key="k3") == [
        x for x in seen if x[1] in (key_of(1, 3), key_of(2, 3))
    ]
    # When time runs on and another consumer receives everything
    sub.add_consumer("d")
    later = []
    for now in range(1_350, 5_000, 50):
        later += _receive(world, sub, clock, "d", now)
        sub.ack("d", np.array([k for _, k in later], dtype=np.int64))
    # Then it got what the peek showed, in the same order, and nothing is scheduled now
    assert [k for _, k in later] == [k for _, k in seen]
    assert world.peek(sub, limit=-1) == []


def test_a_short_peek_reads_only_the_segments_that_can_hold_its_answer():
    # Given a bucket of 40 rows in 20 segments, none loaded yet
    clock = ManualClock(0)
    world = World([(key_of(1, i), 10_000 + 100 * i) for i in range(40)], [NO_DELAY])
    sub = _subscription(clock)
    sub.adopt(world.meta)
    # When the first 3 are peeked
    assert world.peek(sub, limit=3) == [(10_000 + 100 * i, key_of(1, i)) for i in range(3)]
    # Then 2 segments held them, and only the first batch of reads was made (not 20)
    assert world.segment_reads <= 8
    world.segment_reads = 0
    assert len(world.peek(sub, limit=-1)) == 40 and world.segment_reads == 20


def test_first_rows_sorts_keeps_each_position_once_the_earliest_copy():
    def rows(pairs):
        d = np.array([p[0] for p in pairs], dtype=np.int64)
        k = np.array([p[1] for p in pairs], dtype=np.int64)
        return Rows(k, np.zeros(len(k), np.int64), Entries.build([b"x"] * len(k), d))

    out = first_rows([rows([(5, 2), (3, 1)]), rows([(3, 2), (3, 1), (9, 7)])], -1)
    assert list(zip(out.entries.deliver_at_ms.tolist(), out.positions.tolist())) == [
        (3, 1),
        (3, 2),
        (9, 7),
    ]
    assert len(first_rows([rows([(5, 2), (3, 1)])], 1)) == 1
    assert len(first_rows([], 10)) == 0


def test_a_tracker_that_cannot_list_is_refused():
    clock = ManualClock(0)

    class Opaque(InMemoryDelayedDeliveryTracker):
        waiting = None

    sub = Subscription(
        name="t/0/s",
        subscription_type="shared",
        tracker=Opaque(clock=clock),
        clock=clock,
    )
    with pytest.raises(InvalidArgument, match="cannot list"):
        asyncio.run(sub.peek(PeekRange(), None, None))


def test_the_unsealed_index_is_paged_in_due_order_after_a_start_row():
    index = TopicIndex(min_index_count=10**9)
    index.add(_object(1, 0, [500, 300, 300, 900, 100, 700, 300], publish_ms=0))
    everything = page_of(index.untaken(0, -1), PeekRange(limit=-1), None, 100)
    pages, start = [], None
    while True:
        page = page_of(index.untaken(0, -1), PeekRange(limit=-1), start, 3)
        pages += list(zip(page.entries.deliver_at_ms.tolist(), page.positions.tolist()))
        if len(page) < 3:
            break
        start = pages[-1]
    assert pages == list(
        zip(everything.entries.deliver_at_ms.tolist(), everything.positions.tolist())
    )
    assert [d for d, _ in pages] == [100, 300, 300, 300, 500, 700, 900]
    # rows a subscription took (below entry 4, due by 300) are not in its view
    left = index.untaken(key_of(1, 4), 300)
    assert sorted(left.positions.tolist()) == [key_of(1, i) for i in (0, 3, 4, 5, 6)]
