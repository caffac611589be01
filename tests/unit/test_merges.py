"""Merges of sealed buckets (pure, over an in-memory store): a merged bucket is a new meta
over its sources' runs, read group by group; the registry swaps it in for its sources in
one journaled step that carries each subscription's progress over; a subscription reading
the sources while they are merged hands out every row once; a crash at any step of a
merge leaves the sources valid and the partial merge ignored."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from raydelay.cluster.metadata import Metadata
from raydelay.delayed.index import bitmap64_values
from raydelay.delayed.reader import FINISHED, SealedReader
from raydelay.delayed.sealed import (
    SealedMeta,
    TopicIndex,
    decode_meta,
    encode_meta,
    merge_metas,
    registry_name,
    seal,
)
from raydelay.delayed.store import SealedStore, clean, merge, merge_window, record_of, runs_of
from raydelay.errors import InvalidArgument, Unavailable
from raydelay.log.entries import Entries, LedgerObject
from raydelay.positions import key_of
from raydelay.storage.memory import MemoryObjectStore

NAME = registry_name("t", 0)


def _bucket(sealed: SealedStore, ledger: int, dues: list[int], max_indexes: int = 2):
    """A bucket sealed from one ledger whose entry ``i`` is due at ``dues[i]``, written."""
    entries = Entries.build(
        [b"p%d-%d" % (ledger, i) for i in range(len(dues))], np.asarray(dues, dtype=np.int64)
    )
    index = TopicIndex(min_index_count=1, sealed_through=ledger - 1)
    index.add(LedgerObject(ledger, 0, 0, entries, {}))
    job = index.ledger_closed(ledger)
    meta, data, idx = seal(
        job.rows,
        start_ledger=ledger,
        end_ledger=ledger,
        bucket_id=ledger,
        max_indexes=max_indexes,
        max_step_ms=10**9,
    )
    sealed.write(meta, data, idx)
    return meta


def _load(reader: SealedReader, sealed: SealedStore, now: int) -> None:
    """Every load the reader wants at ``now``, from the store, as the actor does it."""
    while wanted := reader.wanted(now, max_loads=100):
        for ld in wanted:
            meta = reader.buckets[ld.key].meta
            rows = [sealed.segment(p.run_key, p.offset, p.length) for p in ld.reads]
            reader.install(ld.key, ld.no, rows, sealed.part_keys(meta, ld.keys_only))


def _take(reader: SealedReader, sealed: SealedStore, now: int, n: int = 10**6) -> list[int]:
    _load(reader, sealed, now)
    out = []
    for rows, idx, keys in reader.take_due(now, n):
        assert (rows.entries.deliver_at_ms[idx] <= now).all()  # never early
        assert [rows.entries.payloads[i] for i in idx.tolist()] == [
            b"p%d-%d" % (k >> 32, k & 0xFFFFFFFF) for k in keys.tolist()
        ]
        out += keys.tolist()
    return out


def test_a_merged_bucket_owns_its_sources_runs_and_reads_their_segments_in_due_order():
    # Given three buckets of one ledger each, their segments of two rows interleaved in time
    sealed = SealedStore(MemoryObjectStore(), "t", 0)
    a = _bucket(sealed, 1, [100, 400, 700, 1_000])
    b = _bucket(sealed, 2, [200, 500, 800])
    c = _bucket(sealed, 3, [300, 600])
    # When they are merged with groups of about 4 rows
    m = merge_metas([a, b, c], bucket_id=9, group_rows=4)
    # Then the merged bucket covers their ledgers and owns their runs (nothing re-encoded)
    assert (m.start_ledger, m.end_ledger, m.count) == (1, 3, 9)
    assert [r.key for r in m.runs] == [a.key, b.key, c.key]
    assert m.runs[0].segments == a.segments and m.keys == a.keys | b.keys | c.keys
    # and its groups take the runs' segments by earliest deliver_at, whole
    starts = [min(m.runs[r].segments[s].min_d for r, s in g) for g in m.groups]
    assert starts == sorted(starts)
    assert sorted(p for g in m.groups for p in g) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    # and its meta (format 3) decodes to the same, while a sealed bucket's stays format 2
    assert decode_meta(encode_meta(m)) == m
    assert decode_meta(encode_meta(a)).runs[0].key == a.key
    # When a subscription reads it
    merged_written = sealed.write_merged(m, [a, b, c])
    assert merged_written == len(encode_meta(m))  # the meta only: no payload rewritten
    reader = SealedReader(lookahead_ms=0)
    reader.adopt(m)
    # Then rows come out when due, each once, with their payloads
    assert sorted(_take(reader, sealed, 450)) == [
        key_of(1, 0),
        key_of(1, 1),
        key_of(2, 0),
        key_of(3, 0),
    ]
    assert _take(reader, sealed, 450) == []
    assert reader.next_time() == 500
    assert sorted(_take(reader, sealed, 10_000)) == sorted(
        [key_of(2, 1), key_of(3, 1), key_of(1, 2), key_of(2, 2), key_of(1, 3)]
    )
    # and its progress is per run, until all are done
    assert reader.progress()[m.key] == [0, 0, 0]
    assert reader.advance(lambda keys: True) == [m.key]
    assert reader.progress() == {m.key: FINISHED}


def test_merge_rejects_buckets_out_of_order_or_alone():
    sealed = SealedStore(MemoryObjectStore(), "t", 0)
    a, b = _bucket(sealed, 1, [100]), _bucket(sealed, 2, [200])
    with pytest.raises(InvalidArgument, match="overlap or are out of ledger order"):
        merge_metas([b, a], bucket_id=3, group_rows=10)
    with pytest.raises(InvalidArgument, match="at least two"):
        merge_metas([a], bucket_id=3, group_rows=10)


def test_a_subscription_resumes_a_merged_bucket_from_its_progress_per_run():
    # Given a merged bucket of two runs, the first segment of run 1 acknowledged
    sealed = SealedStore(MemoryObjectStore(), "t", 0)
    a = _bucket(sealed, 1, [100, 200, 300, 400])
    b = _bucket(sealed, 2, [150, 250])
    m = merge_metas([a, b], bucket_id=9, group_rows=3)
    sealed.write_merged(m, [a, b])
    # When a subscription restarts with progress [1, FINISHED] (run 2 wholly acknowledged)
    reader = SealedReader(lookahead_ms=0)
    reader.adopt(m, done=[1, FINISHED])
    # Then it reads only run 1's segments after the first, and nothing of run 2
    assert _take(reader, sealed, 10_000) == [key_of(1, 2), key_of(1, 3)]
    assert reader.remaining() == 0
    # and a progress from before the merge (one number) starts the merged bucket afresh
    fresh = SealedReader(lookahead_ms=0)
    fresh.adopt(m, done=1)
    assert len(_take(fresh, sealed, 10_000)) == 6


class _Sim:
    """A partition's sealed buckets and one subscription reading them, for the property
    test: merges are applied to the registry and to the subscription as the actors do."""

    def __init__(self, dues: list[list[int]]) -> None:
        self.sealed = SealedStore(MemoryObjectStore(), "t", 0)
        self.metas = [_bucket(self.sealed, i + 1, d) for i, d in enumerate(dues)]
        self.due_of = {key_of(i + 1, e): d for i, ds in enumerate(dues) for e, d in enumerate(ds)}
        self.reader = SealedReader(lookahead_ms=50, max_loaded_rows=2, max_loaded_total=6)
        for m in self.metas:
            self.reader.adopt(m)
        self.out: dict[int, int] = {}
        self.acked: set[int] = set()
        self.next_id = 100

    def take(self, now: int, n: int) -> None:
        for k in _take(self.reader, self.sealed, now, n):
            assert k not in self.out, f"{k} handed out twice"
            assert self.due_of[k] <= now, "early"
            self.out[k] = now

    def ack_all(self) -> None:
        self.acked |= set(self.out)
        self.reader.advance(lambda keys: set(np.asarray(keys).tolist()) <= self.acked)

    def merge(self, at: int, width: int) -> None:
        if len(self.metas) < 2:
            return
        at = at % (len(self.metas) - 1)
        window = self.metas[at : at + max(2, width)]
        self.next_id += 1
        m = merge_metas(window, bucket_id=self.next_id, group_rows=3)
        self.sealed.write_merged(m, window)
        self.metas[at : at + len(window)] = [m]
        self.reader.adopt(m)
        assert not {w.key for w in window} & set(self.reader.buckets)  # taken over


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dues=st.lists(st.lists(st.integers(1, 1_000), min_size=1, max_size=7), min_size=2, max_size=6),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["take", "ack", "merge"]), st.integers(0, 300), st.integers(1, 5)
        ),
        min_size=1,
        max_size=30,
    ),
)
def test_merges_under_a_reading_subscription_lose_nothing_and_repeat_nothing(dues, ops):
    # Given buckets read by a subscription that holds few rows loaded at once
    sim = _Sim(dues)
    now = 0
    # When time passes, rows are taken and acknowledged, and buckets are merged (merged
    # ones too) at any moment: while loaded, half-taken or being acknowledged
    for op, a, b in ops:
        if op == "take":
            now += a
            sim.take(now, b)
        elif op == "ack":
            sim.ack_all()
        else:
            sim.merge(a, b)
    # Then every row goes out once, never early (checked as they go), none is lost
    for _ in range(len(sim.due_of) + 1):  # (a few rows loaded at a time)
        sim.take(10_000, 10**6)
    assert sorted(sim.out) == sorted(sim.due_of)
    # and once all are acknowledged, every bucket held is finished
    sim.ack_all()
    assert set(sim.reader.progress().values()) == {FINISHED}


# --- the registry and the coordinator's journal -------------------------------------------


def _metadata(store: MemoryObjectStore) -> Metadata:
    meta = Metadata(store)
    meta.create_topic("t", 1)
    meta.create_subscription("t", "s", {"type": "shared"})
    meta.create_subscription("t", "f", {"type": "shared"})
    return meta


def test_the_registry_swaps_a_merged_bucket_in_and_carries_progress_over_in_one_record():
    store = MemoryObjectStore()
    md = _metadata(store)
    md.registry_apply([("put", NAME, k, b"r") for k in ("a", "b", "c")])
    md.set_progress("t", 0, "s", [0, 0], [0, 0], {"a": 2, "b": -1, "c": [1, -1]})
    md.set_progress("t", 0, "f", [0, 0], [0, 0], {"a": -1, "b": -1})
    seq = md.seq
    # When a, b and c (c a merged bucket of two runs) are merged into m
    assert md.merge_buckets("t", 0, NAME, ["a", "b", "c"], "m", b"rec", [1, 1, 2]) is True
    # Then one journal record swapped them and carried each subscription's progress over
    assert md.seq == seq + 1
    assert md.registry_list(NAME) == {"m": b"rec"}
    assert md.progress("t", 0, "s") == {"m": [2, -1, 1, -1]}
    assert md.progress("t", 0, "f") == {"m": [-1, -1, 0, 0]}  # c never reported: from 0
    # and the journal replays to the same state
    assert Metadata(store).state["progress"] == md.state["progress"]
    # A retried call is done already; a merge whose source is gone changes nothing
    assert md.merge_buckets("t", 0, NAME, ["a", "b", "c"], "m", b"rec", [1, 1, 2]) is True
    assert md.merge_buckets("t", 0, NAME, ["m", "x"], "n", b"rec", [4, 1]) is False
    assert md.seq == seq + 1
    with pytest.raises(InvalidArgument, match="runs"):
        md.merge_buckets("t", 0, NAME, ["m", "x"], "n", b"rec", [4, 0])
    # A subscription done with every source is done with the merged bucket
    md.registry_apply([("put", NAME, k, b"r") for k in ("d", "e")])
    md.set_progress("t", 0, "s", [0, 0], [0, 0], {"d": -1, "e": -1})
    md.merge_buckets("t", 0, NAME, ["d", "e"], "de", b"rec", [1, 1])
    assert md.progress("t", 0, "s")["de"] == -1


def test_merges_take_the_smallest_adjacent_window_just_wide_enough():
    assert merge_window([10, 1, 1, 10], 1) == [1, 2]
    assert merge_window([5, 5, 1, 9, 1, 1], 2) == [3, 4, 5] or merge_window(
        [5, 5, 1, 9, 1, 1], 2
    ) == [0, 1, 2]
    assert merge_window([1] * 10, 9) == [0, 1, 2, 3]  # at most four at once
    assert merge_window([3, 2], 5) == [0, 1]


# --- a crash at every step of a merge ------------------------------------------------------


class _Crash(Exception):
    pass


class _CrashingStore(MemoryObjectStore):
    """Raises at the ``at``-th change (put or delete), then refuses every change: the
    process is gone."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.changes, self.dead = at, 0, False

    def _change(self) -> None:
        if self.dead:
            raise _Crash("dead")
        self.changes += 1
        if self.changes == self.at:
            self.dead = True
            raise _Crash(f"crash at change {self.at}")

    def put(self, key, data):
        self._change()
        return super().put(key, data)

    def delete(self, key):
        self._change()
        return super().delete(key)


def _seal_three(store) -> tuple[SealedStore, Metadata, list[SealedMeta]]:
    sealed = SealedStore(store, "t", 0)
    md = _metadata(store)
    metas = [_bucket(sealed, i, [100 * i + j for j in range(5)]) for i in (1, 2, 3)]
    md.registry_apply([("put", NAME, m.key, record_of(m)) for m in metas])
    return sealed, md, metas


@pytest.mark.parametrize("register_fails", ["no", "before", "after"])
def test_a_crash_at_any_step_of_a_merge_leaves_the_sources_valid_or_the_merge_whole(
    register_fails,
):
    # For a crash at each change the merge makes to the store in turn (and a coordinator
    # call that fails before or after it applied the swap) ...
    for at in range(1, 12):
        store = _CrashingStore(at=10**9)
        sealed, md, metas = _seal_three(store)
        md.set_progress("t", 0, "s", [0, 0], [0, 0], {metas[0].key: 1})
        store.at = store.changes + at

        def register(keys, merged, record, runs, store=store, md=md):
            if store.dead:
                raise _Crash("dead")
            if register_fails == "before":
                raise Unavailable("coordinator unreachable")
            done = md.merge_buckets("t", 0, NAME, keys, merged.key, record, runs)
            if register_fails == "after":
                raise Unavailable("the reply was lost")
            return done

        try:
            merge(sealed, [m.key for m in metas[:2]], bucket_id=99, group_rows=4, register=register)
        except (_Crash, Unavailable):
            pass
        # ... when the partition comes up again (the journal replayed, orphans cleaned)
        store.dead, store.at = False, 10**9
        md = Metadata(store)
        records = md.registry_list(NAME)
        fresh = SealedStore(store, "t", 0)
        clean(fresh, records)
        # Then what the registry names is whole: every meta and every run's objects
        owned = runs_of(records)
        assert sum(len(r) for r in owned.values()) == 3  # either the sources or the merge
        for key, runs in owned.items():
            meta = fresh.meta(key)
            assert [r.key for r in meta.runs] == runs
            for run in runs:
                assert store.get(f"{NAME}/{run}/data") and store.get(f"{NAME}/{run}/index")
        # and nothing else is left in the store
        kept = {f"{NAME}/{k}/meta" for k in owned} | {
            f"{NAME}/{r}/{what}" for rs in owned.values() for r in rs for what in ("data", "index")
        }
        assert set(store.list(f"{NAME}/")) == kept
        # and a subscription restarted from its progress gets every row not acknowledged
        reader = SealedReader(lookahead_ms=0)
        progress = md.progress("t", 0, "s")
        for key in owned:
            reader.adopt(fresh.meta(key), done=progress.get(key, 0))
        got = sorted(_take(reader, fresh, 10**6))
        expected = sorted(
            k for m in metas for k in bitmap64_values(m.keys).tolist() if k not in (
                key_of(1, 0), key_of(1, 1))  # (segment 0 of bucket 1 was done)
        )  # fmt: skip
        assert got == expected, (register_fails, at)


def test_an_overdue_backlog_taken_in_whole_groups_keeps_few_groups_loaded():
    # Given 40 buckets of one 50-row segment each, every segment spanning the whole
    # backlog (as small ledgers seal), merged into 4 buckets whose groups of ~100 rows
    # therefore overlap in time, all overdue
    sealed = SealedStore(MemoryObjectStore(), "t", 0)
    rng = np.random.default_rng(3)
    metas = [
        _bucket(sealed, ledger, rng.integers(0, 10_000, 50).tolist(), max_indexes=50)
        for ledger in range(1, 41)
    ]
    merged = []
    for i in range(0, 40, 10):
        m = merge_metas(metas[i : i + 10], bucket_id=100 + i, group_rows=100)
        sealed.write_merged(m, metas[i : i + 10])
        merged.append(m)

    def drain(earliest_first: bool) -> tuple[list[int], int]:
        reader = SealedReader(lookahead_ms=0, max_loaded_rows=100, max_loaded_total=1_000)
        for m in merged:
            reader.adopt(m)
        out, most = [], 0
        while True:
            _load(reader, sealed, 20_000)
            most = max(most, sum(len(b.loaded) for b in reader.buckets.values()))
            groups = reader.take_due(20_000, 250, earliest_first=earliest_first)
            if not groups:
                return out, most
            out += [k for _, _, keys in groups for k in keys.tolist()]

    # When it is taken 250 rows at a time in whole groups, and in exact due order
    whole, held_whole = drain(earliest_first=False)
    exact, held_exact = drain(earliest_first=True)
    # Then both hand out every row once
    every = sorted(k for m in metas for k in bitmap64_values(m.keys).tolist())
    assert sorted(whole) == sorted(exact) == every and len(set(whole)) == 2_000
    # and whole groups keep about the cap's worth of groups loaded (1,000 rows in groups of
    # ~100), while exact order leaves the rest of every group it took from behind
    assert held_whole <= 12 < held_exact
