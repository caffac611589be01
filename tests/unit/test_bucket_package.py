"""The bucket package's parts on their own: the bucket lifecycle (BucketState), the merge
as a pure function, retry windows on the tracker's clock and the store-write budget."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from pyroaring import BitMap

from raydelay.clock import ManualClock
from raydelay.delayed import BucketDelayedDeliveryTracker, InMemoryBucketRegistry
from raydelay.delayed.bucket import BucketState
from raydelay.delayed.bucket.immutable import LOAD_RETRY_MS
from raydelay.delayed.bucket.merge import StoredSource, merge_segments, pick_window
from raydelay.delayed.bucket.state import Bucket
from raydelay.errors import InvalidArgument, RaydelayError, StorageError
from raydelay.retries import STORE_WRITE
from raydelay.storage import FaultyObjectStore, MemoryObjectStore

NAME = "subs/orders/0/billing"
T0 = 1_000_000


def tracker(store, clock, **kw):
    args = dict(tick_time_ms=1, strict=True, min_index_count_per_bucket=10)
    args.update(kw)
    return BucketDelayedDeliveryTracker(
        store=store, registry=InMemoryBucketRegistry(), name=NAME, clock=clock, **args
    )


def fill(t, ledger, n, first_delay_ms=1_000, step_ms=10):
    es = np.arange(n)
    assert t.add_messages(np.full(n, ledger), es, T0 + first_delay_ms + es * step_ms).all()
    return [(ledger, int(e)) for e in es]


def pop_until(t, clock, until_ms):
    clock.set(until_ms)
    out = []
    while got := t.get_scheduled_messages(1_000):
        out += got
    return out


def a_bucket(state, bucket_id=1, count=10, first_d=T0):
    return Bucket(
        start=bucket_id,
        end=bucket_id,
        bucket_id=bucket_id,
        seg_min=[first_d],
        seg_count=[count],
        seg_max=[first_d + 100],
        next_seg=0,
        state=state,
    )


# -- the bucket lifecycle --------------------------------------------------------------------

MOVES = {
    (BucketState.SEALING, BucketState.PERSISTED),  # its write landed
    (BucketState.PERSISTED, BucketState.MERGING),  # chosen as a merge source
    (BucketState.MERGING, BucketState.PERSISTED),  # the merge failed or was moot
}


@pytest.mark.parametrize("old, new", list(itertools.product(BucketState, BucketState)))
def test_a_bucket_moves_only_along_its_lifecycle(old, new):
    bucket = a_bucket(old)
    if (old, new) in MOVES:
        bucket.move_to(new)
        assert bucket.state is new
    else:
        with pytest.raises(RaydelayError, match=f"from {old.value} to {new.value}"):
            bucket.move_to(new)
        assert bucket.state is old


def test_a_sealing_bucket_becomes_persisted_when_its_write_lands():
    # Given a tracker whose I/O runs only when told, with ledger 1 sealed
    clock, store = ManualClock(T0), MemoryObjectStore()
    t = tracker(store, clock, io="manual", max_indexes_per_segment=4)
    sealed = fill(t, 1, 10)
    fill(t, 2, 1)
    # Then the bucket is sealing: nothing is in the store yet, and due positions are served
    assert [b.state for b in t._immutable.buckets] == [BucketState.SEALING]
    assert store.list("") == []
    # When its write runs and lands
    assert t.run_background_jobs() >= 1
    t.flush()
    # Then it is persisted, and every position comes out once
    assert [b.state for b in t._immutable.buckets] == [BucketState.PERSISTED]
    assert sorted(store.list(f"{NAME}/buckets/1_1_1/")) == [
        f"{NAME}/buckets/1_1_1/{o}" for o in ("meta", "seg-000001", "seg-000002", "seg-000003")
    ]
    clock.set(T0 + 10_000)
    out = []
    for _ in range(20):
        out += t.get_scheduled_messages(1_000)
        t.run_background_jobs()
    assert sorted(out) == sorted(sealed + [(2, 0)])
    t.close()


def test_the_merge_window_skips_buckets_that_are_sealing_or_merging():
    sizes = [(BucketState.PERSISTED, 5), (BucketState.SEALING, 1), (BucketState.PERSISTED, 9)]
    sizes += [(BucketState.PERSISTED, 7), (BucketState.MERGING, 1)]
    buckets = [a_bucket(s, i + 1, n) for i, (s, n) in enumerate(sizes)]
    assert pick_window(buckets) == (2, 4)  # the only two adjacent persisted buckets
    buckets[3].loading = True
    assert pick_window(buckets) is None


# -- the merge as a pure function ----------------------------------------------------------


def cols(d, l, e):  # noqa: E741
    return np.array(d, dtype=np.int64), np.array(l, dtype=np.int64), np.array(e, dtype=np.int64)


def test_merge_segments_interleaves_its_sources_without_their_exclusions():
    # Given a stored source of two segments (entry 1:1 handed out already, so excluded),
    # another of one segment, and unsorted columns still in memory
    seg_a1, seg_a2 = cols([10, 30], [1, 1], [0, 1]), cols([50, 70], [1, 1], [2, 3])
    seg_b1 = cols([20, 40, 60], [2, 2, 2], [0, 1, 2])
    reads = []

    def loader(name, seg):
        def load():
            reads.append(name)
            return seg

        return load

    stored = [
        StoredSource([loader("a1", seg_a1), loader("a2", seg_a2)], {1: BitMap([1])}),
        StoredSource([loader("b1", seg_b1)], None),
    ]
    memory = [cols([65, 15], [3, 3], [1, 0])]
    # When they are merged into segments of at most 3 positions spanning at most 100 ms
    segments = list(merge_segments(stored, memory, max_per_segment=3, max_step_ms=100))
    # Then the segments hold every position but the excluded one, in (deliver_at, ledger,
    # entry) order, cut by count
    got = [list(zip(*(c.tolist() for c in s))) for s in segments]
    assert got == [
        [(10, 1, 0), (15, 3, 0), (20, 2, 0)],
        [(40, 2, 1), (50, 1, 2), (60, 2, 2)],
        [(65, 3, 1), (70, 1, 3)],
    ]
    assert sorted(reads) == ["a1", "a2", "b1"]  # each segment read once


def test_merge_segments_cuts_by_time_step_and_of_nothing_makes_nothing():
    stored = [StoredSource([lambda: cols([0, 50, 150, 151], [1] * 4, [0, 1, 2, 3])], None)]
    segments = list(merge_segments(stored, [], max_per_segment=10, max_step_ms=100))
    assert [s[0].tolist() for s in segments] == [[0, 50], [150, 151]]
    assert list(merge_segments([], [], max_per_segment=10, max_step_ms=100)) == []


# -- retry windows follow the tracker's clock ------------------------------------------------


def test_a_failed_segment_load_is_retried_once_its_window_passes_on_the_clock():
    # Given a sealed bucket of 10 positions in segments of 4 (due +1000..1030, +1040..1070,
    # +1080..1090) whose segment 1 is loaded
    clock, store = ManualClock(T0), FaultyObjectStore(MemoryObjectStore())
    t = tracker(store, clock, max_indexes_per_segment=4)
    sealed = fill(t, 1, 10)
    fill(t, 2, 1)
    # When the load of segment 2 fails once (transiently)
    store.fail_next("get", times=1)
    first = pop_until(t, clock, T0 + 1_070)
    # Then segment 1 goes out, and segment 2 waits out the retry window on the clock
    assert first == sealed[:4] + [(2, 0)]
    assert store.failed["get"] == 1
    assert pop_until(t, clock, T0 + 1_070 + LOAD_RETRY_MS - 1) == []
    assert store.calls["get"] == 0  # no retry before the window has passed
    # and once the window has passed, the rest comes out: nothing lost
    assert pop_until(t, clock, T0 + 1_070 + LOAD_RETRY_MS) == sealed[4:]
    assert store.calls["get"] == 2  # segments 2 and 3
    t.close()


def test_a_failed_merge_is_tried_again_once_its_backoff_passes_on_the_clock():
    class MergeFails(MemoryObjectStore):
        """Fails every write of the merged bucket (ledgers 1-2, id 3) while ``failing``."""

        failing = True

        def put(self, key, data):
            if self.failing and "/1_2_3/" in key:
                raise StorageError("injected merge write failure", retriable=True)
            super().put(key, data)

    # Given a tracker allowed one bucket, and a store that fails the merge's writes
    clock, store = ManualClock(T0), MergeFails()
    t = tracker(store, clock, max_num_buckets=1, max_indexes_per_segment=4)
    expected = fill(t, 1, 10, first_delay_ms=100_000) + fill(t, 2, 10, first_delay_ms=100_000)
    # When ledger 2 seals: two buckets, one allowed, and the merge fails
    t.add_messages([3], [0], [T0 + 100_000])
    t.flush()
    # Then its sources are persisted again, and no retry happens while the clock stands
    assert t.stats()["merged"] == 0 and t.immutable_bucket_count() == 2
    assert [b.state for b in t._immutable.buckets] == [BucketState.PERSISTED] * 2
    store.failing = False
    clock.advance(499)
    t.flush()
    assert t.stats()["merged"] == 0
    # When the clock passes the backoff (0.5 s after a first failure)
    clock.advance(1)
    t.flush()
    # Then the merge is tried again and succeeds, losing nothing
    assert t.stats()["merged"] == 1 and t.immutable_bucket_count() == 1
    assert sorted(pop_until(t, clock, T0 + 200_000)) == sorted(expected + [(3, 0)])
    t.close()


# -- the store-write budget ------------------------------------------------------------------


def test_a_snapshot_write_is_tried_exactly_the_budget_then_kept_in_memory():
    # Given a store whose next puts all fail, more of them than the budget
    clock, store = ManualClock(T0), FaultyObjectStore(MemoryObjectStore())
    t = tracker(store, clock, max_indexes_per_segment=4)
    sealed = fill(t, 1, 10)
    store.fail_next("put", times=STORE_WRITE.attempts + 2)
    # When ledger 1 is sealed
    fill(t, 2, 1)
    t.flush()
    # Then its first segment write was tried exactly STORE_WRITE.attempts times, no more
    assert store.failed["put"] == STORE_WRITE.attempts
    assert store.pending_failures("put") == 2 and store.calls["put"] == 0
    # and the bucket was downgraded: its positions stay in memory, nothing is lost
    assert t.stats()["downgraded"] == 1 and t.immutable_bucket_count() == 0
    assert store.list("") == []
    assert t.number_of_delayed_messages() == 11
    store.reset()
    assert sorted(pop_until(t, clock, T0 + 100_000)) == sorted(sealed + [(2, 0)])
    t.close()


def test_a_snapshot_write_that_fails_within_the_budget_persists():
    clock, store = ManualClock(T0), FaultyObjectStore(MemoryObjectStore())
    t = tracker(store, clock, max_indexes_per_segment=4)
    fill(t, 1, 10)
    store.fail_next("put", times=STORE_WRITE.attempts - 1)
    fill(t, 2, 1)
    t.flush()
    assert store.failed["put"] == STORE_WRITE.attempts - 1
    assert t.stats()["downgraded"] == 0 and t.immutable_bucket_count() == 1
    assert store.calls["put"] == 4  # three segments and the meta, each landed once
    t.close()


def test_io_must_be_one_of_the_modes():
    with pytest.raises(InvalidArgument, match="io: expected one of"):
        tracker(MemoryObjectStore(), ManualClock(T0), io="background")
