"""The coordinator's metadata: write ahead, then apply; recovery from snapshot + journal."""

from __future__ import annotations

import pytest

from raydelay.cluster import metadata
from raydelay.cluster.metadata import JOURNAL_PREFIX, SNAPSHOT_PREFIX, Metadata
from raydelay.errors import InvalidArgument, NotFound, StorageError
from raydelay.storage import FaultyObjectStore, MemoryObjectStore

SHARED = {
    "type": "shared",
    "ack_timeout_s": None,
    "max_redeliveries": None,
    "dead_letter_topic": None,
}


def populated(store) -> Metadata:
    m = Metadata(store, snapshot_every=5)
    m.create_topic("orders", 2)
    m.create_subscription("orders", "billing", SHARED)
    first = m.roll_ledger("orders", 0, None, 0)
    m.roll_ledger("orders", 0, first, 10)
    m.set_mark_delete("orders", 0, "billing", [first, 4])
    m.registry_apply(
        [
            ("put", "subs/orders/0/billing", "b1", b"rec"),
            ("put", "subs/orders/0/billing", "b2", b"rec2"),
        ]
    )
    m.registry_apply([("remove", "subs/orders/0/billing", "b1", None)])
    return m


def test_every_change_is_journaled_and_a_new_instance_rebuilds_the_same_state():
    store = MemoryObjectStore()
    m = populated(store)
    assert store.list(SNAPSHOT_PREFIX)  # 7 changes with snapshot_every=5: one snapshot
    assert len(store.list(JOURNAL_PREFIX)) == 2  # the journal after it
    again = Metadata(store)
    assert again.state == m.state
    assert again.seq == m.seq
    assert again.registry_list("subs/orders/0/billing") == {"b2": b"rec2"}
    assert again.ledgers("orders", 0) == [[1, 10], [2, None]]


def test_a_failed_journal_write_changes_nothing():
    store = FaultyObjectStore(MemoryObjectStore())
    m = Metadata(store)
    store.fail_next("put")
    with pytest.raises(StorageError):
        m.create_topic("orders", 1)
    with pytest.raises(NotFound):
        m.partitions("orders")
    m.create_topic("orders", 1)
    assert Metadata(store).topics() == {"orders": 1}


def test_retention_needs_every_subscription_past_a_closed_ledger():
    m = Metadata(MemoryObjectStore())
    m.create_topic("t", 1)
    a = m.roll_ledger("t", 0, None, 0)
    b = m.roll_ledger("t", 0, a, 3)
    m.roll_ledger("t", 0, b, 2)
    assert m.retention("t", 0) == []  # no subscription: keep everything for future ones
    m.create_subscription("t", "s1", SHARED)
    m.create_subscription("t", "s2", SHARED)
    m.set_mark_delete("t", 0, "s1", [b, 1])
    assert m.retention("t", 0) == []
    m.set_mark_delete("t", 0, "s2", [a, 2])  # the last entry of ledger a
    assert m.retention("t", 0) == [a]
    m.set_mark_delete("t", 0, "s2", [b, 1])
    assert m.retention("t", 0) == [a, b]
    m.drop_ledgers("t", 0, [a, b])
    assert [x[0] for x in m.ledgers("t", 0)] == [b + 1]


def test_topics_and_subscriptions_are_checked():
    m = Metadata(MemoryObjectStore())
    assert m.create_topic("t", 3) == 3
    assert m.create_topic("t", 3) == 3  # idempotent
    with pytest.raises(InvalidArgument, match="3 partitions"):
        m.create_topic("t", 4)
    for bad in (0, -1, 5000, True, "2"):
        with pytest.raises(InvalidArgument, match="partitions"):
            m.create_topic("u", bad)
    with pytest.raises(InvalidArgument, match="topic"):
        m.create_topic("a/b", 1)
    m.create_subscription("t", "s", SHARED)
    with pytest.raises(InvalidArgument, match="cannot become"):
        m.create_subscription("t", "s", SHARED | {"type": "exclusive"})
    with pytest.raises(NotFound):
        m.create_subscription("nope", "s", SHARED)
    with pytest.raises(InvalidArgument, match="partition"):
        m.ledgers("t", 3)
    with pytest.raises(InvalidArgument, match="registry op"):
        m.registry_apply([("upsert", "n", "k", b"")])


# --- fencing: two coordinators of one store -------------------------------------------------


def _coordinator(store, address: str = "10.0.0.1:6379"):
    from raydelay.cluster.owner import StoreOwner

    owner = StoreOwner(store, address)
    owner.acquire()
    return owner, Metadata(store, guard=owner.check, fence=owner.fence)


def test_a_replaced_coordinator_is_fenced_off_at_its_next_journal_write():
    from raydelay.errors import StoreOwned

    store = MemoryObjectStore()
    old_owner, old = _coordinator(store)
    old.create_topic("a", 1)
    # Ray replaced the coordinator (its node was lost) while the old process still runs
    new_owner, new = _coordinator(store)
    assert new.topics() == {"a": 1}
    new.create_topic("b", 1)
    with pytest.raises(StoreOwned, match="taken over"):
        old.create_topic("c", 1)  # its journal number is taken, and a newer claim exists
    with pytest.raises(StoreOwned):
        old.create_topic("d", 1)  # and it stays fenced off
    assert Metadata(store).topics() == {"a": 1, "b": 1}
    old_owner.release()
    new_owner.release()


def test_the_new_coordinator_takes_in_what_the_old_one_wrote_before_it_knew():
    store = MemoryObjectStore()
    old_owner, old = _coordinator(store)
    old.create_topic("a", 1)
    new_owner, new = _coordinator(store)
    old.create_topic("late", 2)  # the old one wrote once more, before the new one's write
    new.create_topic("b", 1)  # its number was taken: it catches up, then writes after it
    assert new.topics() == {"a": 1, "late": 2, "b": 1}
    assert Metadata(store).topics() == new.topics()
    old_owner.release()
    new_owner.release()


def test_a_retried_roll_gets_the_ledger_the_first_call_opened():
    # Given a partition whose ledger a was rolled (closed at 3 entries, b opened), and a
    # first open that was retried too
    store = MemoryObjectStore()
    m = Metadata(store)
    m.create_topic("t", 1)
    a = m.roll_ledger("t", 0, None, 0)
    assert m.roll_ledger("t", 0, None, 0) == a
    b = m.roll_ledger("t", 0, a, 3)
    # When the roll is sent again (its reply was lost), also by a coordinator that
    # rebuilt its state from the journal
    assert m.roll_ledger("t", 0, a, 3) == b
    again = Metadata(store)
    assert again.roll_ledger("t", 0, a, 3) == b
    # Then one ledger is open, and retention passes the closed one
    assert again.ledgers("t", 0) == [[a, 3], [b, None]]
    again.create_subscription("t", "s", SHARED)
    again.set_mark_delete("t", 0, "s", [a, 2])
    assert again.retention("t", 0) == [a]
    # and the next roll goes on as usual; a retry claiming another count is refused
    c = again.roll_ledger("t", 0, b, 5)
    assert c > b and again.ledgers("t", 0) == [[a, 3], [b, 5], [c, None]]
    with pytest.raises(InvalidArgument, match="count: ledger .* was closed at 5 entries, not 4"):
        again.roll_ledger("t", 0, b, 4)


def test_the_journal_a_recovery_replays_stays_short_under_a_stream_of_progress_reports():
    # Given the default snapshot rule and a small state (a topic, a subscription)
    store = MemoryObjectStore()
    m = Metadata(store)
    m.create_topic("orders", 2)
    m.create_subscription("orders", "billing", SHARED)
    assert m.snapshot_after() == metadata.MIN_SNAPSHOT_EVERY
    longest = 0
    # When the subscription reports its progress 500 times (each a journal record)
    for i in range(500):
        m.set_mark_delete("orders", i % 2, "billing", [1, i])
        longest = max(longest, len(store.list(JOURNAL_PREFIX)))
    # Then a recovery never had more than the rule's records to read one by one (not the
    # 1,000 of snapshot_every), and it rebuilds the same state from snapshot + journal
    assert longest < metadata.MIN_SNAPSHOT_EVERY
    again = Metadata(store)
    assert again.state == m.state and again.seq == m.seq == 502


def test_a_larger_state_is_snapshotted_less_often_and_never_past_snapshot_every(monkeypatch):
    monkeypatch.setattr(metadata, "SNAPSHOT_BYTES_PER_RECORD", 2)
    store = MemoryObjectStore()
    m = Metadata(store, snapshot_every=300)
    for i in range(20):
        m.create_topic(f"orders-{i}", 2)
    m.snapshot()
    size = len(store.get(store.list(SNAPSHOT_PREFIX)[-1]))
    # a snapshot of some hundreds of bytes: one record per 2 bytes of it, capped at 300
    assert size // 2 > metadata.MIN_SNAPSHOT_EVERY
    assert m.snapshot_after() == min(300, size // 2)
    assert Metadata(store, snapshot_every=300).snapshot_after() == m.snapshot_after()
    monkeypatch.setattr(metadata, "SNAPSHOT_BYTES_PER_RECORD", 1 << 30)
    assert m.snapshot_after() == metadata.MIN_SNAPSHOT_EVERY


def test_many_progress_reports_are_one_journal_record_and_a_gone_topics_is_left_out():
    store = MemoryObjectStore()
    m = Metadata(store)
    m.create_topic("orders", 2)
    seq = m.seq
    changed = m.set_progress_many(
        [
            ["orders", 0, "billing", [1, 5], [1, 5], {"b1": 2}],
            ["orders", 1, "billing", [1, 7], [1, 6], {}],
            ["gone", 0, "billing", [1, 1], [1, 1], {}],  # (deleted meanwhile)
            ["orders", 9, "billing", [1, 1], [1, 1], {}],  # (no such partition now)
        ]
    )
    assert changed == 2 and m.seq == seq + 1  # one record for both
    assert m.progress("orders", 0, "billing") == {"b1": 2}
    assert m.set_progress_many([["orders", 1, "billing", [1, 7], [1, 6], {}]]) == 0
    assert m.seq == seq + 1  # (nothing changed: nothing written)
    again = Metadata(store)  # replayed from the journal
    assert again.state["mark_delete"] == m.state["mark_delete"]
    assert again.state["log_mark"]["orders/1/billing"] == [1, 6]
