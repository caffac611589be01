"""Rows handed to a consumer ahead of their due time, held by its client until it comes."""

from __future__ import annotations

import pyarrow as pa
import pytest

from raydelay.client.held import HeldRows
from raydelay.clock import ManualClock
from raydelay.dispatch.wire import DELIVERY_SCHEMA


def _rows(*deliver_at: int, first: int = 0) -> pa.RecordBatch:
    n = len(deliver_at)
    return pa.record_batch(
        [
            pa.array([1] * n, pa.int64()),
            pa.array(range(first, first + n), pa.int64()),
            pa.array([0] * n, pa.int64()),
            pa.array(deliver_at, pa.int64()),
            pa.array([0] * n, pa.int64()),
            pa.array([b"x"] * n, pa.binary()),
            pa.array([None] * n, pa.string()),
            pa.array([None] * n, DELIVERY_SCHEMA.field("properties").type),
        ],
        schema=DELIVERY_SCHEMA,
    )


def _entries(rows: list[tuple[int, pa.RecordBatch, int]]) -> list[int]:
    return [e for _, rb, _ in rows for e in rb.column("entry_id").to_pylist()]


def test_rows_due_now_pass_and_the_others_come_out_at_their_instant_in_due_order():
    # Given a client whose clock is the subscription's, and a reply made at 1,000 holding
    # an immediate row, one due already, and three due within the next 50 ms
    clock = ManualClock(1_000)
    held = HeldRows(clock.now_ms)
    held.came(1_000, 1_000)
    now_rows = held.split(0, _rows(-1, 1_040, 990, 1_010, 1_040), 1_000)
    # Then the rows due pass at once, the others are held
    assert now_rows is not None and now_rows.column("entry_id").to_pylist() == [0, 2]
    assert len(held) == 3 and held.wait_s() == pytest.approx(0.010)
    # and none comes out a millisecond before its due time
    clock.set(1_009)
    assert held.release() == []
    clock.set(1_010)
    out = held.release()
    assert _entries(out) == [3]
    assert out[0][2] == 1_010  # (the returned stage starts at the due time, not the reply)
    clock.set(1_039)
    assert held.release() == [] and held.wait_s() == pytest.approx(0.001)
    clock.set(1_040)
    assert _entries(held.release()) == [1, 4]
    assert len(held) == 0 and held.wait_s() is None


def test_a_reply_with_nothing_early_is_passed_on_whole():
    clock = ManualClock(5_000)
    held = HeldRows(clock.now_ms)
    held.came(5_000, 5_000)
    rows = _rows(-1, 4_000, 5_000)
    assert held.split(1, rows, 5_000) is rows and len(held) == 0


@pytest.mark.parametrize("offset_ms", [-700, -3, 0, 4, 900])
def test_nothing_comes_out_before_the_subscriptions_clock_says_it_is_due(offset_ms):
    # Given a subscription whose clock is offset_ms ahead of the client's, and replies
    # made every 4 ms, each with a row due 20 ms later (on the subscription's clock),
    # that take 1-9 ms to come back
    local = ManualClock(100_000)
    held = HeldRows(local.now_ms)
    replies = {}  # arrival (client's clock) -> (made on the subscription's clock, due)
    for i in range(30):
        made = 100_000 + 4 * i
        replies.setdefault(made + 1 + (i * 5) % 9, []).append((made + offset_ms, i))
    due = [100_000 + 4 * i + offset_ms + 20 for i in range(30)]
    out_at: dict[int, int] = {}  # row -> when it came out, on the subscription's clock
    # When the client's clock moves a millisecond at a time, taking in what arrives
    for t in range(100_000, 100_300):
        local.set(t)
        for made_sub, i in replies.get(t, []):
            held.came(made_sub, t)
            first = held.split(0, _rows(due[i], first=i), made_sub)
            for e in [] if first is None else first.column("entry_id").to_pylist():
                out_at[e] = t + offset_ms
        for e in _entries(held.release()):
            out_at[e] = t + offset_ms
    # Then each came out at or after its due time on the subscription's clock, and no
    # later than the best trip back (1 ms) after it
    assert len(out_at) == len(due)
    assert {e: at - due[e] for e, at in out_at.items() if not due[e] <= at <= due[e] + 1} == {}


def test_clear_drops_what_is_held():
    clock = ManualClock(0)
    held = HeldRows(clock.now_ms)
    held.came(0, 0)
    assert held.split(0, _rows(10, 20), 0) is None
    held.clear()
    clock.set(100)
    assert held.release() == [] and len(held) == 0


def test_rows_all_early_and_in_order_are_held_as_they_came():
    clock = ManualClock(0)
    held = HeldRows(clock.now_ms)
    held.came(0, 0)
    rows = _rows(50, 50, 60)
    assert held.split(2, rows, 0) is None
    clock.set(50)
    out = held.release()
    assert [(p, e) for p, rb, _ in out for e in rb.column("entry_id").to_pylist()] == [
        (2, 0),
        (2, 1),
    ]
    clock.set(60)
    assert _entries(held.release()) == [2]
