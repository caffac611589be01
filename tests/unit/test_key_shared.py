"""key_shared subscriptions: one key's messages go to one consumer at a time, in order."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest

from raydelay.dispatch.keyshared import SLOTS, Ring, slot_of, slots_of
from raydelay.log.entries import NO_DELAY
from tests.unit.test_subscription import T0, make, obj, read, receive, take


def test_a_key_has_one_slot_and_keyless_messages_share_the_empty_key():
    col = pa.array(["a", None, "b", "a", None], type=pa.string())
    s = slots_of(col).tolist()
    assert s[0] == s[3] == slot_of("a")
    assert s[1] == s[4] == slot_of(None) == slot_of("")
    assert s[2] == slot_of("b")
    assert all(0 <= x < SLOTS for x in s)


def test_the_ring_spreads_slots_and_a_consumer_leaving_moves_only_its_own():
    ring = Ring(["c1", "c2", "c3"])
    share = np.bincount(ring.owners, minlength=3) / SLOTS
    assert share.min() > 0.2, share  # 100 points each: roughly a third apiece
    after = Ring(["c1", "c3"])
    moved = ring.owners != np.where(after.owners == 1, 2, after.owners)  # re-index c3
    assert (ring.owners[moved] == 1).all()  # only c2's slots changed hands


def keyed(n: int, keys: list[str], ledger=1, first=0, deliver_at=None):
    return obj(
        ledger, first, deliver_at or [NO_DELAY] * n, keys=[keys[i % len(keys)] for i in range(n)]
    )


def test_each_key_goes_to_one_consumer_in_order_and_keys_spread():
    t = make("key_shared")
    t.sub.add_consumer("c2")
    t.sub.add_consumer("c3")
    names = [f"k{i}" for i in range(30)]
    o = keyed(300, names)
    read(t, o)
    owner: dict[str, str] = {}
    seen: dict[str, list[int]] = defaultdict(list)
    for _ in range(20):
        for c in ("c1", "c2", "c3"):
            got = take(t, consumer=c, n=7)
            for _, e in got:
                k = o.entries.key(e)
                assert owner.setdefault(k, c) == c, f"{k} went to {owner[k]} and {c}"
                seen[k].append(e)
            t.sub.ack(c, [(lg << 32) | e for lg, e in got])
    assert sum(map(len, seen.values())) == 300  # every message, once
    assert all(v == sorted(v) for v in seen.values())  # in log order per key
    assert len(set(owner.values())) == 3  # spread over the three


def test_a_key_moves_to_a_new_consumer_only_after_the_old_one_acks():
    t = make("key_shared")
    ring = Ring(["c1", "c2"])
    # a key that c2 owns once it joins
    k = next(f"k{i}" for i in range(1000) if ring.owners[slot_of(f"k{i}")] == 1)
    read(t, keyed(6, [k]))
    assert take(t, "c1", n=2) == [(1, 0), (1, 1)]
    t.sub.add_consumer("c2")
    assert take(t, "c2", n=10) == []  # c1 still holds two of the key's messages
    assert take(t, "c1", n=10) == []  # no longer its key
    t.sub.ack("c1", [(1 << 32) | 0])
    assert take(t, "c2", n=10) == []  # one still held
    t.sub.ack("c1", [(1 << 32) | 1])
    assert take(t, "c2", n=10) == [(1, 2), (1, 3), (1, 4), (1, 5)]


def test_a_consumer_leaving_hands_its_keys_over_in_order():
    t = make("key_shared")
    t.sub.add_consumer("c2")
    t.sub.add_consumer("c3")
    names = [f"k{i}" for i in range(12)]
    o = keyed(120, names)
    read(t, o)
    held = {c: take(t, c, n=15) for c in ("c1", "c2", "c3")}
    assert held["c2"], "c2 should own some keys"
    t.sub.remove_consumer("c2")  # its 15 come back, ahead of the later messages of its keys
    seen: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for c in ("c1", "c3"):
        for _, e in held[c]:
            seen[o.entries.key(e)].append((e, 0))
    for c in ("c1", "c3"):
        t.sub.ack(c, [(1 << 32) | e for _, e in held[c]])
    for _ in range(30):
        for c in ("c1", "c3"):
            w = receive(t, c, 9)
            for e, n in zip(w["entry_id"], w["redelivery_count"], strict=True):
                seen[o.entries.key(e)].append((e, n))
            t.sub.ack(c, [(1 << 32) | e for e in w["entry_id"]])
    delivered = [e for v in seen.values() for e, _ in v]
    assert sorted(delivered) == list(range(120))  # nothing lost, nothing twice
    for c2_entry in (e for _, e in held["c2"]):
        k = o.entries.key(c2_entry)
        entries = [e for e, _ in seen[k]]
        assert entries == sorted(entries), f"{k} out of order: {entries}"
        assert dict(seen[k])[c2_entry] == 1  # handed back: its redelivery_count went up


def test_key_shared_honours_deliver_at_never_early():
    t = make("key_shared")
    read(t, obj(1, 0, [T0 + 500, NO_DELAY, T0 + 200], keys=["a", "a", "b"]))
    assert take(t, n=10) == [(1, 1)]
    t.clock.advance(199)
    assert take(t, n=10) == []
    t.clock.advance(1)
    assert take(t, n=10) == [(1, 2)]
    t.clock.advance(300)
    assert take(t, n=10) == [(1, 0)]


def test_keyless_messages_go_to_one_consumer():
    t = make("key_shared")
    t.sub.add_consumer("c2")
    read(t, obj(1, 0, [NO_DELAY] * 10))
    got = {c: take(t, c, n=100) for c in ("c1", "c2")}
    assert sorted(len(v) for v in got.values()) == [0, 10]


@pytest.mark.parametrize("kind", ["shared", "key_shared"])
def test_spread_types_take_back_only_the_named_messages(kind):
    t = make(kind)
    read(t, keyed(4, ["a"]))
    got = take(t, n=4)
    assert len(got) == 4
    assert t.sub.redeliver_unacked("c1", np.array([(1 << 32) | 3])) == 1
    assert t.sub.pending_count() == 3


def test_a_consumer_that_stops_asking_holds_up_only_its_own_keys():
    t = make("key_shared", read_ahead_entries=100)  # at most 1,000 wait in the pool
    t.sub.add_consumer("c2")
    names = [f"k{i}" for i in range(60)]
    o = keyed(600, names)
    read(t, o)
    ring = Ring(["c1", "c2"])
    mine = [e for e in range(600) if ring.owners[slot_of(o.entries.key(e))] == 1]
    assert 100 < len(mine) < 500
    got = []
    for _ in range(50):  # c1 never asks; its keys' rows pile up in the pool
        batch = take(t, "c2", n=20)
        got += [e for _, e in batch]
        t.sub.ack("c2", [(1 << 32) | e for _, e in batch])
    assert got == mine  # all of c2's, in log order
    assert len(t.sub.redelivery.redeliver) == 600 - len(mine)  # c1's wait for it


def test_a_key_given_back_while_a_later_one_was_fetched_still_goes_first():
    # Given key k's first message held by c1, and its second due from the tracker (its
    # slot not known yet, its payload no longer held) once c2, k's new owner, has joined
    t = make("key_shared", cached_entries=1)
    ring = Ring(["c1", "c2"])
    k = next(f"k{i}" for i in range(1000) if ring.owners[slot_of(f"k{i}")] == 1)
    read(t, obj(1, 0, [NO_DELAY, T0 + 100], keys=[k, k]), obj(1, 2, [NO_DELAY], keys=["z"]))
    assert take(t, "c1", n=1) == [(1, 0)]
    t.sub.add_consumer("c2")
    t.clock.advance(100)
    # When c1 gives the first back while c2's fetch of the second is under way
    t.log.during_read = lambda: t.sub.nack("c1", [(1 << 32) | 0], 0, t.clock.now_ms())
    assert take(t, "c2", n=1) == []
    # Then the second waited, and the first goes out before it
    assert t.log.reads == [[(1 << 32) | 1]]
    assert take(t, "c2", n=10)[:2] == [(1, 0), (1, 1)]
