"""Scenario tests for both trackers, after the behaviours Pulsar's tracker tests pin down."""

from __future__ import annotations

import numpy as np
import pytest

from raydelay.clock import ManualClock
from raydelay.delayed import (
    BucketDelayedDeliveryTracker,
    DelayedDeliveryTracker,
    InMemoryBucketRegistry,
    InMemoryDelayedDeliveryTracker,
)
from raydelay.errors import InvalidArgument
from raydelay.storage import MemoryObjectStore

NAME = "subs/orders/0/billing"


def make(kind: str, clock: ManualClock, **kw):
    if kind == "memory":
        kw.pop("min_index_count_per_bucket", None)
        return InMemoryDelayedDeliveryTracker(clock=clock, **kw)
    kw.setdefault("store", MemoryObjectStore())
    kw.setdefault("registry", InMemoryBucketRegistry())
    return BucketDelayedDeliveryTracker(name=NAME, clock=clock, **kw)


def drain(tracker, n: int = 1_000_000) -> list[tuple[int, int]]:
    out = []
    while True:
        got = tracker.get_scheduled_messages(10_000)
        if not got:
            return out
        out += got
        if len(out) >= n:
            return out


@pytest.fixture(params=["memory", "bucket"])
def kind(request):
    return request.param


# -- core rules ---------------------------------------------------------------------------


def test_basic_flow(kind):
    clock = ManualClock(1_000)
    t = make(kind, clock, tick_time_ms=1)
    assert isinstance(t, DelayedDeliveryTracker)
    for i, d in enumerate([1_010, 1_020, 1_030, 1_040, 1_050]):
        assert t.add_message(1, i, d) is True
    assert t.number_of_delayed_messages() == 5
    assert t.buffer_memory_usage() > 0  # what it tracks takes room
    assert t.has_message_available() is False
    assert t.next_delivery_time() == 1_010
    assert t.get_scheduled_messages(10) == []
    clock.set(1_029)  # cutoff = now + tick = 1030
    assert t.has_message_available() is True
    assert t.get_scheduled_messages(10) == [(1, 0), (1, 1), (1, 2)]
    assert t.number_of_delayed_messages() == 2
    clock.set(1_100)
    assert t.get_scheduled_messages(10) == [(1, 3), (1, 4)]
    assert t.number_of_delayed_messages() == 0
    assert t.next_delivery_time() is None


def test_add_within_the_tick_is_delivered_now(kind):
    clock = ManualClock(1_000)
    t = make(kind, clock, tick_time_ms=10)
    assert t.add_message(1, 1, 1_005) is False  # within the tick
    assert t.add_message(1, 2, 1_010) is False  # exactly at the cutoff
    assert t.add_message(1, 3, 1_011) is True
    assert t.add_message(1, 4, -1) is False  # negative: deliver now
    assert t.add_message(1, 5, 999) is False  # in the past
    assert t.number_of_delayed_messages() == 1


def test_strict_cutoff_never_delivers_early(kind):
    clock = ManualClock(1_000)
    t = make(kind, clock, tick_time_ms=1_000, strict=True)
    assert t.add_message(1, 1, 1_000) is False
    assert t.add_message(1, 2, 1_001) is True  # a tick would have made this due
    assert t.get_scheduled_messages(10) == []
    assert t.has_message_available() is False
    clock.set(1_001)
    assert t.get_scheduled_messages(10) == [(1, 2)]


def test_same_deliver_at_comes_out_in_position_order(kind):
    clock = ManualClock(0)
    t = make(kind, clock, tick_time_ms=1, strict=True)
    for pos in [(3, 1), (1, 5), (2, 0), (1, 2)]:
        t.add_message(*pos, 100)
    clock.set(100)
    assert t.get_scheduled_messages(2) == [(1, 2), (1, 5)]
    assert t.get_scheduled_messages(2) == [(2, 0), (3, 1)]


def test_max_smaller_than_the_due_set_takes_the_earliest(kind):
    clock = ManualClock(0)
    t = make(kind, clock, tick_time_ms=1, strict=True)
    deliver_ats = [50, 10, 40, 20, 30, 60, 70]
    for i, d in enumerate(deliver_ats):
        t.add_message(1, i, d)
    clock.set(1_000)
    first = t.get_scheduled_messages(3)
    assert first == [(1, 1), (1, 3), (1, 4)]  # deliver_at 10, 20, 30, sorted by position
    assert t.get_scheduled_messages(3) == [(1, 0), (1, 2), (1, 5)]
    assert t.get_scheduled_messages(3) == [(1, 6)]
    assert t.get_scheduled_messages(0) == []


def test_duplicates_count_once_and_come_out_once(kind):
    clock = ManualClock(0)
    t = make(kind, clock, tick_time_ms=1)
    assert t.add_message(1, 1, 100) is True
    assert t.add_message(1, 1, 100) is True
    assert bool(t.add_messages([1, 1], [1, 1], [100, 100]).all())
    assert t.number_of_delayed_messages() == 1
    clock.set(200)
    assert t.get_scheduled_messages(10) == [(1, 1)]
    assert t.get_scheduled_messages(10) == []


def test_batch_add_follows_the_same_rules(kind):
    clock = ManualClock(1_000)
    t = make(kind, clock, tick_time_ms=10)
    got = t.add_messages(
        np.array([1, 1, 1, 2]), np.array([0, 1, 2, 0]), np.array([-1, 1_005, 5_000, 9_000])
    )
    assert got.dtype == bool
    assert got.tolist() == [False, False, True, True]
    # a later due add of the same position in one batch untracks it, as one-by-one adds would
    got = t.add_messages([3, 3], [7, 7], [5_000, 1_000])
    assert got.tolist() == [True, False]
    assert not t.contains_message(3, 7)
    assert t.number_of_delayed_messages() == 2


def test_cancel_removes_wherever_it_is(kind):
    clock = ManualClock(0)
    t = make(kind, clock, tick_time_ms=1)
    t.add_messages([1, 1, 1], [0, 1, 2], [100, 100, 100])
    assert t.contains_message(1, 1)
    assert t.remove_message(1, 1) is True
    assert t.remove_message(1, 1) is False
    assert t.remove_message(9, 9) is False
    assert not t.contains_message(1, 1)
    assert t.number_of_delayed_messages() == 2
    clock.set(500)
    assert t.get_scheduled_messages(10) == [(1, 0), (1, 2)]


def test_expired_re_add_untracks(kind):
    clock = ManualClock(0)
    t = make(kind, clock, tick_time_ms=1)
    assert t.add_message(1, 1, 100) is True
    assert t.add_message(1, 1, 0) is False  # expiry before dedup
    assert not t.contains_message(1, 1)
    assert t.number_of_delayed_messages() == 0
    clock.set(500)
    assert t.get_scheduled_messages(10) == []


def test_reset_tick_time_moves_the_cutoff(kind):
    clock = ManualClock(0)
    t = make(kind, clock, tick_time_ms=1)
    t.add_message(1, 1, 50)
    assert t.get_scheduled_messages(10) == []
    t.reset_tick_time(100)
    assert t.tick_time_ms == 100
    assert t.get_scheduled_messages(10) == [(1, 1)]
    with pytest.raises(InvalidArgument, match="tick_time_ms"):
        t.reset_tick_time(0)


def test_bad_input_is_named_and_changes_nothing(kind):
    clock = ManualClock(0)
    t = make(kind, clock, tick_time_ms=1)
    cases = [
        (lambda: t.add_messages([1, 2], [1], [5, 5]), "lengths differ"),
        (lambda: t.add_messages([1], [1], [5.5]), "deliver_ats: expected ints"),
        (lambda: t.add_messages([1], [-1], [5]), "entry_ids"),
        (lambda: t.add_messages([-1], [1], [5]), "ledger_ids"),
        (lambda: t.add_message(1, 1, "soon"), "deliver_at_ms"),
        (lambda: t.add_message(1.0, 1, 5), "ledger_id"),
        (lambda: t.add_message(1, 2**33, 5), "entry_id"),
        (lambda: t.get_scheduled_messages(-1), "max_messages"),
        (lambda: t.get_scheduled_messages(True), "max_messages"),
        (lambda: t.remove_message(1, "x"), "entry_id"),
    ]
    for call, field in cases:
        with pytest.raises(InvalidArgument, match=field):
            call()
    assert t.number_of_delayed_messages() == 0


def test_constructor_arguments_are_checked():
    with pytest.raises(InvalidArgument, match="tick_time_ms"):
        InMemoryDelayedDeliveryTracker(clock=ManualClock(), tick_time_ms=0)
    with pytest.raises(InvalidArgument, match="clock"):
        InMemoryDelayedDeliveryTracker(clock=object())
    with pytest.raises(InvalidArgument, match="max_num_buckets"):
        make("bucket", ManualClock(), max_num_buckets=0)
    with pytest.raises(InvalidArgument, match="store"):
        make("bucket", ManualClock(), store=object())
    with pytest.raises(InvalidArgument, match="key"):
        BucketDelayedDeliveryTracker(
            store=MemoryObjectStore(),
            registry=InMemoryBucketRegistry(),
            name="../x",
            clock=ManualClock(),
        )


# -- in-memory only: fixed-delay pause --------------------------------------------------------


def test_fixed_delays_pause_deliveries_once_the_lookahead_is_full():
    clock = ManualClock(0)
    t = InMemoryDelayedDeliveryTracker(clock=clock, tick_time_ms=1, fixed_delay_lookahead=10)
    for i in range(9):
        t.add_message(1, i, 1_000 + i)
    assert t.should_pause_all_deliveries() is False  # not enough yet
    t.add_message(1, 9, 1_009)
    assert t.should_pause_all_deliveries() is True
    clock.set(1_000)  # something is due: deliver, do not pause
    assert t.should_pause_all_deliveries() is False
    assert t.get_scheduled_messages(100) == [(1, 0), (1, 1)]


def test_mixed_delays_never_pause():
    clock = ManualClock(0)
    t = InMemoryDelayedDeliveryTracker(clock=clock, tick_time_ms=1, fixed_delay_lookahead=10)
    for i in range(10):
        t.add_message(1, i, 1_000 + i)
    t.add_message(1, 10, 500)  # far below the highest seen: not a fixed delay
    assert t.should_pause_all_deliveries() is False
    for i in range(11, 30):
        t.add_message(1, i, 2_000 + i)
    assert t.should_pause_all_deliveries() is False


def test_no_delay_messages_end_the_fixed_delay_state_and_lookahead_zero_disables():
    clock = ManualClock(0)
    t = InMemoryDelayedDeliveryTracker(clock=clock, tick_time_ms=1, fixed_delay_lookahead=10)
    assert t.add_message(1, 0, -1) is False
    for i in range(1, 20):
        t.add_message(1, i, 1_000 + i)
    assert t.should_pause_all_deliveries() is False
    off = InMemoryDelayedDeliveryTracker(clock=clock, tick_time_ms=1, fixed_delay_lookahead=0)
    for i in range(20):
        off.add_message(1, i, 1_000 + i)
    assert off.should_pause_all_deliveries() is False


def test_draining_resets_the_fixed_delay_state():
    clock = ManualClock(0)
    t = InMemoryDelayedDeliveryTracker(clock=clock, tick_time_ms=1, fixed_delay_lookahead=3)
    t.add_message(1, 0, -1)  # ends the fixed-delay state
    t.add_message(1, 1, 10)
    clock.set(20)
    assert t.get_scheduled_messages(10) == [(1, 1)]
    for i in range(2, 5):
        t.add_message(1, i, 100 + i)
    assert t.should_pause_all_deliveries() is True
