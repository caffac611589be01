"""Bucket tracker scenarios: sealing, segments, recovery, merging, failures and cleanup."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from raydelay.clock import ManualClock
from raydelay.delayed import BucketDelayedDeliveryTracker, InMemoryBucketRegistry
from raydelay.delayed.sealed import (
    bucket_key,
    cut_segments,
    decode_index,
    decode_meta,
    decode_segment,
)
from raydelay.errors import CodecError, InvalidArgument, RaydelayError, StorageError
from raydelay.retries import STORE_WRITE
from raydelay.storage import FaultyObjectStore, LocalDirObjectStore, MemoryObjectStore

NAME = "subs/orders/0/billing"
T0 = 1_000_000
B111 = bucket_key(1, 1, 1)  # the first bucket: ledger 1, id 1


class Env:
    """A store, a registry and a clock that outlive tracker instances (restarts)."""

    def __init__(self, store=None, **defaults):
        self.clock = ManualClock(T0)
        self.store = store if store is not None else FaultyObjectStore(MemoryObjectStore())
        self.registry = InMemoryBucketRegistry()
        self.defaults = dict(
            tick_time_ms=1, strict=True, min_index_count_per_bucket=10, max_indexes_per_segment=4
        )
        self.defaults.update(defaults)

    def tracker(self, **kw):
        args = {**self.defaults, **kw}
        return BucketDelayedDeliveryTracker(
            store=self.store, registry=self.registry, name=NAME, clock=self.clock, **args
        )

    def bucket_keys(self):
        return sorted({k.split("/")[5] for k in self.store.list(f"{NAME}/buckets/")})

    def objects(self, bucket_key):
        return [k.rsplit("/", 1)[1] for k in self.store.list(f"{NAME}/buckets/{bucket_key}/")]


def fill(t, ledger, n, first_delay_ms=1_000, step_ms=10, start_entry=0):
    es = np.arange(start_entry, start_entry + n)
    ds = T0 + first_delay_ms + (es - start_entry) * step_ms
    assert t.add_messages(np.full(n, ledger), es, ds).all()
    return [(ledger, int(e)) for e in es]


def seal_first_bucket(env):
    """A tracker whose ledger 1 (10 positions) sealed into bucket 1_1_1 when ledger 2 came."""
    t = env.tracker()
    sealed = fill(t, 1, 10)
    fill(t, 2, 1)
    return t, sealed


def drain(t, clock, until_ms):
    out = []
    clock.set(until_ms)
    while True:
        got = t.get_scheduled_messages(1_000)
        if not got:
            return out
        out += got


# -- structure ------------------------------------------------------------------------------


def test_seal_happens_only_at_a_ledger_boundary():
    env = Env()
    t = env.tracker()
    fill(t, 1, 15)  # past min_index_count, but the ledger is still open
    assert t.immutable_bucket_count() == 0
    fill(t, 1, 3, start_entry=15)
    assert t.immutable_bucket_count() == 0
    fill(t, 2, 1)  # the first position of a later ledger seals ledger 1
    assert t.immutable_bucket_count() == 1
    assert env.bucket_keys() == [B111]
    assert list(env.registry.list(NAME)) == [B111]


def test_below_the_minimum_no_seal_even_across_ledgers():
    env = Env()
    t = env.tracker()
    for ledger in range(1, 6):
        fill(t, ledger, 1)
    assert t.immutable_bucket_count() == 0
    assert env.store.list("") == []


def test_segments_are_cut_by_count_and_written_as_objects():
    # the partition's own bucket format: data (Arrow segments), index, meta
    env = Env()
    t, _ = seal_first_bucket(env)
    assert env.objects(B111) == ["data", "index", "meta"]
    meta = decode_meta(env.store.get(f"{NAME}/buckets/{B111}/meta"), "meta")
    assert [s.count for s in meta.segments] == [4, 4, 2]
    index = decode_index(env.store.get(f"{NAME}/buckets/{B111}/index"))
    assert sorted(int(k) & 0xFFFFFFFF for k in index[0]) == [0, 1, 2, 3]
    data = env.store.get(f"{NAME}/buckets/{B111}/data")
    seg = meta.segments[1]
    rows = decode_segment(data[seg.offset : seg.offset + seg.length])
    assert rows.positions.tolist() == [(1 << 32) | e for e in (4, 5, 6, 7)]
    assert msgpack.unpackb(env.registry.list(NAME)[B111]) == [10, 3]


def test_segments_are_cut_by_time_step():
    d = np.array([0, 50, 99, 100, 150, 250, 251])
    assert cut_segments(d, max_indexes=100, max_step_ms=100) == [(0, 4), (4, 6), (6, 7)]
    assert cut_segments(d, max_indexes=2, max_step_ms=1_000) == [(0, 2), (2, 4), (4, 6), (6, 7)]
    assert cut_segments(np.array([5]), 3, 1) == [(0, 1)]


def test_contains_follows_positions_through_buckets():
    env = Env()
    t, sealed = seal_first_bucket(env)
    assert all(t.contains_message(*p) for p in sealed)
    assert not t.contains_message(1, 10)
    out = drain(t, env.clock, T0 + 10_000)
    assert out == sorted(sealed + [(2, 0)])
    assert not any(t.contains_message(*p) for p in sealed)


def test_a_covered_ledger_goes_straight_to_the_shared_queue():
    env = Env()
    t, _ = seal_first_bucket(env)
    assert t.add_message(1, 50, T0 + 5_000)  # ledger 1 is already sealed
    assert t.immutable_bucket_count() == 1
    assert (1, 50) in drain(t, env.clock, T0 + 10_000)


def test_a_bucket_is_deleted_after_its_last_segment():
    env = Env()
    t, _ = seal_first_bucket(env)
    assert env.bucket_keys() == [B111]
    out = drain(t, env.clock, T0 + 10_000)
    assert len(out) == 11
    assert t.immutable_bucket_count() == 0
    assert env.bucket_keys() == []
    assert env.registry.list(NAME) == {}


def test_only_one_segment_per_bucket_is_resident_until_needed():
    env = Env(min_index_count_per_bucket=100, max_indexes_per_segment=10)
    t = env.tracker()
    fill(t, 1, 100, step_ms=1_000)
    fill(t, 2, 1, first_delay_ms=500_000)
    assert t.stats()["segments_loaded"] == 0  # nothing is read before it comes due
    env.clock.set(T0 + 1_000 + 9 * 1_000)  # the 10 positions of segment 1 are due
    assert len(t.get_scheduled_messages(1_000)) == 10
    assert t.stats()["segments_loaded"] == 1  # segment 1 only; 9 more wait in the store
    env.clock.set(T0 + 1_000 + 14 * 1_000)
    assert len(t.get_scheduled_messages(1_000)) == 5
    assert t.stats()["segments_loaded"] == 2
    assert t.stats()["loaded_indexes"] <= 10 + 1  # segment 2's rest, and the mutable one


# -- recovery ---------------------------------------------------------------------------------


def test_recovery_restores_counts_and_delivers_everything_once_more_at_most():
    env = Env()
    t = env.tracker()
    sealed = fill(t, 1, 10) + fill(t, 2, 10) + fill(t, 3, 10)
    fill(t, 4, 3)  # mutable: lost on restart, re-read from the log
    t.flush()
    assert t.immutable_bucket_count() == 3
    t2 = env.tracker()
    assert t2.immutable_bucket_count() == 3
    assert t2.number_of_delayed_messages() == 30
    assert all(t2.contains_message(*p) for p in sealed)
    # the subscription replays the log from mark-delete: sealed ones are recognised
    assert t2.add_messages(
        [1, 4, 4, 4], [0, 0, 1, 2], [T0 + 1_000, T0 + 1_000, T0 + 1_010, T0 + 1_020]
    ).all()
    assert t2.number_of_delayed_messages() == 33
    out = drain(t2, env.clock, T0 + 100_000)
    assert sorted(out) == sorted(set(out)) and len(out) == 33


def test_recovery_skips_segments_that_are_already_due():
    env = Env()
    t = env.tracker()
    fill(t, 1, 10, step_ms=1_000)  # segments by 4: [1000..4000], [5000..8000], [9000, 10000]
    fill(t, 2, 1, first_delay_ms=50_000)
    t.flush()
    env.clock.set(T0 + 8_000)
    t2 = env.tracker()
    # segments 1 and 2 are wholly due: their positions are re-read from the log and go out now
    assert t2.number_of_delayed_messages() == 2
    assert not t2.contains_message(1, 0)
    assert t2.contains_message(1, 8)
    env.clock.set(T0 + 5_000_000)
    t3 = env.tracker()
    assert t3.immutable_bucket_count() == 0
    t3.flush()
    assert env.bucket_keys() == []  # a wholly due bucket is deleted on recovery


def test_a_cancel_inside_a_sealed_bucket_survives_a_restart():
    env = Env()
    t, _ = seal_first_bucket(env)
    assert t.remove_message(1, 7) is True  # in segment 2, not loaded
    assert t.remove_message(1, 1) is True  # in the loaded segment 1
    t.flush()
    t2 = env.tracker()
    assert not t2.contains_message(1, 7)
    out = drain(t2, env.clock, T0 + 100_000)
    assert (1, 7) not in out and (1, 1) not in out
    assert len(out) == 8


@pytest.mark.parametrize("step", ["merged-meta", "registry-put", "source-removed"])
def test_a_crashed_merge_is_resolved_on_recovery(step):
    # Given three sealed buckets, and a tracker that merges them and dies at a step
    env = Env()
    t = env.tracker()
    for ledger in (1, 2, 3):
        fill(t, ledger, 10)
    fill(t, 4, 1)
    t.flush()

    class Dies(Exception):
        pass

    registry, store = env.registry, env.store
    real_put, real_remove, real_store_put = registry.put, registry.remove, store.put
    if step == "merged-meta":  # the merged meta written, nothing registered

        def put(name, key, record):
            raise Dies()

        registry.put = put
    elif step == "registry-put":  # registered, no source removed

        def remove(name, key):
            raise Dies()

        registry.remove = remove
    else:  # one source removed, not the other

        def remove(name, key, calls=[]):  # noqa: B006
            calls.append(key)
            if len(calls) > 1:
                raise Dies()
            real_remove(name, key)

        registry.remove = remove
    t._max_buckets = 1  # (the tracker over the same store, now told to merge)
    t._merge()
    registry.put, registry.remove, store.put = real_put, real_remove, real_store_put
    # When a new tracker comes up over the same store and registry
    t2 = env.tracker(max_num_buckets=10)
    # Then every position is there once, in whole buckets, nothing left over
    assert t2.number_of_delayed_messages() == 30
    owned = {r.key for key in env.registry.list(NAME) for r in t2._sealed.meta(key).runs}
    assert sorted(owned) == sorted([bucket_key(1, 1, 1), bucket_key(2, 2, 2), bucket_key(3, 3, 3)])
    assert set(env.bucket_keys()) == owned | set(env.registry.list(NAME))
    out = drain(t2, env.clock, T0 + 100_000)
    assert len(out) == len(set(out)) == 30


# -- merging ---------------------------------------------------------------------------------


@pytest.mark.parametrize("max_buckets", [1, 2, 3, 10])
def test_merges_keep_the_bucket_count_at_the_limit_and_lose_nothing(max_buckets):
    env = Env(max_num_buckets=max_buckets)
    t = env.tracker()
    expected = []
    rng = np.random.default_rng(max_buckets)
    for ledger in range(1, 16):
        es = np.arange(10)
        ds = T0 + 1_000 + rng.integers(0, 60_000, 10)
        t.add_messages(np.full(10, ledger), es, ds)
        expected += [(int(d), ledger, int(e)) for d, e in zip(ds, es)]
    t.flush()
    assert t.immutable_bucket_count() <= max_buckets
    assert t.number_of_delayed_messages() == 150
    assert t.stats()["merged"] >= 1  # 14 sealed buckets, at most 10 allowed
    delivered = []
    for step in range(0, 62_000, 500):  # step the clock: never early, nothing lost, no duplicate
        env.clock.set(T0 + step)
        for pos in t.get_scheduled_messages(1_000):
            delivered.append(pos)
    by_pos = {(lg, e): d for d, lg, e in expected}
    assert sorted(delivered) == sorted(by_pos)
    assert len(delivered) == len(set(delivered))
    t.flush()
    assert env.bucket_keys() == [] and env.registry.list(NAME) == {}


def test_merge_window_prefers_the_smallest_adjacent_buckets():
    env = Env(max_num_buckets=4)
    t = env.tracker()
    sizes = [40, 40, 10, 10, 10, 40]
    for i, n in enumerate(sizes):
        fill(t, i + 1, n, first_delay_ms=100_000)
    fill(t, 7, 1, first_delay_ms=100_000)
    t.flush()
    # a fifth bucket merges the smallest adjacent pair (ledgers 3-4, id 6), a sixth the
    # smallest pair again (that one and ledger 5, id 8): 4 buckets, the big ones untouched
    assert sorted(env.registry.list(NAME)) == [
        bucket_key(1, 1, 1),
        bucket_key(2, 2, 2),
        bucket_key(3, 5, 8),
        bucket_key(6, 6, 7),
    ]
    assert t.number_of_delayed_messages() == 151


# -- failures and cleanup ---------------------------------------------------------------------


def test_a_write_failing_every_try_downgrades_the_bucket_to_memory_and_loses_nothing():
    env = Env()
    t = env.tracker()
    sealed = fill(t, 1, 10)
    env.store.fail_next("put", times=STORE_WRITE.attempts)  # every try of the first put
    fill(t, 2, 1)
    t.flush()
    assert t.immutable_bucket_count() == 0
    assert t.stats()["downgraded"] == 1
    assert env.bucket_keys() == [] and env.registry.list(NAME) == {}
    assert t.number_of_delayed_messages() == 11
    out = drain(t, env.clock, T0 + 100_000)
    assert sorted(out) == sorted(sealed + [(2, 0)])


def test_one_failed_write_is_retried_and_the_bucket_persists():
    env = Env()
    t = env.tracker()
    fill(t, 1, 10)
    env.store.fail_next("put", times=1)
    fill(t, 2, 1)
    t.flush()
    assert t.immutable_bucket_count() == 1
    assert t.stats()["downgraded"] == 0
    assert env.objects(B111) == ["data", "index", "meta"]


@pytest.mark.parametrize("landed", [False, True], ids=["put-failed", "reply-lost"])
def test_a_failed_registry_write_downgrades_and_leaves_nothing_half_registered(landed):
    class FlakyRegistry(InMemoryBucketRegistry):
        """The put fails; with ``landed``, only after it was applied (a coordinator killed
        before it could answer)."""

        def put(self, name, key, record):
            if landed:
                super().put(name, key, record)
            raise StorageError("coordinator unreachable", retriable=False)

    env = Env()
    env.registry = FlakyRegistry()
    t, sealed = seal_first_bucket(env)
    t.flush()
    assert t.immutable_bucket_count() == 0  # downgraded: the positions stay in memory
    assert env.registry.list(NAME) == {} and env.store.list("") == []
    assert sorted(drain(t, env.clock, T0 + 100_000)) == sorted(sealed + [(2, 0)])


def test_recovery_drops_a_registry_entry_whose_objects_are_gone():
    env = Env()
    t, _ = seal_first_bucket(env)
    t.flush()
    t.close()
    (key,) = env.registry.list(NAME)
    for k in env.store.list(f"{NAME}/buckets/{key}/"):
        env.store.delete(k)  # a crash after the registry put, mid-cleanup
    again = env.tracker()
    assert again.immutable_bucket_count() == 0 and env.registry.list(NAME) == {}
    assert again.number_of_delayed_messages() == 0  # the log re-read brings them back


def test_positions_below_mark_delete_are_dropped_and_their_buckets_trimmed():
    md = [0, 0]
    env = Env()
    t = env.tracker(mark_delete=lambda: tuple(md))
    for ledger in (1, 2, 3, 4):
        fill(t, ledger, 10)
    t.flush()
    assert t.immutable_bucket_count() == 3
    md[:] = [3, 0]
    out = drain(t, env.clock, T0 + 100_000)
    assert {lg for lg, _ in out} == {3, 4}
    t.flush()
    assert all(k.split("_")[0] not in (f"{1:020d}", f"{2:020d}") for k in env.bucket_keys())
    assert t.add_message(1, 99, T0 + 200_000) is True  # acknowledged already: dropped
    assert not t.contains_message(1, 99)


def test_clear_deletes_every_snapshot_and_registry_entry():
    env = Env()
    t = env.tracker()
    for ledger in (1, 2, 3):
        fill(t, ledger, 10)
    t.remove_message(1, 5)
    t.flush()
    assert env.store.list("") != []
    t.clear()
    assert env.store.list("") == []
    assert env.registry.list(NAME) == {}
    assert t.number_of_delayed_messages() == 0
    assert t.immutable_bucket_count() == 0
    fill(t, 9, 2)  # still usable
    assert t.number_of_delayed_messages() == 2


def test_a_corrupt_meta_object_fails_recovery_naming_the_key():
    env = Env()
    t, _ = seal_first_bucket(env)
    t.flush()
    env.store.put(f"{NAME}/buckets/{B111}/meta", b"\x00garbage")
    with pytest.raises(CodecError, match=f"{B111} meta"):
        env.tracker()


def test_closed_tracker_refuses_calls():
    env = Env()
    t = env.tracker()
    t.close()
    with pytest.raises(RaydelayError, match="closed"):
        t.add_message(1, 1, T0 + 10)


def test_orphan_objects_are_swept_on_recovery():
    env = Env()
    env.store.put(f"{NAME}/buckets/{bucket_key(5, 5, 9)}/data", b"half-written")
    t = env.tracker()
    t.flush()
    assert env.store.list("") == []


# -- background I/O --------------------------------------------------------------------------


def test_a_local_dir_store_loses_nothing_across_a_restart(tmp_path):
    env = Env(store=LocalDirObjectStore(tmp_path), max_num_buckets=3)
    t = env.tracker()
    expected = []
    for ledger in range(1, 9):
        expected += fill(t, ledger, 10, first_delay_ms=1_000 + ledger)
    t.flush()
    assert t.immutable_bucket_count() <= 3
    t.close()
    t2 = env.tracker()
    assert t2.number_of_delayed_messages() == 70  # ledger 8 was still mutable
    out = drain(t2, env.clock, T0 + 100_000)
    assert sorted(out) == sorted(expected[:70])
    t2.close()


def test_copies_handed_out_never_return_even_through_a_merge():
    env = Env(max_num_buckets=1)
    t = env.tracker()
    fill(t, 1, 10, first_delay_ms=10)  # due at T0+10, +20, ... +100
    fill(t, 2, 1, first_delay_ms=10_000)  # seals ledger 1
    env.clock.set(T0 + 60)  # six due: segment 1 (four) and two of segment 2
    assert t.get_scheduled_messages(100) == [(1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (1, 5)]
    assert t.add_message(1, 4, T0 + 5_000) is True  # a nack: (1, 4) comes back later
    fill(t, 2, 9, first_delay_ms=10_000, start_entry=1)
    fill(t, 3, 1, first_delay_ms=10_000)  # seals ledger 2: two buckets, one allowed: merge
    t.flush()
    assert t.stats()["merged"] == 1 and t.immutable_bucket_count() == 1
    env.clock.set(T0 + 200)
    assert sorted(t.get_scheduled_messages(1_000)) == [(1, 6), (1, 7), (1, 8), (1, 9)]
    env.clock.set(T0 + 5_000)
    assert t.get_scheduled_messages(1_000) == [(1, 4)]  # once, at its new time
    t.close()


# -- due windows --------------------------------------------------------------------------------


def test_due_histogram_counts_sealed_segments_and_the_mutable_bucket_by_window():
    # Given a sealed bucket of ledger 1 (segments due at +1000..1030, +1040..1070 and
    # +1080..1090) and one message of ledger 2 due at +1000
    env = Env()
    t, _ = seal_first_bucket(env)
    edges = np.array([T0 + 1_035, T0 + 1_075])
    # Then each window holds what is due in it; nothing is lost or counted twice
    assert t.due_histogram(edges) == [5, 4, 2]
    # and a cancel is counted out
    assert t.remove_message(2, 0)
    assert t.due_histogram(edges) == [4, 4, 2]
    assert sum(t.due_histogram(edges)) == t.number_of_delayed_messages()


def test_due_histogram_of_the_in_memory_tracker_is_exact():
    from raydelay.delayed import InMemoryDelayedDeliveryTracker

    clock = ManualClock(T0)
    t = InMemoryDelayedDeliveryTracker(clock=clock, tick_time_ms=1, strict=True)
    ds = T0 + np.array([10, 70_000, 4_000_000, 90_000_000, 200_000_000])
    t.add_messages(np.ones(5, dtype=np.int64), np.arange(5), ds)
    t.remove_message(1, 2)
    edges = T0 + np.array([60_000, 3_600_000, 86_400_000])
    assert t.due_histogram(edges) == [1, 1, 0, 2]


def test_a_segment_not_loaded_is_spread_evenly_over_its_due_range():
    from raydelay.delayed.common import due_window_counts
    from raydelay.delayed.index import Membership

    assert due_window_counts(np.array([50]), [], Membership(), [(0, 100, 10)]) == [5, 5]
    counts = due_window_counts(np.array([33, 66]), [], Membership(), [(0, 99, 10)])
    assert sum(counts) == 10 and max(counts) - min(counts) <= 1
    assert due_window_counts(np.array([50]), [], Membership(), [(70, 70, 3)]) == [0, 3]


def test_minus_one_means_one_segment_per_time_step_and_no_merges():
    env = Env(max_indexes_per_segment=-1, max_num_buckets=-1)
    t = env.tracker()
    for ledger in range(1, 13):  # 12 buckets of 10: over the default limit of merges
        t.add_messages(np.full(10, ledger), np.arange(10), np.full(10, T0 + 1_000 + ledger))
    t.flush()
    # 11 sealed (the last ledger's rows wait in the mutable bucket), none merged
    assert t.immutable_bucket_count() == 11 and t.stats()["merged"] == 0
    # each bucket is one segment (its 10 rows are within one time step)
    for key in env.bucket_keys():
        meta = decode_meta(env.store.get(f"{NAME}/buckets/{key}/meta"))
        assert len(meta.segments) == 1
    env.clock.set(T0 + 2_000)
    assert len(t.get_scheduled_messages(1_000)) == 120
    with pytest.raises(InvalidArgument, match="max_num_buckets: must be > 0, or -1"):
        env.tracker(max_num_buckets=0)
