"""Keys of the caller's choosing: a keyed message scheduled for later is its key's while it
is pending (ignore, replace or refuse a second send; cancel by key), through host
restarts, ledger rolls and retention."""

from __future__ import annotations

import time

import pytest

from raydelay import InvalidArgument, KeyPending
from raydelay.actors.host import HostActor
from tests.conftest import rpc_get
from tests.integration.helpers import (
    receive_all,
    receive_until,
    restart_partition,
    topic_partition,
    wait_until,
)


def _deliveries(consumer, seconds: float) -> list:
    """Everything delivered (and acked) within ``seconds``."""
    got = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        msgs = consumer.receive(max_messages=1_000, timeout_s=0.3)
        got.extend(msgs)
        consumer.ack(msgs)
    return got


def test_two_sends_of_one_pending_key_deliver_once(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    first = producer.send(b"first", deliver_after=1.5, key="order-1")
    again = producer.send(b"second", deliver_after=0.5, key="order-1")
    assert again == first  # ignored: the pending one's id
    got = receive_until(consumer, 1, timeout_s=20)
    rest = _deliveries(consumer, 2.5)
    assert [m.payload for m, _ in got] + [m.payload for m in rest] == [b"first"]


def test_replace_delivers_only_the_new_message_at_its_time(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    old = producer.send(b"old", deliver_after=1.0, key="invoice-7")
    new = producer.send(b"new", deliver_after=2.0, key="invoice-7", on_duplicate="replace")
    assert new != old
    got = _deliveries(consumer, 4.0)
    assert [(m.payload, m.message_id) for m in got] == [(b"new", new)]
    assert got[0].deliver_at_ms == new_deliver_at(cluster, topic_name, new, got)


def new_deliver_at(cluster, topic, mid, got) -> int:
    """The deliver_at the replacing send asked for (as delivered: the message's own)."""
    return [m for m in got if m.message_id == mid][0].deliver_at_ms


def test_error_refuses_and_writes_nothing(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=3)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    producer.send(b"held", deliver_after=1.0, key="k-held")
    before = _tails(topic_name, 3)
    with pytest.raises(KeyPending, match="k-held"):
        producer.send(b"again", deliver_after=1.0, key="k-held", on_duplicate="error")
    # a batch across partitions: the pending key refuses all of it, nothing is written
    keys = [f"free-{i}" for i in range(20)] + ["k-held"]
    with pytest.raises(KeyPending, match="k-held"):
        producer.send_many([b"x"] * len(keys), deliver_after=1.0, keys=keys, on_duplicate="error")
    assert _tails(topic_name, 3) == before
    got = _deliveries(consumer, 3.0)
    assert [m.payload for m in got] == [b"held"]


def test_a_batch_with_one_key_twice(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    ids = producer.send_many([b"a1", b"a2", b"b"], deliver_after=1.0, keys=["a", "a", "b"])
    assert ids[0] == ids[1] != ids[2]  # "ignore": the first keeps the key
    ids = producer.send_many(
        [b"c1", b"c2"], deliver_after=1.0, keys=["c", "c"], on_duplicate="replace"
    )
    assert ids[0] == ids[1]  # "replace": the last wins, the first was never written
    got = sorted(m.payload for m in _deliveries(consumer, 3.0))
    assert got == [b"a1", b"b", b"c2"]


def test_cancel_by_key(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    producer.send(b"pay-or-cancel", deliver_after=1.5, key="order-9")
    producer.send(b"stays", deliver_after=1.5, key="order-10")
    assert cluster.cancel(topic_name, key="order-9") is True
    assert cluster.cancel(topic_name, key="order-9") is False  # nothing pending under it now
    assert cluster.cancel(topic_name, keys=["never-sent", "order-10"]) == [False, True]
    # the key is free again: a new send schedules a new message
    producer.send(b"second life", deliver_after=1.0, key="order-9")
    got = sorted(m.payload for m in _deliveries(consumer, 3.5))
    assert got == [b"second life"]


def test_a_key_is_free_once_its_message_fell_due(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=1)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    first = producer.send(b"1", deliver_after=0.3, key="daily")
    receive_all(consumer, 1, timeout_s=20)
    second = producer.send(b"2", deliver_after=0.3, key="daily")
    assert second != first
    assert cluster.cancel(topic_name, key="daily") is True


def test_keys_route_immediate_messages_as_before(cluster, topic_name):
    """A message due at once has no pending life: its key only routes it."""
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    ids = [producer.send(f"{i}".encode(), key="same") for i in range(3)]
    assert len(set(ids)) == 3 and len({m.partition for m in ids}) == 1
    got = receive_all(consumer, 3, timeout_s=20)
    assert [m.payload for m, _ in got] == [b"0", b"1", b"2"]


def test_bad_input(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=1)
    producer = cluster.create_producer(topic_name)
    with pytest.raises(InvalidArgument, match="on_duplicate"):
        producer.send(b"x", deliver_after=1, key="k", on_duplicate="overwrite")
    with pytest.raises(InvalidArgument, match="on_duplicate"):
        producer.send_many([b"x"], deliver_after=1, keys=["k"], on_duplicate=None)
    with pytest.raises(InvalidArgument, match="key"):
        cluster.cancel(topic_name, key=17)
    with pytest.raises(InvalidArgument, match="keys"):
        cluster.cancel(topic_name, keys="one-string")
    with pytest.raises(InvalidArgument, match="topic"):
        cluster.cancel(["not", "a topic"], key="k")
    with pytest.raises(InvalidArgument, match="not both"):
        cluster.cancel(topic_name, key="a", keys=["b"])


def test_the_key_index_survives_a_host_restart_past_rolls_and_retention(cluster, topic_name):
    """The keyed message's ledger rolls (its delta is written), retention deletes the
    ledgers (its row lives on in a sealed bucket); a restarted host still knows the key."""
    cluster.create_topic(topic_name, partitions=1)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    held = producer.send(b"held", deliver_after=60, key="survivor")
    replaced = producer.send(b"to be replaced", deliver_after=60, key="replaced-later")
    # enough delayed messages for a sealed bucket (min_index_count_per_bucket is 2,000 in
    # tests): then retention may delete their ledger
    ds = producer.send_many([b"d"] * 2_500, deliver_after=60, keys=[f"d-{i}" for i in range(2_500)])
    fillers = producer.send_many([b"f"] * 6_000)  # three more ledgers of 2,000 roll
    receive_until(consumer, set(fillers), timeout_s=60)
    part = topic_partition(topic_name, 0)

    def first_ledger() -> int:
        return min(lg for lg, _ in _ledgers(part))

    wait_until(
        "retention deleted the keyed messages' ledger",
        lambda: first_ledger() > held.ledger_id,
        got=lambda: _ledgers(part),
    )
    restart_partition(topic_name, 0)
    assert producer.send(b"again", deliver_after=5, key="survivor") == held
    new = producer.send(b"new", deliver_after=1.0, key="replaced-later", on_duplicate="replace")
    assert new != replaced
    assert cluster.cancel(topic_name, key="survivor") is True
    assert producer.send_many([b"d"] * 2, deliver_after=5, keys=["d-0", "d-2499"]) == [
        ds[0],
        ds[-1],
    ]
    got = _deliveries(consumer, 3.0)
    assert [m.payload for m in got] == [b"new"]


def _ledgers(part) -> list[tuple[int, int | None]]:
    return [tuple(x) for x in rpc_get(part.submit(HostActor.stats))["ledgers"]]


def _tails(topic: str, partitions: int) -> list:
    """Each partition's last position (what a write would move)."""
    return [
        rpc_get(topic_partition(topic, p).submit(HostActor.stats))["tail"]
        for p in range(partitions)
    ]


def test_keys_hold_across_bucket_merges(cluster, topic_name):
    """Four sealed buckets of keyed messages, over max_num_buckets (3 in tests): merged;
    every key still finds its message, and a replace in a merged bucket still holds."""
    cluster.create_topic(topic_name, partitions=1)
    cluster.subscribe(topic_name, "s").close()
    producer = cluster.create_producer(topic_name)
    part = topic_partition(topic_name, 0)
    firsts = []
    for b in range(4):  # each 2,100 delayed: a bucket each (min_index_count 2,000 in tests)
        keys = [f"b{b}-{i}" for i in range(2_100)]
        firsts.append(producer.send_many([b"x"] * 2_100, deliver_after=600, keys=keys))
        producer.send_many([b"roll"] * 2_000)  # (the ledger rolls: its bucket is sealed)
    wait_until(
        "a merge",
        lambda: rpc_get(part.submit(HostActor.stats))["merged"] >= 1,
        got=lambda: rpc_get(part.submit(HostActor.stats)),
        timeout_s=60,
    )
    again = producer.send_many([b"y"] * 4, deliver_after=600, keys=[f"b{b}-7" for b in range(4)])
    assert list(again) == [ids[7] for ids in firsts]  # ignored: each answers its first
    new = producer.send(b"z", deliver_after=600, key="b0-9", on_duplicate="replace")
    assert new != firsts[0][9]
    assert producer.send(b"w", deliver_after=600, key="b0-9") == new
    assert cluster.cancel(topic_name, keys=["b0-9", "b3-2099"]) == [True, True]
