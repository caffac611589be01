"""The pure Subscription: what is delivered, to whom, when; driven by a ManualClock."""

from __future__ import annotations

import numpy as np
import pytest

from raydelay.clock import ManualClock
from raydelay.delayed import (
    BucketDelayedDeliveryTracker,
    InMemoryBucketRegistry,
    InMemoryDelayedDeliveryTracker,
)
from raydelay.dispatch.cursor import Cursor
from raydelay.dispatch.objects import ObjectCache
from raydelay.dispatch.subscription import (
    DISPATCH_MARK_STEP,
    ConsumerBusy,
    Subscription,
    key_of,
    position_of,
)
from raydelay.dispatch.wire import delivery_batch
from raydelay.errors import InvalidArgument
from raydelay.log.entries import NO_DELAY, Entries, LedgerObject, Rows
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


def rows(objects: list[LedgerObject], wanted: list[int]) -> Rows:
    """What the topic actor's point read returns for the positions ``wanted``."""
    parts = []
    for o in objects:
        ks = key_of(o.ledger_id, o.first_entry) + np.arange(o.count, dtype=np.int64)
        idx = np.flatnonzero(np.isin(ks, wanted))
        if len(idx):
            parts.append(Rows(ks[idx], o.publish_times(idx), o.entries.take(idx)))
    return Rows.concat(parts)


def wire(out) -> dict[str, list]:
    """The delivered record batch as columns of Python values."""
    return delivery_batch(out).to_pydict()


def make(kind="shared", clock=None, tracker=None, **kw) -> tuple[Subscription, ManualClock]:
    clock = clock or ManualClock(T0)
    tracker = tracker or InMemoryDelayedDeliveryTracker(clock=clock, tick_time_ms=10, strict=True)
    sub = Subscription(name="t/0/s", subscription_type=kind, tracker=tracker, clock=clock, **kw)
    sub.add_consumer("c1")
    return sub, clock


def take(sub: Subscription, clock: ManualClock, consumer="c1", n=100) -> list[tuple[int, int]]:
    """One receive: collect due, 'fetch' from what on_read saw, deliver; returns positions."""
    move_mark(sub)
    sub.collect_due(clock.now_ms(), n)
    asked = sub.keys_to_fetch(n, consumer)
    fetched, _ = CACHE.lookup(np.array(asked, dtype=np.int64))
    out = sub.deliver(consumer, fetched, n, clock.now_ms())
    w = wire(out)
    return list(zip(w["ledger_id"], w["entry_id"], strict=True))


def move_mark(sub: Subscription) -> None:
    """What the actor does before delivering: persist the wanted dispatch mark, then set it."""
    mark = sub.wanted_mark()
    if mark is not None:
        sub.dispatch_mark = mark


CACHE = ObjectCache(max_entries=1_000_000)  # what the actor would fetch payloads from


def read(sub: Subscription, *objects: LedgerObject, ledgers=((1, None),)) -> None:
    for o in objects:
        CACHE.add(o)
    sub.on_read(list(objects), list(ledgers), None)


def keys(positions) -> list[int]:
    return [key_of(*p) for p in positions]


def test_immediate_entries_go_out_at_once_and_delayed_ones_when_due_never_early():
    sub, clock = make()
    read(sub, obj(1, 0, [NO_DELAY, T0 + 500, NO_DELAY, T0 + 200]))
    assert take(sub, clock) == [(1, 0), (1, 2)]
    clock.advance(199)
    assert take(sub, clock) == []
    clock.advance(1)
    assert take(sub, clock) == [(1, 3)]
    clock.advance(300)
    assert take(sub, clock) == [(1, 1)]
    assert sub.stats()["delayed"] == 0


@pytest.mark.parametrize("kind", ["exclusive", "failover"])
def test_fifo_subscriptions_ignore_deliver_at(kind):
    sub, clock = make(kind)
    read(sub, obj(1, 0, [T0 + 10_000, NO_DELAY, T0 + 5]))
    assert take(sub, clock) == [(1, 0), (1, 1), (1, 2)]


def test_redeliveries_go_before_new_entries_and_carry_a_higher_count():
    sub, clock = make()
    read(sub, obj(1, 0, [NO_DELAY] * 4))
    first = take(sub, clock, n=2)
    sub.nack("c1", keys(first), 0, clock.now_ms())
    sub.collect_due(clock.now_ms(), 10)
    fetched, _ = CACHE.lookup(np.array(sub.keys_to_fetch(10), dtype=np.int64))
    out = sub.deliver("c1", fetched, 10, clock.now_ms())
    w = wire(out)
    assert list(zip(w["ledger_id"], w["entry_id"], strict=True)) == [(1, 0), (1, 1), (1, 2), (1, 3)]
    assert w["redelivery_count"] == [1, 1, 0, 0]
    assert w["payload"] == [b"1:0", b"1:1", b"1:2", b"1:3"]


def test_nack_with_a_delay_waits_in_the_tracker():
    sub, clock = make()
    read(sub, obj(1, 0, [NO_DELAY]))
    [p] = take(sub, clock)
    sub.nack("c1", keys([p]), 1_000, clock.now_ms())
    clock.advance(999)
    assert take(sub, clock) == []
    clock.advance(1)
    assert take(sub, clock) == [p]


def test_an_expired_ack_deadline_redelivers_and_an_ack_stops_it():
    sub, clock = make(ack_timeout_ms=1_000)
    read(sub, obj(1, 0, [NO_DELAY, NO_DELAY]))
    got = take(sub, clock)
    sub.ack("c1", keys(got[:1]))
    clock.advance(999)
    assert take(sub, clock) == []
    clock.advance(1)
    assert take(sub, clock) == got[1:]
    assert sub.counters["redelivered"] == 1


def test_after_max_redeliveries_a_message_waits_for_the_dead_letter_topic():
    sub, clock = make(max_redeliveries=1)
    read(sub, obj(1, 0, [NO_DELAY]))
    [p] = take(sub, clock)
    sub.nack("c1", keys([p]), 0, clock.now_ms())
    assert take(sub, clock) == [p]
    sub.nack("c1", keys([p]), 0, clock.now_ms())
    assert take(sub, clock) == []
    assert sub.dead_letters(10) == keys([p])
    sub.dead_lettered(keys([p]))
    assert sub.cursor.is_acked(*p) and sub.dead_letters(10) == []


def test_cancel_ahead_of_the_read_in_the_tracker_and_after_delivery():
    sub, clock = make()
    assert sub.cancel(1, 2, marker=(1, 9)) is True  # not read yet
    read(sub, obj(1, 0, [T0 + 100, NO_DELAY, T0 + 100, T0 + 100]))
    assert sub.cancel(1, 3, marker=(1, 10)) is True  # waiting in the tracker
    assert take(sub, clock) == [(1, 1)]
    assert sub.cancel(1, 1, marker=(1, 11)) is False  # delivered
    clock.advance(100)
    assert take(sub, clock) == [(1, 0)]
    assert sub.cursor.is_acked(1, 2) and sub.cursor.is_acked(1, 3)
    assert sub.stats()["cancelled"] == 2


def test_a_cancel_marker_read_from_the_log_and_applied_directly_counts_once():
    sub, clock = make()
    read(sub, obj(1, 0, [T0 + 100, NO_DELAY], cancels={1: (1, 0)}))
    # the log read applied the marker at (1, 1) first; the caller's own call agrees with it
    assert sub.cancel(1, 0, marker=(1, 1)) is True
    assert sub.cancel(1, 0, marker=(1, 2)) is False  # a second cancel is not honoured
    clock.advance(100)
    assert take(sub, clock) == []
    assert sub.cursor.mark_delete == (1, 1)


def test_two_cancels_of_a_message_not_read_yet_count_once():
    sub, clock = make()
    # both markers come before the subscription reads the target (1:0 is ahead)
    assert sub.cancel(1, 0, marker=(2, 0)) is True
    assert sub.cancel(1, 0, marker=(2, 1)) is False  # as for one applied already
    assert sub.counters["cancelled"] == 1
    read(sub, obj(1, 0, [NO_DELAY, NO_DELAY]))
    assert take(sub, clock) == [(1, 1)]


def test_a_consumer_that_leaves_hands_its_messages_back():
    sub, clock = make()
    sub.add_consumer("c2")
    read(sub, obj(1, 0, [NO_DELAY] * 3))
    got = take(sub, clock, "c1")
    assert sub.remove_consumer("c1") == 3
    assert take(sub, clock, "c2") == got
    assert sub.pending_count() == 3


def test_failover_delivers_only_to_the_oldest_consumer_and_exclusive_to_one():
    sub, clock = make("failover")
    sub.add_consumer("c2")
    read(sub, obj(1, 0, [NO_DELAY] * 2))
    assert take(sub, clock, "c2") == []
    assert take(sub, clock, "c1") == [(1, 0), (1, 1)]
    ex, _ = make("exclusive")
    with pytest.raises(ConsumerBusy):
        ex.add_consumer("c2")
    with pytest.raises(InvalidArgument, match="subscription_type"):
        make("broadcast")


@pytest.mark.parametrize("kind", ["shared", "failover", "exclusive"])
def test_a_consumer_whose_lease_lapses_is_removed_and_its_messages_go_to_another(kind):
    # Given c1 holding three unacked messages (and, but for exclusive, c2 waiting)
    sub, clock = make(kind)
    read(sub, obj(1, 0, [NO_DELAY] * 3))
    got = take(sub, clock, "c1")
    assert got == [(1, 0), (1, 1), (1, 2)]
    if kind != "exclusive":
        sub.add_consumer("c2")
    # When c2 keeps calling and c1 falls silent for longer than the lease
    clock.advance(6_000)
    assert sub.touch("c2") == (kind != "exclusive") and not sub.touch("nobody")
    assert sub.expire_consumers(clock.now_ms(), lease_ms=10_000) == []  # 6 s: not yet
    clock.advance(4_001)
    removed = sub.expire_consumers(clock.now_ms(), lease_ms=10_000)
    # Then c1 is removed with its three messages handed back
    assert removed == [("c1", 3)]
    assert sub.consumers() == ([] if kind == "exclusive" else ["c2"])
    if kind == "exclusive":  # the slot is free for a new consumer
        sub.add_consumer("c3")
    nxt = "c3" if kind == "exclusive" else "c2"
    move_mark(sub)
    sub.collect_due(clock.now_ms(), 10)
    fetched, _ = CACHE.lookup(np.array(sub.keys_to_fetch(10), dtype=np.int64))
    out = wire(sub.deliver(nxt, fetched, 10, clock.now_ms()))
    assert list(zip(out["ledger_id"], out["entry_id"], strict=True)) == got
    assert out["redelivery_count"] == [1, 1, 1]
    age = 0 if kind == "exclusive" else 4_001  # c2 was last heard from at the touch
    assert sub.consumer_leases(clock.now_ms())[nxt] == {"unacked": 3, "lease_age_ms": age}


def _deliver(sub: Subscription, clock: ManualClock, consumer: str) -> dict[str, list]:
    """One receive, as columns (counts included)."""
    move_mark(sub)
    sub.collect_due(clock.now_ms(), 100)
    fetched, _ = CACHE.lookup(np.array(sub.keys_to_fetch(100), dtype=np.int64))
    return wire(sub.deliver(consumer, fetched, 100, clock.now_ms()))


def test_redeliver_on_demand_takes_back_only_what_the_consumer_holds_on_shared():
    sub, clock = make("shared")
    sub.add_consumer("c2")
    read(sub, obj(1, 0, [NO_DELAY] * 5))
    mine = take(sub, clock, "c1", n=3)
    theirs = take(sub, clock, "c2")
    assert len(mine) == 3 and len(theirs) == 2
    sub.ack("c1", keys([mine[2]]))
    # a message held by another consumer, or acknowledged, is named, and nothing goes back
    with pytest.raises(InvalidArgument, match=r"1:\d \(held by another consumer\)"):
        sub.redeliver_unacked("c1", np.array(keys([mine[0], theirs[0]])))
    with pytest.raises(InvalidArgument, match=r"\(acknowledged\)"):
        sub.redeliver_unacked("c1", np.array(keys([mine[2]])))
    assert sub.consumer_leases(clock.now_ms())["c1"]["unacked"] == 2
    # the given ones go back now, with their count raised; then all the rest
    assert sub.redeliver_unacked("c1", np.array(keys([mine[0]])), dry_run=True) == 1
    assert sub.redeliver_unacked("c1", np.array(keys([mine[0]]))) == 1
    again = _deliver(sub, clock, "c2")
    assert list(zip(again["ledger_id"], again["entry_id"], strict=True)) == [mine[0]]
    assert again["redelivery_count"] == [1]
    assert sub.redeliver_unacked("c1") == 1
    assert _deliver(sub, clock, "c1")["entry_id"] == [mine[1][1]]


@pytest.mark.parametrize("kind", ["exclusive", "failover"])
def test_redeliver_on_demand_rewinds_a_fifo_subscription(kind):
    sub, clock = make(kind)
    read(sub, obj(1, 0, [NO_DELAY] * 6))
    assert take(sub, clock, "c1", n=4) == [(1, 0), (1, 1), (1, 2), (1, 3)]
    sub.ack("c1", keys([(1, 1)]))
    # given one message, delivery still rewinds to the first unacked and goes on in order
    assert sub.redeliver_unacked("c1", np.array(keys([(1, 2)]))) == 3
    out = _deliver(sub, clock, "c1")
    assert out["entry_id"] == [0, 2, 3, 4, 5]
    assert out["redelivery_count"] == [1, 1, 1, 0, 0]


def test_an_ack_past_the_end_of_the_log_names_no_message_and_acks_nothing():
    sub, clock = make()
    read(sub, obj(1, 0, [NO_DELAY] * 3))
    sub.on_read([], [(1, None)], (1, 2))  # the log's last entry is 1:2
    got = take(sub, clock, "c1")
    with pytest.raises(InvalidArgument, match=r"1048576:5 past the end of t/0/s .*1:2"):
        sub.ack("c1", keys([got[0], (2**20, 5)]))
    assert sub.counters["acked"] == 0
    # any consumer may ack a message that exists, as Pulsar's ack by id; counted once
    sub.add_consumer("c2")
    assert sub.ack("c2", keys(got)) == 3 and sub.ack("c1", keys(got)) == 0
    assert sub.counters["acked"] == 3


def test_read_ahead_is_bounded():
    sub, clock = make(read_ahead_entries=5)
    assert sub.wants_read()
    read(sub, obj(1, 0, [NO_DELAY] * 5))
    assert not sub.wants_read()
    take(sub, clock, n=3)
    assert sub.wants_read() and sub.ready_count() == 2


def test_a_restarted_subscription_marks_possibly_delivered_messages_and_skips_acked_ones():
    cursor = Cursor()
    cursor.learn_ledgers([(1, None)])
    cursor.ack(np.array([1, 1]), np.array([0, 2]))
    sub, clock = make(cursor=cursor, dispatched_before=(1, 3))
    read(sub, obj(1, 0, [NO_DELAY] * 5))
    # below the old dispatch mark: may have gone out before the restart
    w = wire(sub.deliver("c1", [], 10, clock.now_ms()))
    assert list(zip(w["entry_id"], w["redelivery_count"], strict=True)) == [(1, 1)]
    # beyond it: only once the mark has moved (persisted first, by the actor)
    assert sub.wanted_mark() == (1, 3 + DISPATCH_MARK_STEP)
    move_mark(sub)
    w = wire(sub.deliver("c1", [], 10, clock.now_ms()))
    assert list(zip(w["entry_id"], w["redelivery_count"], strict=True)) == [(3, 0), (4, 0)]


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
    sub, _ = make(clock=clock, tracker=tracker)
    read(sub, obj(1, 0, [T0 + 50] * 4), obj(2, 0, [T0 + 60] * 2), ledgers=((1, 4), (2, None)))
    assert sub.stats()["delayed"] == 6
    clock.advance(60)
    got = take(sub, clock)
    assert sorted(got) == [(1, 0), (1, 1), (1, 2), (1, 3), (2, 0), (2, 1)]
    assert position_of(key_of(2, 1)) == (2, 1)


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
    sub, clock = make()
    assert sub.learn_cancels([((1, 5), (1, 1)), ((1, 6), (1, 3))]) == 2
    read(
        sub,
        obj(1, 0, [NO_DELAY, NO_DELAY, T0 + 10, T0 + 10]),
        obj(1, 4, [NO_DELAY] * 3, cancels={1: (1, 1), 2: (1, 3)}),
    )
    clock.advance(10)
    assert sorted(take(sub, clock)) == [(1, 0), (1, 2), (1, 4)]
    assert sub.cancel(1, 1, marker=(1, 5)) is True  # the caller's retry agrees
    assert all(sub.cursor.is_acked(1, e) for e in (1, 3, 5, 6))  # targets and markers


def test_a_restart_skips_the_log_its_buckets_cover_and_rereads_only_loose_positions():
    clock, store, registry = ManualClock(T0), MemoryObjectStore(), InMemoryBucketRegistry()

    def life(cursor=None, dispatched_before=(-1, -1)):
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
        )[0]

    d1, d2, d3 = T0 + 1_000, T0 + 2_000, T0 + 3_000
    l1 = obj(11, 0, [NO_DELAY, d1, d1, NO_DELAY, d1])
    l2 = obj(12, 0, [d2, d2, d2, NO_DELAY, NO_DELAY], cancels={4: (11, 2)})  # 12:4 cancels 11:2
    l3 = obj(13, 0, [d3, NO_DELAY])
    ledgers = [(11, 5), (12, 5), (13, None)]
    sub = life()
    read(sub, l1, l2, l3, ledgers=ledgers)
    assert sub.tracker.immutable_bucket_count() == 2  # ledgers 11 and 12 sealed
    got = take(sub, clock) + take(sub, clock) + take(sub, clock)  # a mark step per ledger
    assert sorted(got) == [(11, 0), (11, 3), (12, 3), (13, 1)]
    sub.ack("c1", keys([(11, 0), (13, 1)]))
    move_mark(sub)
    saved, dispatched = Cursor.decode(sub.cursor.encode(sub.dispatch_mark))

    sub = life(saved, dispatched)
    assert sub.resume_after_buckets(ledgers) == 2
    assert sub.read_position == (13, 0)  # ledgers 11 and 12 are not read again
    assert sorted(position_of(k) for k in sub.unread) == [(11, 3), (12, 3)]
    assert sub.next_unread(1) == keys([(11, 3)])
    loose = sub.next_unread(10)
    assert sub.on_reread(rows([l1, l2], loose), loose) == 2 and not sub.unread
    read(sub, l1, l2, l3, ledgers=ledgers)  # the sequential read takes only ledger 13 in
    assert sub.stats()["delayed"] == 6  # 11:1, 11:4, 12:0-2 from the buckets; 13:0 re-read
    w = wire(sub.deliver("c1", [], 10, clock.now_ms()))
    got = list(zip(w["ledger_id"], w["entry_id"], w["redelivery_count"], strict=True))
    assert got == [(11, 3, 1), (12, 3, 1)]
    clock.advance(3_000)
    got = take(sub, clock)
    assert sorted(got) == [(11, 1), (11, 4), (12, 0), (12, 1), (12, 2), (13, 0)]  # never 11:2


def test_a_loose_position_cancelled_before_its_reread_is_never_delivered():
    sub, clock = make(
        tracker=BucketDelayedDeliveryTracker(
            store=MemoryObjectStore(),
            registry=InMemoryBucketRegistry(),
            name="subs/t/0/s",
            clock=ManualClock(T0),
            min_index_count_per_bucket=1,
        )
    )
    sub.unread.update(keys([(1, 0), (1, 1)]))  # what resume_after_buckets would find
    assert sub.cancel(1, 1, marker=(2, 0)) is True
    loose = keys([(1, 0), (1, 1)])
    assert sub.on_reread(rows([obj(1, 0, [NO_DELAY, NO_DELAY])], loose), loose) == 1
    assert take(sub, clock) == [(1, 0)]


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
    sub, clock = make()
    read(sub, obj(1, 0, [NO_DELAY, NO_DELAY]))
    got = take(sub, clock)
    sub.nack("c1", keys(got), 100, clock.now_ms())
    sub.ack("c1", keys(got[:1]))  # acked while it waits out its nack delay
    clock.advance(100)
    assert take(sub, clock) == [(1, 1)]
    clock.advance(1_000)
    assert take(sub, clock) == []
