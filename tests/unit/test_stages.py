"""Lateness by stage (raydelay.dispatch.stages): what each stage counts, that the stages
add up to the lateness, and how counts of partitions and consumers combine."""

from __future__ import annotations

import numpy as np
import pytest

from raydelay.dispatch.ports import Delivery
from raydelay.dispatch.stages import (
    LATENESS_EDGES_MS,
    STAGES,
    SUBSCRIPTION_STAGES,
    StageCounts,
    bucket_counts,
    handed_out,
    merge,
    quantile_ms,
    returned,
    summary,
)
from raydelay.dispatch.wire import delivery_batch, handed_ms_of
from raydelay.log.entries import NO_DELAY, DelayedRun, Entries, Rows, note_arrival


def _delivery(due, written, counts=None, arrived_ms=0) -> Delivery:
    n = len(due)
    rows = Rows(
        np.arange(n, dtype=np.int64),
        np.asarray(written, dtype=np.int64),
        Entries.build([b"p"] * n, np.asarray(due, dtype=np.int64)),
    )
    note_arrival([rows], arrived_ms)
    counts = np.zeros(n, dtype=np.int64) if counts is None else np.asarray(counts)
    return Delivery(rows, np.arange(n, dtype=np.int64), rows.positions, counts)


def test_a_row_staged_ahead_of_its_time_is_late_only_by_its_wait():
    # Given a row due at 1,000, written at 400 and in the subscription's hands at 500
    out = [_delivery([1_000], [400], arrived_ms=500)]
    # When a receive hands it out at 1,012
    late, stages = handed_out(out, 1_012)
    # Then all of its 12 ms were the subscription's wait
    assert late.tolist() == [12]
    assert dict(zip(SUBSCRIPTION_STAGES, stages[:, 0].tolist(), strict=True)) == {
        "written": 0,
        "reached": 0,
        "waited": 12,
    }


def test_a_row_written_after_its_due_time_counts_that_as_written():
    # Given a row due at 1,000 but written at 1,300, reaching the subscription at 1,350
    out = [_delivery([1_000], [1_300], arrived_ms=1_350)]
    late, stages = handed_out(out, 1_400)
    # Then 300 ms were the producer's, 50 the way to the subscription, 50 its wait
    assert stages[:, 0].tolist() == [300, 50, 50]
    # and the stages add up to the lateness
    assert int(stages.sum()) == int(late.sum()) == 400


def test_a_row_reaching_the_subscription_after_its_due_time_counts_the_gap_as_reached():
    out = [_delivery([1_000, 1_000], [900, 1_100], arrived_ms=1_200)]
    late, stages = handed_out(out, 1_205)
    assert late.tolist() == [205, 205]
    assert stages.T.tolist() == [[0, 200, 5], [100, 100, 5]]
    assert stages.sum(axis=0).tolist() == late.tolist()


def test_a_row_whose_arrival_was_not_noted_counts_its_wait_from_its_due_time():
    out = [_delivery([1_000], [900], arrived_ms=0)]
    assert handed_out(out, 1_030)[1][:, 0].tolist() == [0, 0, 30]


def test_redeliveries_and_immediate_messages_have_no_stages():
    out = [_delivery([1_000, NO_DELAY, 990], [900, 900, 900], counts=[0, 0, 2], arrived_ms=950)]
    late, stages = handed_out(out, 1_010)
    assert late.tolist() == [10] and stages.shape == (3, 1)
    assert handed_out([], 1_000)[1].shape == (3, 0)


def test_arrival_is_noted_once_and_only_on_ledger_objects_and_rows():
    rows = _delivery([1], [1], arrived_ms=0).source
    note_arrival([rows], 500)
    note_arrival([rows], 900)  # (a second look at a shared read keeps the first)
    assert rows.arrived_ms == 500
    run = DelayedRun(1, 0, 10, 5_000)
    note_arrival([run], 700)  # (stands for rows that are not there: nothing to note)
    assert not hasattr(run, "arrived_ms")


def test_the_returned_stage_is_the_replys_age_for_each_first_delivery_of_a_delayed_message():
    due = np.array([100, NO_DELAY, 100, 100])
    counts = np.array([0, 0, 1, 0])
    assert returned(due, counts, handed_ms=1_000, now_ms=1_007).tolist() == [7, 7]
    # (clocks of two machines: a reply that seems to arrive before it was made counts 0)
    assert returned(due, counts, handed_ms=1_000, now_ms=990).tolist() == [0, 0]


def test_a_reply_says_when_it_was_made():
    out = [_delivery([1_000, 2_000], [1, 1], arrived_ms=5)]
    batch = delivery_batch(out, handed_ms=123_456)
    assert handed_ms_of(batch) == 123_456 and batch.num_rows == 2
    assert handed_ms_of(delivery_batch(out)) is None
    assert handed_ms_of(delivery_batch([], handed_ms=5)) is None


def test_counts_add_up_across_partitions_and_summarise_by_stage():
    # Given two partitions' counts and a consumer's
    a, b = StageCounts(SUBSCRIPTION_STAGES), StageCounts(SUBSCRIPTION_STAGES)
    a.add(np.array([[0, 0], [0, 0], [3, 40]]))
    b.add(np.array([[300], [0], [2]]))
    consumer = StageCounts(("returned",))
    consumer.add(np.array([[5, 5, 5]]))
    # When they are merged
    merged = merge([a.as_dict(), b.as_dict(), consumer.as_dict()])
    # Then each stage has every measurement, and its milliseconds
    assert {s: sum(v["counts"]) for s, v in merged.items()} == {
        "written": 3,
        "reached": 3,
        "waited": 3,
        "returned": 3,
    }
    assert merged["waited"]["sum_ms"] == 45 and merged["written"]["sum_ms"] == 300
    rows = {r["stage"]: r for r in summary(merged)}
    assert list(rows) == list(STAGES)
    total = 300 + 45 + 15
    assert rows["written"]["share"] == pytest.approx(300 / total)
    assert sum(r["share"] for r in rows.values()) == pytest.approx(1.0)
    assert rows["waited"]["p50_ms"] == 5 and rows["waited"]["p99_ms"] == 50
    assert rows["reached"]["mean_ms"] == 0


def test_quantiles_are_bucket_edges():
    counts = bucket_counts(np.array([0, 1, 2, 3, 60_000]))
    assert len(counts) == len(LATENESS_EDGES_MS) + 1 and counts.sum() == 5
    assert quantile_ms(counts.tolist(), 0.5) == 2  # (2 is at most 2 ms: the edge 2 bucket)
    assert quantile_ms(counts.tolist(), 0.99) == -1  # past the last edge
    assert quantile_ms([0] * len(counts), 0.5) is None
