"""Lateness by stage (raydelay.dispatch.stages): what each stage counts, that the stages
add up to the lateness, and how counts of partitions and consumers combine."""

from __future__ import annotations

import numpy as np
import pytest

from raydelay.dispatch.ports import Delivery
from raydelay.dispatch.stages import (
    EXACT_ROWS,
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
    got = handed_out(out, 1_012)
    late, stages = got.lateness_ms, got.stages_ms
    # Then all of its 12 ms were the subscription's wait
    assert late.tolist() == [12]
    assert dict(zip(SUBSCRIPTION_STAGES, stages[:, 0].tolist(), strict=True)) == {
        "written": 0,
        "reached": 0,
        "waited": 12,
    }


def test_a_row_handed_out_ahead_of_its_time_is_not_late_at_all():
    # Given rows due at 1,000 and 1,030, in the subscription's hands at 500
    out = [_delivery([1_000, 1_030], [400, 400], arrived_ms=500)]
    # When a receive that asks ahead hands them out at 990
    got = handed_out(out, 990)
    # Then neither counts a negative lateness or stage (the metrics' export drops whole
    # batches of samples that hold one): both are 0 late, every stage 0
    assert got.lateness_ms.tolist() == [0, 0]
    assert got.stages_ms.tolist() == [[0, 0], [0, 0], [0, 0]]


def test_a_row_written_after_its_due_time_counts_that_as_written():
    # Given a row due at 1,000 but written at 1,300, reaching the subscription at 1,350
    out = [_delivery([1_000], [1_300], arrived_ms=1_350)]
    got = handed_out(out, 1_400)
    late, stages = got.lateness_ms, got.stages_ms
    # Then 300 ms were the producer's, 50 the way to the subscription, 50 its wait
    assert stages[:, 0].tolist() == [300, 50, 50]
    # and the stages add up to the lateness
    assert int(stages.sum()) == int(late.sum()) == 400


def test_a_row_reaching_the_subscription_after_its_due_time_counts_the_gap_as_reached():
    out = [_delivery([1_000, 1_000], [900, 1_100], arrived_ms=1_200)]
    got = handed_out(out, 1_205)
    late, stages = got.lateness_ms, got.stages_ms
    assert late.tolist() == [205, 205]
    assert stages.T.tolist() == [[0, 200, 5], [100, 100, 5]]
    assert stages.sum(axis=0).tolist() == late.tolist()


def test_a_row_whose_arrival_was_not_noted_counts_its_wait_from_its_due_time():
    out = [_delivery([1_000], [900], arrived_ms=0)]
    assert handed_out(out, 1_030).stages_ms[:, 0].tolist() == [0, 0, 30]


def test_redeliveries_and_immediate_messages_have_no_stages():
    out = [_delivery([1_000, NO_DELAY, 990], [900, 900, 900], counts=[0, 0, 2], arrived_ms=950)]
    got = handed_out(out, 1_010)
    assert got.lateness_ms.tolist() == [10] and got.stages_ms.shape == (3, 1)
    assert got.weights is None and got.count == 1
    assert handed_out([], 1_000).stages_ms.shape == (3, 0)


def test_a_large_delivery_is_measured_on_an_even_sample_standing_for_all_of_it():
    # Given one delivery of 1,000 rows due at 0..999, written at 0, in hand at 2,000
    n = 1_000
    out = [_delivery(list(range(n)), [0] * n, arrived_ms=2_000)]
    # When it is handed out at 2,010
    got = handed_out(out, 2_010)
    # Then at most EXACT_ROWS rows are measured, and their weights add up to the 1,000
    assert len(got.lateness_ms) <= EXACT_ROWS and got.weights is not None
    assert got.count == n
    counts = StageCounts(SUBSCRIPTION_STAGES)
    counts.add(got.stages_ms, got.weights)
    d = counts.as_dict()
    assert all(sum(d[s]["counts"]) == n for s in SUBSCRIPTION_STAGES)
    # and the sums are those of the rows, to within a sampling step per row's spread:
    # every row waited exactly 10 ms, and reached 2,000 - its due time (1,000 on average)
    assert d["waited"]["sum_ms"] == 10 * n
    assert abs(d["reached"]["sum_ms"] - sum(2_000 - i for i in range(n))) <= 4 * n


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
    assert returned(due, counts, made_ms=1_000, now_ms=1_007) == (7, 2)
    # (clocks of two machines: a reply that seems to arrive before it was made counts 0)
    assert returned(due, counts, made_ms=1_000, now_ms=990) == (0, 2)
    kept = StageCounts(("returned",))
    kept.add_one(0, 7, 2)
    assert kept.as_dict()["returned"] == {
        "counts": bucket_counts(np.array([7, 7])).tolist(),
        "sum_ms": 14,
    }


def test_counts_add_up_across_partitions_and_summarise_by_stage():
    # Given two partitions' counts and a consumer's
    a, b = StageCounts(SUBSCRIPTION_STAGES), StageCounts(SUBSCRIPTION_STAGES)
    a.add(np.array([[0, 0], [0, 0], [3, 40]]))
    b.add(np.array([[300], [0], [2]]))
    consumer = StageCounts(("returned",))
    consumer.add_one(0, 5, 3)
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


def test_the_metrics_sample_counts_every_message_a_measurement_stands_for():
    from raydelay.actors.metrics import Sampler

    sample = Sampler(1_000)
    # three measurements standing for 2, 1 and 4 messages: 7 observations
    assert sorted(sample.pick(3, np.array([2, 1, 4])).tolist()) == [0, 0, 1, 2, 2, 2, 2]
    # then a lot larger than the second's room left: that room's worth, spread over it
    picked = sample.pick(500, np.full(500, 4))
    assert len(picked) == 993 and picked.min() >= 0 and picked.max() < 500
    assert sample.pick(5) is None  # (the second is full)
