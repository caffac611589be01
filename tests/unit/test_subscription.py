"""The pure Subscription, driven as the actor drives it: ``receive`` and ``step`` with a
ManualClock and in-memory fakes of the log, the cursor store and the dead-letter topic."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest

from raydelay.clock import ManualClock
from raydelay.delayed import (
    BucketDelayedDeliveryTracker,
    InMemoryBucketRegistry,
    InMemoryDelayedDeliveryTracker,
)
from raydelay.delayed.reader import SealedReader
from raydelay.delayed.store import SealedStore
from raydelay.dispatch.cursor import Cursor
from raydelay.dispatch.marks import QUIET_WRITE_MS
from raydelay.dispatch.objects import ObjectCache
from raydelay.dispatch.subscription import (
    DISPATCH_MARK_STEP,
    ConsumerBusy,
    Subscription,
)
from raydelay.dispatch.wire import delivery_batch
from raydelay.errors import InvalidArgument, PartitionMoved, Unavailable
from raydelay.log.entries import NO_DELAY, Entries, LedgerObject, Rows
from raydelay.positions import key_of, position_of
from raydelay.storage import MemoryObjectStore

T0 = 1_000_000


def obj(ledger: int, first: int, deliver_at: list[int], cancels=None, keys=None) -> LedgerObject:
    n = len(deliver_at)
    entries = Entries.build(
        [b"%d:%d" % (ledger, first + i) for i in range(n)],
        np.array(deliver_at, np.int64),
        keys=keys,
        cancels=cancels or {},
    )
    return LedgerObject(ledger, first, T0, entries, {})


def rows(objects: list[LedgerObject], wanted) -> Rows:
    """What the topic actor's point read returns for the positions ``wanted``."""
    parts = []
    for o in objects:
        ks = key_of(o.ledger_id, o.first_entry) + np.arange(o.count, dtype=np.int64)
        idx = np.flatnonzero(np.isin(ks, wanted))
        if len(idx):
            parts.append(Rows(ks[idx], o.publish_times(idx), o.entries.take(idx)))
    return Rows.concat(parts)


class FakeLog:
    """The fetch: the topic actor's point reads over the objects written to the log."""

    def __init__(self) -> None:
        self.objects: list[LedgerObject] = []
        self.reads: list[list[int]] = []  # the keys of each read
        self.during_read: Callable[[], object] | None = None  # runs while a read is under way

    async def __call__(self, keys: np.ndarray) -> Rows:
        self.reads.append(keys.tolist())
        if self.during_read is not None:
            self.during_read()
        return rows(self.objects, keys)


@dataclass
class Case:
    sub: Subscription
    clock: ManualClock
    log: FakeLog
    cursor_writes: list[bytes] = field(default_factory=list)
    dead: list[tuple[list[int], Entries]] = field(default_factory=list)

    async def write_cursor(self, data: bytes) -> None:
        self.cursor_writes.append(data)

    async def publish_dead_letters(self, keys: np.ndarray, entries: Entries) -> None:
        self.dead.append((keys.tolist(), entries))


def make(kind="shared", clock=None, tracker=None, **kw) -> Case:
    clock = clock or ManualClock(T0)
    tracker = tracker or InMemoryDelayedDeliveryTracker(clock=clock, tick_time_ms=10, strict=True)
    case = Case(None, clock, FakeLog())  # type: ignore[arg-type]
    case.sub = Subscription(
        name="t/0/s",
        subscription_type=kind,
        tracker=tracker,
        clock=clock,
        write_cursor=case.write_cursor,
        publish_dead_letters=case.publish_dead_letters,
        **kw,
    )
    case.sub.add_consumer("c1")
    return case


def wire(out) -> dict[str, list]:
    """The delivered record batch as columns of Python values."""
    return delivery_batch(out).to_pydict()


def receive(case: Case, consumer="c1", n=100) -> dict[str, list]:
    """One receive at the clock's time, as the delivered columns."""
    out = asyncio.run(case.sub.receive(consumer, case.log, n, case.clock.now_ms()))
    return wire(out)


def take(case: Case, consumer="c1", n=100) -> list[tuple[int, int]]:
    """One receive; the positions delivered."""
    w = receive(case, consumer, n)
    return list(zip(w["ledger_id"], w["entry_id"], strict=True))


def read(case: Case, *objects: LedgerObject, ledgers=((1, None),), tail=None) -> None:
    """The log reader brings ``objects``; the next step applies them."""
    case.log.objects += objects
    case.sub.offer_read(list(objects), list(ledgers), tail)
    case.sub.step(case.clock.now_ms())


def keys(positions) -> list[int]:
    return [key_of(*p) for p in positions]


def test_immediate_entries_go_out_at_once_and_delayed_ones_when_due_never_early():
    c = make()
    read(c, obj(1, 0, [NO_DELAY, T0 + 500, NO_DELAY, T0 + 200]))
    assert take(c) == [(1, 0), (1, 2)]
    assert c.sub.step(c.clock.now_ms()).wake_at_ms == T0 + 200  # the driver sleeps till then
    c.clock.advance(199)
    assert take(c) == []
    c.clock.advance(1)
    assert c.sub.step(c.clock.now_ms()).deliverable
    assert take(c) == [(1, 3)]
    c.clock.advance(300)
    assert take(c) == [(1, 1)]
    assert c.sub.stats()["delayed"] == 0


def test_the_reader_waits_until_a_step_applied_what_it_brought():
    # Given a read the reader brought but no step applied yet
    c = make()
    before = c.sub.reading.read_position
    c.log.objects.append(obj(1, 0, [NO_DELAY]))
    c.sub.offer_read(c.log.objects[:], [(1, None)], (1, 0))
    # Then the reader may not read on (its next read starts where this one ends)
    assert not c.sub.wants_read() and c.sub.reading.read_position == before
    # When a step applies it
    step = c.sub.step(T0)
    # Then its entry is deliverable and the reader may read on from after it
    assert step.deliverable and step.wants_read and c.sub.reading.read_position == (1, 1)
    assert take(c) == [(1, 0)]


@pytest.mark.parametrize("kind", ["exclusive", "failover"])
def test_fifo_subscriptions_ignore_deliver_at(kind):
    c = make(kind)
    read(c, obj(1, 0, [T0 + 10_000, NO_DELAY, T0 + 5]))
    assert take(c) == [(1, 0), (1, 1), (1, 2)]


def test_redeliveries_go_before_new_entries_and_carry_a_higher_count():
    c = make()
    read(c, obj(1, 0, [NO_DELAY] * 4))
    first = take(c, n=2)
    c.sub.nack("c1", keys(first), 0, c.clock.now_ms())
    w = receive(c, n=10)
    assert list(zip(w["ledger_id"], w["entry_id"], strict=True)) == [(1, 0), (1, 1), (1, 2), (1, 3)]
    assert w["redelivery_count"] == [1, 1, 0, 0]
    assert w["payload"] == [b"1:0", b"1:1", b"1:2", b"1:3"]
    assert c.log.reads == []  # every payload came from the objects the subscription read


def test_nack_with_a_delay_waits_in_the_tracker():
    c = make()
    read(c, obj(1, 0, [NO_DELAY]))
    [p] = take(c)
    c.sub.nack("c1", keys([p]), 1_000, c.clock.now_ms())
    c.clock.advance(999)
    assert take(c) == []
    c.clock.advance(1)
    assert take(c) == [p]


def test_a_step_sends_an_expired_ack_deadline_back_and_an_ack_stops_it():
    c = make(ack_timeout_ms=1_000)
    read(c, obj(1, 0, [NO_DELAY, NO_DELAY]))
    got = take(c)
    c.sub.ack("c1", keys(got[:1]))
    assert c.sub.step(c.clock.now_ms()).wake_at_ms == T0 + 1_000  # the deadline
    c.clock.advance(999)
    assert not c.sub.step(c.clock.now_ms()).deliverable
    assert take(c) == []
    c.clock.advance(1)
    assert c.sub.step(c.clock.now_ms()).deliverable  # the step took it back
    assert c.sub.counters["redelivered"] == 1
    assert take(c) == got[1:]


def test_after_max_redeliveries_a_message_is_published_to_the_dead_letter_topic_then_acked():
    c = make(max_redeliveries=1)
    read(c, obj(1, 0, [NO_DELAY]))
    [p] = take(c)
    c.sub.nack("c1", keys([p]), 0, c.clock.now_ms())
    assert take(c) == [p]
    c.sub.nack("c1", keys([p]), 0, c.clock.now_ms())
    assert c.sub.step(c.clock.now_ms()).dead_letters  # the driver would flush it now
    assert take(c) == []  # ... and so does the next receive
    [(published, entries)] = c.dead
    assert published == keys([p]) and entries.batch.column(0).to_pylist() == [b"1:0"]
    assert c.sub.cursor.is_acked(*p) and not c.sub.redelivery.dead
    assert c.sub.stats()["dead_lettered"] == 1
    assert not c.sub.step(c.clock.now_ms()).dead_letters


def test_an_ack_timeout_past_max_redeliveries_is_flushed_by_the_driver():
    c = make(ack_timeout_ms=100, max_redeliveries=0)
    read(c, obj(1, 0, [NO_DELAY]))
    [p] = take(c)
    c.clock.advance(100)
    step = c.sub.step(c.clock.now_ms())
    assert step.dead_letters and not step.deliverable
    assert asyncio.run(c.sub.flush_dead_letters(c.log)) == 1
    assert c.dead[0][0] == keys([p]) and c.sub.cursor.is_acked(*p)


def test_dead_letters_need_a_publisher():
    with pytest.raises(InvalidArgument, match="publish_dead_letters"):
        Subscription(
            name="t/0/s",
            subscription_type="shared",
            tracker=InMemoryDelayedDeliveryTracker(clock=ManualClock(T0)),
            clock=ManualClock(T0),
            max_redeliveries=3,
        )


def test_cancel_ahead_of_the_read_in_the_tracker_and_after_delivery():
    c = make()
    assert c.sub.cancel(1, 2, marker=(1, 9)) is True  # not read yet
    read(c, obj(1, 0, [T0 + 100, NO_DELAY, T0 + 100, T0 + 100]))
    assert c.sub.cancel(1, 3, marker=(1, 10)) is True  # waiting in the tracker
    assert take(c) == [(1, 1)]
    assert c.sub.cancel(1, 1, marker=(1, 11)) is False  # delivered
    c.clock.advance(100)
    assert take(c) == [(1, 0)]
    assert c.sub.cursor.is_acked(1, 2) and c.sub.cursor.is_acked(1, 3)
    assert c.sub.stats()["cancelled"] == 2


def test_a_cancel_marker_read_from_the_log_and_applied_directly_counts_once():
    c = make()
    read(c, obj(1, 0, [T0 + 100, NO_DELAY], cancels={1: (1, 0)}))
    # the log read applied the marker at (1, 1) first; the caller's own call agrees with it
    assert c.sub.cancel(1, 0, marker=(1, 1)) is True
    assert c.sub.cancel(1, 0, marker=(1, 2)) is False  # a second cancel is not honoured
    c.clock.advance(100)
    assert take(c) == []
    assert c.sub.cursor.mark_delete == (1, 1)


def test_two_cancels_of_a_message_not_read_yet_count_once():
    c = make()
    # both markers come before the subscription reads the target (1:0 is ahead)
    assert c.sub.cancel(1, 0, marker=(2, 0)) is True
    assert c.sub.cancel(1, 0, marker=(2, 1)) is False  # as for one applied already
    assert c.sub.counters["cancelled"] == 1
    read(c, obj(1, 0, [NO_DELAY, NO_DELAY]))
    assert take(c) == [(1, 1)]


def test_a_consumer_that_leaves_hands_its_messages_back():
    c = make()
    c.sub.add_consumer("c2")
    read(c, obj(1, 0, [NO_DELAY] * 3))
    got = take(c, "c1")
    assert c.sub.remove_consumer("c1") == 3
    assert take(c, "c2") == got
    assert c.sub.pending_count() == 3


def test_failover_delivers_only_to_the_oldest_consumer_and_exclusive_to_one():
    c = make("failover")
    c.sub.add_consumer("c2")
    read(c, obj(1, 0, [NO_DELAY] * 2))
    assert take(c, "c2") == []
    assert take(c, "c1") == [(1, 0), (1, 1)]
    ex = make("exclusive")
    with pytest.raises(ConsumerBusy):
        ex.sub.add_consumer("c2")
    with pytest.raises(InvalidArgument, match="subscription_type"):
        make("broadcast")


@pytest.mark.parametrize("kind", ["shared", "failover", "exclusive"])
def test_a_consumer_whose_lease_lapses_is_removed_by_a_step_and_its_messages_go_to_another(kind):
    # Given c1 holding three unacked messages (and, but for exclusive, c2 waiting)
    c = make(kind, consumer_lease_ms=10_000, cursor_persist_interval_ms=60_000)
    read(c, obj(1, 0, [NO_DELAY] * 3))
    got = take(c, "c1")
    assert got == [(1, 0), (1, 1), (1, 2)]
    if kind != "exclusive":
        c.sub.add_consumer("c2")
    # When c2 keeps calling and c1 falls silent for longer than the lease
    c.clock.advance(6_000)
    assert c.sub.touch("c2") == (kind != "exclusive") and not c.sub.touch("nobody")
    step = c.sub.step(c.clock.now_ms())
    assert step.expired == []  # 6 s: not yet
    assert step.wake_at_ms == T0 + 10_001  # when c1's lease lapses
    c.clock.advance(4_001)
    step = c.sub.step(c.clock.now_ms())
    # Then c1 is removed with its three messages handed back
    assert step.expired == [("c1", 3)] and step.deliverable
    assert c.sub.consumers() == ([] if kind == "exclusive" else ["c2"])
    if kind == "exclusive":  # the slot is free for a new consumer
        c.sub.add_consumer("c3")
    nxt = "c3" if kind == "exclusive" else "c2"
    out = receive(c, nxt, 10)
    assert list(zip(out["ledger_id"], out["entry_id"], strict=True)) == got
    assert out["redelivery_count"] == [1, 1, 1]
    age = 0 if kind == "exclusive" else 4_001  # c2 was last heard from at the touch
    assert c.sub.consumer_leases(c.clock.now_ms())[nxt] == {"unacked": 3, "lease_age_ms": age}


def test_redeliver_on_demand_takes_back_only_what_the_consumer_holds_on_shared():
    c = make("shared")
    c.sub.add_consumer("c2")
    read(c, obj(1, 0, [NO_DELAY] * 5))
    mine = take(c, "c1", n=3)
    theirs = take(c, "c2")
    assert len(mine) == 3 and len(theirs) == 2
    c.sub.ack("c1", keys([mine[2]]))
    # a message held by another consumer, or acknowledged, is named, and nothing goes back
    with pytest.raises(InvalidArgument, match=r"1:\d \(held by another consumer\)"):
        c.sub.redeliver_unacked("c1", np.array(keys([mine[0], theirs[0]])))
    with pytest.raises(InvalidArgument, match=r"\(acknowledged\)"):
        c.sub.redeliver_unacked("c1", np.array(keys([mine[2]])))
    assert c.sub.consumer_leases(c.clock.now_ms())["c1"]["unacked"] == 2
    # the given ones go back now, with their count raised; then all the rest
    assert c.sub.redeliver_unacked("c1", np.array(keys([mine[0]])), dry_run=True) == 1
    assert c.sub.redeliver_unacked("c1", np.array(keys([mine[0]]))) == 1
    again = receive(c, "c2")
    assert list(zip(again["ledger_id"], again["entry_id"], strict=True)) == [mine[0]]
    assert again["redelivery_count"] == [1]
    assert c.sub.redeliver_unacked("c1") == 1
    assert receive(c, "c1")["entry_id"] == [mine[1][1]]


@pytest.mark.parametrize("kind", ["exclusive", "failover"])
def test_redeliver_on_demand_rewinds_a_fifo_subscription(kind):
    c = make(kind)
    read(c, obj(1, 0, [NO_DELAY] * 6))
    assert take(c, "c1", n=4) == [(1, 0), (1, 1), (1, 2), (1, 3)]
    c.sub.ack("c1", keys([(1, 1)]))
    # given one message, delivery still rewinds to the first unacked and goes on in order
    assert c.sub.redeliver_unacked("c1", np.array(keys([(1, 2)]))) == 3
    out = receive(c, "c1")
    assert out["entry_id"] == [0, 2, 3, 4, 5]
    assert out["redelivery_count"] == [1, 1, 1, 0, 0]


def test_an_ack_past_the_end_of_the_log_names_no_message_and_acks_nothing():
    c = make()
    read(c, obj(1, 0, [NO_DELAY] * 3), tail=(1, 2))  # the log's last entry is 1:2
    got = take(c, "c1")
    with pytest.raises(InvalidArgument, match=r"1048576:5 past the end of t/0/s .*1:2"):
        c.sub.ack("c1", keys([got[0], (2**20, 5)]))
    assert c.sub.counters["acked"] == 0
    # any consumer may ack a message that exists, as Pulsar's ack by id; counted once
    c.sub.add_consumer("c2")
    assert c.sub.ack("c2", keys(got)) == 3 and c.sub.ack("c1", keys(got)) == 0
    assert c.sub.counters["acked"] == 3


def test_an_ack_past_what_this_life_has_read_asks_the_log_tail_and_is_not_refused():
    # A consumer acks what an earlier life of the subscription delivered: this life knows
    # the log only as far as it has read (1:2), but the log goes on to 1:5
    c = make()
    read(c, obj(1, 0, [NO_DELAY] * 3), tail=(1, 2))
    asked = []

    async def log_tail(at=(1, 5)):
        asked.append(at)
        return key_of(*at)

    assert asyncio.run(c.sub.acks.ack_learning_tail(keys([(1, 4)]), log_tail)) == 1
    assert asked == [(1, 5)] and c.sub.counters["acked"] == 1
    # within what is known now: the tail is not asked again
    assert asyncio.run(c.sub.acks.ack_learning_tail(keys([(1, 5)]), log_tail)) == 1
    assert len(asked) == 1
    # past the tail the host gives too: still no such message, and nothing acked
    with pytest.raises(InvalidArgument, match=r"1:9 past the end of t/0/s .*1:5"):
        asyncio.run(c.sub.acks.ack_learning_tail(keys([(1, 0), (1, 9)]), log_tail))
    assert len(asked) == 2 and c.sub.counters["acked"] == 2


def test_an_ack_whose_log_tail_cannot_be_asked_fails_retriably_and_acks_nothing(monkeypatch):
    import raydelay.dispatch.acks as acks_module

    monkeypatch.setattr(acks_module, "ACK_TAIL_TIMEOUT_S", 0.05)
    c = make()
    read(c, obj(1, 0, [NO_DELAY] * 3), tail=(1, 2))

    async def silent():  # a host that does not answer
        await asyncio.sleep(3600)

    async def moved():  # the partition's host moved: not the subscription's
        raise PartitionMoved("t/0 is served elsewhere")

    for log_tail in (silent, moved):
        with pytest.raises(Unavailable, match=r"1:4, past what .* sent again") as info:
            asyncio.run(c.sub.acks.ack_learning_tail(keys([(1, 0), (1, 4)]), log_tail))
        assert type(info.value) is Unavailable
    assert c.sub.counters["acked"] == 0


def test_read_ahead_is_bounded():
    c = make(read_ahead_entries=5)
    assert c.sub.wants_read()
    read(c, obj(1, 0, [NO_DELAY] * 5))
    assert not c.sub.wants_read() and not c.sub.step(c.clock.now_ms()).wants_read
    take(c, n=3)
    assert c.sub.wants_read() and c.sub.ready_count() == 2


def test_the_cursor_is_written_with_the_dispatch_mark_before_anything_beyond_it_goes_out():
    # Given a fresh subscription (its dispatch mark at the start of the log)
    c = make()
    read(c, obj(1, 0, [NO_DELAY] * 3))
    # When a receive hands entries out
    got = take(c)
    # Then a cursor was written first whose dispatch mark is past every one of them
    [data] = c.cursor_writes
    _, mark = Cursor.decode(data)
    assert got == [(1, 0), (1, 1), (1, 2)] and all(p < mark for p in got)
    assert c.sub.marks.dispatch_mark == mark == (1, DISPATCH_MARK_STEP)
    take(c)  # below the mark already: nothing more is written
    assert len(c.cursor_writes) == 1


def test_a_step_asks_for_a_cursor_write_once_per_interval_and_only_a_change_is_written():
    c = make(cursor_persist_interval_ms=1_000)
    assert c.sub.step(T0).persist  # the first step writes at once
    assert asyncio.run(c.sub.persist()) is True
    assert not c.sub.step(T0 + 999).persist
    assert c.sub.step(T0 + 1_000).persist
    assert asyncio.run(c.sub.persist()) is False  # nothing changed since
    read(c, obj(1, 0, [NO_DELAY]))
    c.sub.ack("c1", keys(take(c)))
    assert c.sub.step(T0 + 2_000).persist
    assert asyncio.run(c.sub.persist()) is True
    back, _ = Cursor.decode(c.cursor_writes[-1])
    assert back.is_acked(1, 0)


def test_an_idle_subscription_looks_for_a_cursor_write_rarely_until_something_changes():
    c = make(cursor_persist_interval_ms=1_000)
    marks = c.sub.marks
    assert c.sub.step(T0).persist and asyncio.run(c.sub.persist()) is True
    assert c.sub.step(T0 + 1_000).persist
    state = marks.state()
    assert asyncio.run(c.sub.persist()) is False  # nothing to write: the driver says quiet
    marks.quiet(state)
    # Quiet: no step asks, and none wakes, until QUIET_WRITE_MS after the last look
    assert not c.sub.step(T0 + 5_000).persist
    assert marks.next_write_ms() == T0 + 1_000 + QUIET_WRITE_MS
    assert c.sub.step(T0 + 1_000 + QUIET_WRITE_MS).persist
    # ... unless what a write holds changes: an ack is written at the next interval
    marks.quiet(marks.state())
    read(c, obj(1, 0, [NO_DELAY]))
    c.sub.ack("c1", keys(take(c)))
    assert c.sub.step(T0 + 1_000 + QUIET_WRITE_MS + 1_000).persist
    assert asyncio.run(c.sub.persist()) is True
    back, _ = Cursor.decode(c.cursor_writes[-1])
    assert back.is_acked(1, 0)


def test_the_write_state_sees_a_bucket_adopted_as_a_change():
    from tests.unit.test_merges import _bucket

    c = make(sealed=SealedReader())
    before = c.sub.marks.state()
    c.sub.adopt(_bucket(SealedStore(MemoryObjectStore(), "t", 0), 1, [T0 + 60_000] * 3))
    after = c.sub.marks.state()
    # (the buckets' own part changed, not only the log cursor's acks of their ledger)
    assert after[-1] == c.sub.buckets.generation() != before[-1]


def test_a_restarted_subscription_marks_possibly_delivered_messages_and_skips_acked_ones():
    cursor = Cursor()
    cursor.learn_ledgers([(1, None)])
    cursor.ack(np.array([1, 1]), np.array([0, 2]))
    c = make(cursor=cursor, dispatched_before=(1, 3))
    read(c, obj(1, 0, [NO_DELAY] * 5))
    # below the old dispatch mark: may have gone out before the restart
    w = receive(c, n=10)
    assert list(zip(w["entry_id"], w["redelivery_count"], strict=True)) == [(1, 1)]
    assert c.cursor_writes == []
    # beyond it: only once the mark has moved, written first
    w = receive(c, n=10)
    assert list(zip(w["entry_id"], w["redelivery_count"], strict=True)) == [(3, 0), (4, 0)]
    assert Cursor.decode(c.cursor_writes[0])[1] == (1, 3 + DISPATCH_MARK_STEP)


def test_bucket_tracked_delayed_messages_are_delivered_through_the_redelivery_set():
    clock = ManualClock(T0)
    tracker = BucketDelayedDeliveryTracker(
        store=MemoryObjectStore(),
        registry=InMemoryBucketRegistry(),
        name="subs/t/0/s",
        clock=clock,
        tick_time_ms=10,
        strict=True,
        min_index_count_per_bucket=3,
    )
    c = make(clock=clock, tracker=tracker)
    read(c, obj(1, 0, [T0 + 50] * 4), obj(2, 0, [T0 + 60] * 2), ledgers=((1, 4), (2, None)))
    assert c.sub.stats()["delayed"] == 6
    clock.advance(60)
    got = take(c)
    assert sorted(got) == [(1, 0), (1, 1), (1, 2), (1, 3), (2, 0), (2, 1)]


def test_payloads_the_subscription_no_longer_holds_are_read_through_the_fetch():
    # Given a cache of one entry: the delayed entry's object is gone from it by its time
    c = make(cached_entries=1)
    read(c, obj(1, 0, [T0 + 100]), obj(1, 1, [NO_DELAY]), ledgers=((1, None),))
    assert take(c) == [(1, 1)]
    c.clock.advance(100)
    # When it is due, its payload is read from the log
    w = receive(c)
    assert w["payload"] == [b"1:0"] and c.log.reads == [keys([(1, 0)])]
    # and a position the log no longer has is acked, never delivered
    c.sub.nack("c1", keys([(1, 0)]), 0, c.clock.now_ms())
    c.log.objects.clear()
    assert take(c) == [] and c.sub.cursor.is_acked(1, 0)


def test_the_object_cache_finds_positions_by_object_and_forgets_the_oldest():
    cache = ObjectCache(max_entries=6)
    a, b, c = obj(1, 0, [NO_DELAY] * 3), obj(1, 3, [NO_DELAY] * 3), obj(2, 0, [NO_DELAY] * 3)
    cache.add(a)
    cache.add(b)
    groups, missing = cache.lookup(np.array(keys([(1, 4), (1, 0), (1, 9), (2, 0)])))
    assert sorted((g[0].first_entry, g[1].tolist()) for g in groups) == [(0, [0]), (3, [1])]
    assert sorted(missing.tolist()) == keys([(1, 9), (2, 0)])
    cache.add(c)  # over 6 entries: the oldest object goes
    assert len(cache) == 2 and cache.entries == 6
    groups, missing = cache.lookup(np.array(keys([(1, 0), (2, 2)])))
    assert [g[0].ledger_id for g in groups] == [2] and missing.tolist() == keys([(1, 0)])


def test_cancels_learned_at_startup_keep_their_targets_from_ever_going_out():
    c = make()
    assert c.sub.learn_cancels([((1, 5), (1, 1)), ((1, 6), (1, 3))]) == 2
    read(
        c,
        obj(1, 0, [NO_DELAY, NO_DELAY, T0 + 10, T0 + 10]),
        obj(1, 4, [NO_DELAY] * 3, cancels={1: (1, 1), 2: (1, 3)}),
    )
    c.clock.advance(10)
    assert sorted(take(c)) == [(1, 0), (1, 2), (1, 4)]
    assert c.sub.cancel(1, 1, marker=(1, 5)) is True  # the caller's retry agrees
    assert all(c.sub.cursor.is_acked(1, e) for e in (1, 3, 5, 6))  # targets and markers


def test_a_restart_skips_the_log_its_buckets_cover_and_rereads_only_loose_positions():
    clock, store, registry = ManualClock(T0), MemoryObjectStore(), InMemoryBucketRegistry()

    def life(cursor=None, dispatched_before=(-1, -1)) -> Case:
        tracker = BucketDelayedDeliveryTracker(
            store=store,
            registry=registry,
            name="subs/t/0/s",
            clock=clock,
            tick_time_ms=10,
            strict=True,
            min_index_count_per_bucket=3,
        )
        return make(
            clock=clock, tracker=tracker, cursor=cursor, dispatched_before=dispatched_before
        )

    d1, d2, d3 = T0 + 1_000, T0 + 2_000, T0 + 3_000
    l1 = obj(11, 0, [NO_DELAY, d1, d1, NO_DELAY, d1])
    l2 = obj(12, 0, [d2, d2, d2, NO_DELAY, NO_DELAY], cancels={4: (11, 2)})  # 12:4 cancels 11:2
    l3 = obj(13, 0, [d3, NO_DELAY])
    ledgers = [(11, 5), (12, 5), (13, None)]
    c = life()
    read(c, l1, l2, l3, ledgers=ledgers)
    assert c.sub.tracker.immutable_bucket_count() == 2  # ledgers 11 and 12 sealed
    got = take(c) + take(c) + take(c)  # a mark step per ledger
    assert sorted(got) == [(11, 0), (11, 3), (12, 3), (13, 1)]
    c.sub.ack("c1", keys([(11, 0), (13, 1)]))
    asyncio.run(c.sub.persist())
    saved, dispatched = Cursor.decode(c.cursor_writes[-1])

    c = life(saved, dispatched)
    c.log.objects += [l1, l2, l3]
    assert c.sub.resume_after_buckets(ledgers) == 2
    assert c.sub.reading.read_position == (13, 0)  # ledgers 11 and 12 are not read again
    assert sorted(position_of(k) for k in c.sub.reading.unread) == [(11, 3), (12, 3)]
    assert c.sub.next_unread(1) == keys([(11, 3)])
    loose = c.sub.next_unread(10)
    c.sub.offer_reread(rows([l1, l2], loose), np.array(loose))
    c.sub.step(clock.now_ms())
    assert not c.sub.reading.unread
    read(c, l1, l2, l3, ledgers=ledgers)  # the sequential read takes only ledger 13 in
    assert c.sub.stats()["delayed"] == 6  # 11:1, 11:4, 12:0-2 from the buckets; 13:0 re-read
    w = receive(c, n=10)
    got3 = list(zip(w["ledger_id"], w["entry_id"], w["redelivery_count"], strict=True))
    assert got3 == [(11, 3, 1), (12, 3, 1)]
    clock.advance(3_000)
    got = take(c)
    assert sorted(got) == [(11, 1), (11, 4), (12, 0), (12, 1), (12, 2), (13, 0)]  # never 11:2


def test_a_loose_position_cancelled_before_its_reread_is_never_delivered():
    c = make(
        tracker=BucketDelayedDeliveryTracker(
            store=MemoryObjectStore(),
            registry=InMemoryBucketRegistry(),
            name="subs/t/0/s",
            clock=ManualClock(T0),
            min_index_count_per_bucket=1,
        )
    )
    c.sub.reading.unread.update(keys([(1, 0), (1, 1)]))  # what resume_after_buckets would find
    assert c.sub.cancel(1, 1, marker=(2, 0)) is True
    loose = keys([(1, 0), (1, 1)])
    assert c.sub.on_reread(rows([obj(1, 0, [NO_DELAY, NO_DELAY])], loose), loose) == 1
    assert take(c) == [(1, 0)]


def test_the_object_cache_finds_positions_in_overlapping_runs():
    cache = ObjectCache(max_entries=100)
    cache.add(obj(7, 0, [NO_DELAY] * 10))  # a whole object: entries 0..9
    cache.add(obj(7, 4, [NO_DELAY]))  # a run cut out of it: entry 4 only
    cache.add(obj(7, 6, [NO_DELAY]))
    cache.add(obj(7, 6, [NO_DELAY] * 3))  # a longer run from the same entry replaces it
    assert cache.entries == 14
    groups, missing = cache.lookup(np.array(keys([(7, 5), (7, 8), (7, 9), (7, 10)])))
    found = sorted((g[0].first_entry, g[0].count, int(i)) for g in groups for i in g[1])
    assert found == [(0, 10, 5), (0, 10, 9), (6, 3, 2)]  # 5 and 9: from the whole object
    assert missing.tolist() == keys([(7, 10)])


def test_a_message_nacked_with_a_delay_then_acked_does_not_come_back():
    c = make()
    read(c, obj(1, 0, [NO_DELAY, NO_DELAY]))
    got = take(c)
    c.sub.nack("c1", keys(got), 100, c.clock.now_ms())
    c.sub.ack("c1", keys(got[:1]))  # acked while it waits out its nack delay
    c.clock.advance(100)
    assert take(c) == [(1, 1)]
    c.clock.advance(1_000)
    assert take(c) == []


def test_a_step_queries_the_unsealed_index_when_a_row_there_is_due_one_query_at_a_time():
    # Given a shared subscription over sealed buckets that read a delayed entry
    c = make(sealed=SealedReader())
    delayed = obj(1, 0, [T0 + 500])  # (published at T0: not due when committed)
    c.sub.offer_read([delayed], [(1, None)], None)
    # When steps run: the first polls the topic's index for the new delayed rows
    first = c.sub.step(T0).tail_query
    assert c.sub.unsealed.next_ms == T0 + 500 and c.sub.tracker.number_of_delayed_messages() == 0
    assert first is not None and first.now_ms == T0
    # Then no second query goes while it is under way, even once the row is due
    assert c.sub.step(T0 + 500).tail_query is None
    # When it fails, the next poll asks again
    c.sub.tail_failed()
    assert c.sub.step(T0 + 500).tail_query is not None


def test_a_delivery_of_a_run_of_rows_shares_their_payloads_and_any_other_is_taken_in_order():
    from raydelay.dispatch.subscription import Delivery

    payloads = [f"m{i}".encode() for i in range(6)]
    entries = Entries.build(payloads, np.full(6, NO_DELAY, dtype=np.int64))
    keys = np.array([key_of(1, i) for i in range(6)], dtype=np.int64)
    rows = Rows(keys, np.arange(6, dtype=np.int64) * 10, entries)

    def deliver(idx: list[int]):
        i = np.array(idx, dtype=np.int64)
        return delivery_batch([Delivery(rows, i, keys[i], np.zeros(len(i), np.int64))])

    run = deliver([2, 3, 4])
    assert run.column("payload").to_pylist() == [b"m2", b"m3", b"m4"]
    assert run.column("entry_id").to_pylist() == [2, 3, 4]
    assert run.column("publish_time_ms").to_pylist() == [20, 30, 40]
    # a slice of the source (no copy): its payload bytes are the source's own buffer
    src = entries.batch.column(0).buffers()[2]
    assert run.column("payload").buffers()[2].address == src.address
    shuffled = deliver([4, 0, 3])
    assert shuffled.column("payload").to_pylist() == [b"m4", b"m0", b"m3"]
    assert shuffled.column("entry_id").to_pylist() == [4, 0, 3]
    assert shuffled.column("payload").buffers()[2].address != src.address


def test_a_delivery_sliced_out_of_a_large_source_carries_only_its_own_rows():
    # (a pickled Arrow slice ships its source's whole buffers: the consumer would get the
    # window's 5 MB with each 100 rows of it)
    import pickle

    from raydelay.dispatch.subscription import Delivery

    n = 50_000
    entries = Entries.build([b"x" * 100] * n, np.full(n, NO_DELAY, dtype=np.int64))
    keys = np.array([key_of(1, i) for i in range(n)], dtype=np.int64)
    rows = Rows(keys, np.zeros(n, dtype=np.int64), entries)
    i = np.arange(20_000, 20_100, dtype=np.int64)
    batch = delivery_batch([Delivery(rows, i, keys[i], np.zeros(len(i), np.int64))])

    buffers: list = []
    wire = pickle.dumps(batch, protocol=5, buffer_callback=buffers.append)
    shipped = len(wire) + sum(len(b.raw()) for b in buffers)
    assert shipped < 100 * 200  # 100 rows of 100-byte payloads, with their columns
    assert batch.column("entry_id").to_pylist() == list(range(20_000, 20_100))
    assert batch.column("payload").to_pylist() == [b"x" * 100] * 100
    back = pickle.loads(wire, buffers=buffers)
    assert back.equals(batch)


def test_states_say_where_each_position_stands_and_change_nothing():
    c = make()
    assert c.sub.cancel(1, 4, marker=(1, 9)) is True  # cancelled ahead of the read
    read(c, obj(1, 0, [NO_DELAY, NO_DELAY, T0 + 100, T0 + 100, T0 + 100]))
    assert take(c) == [(1, 0), (1, 1)]
    c.sub.ack("c1", keys([(1, 0)]))
    assert c.sub.cancel(1, 3, marker=(1, 10)) is True  # cancelled once read: acknowledged
    positions = [(1, 0), (1, 1), (1, 2), (1, 3), (1, 4)]
    before = c.sub.stats()
    assert c.sub.cancels.states(positions) == ["acked", "held", "waiting", "acked", "acked"]
    assert c.sub.stats() == before  # nothing changed
    # the one due later is delivered when due, then acknowledged
    c.clock.advance(100)
    assert take(c) == [(1, 2)]
    assert c.sub.cancels.states([(1, 2)]) == ["held"]
    c.sub.ack("c1", keys([(1, 1), (1, 2)]))
    assert c.sub.cancels.states(positions) == ["acked"] * 5


def test_states_of_positions_cancelled_before_they_are_read():
    c = make()
    assert c.sub.cancel(2, 0, marker=(2, 5)) is True
    assert c.sub.cancels.states([(2, 0), (2, 1)]) == ["cancelled", "waiting"]
