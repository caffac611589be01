"""The topic indexes each partition once: sealed buckets that carry their payloads, read
by every shared subscription (the session's config: ledgers of 2,000 entries, buckets
from 2,000 delayed entries, segments of 1,000).

Each test checks what a user sees: K subscriptions each get every message exactly once
(cancels honoured, never early), a subscription made after the seal too; due messages
come from the buckets without point reads of the log; buckets and ledgers are deleted
once no subscription needs them and not before; restarts of the topic and subscription
actors lose nothing.
"""

from __future__ import annotations

import collections
import time

import ray

from raydelay import Message
from raydelay.actors.host import HostActor
from raydelay.delayed.sealed import THROUGH_KEY, registry_name
from raydelay.storage import make_store
from tests.integration.helpers import (
    now_ms,
    receive_all,
    receive_and_join,
    restart_partition,
    restart_subscription,
    topic_partition,
    wait_until,
)


def _topic(topic: str, partition: int = 0):
    return topic_partition(topic, partition)


def _topic_stats(topic: str) -> dict:
    return ray.get(_topic(topic).submit(HostActor.stats))


Deliveries = dict[bytes, list[tuple[int, int, int | None]]]


def _by_payload(received: list[tuple[Message, int]]) -> Deliveries:
    """payload -> [(redelivery_count, received ms, deliver_at)], in arrival order."""
    got: Deliveries = collections.defaultdict(list)
    for m, t in received:
        got[m.payload].append((m.redelivery_count, t, m.deliver_at_ms))
    return got


def _receive(cluster, consumer, wanted: set[bytes], timeout_s: float = 60.0) -> Deliveries:
    """What the subscription delivers once every one of ``wanted`` arrived and it has
    nothing left (see ``receive_and_join``), by payload."""

    def every_one(messages: list[Message]) -> bool:
        return wanted <= {m.payload for m in messages}

    received = receive_and_join(
        cluster, consumer, every_one, what=f"{len(wanted)} payloads", timeout_s=timeout_s
    )
    return _by_payload(received)


def _coordinator():
    return ray.get_actor("coordinator", namespace="raydelay")


def _done_with_every_bucket(topic: str, subscription: str) -> bool:
    """Whether the subscription's recorded progress has every sealed bucket of partition 0
    finished (what lets the topic delete a bucket)."""
    coordinator = _coordinator()
    keys = set(ray.get(coordinator.registry_list.remote(registry_name(topic, 0)))) - {THROUGH_KEY}
    progress = ray.get(coordinator.progress.remote(topic, 0, subscription))
    return bool(keys) and all(progress.get(k) == -1 for k in keys)


def _settled_due_read(cluster, topic: str, subscriptions: list[str]) -> int:
    """Rows the subscriptions read from the log to learn settled rows' deliver_at."""
    return sum(
        p["settled_due_read"] for s in subscriptions for p in cluster.stats(topic, s)["partitions"]
    )


def _bucket_objects(cluster, topic: str) -> list[str]:
    return make_store(cluster.config).list(f"topics/{topic}/0/buckets/")


def test_every_subscription_gets_each_message_once_from_one_index(cluster, topic_name):
    # Given one partition, three shared subscriptions, and delayed messages enough to seal
    # buckets (6,000 over 3+ ledgers), 1,000 immediate ones, and 100 cancels
    cluster.create_topic(topic_name, partitions=1)
    consumers = [cluster.subscribe(topic_name, f"s{i}") for i in range(3)]
    producer = cluster.create_producer(topic_name)
    first_ledger = _topic_stats(topic_name)["ledgers"][0][0]
    due = now_ms() + 4_000
    delayed = producer.send_many([b"d%d" % i for i in range(6_000)], deliver_at=due)
    producer.send_many([b"n%d" % i for i in range(1_000)])
    assert all(producer.cancel_many(delayed[:100]))
    # When the topic has sealed, and a fourth subscription is made after it
    wait_until("a sealed bucket", lambda: _topic_stats(topic_name)["buckets"] >= 2)
    late = cluster.subscribe(topic_name, "late")
    names = [f"s{i}" for i in range(3)] + ["late"]
    learned_before = _settled_due_read(cluster, topic_name, names)
    reads_before = _topic_stats(topic_name)["point_reads"]
    # Then each subscription gets every uncancelled message exactly once, none early
    wanted = {b"d%d" % i for i in range(100, 6_000)} | {b"n%d" % i for i in range(1_000)}
    for consumer in consumers:
        got = _receive(cluster, consumer, wanted)
        assert set(got) == wanted
        assert all(len(v) == 1 and v[0][0] == 0 for v in got.values()), "a duplicate"
        assert all(t >= d for v in got.values() for _, t, d in v if d is not None), "early"
    # ... and the due messages came from the buckets, not from point reads of the log: the
    # only ones are of cancelled rows' deliver_at, read once each so that the due chart
    # leaves them out after a restart (a read under way at the first count is counted in
    # the subscriptions' figure only: at most, then)
    learned = _settled_due_read(cluster, topic_name, names) - learned_before
    assert _topic_stats(topic_name)["point_reads"] - reads_before <= learned
    # The buckets stay while the late subscription has not acknowledged them: once the
    # other three are recorded done with every bucket, a retention pass keeps them
    for i in range(3):
        wait_until(
            f"s{i} done with every bucket", lambda i=i: _done_with_every_bucket(topic_name, f"s{i}")
        )
    ray.get(_topic(topic_name).submit(HostActor.trim))
    assert _bucket_objects(cluster, topic_name), "a bucket went before every subscription was done"
    got = _receive(cluster, late, wanted)
    assert set(got) == wanted and all(len(v) == 1 for v in got.values())
    # Once every subscription is done, the buckets and the sealed ledgers are deleted
    wait_until("buckets deleted", lambda: not _bucket_objects(cluster, topic_name))
    wait_until(
        "sealed ledgers deleted",
        lambda: _topic_stats(topic_name)["ledgers"][0][0] > first_ledger,
    )
    stats = cluster.stats(topic_name, "s0")
    assert stats["backlog"] == 0 and stats["delayed"] == 0


def test_a_fifo_subscription_keeps_the_log_the_buckets_no_longer_hold(cluster, topic_name):
    # Given a shared and a failover subscription, and delayed messages that seal buckets
    cluster.create_topic(topic_name, partitions=1)
    shared = cluster.subscribe(topic_name, "shared")
    fifo = cluster.subscribe(topic_name, "fifo", subscription_type="failover")
    producer = cluster.create_producer(topic_name)
    first_ledger = _topic_stats(topic_name)["ledgers"][0][0]
    producer.send_many([b"d%d" % i for i in range(5_000)], deliver_at=now_ms() + 1_500)
    producer.send_many([b"n%d" % i for i in range(500)])
    wanted = {b"d%d" % i for i in range(5_000)} | {b"n%d" % i for i in range(500)}
    # When the shared one is done with everything
    got = _receive(cluster, shared, wanted)
    assert len(got) == 5_500
    wait_until("buckets deleted", lambda: not _bucket_objects(cluster, topic_name))
    # Then the ledgers stay for the failover one, which reads all of it in log order: once
    # the shared one is recorded past the first ledger, a retention pass keeps it
    wait_until(
        "the shared subscription recorded past the first ledger",
        lambda: (
            ray.get(_coordinator().mark_delete.remote(topic_name, 0, "shared"))[0] > first_ledger
        ),
    )
    ray.get(_topic(topic_name).submit(HostActor.trim))
    assert _topic_stats(topic_name)["ledgers"][0][0] == first_ledger
    got = _receive(cluster, fifo, wanted)
    assert len(got) == 5_500 and all(len(v) == 1 for v in got.values())


def test_restarts_of_topic_and_subscription_actors_lose_nothing(cluster, topic_name):
    # Given two shared subscriptions and delayed messages sent in waves around restarts
    cluster.create_topic(topic_name, partitions=1)
    consumers = [cluster.subscribe(topic_name, f"s{i}") for i in range(2)]
    producer = cluster.create_producer(topic_name)
    due = now_ms() + 5_000
    producer.send_many([b"a%d" % i for i in range(3_000)], deliver_at=due)
    # When the partition's host dies while it seals, and again after more are sent
    restart_partition(topic_name, 0)
    producer.send_many([b"b%d" % i for i in range(3_000)], deliver_at=due + 1_000)
    producer.send_many([b"n%d" % i for i in range(500)])
    wait_until("a sealed bucket", lambda: _topic_stats(topic_name)["buckets"] >= 1)
    restart_partition(topic_name, 0)
    # ... and one subscription's actor dies half-way through delivering
    first = _by_payload(receive_all(consumers[0], 3_000, timeout_s=15, max_messages=2_000))
    restart_subscription(topic_name, "s0")
    wanted = {b"a%d" % i for i in range(3_000)} | {b"b%d" % i for i in range(3_000)}
    wanted |= {b"n%d" % i for i in range(500)}
    rest = _receive(cluster, consumers[0], wanted - set(first))
    # Then each subscription got every message, never early, and a message that came
    # twice came back with its redelivery_count raised
    merged: Deliveries = collections.defaultdict(list)
    for part in (first, rest):
        for k, v in part.items():
            merged[k] += v
    assert set(merged) == wanted
    for deliveries in merged.values():
        assert all(t >= d for _, t, d in deliveries if d is not None), "early"
        assert all(c >= 1 for c, _, _ in deliveries[1:]), "a duplicate without a count"
    got = _receive(cluster, consumers[1], wanted)
    assert set(got) == wanted


def test_a_message_whose_ledger_is_gone_can_still_be_cancelled(cluster, topic_name):
    # Given delayed messages whose ledgers are deleted once their bucket is sealed (the
    # only subscription holds them in buckets, so the log is not needed any more)
    cluster.create_topic(topic_name, partitions=1)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    mids = producer.send_many([b"d%d" % i for i in range(5_000)], deliver_at=now_ms() + 8_000)
    # (the first message's ledger, not the one the topic opened with: under a loaded suite
    # the topic has been seen to open a second ledger before the first append)
    wait_until(
        "the first message's ledger deleted",
        lambda: _topic_stats(topic_name)["ledgers"][0][0] > mids[0].ledger_id,
    )
    # When one of them is cancelled
    assert producer.cancel(mids[0]) is True
    # Then the cancel holds: every other one arrives, that one never
    got = _receive(cluster, consumer, {b"d%d" % i for i in range(1, 5_000)}, timeout_s=40)
    assert set(got) == {b"d%d" % i for i in range(1, 5_000)}


def test_merges_interleaved_with_delivery_acks_cancels_and_restarts_lose_nothing(
    cluster, topic_name
):
    # Given a partition that may hold 3 buckets (the session's max_num_buckets), a
    # subscription whose consumer receives and acknowledges all along, and 8 waves of
    # 2,000 delayed messages (a bucket each), due in an order that interleaves the buckets
    cluster.create_topic(topic_name, partitions=1)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    # A message due by the time it is published is not delayed and goes to no bucket: the
    # waves are due well ahead of the time they go out, however slowly that is under load
    start = now_ms() + 10_000
    got: Deliveries = collections.defaultdict(list)
    cancelled: set[bytes] = set()
    # Until the merge, the consumer holds one delivery of each ledger unacknowledged: a
    # bucket (whole ledgers) cannot finish and go before the partition has had to merge,
    # however slowly the waves go out
    held: dict[int, Message] = {}

    def receive(seconds: float, *, hold: bool = True) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            batch = consumer.receive(max_messages=2_000, timeout_s=0.2)
            t = now_ms()
            acks = []
            for m in batch:
                got[m.payload].append((m.redelivery_count, t, m.deliver_at_ms))
                kept = held.get(m.message_id.ledger_id)
                if hold and (kept is None or kept.message_id == m.message_id):
                    held[m.message_id.ledger_id] = m  # (again, when redelivered)
                else:
                    acks.append(m)
            if acks:
                consumer.ack(acks)

    for wave in range(8):
        payloads = [b"w%d-%d" % (wave, i) for i in range(2_000)]
        base = max(start, now_ms() + 3_000)
        due = [base + ((i * 7 + wave * 131) % 2_000) * 4 for i in range(2_000)]
        mids = producer.send_many(payloads, deliver_at=due)
        assert all(producer.cancel_many(mids[:25]))  # cancels, in buckets to be merged
        cancelled |= set(payloads[:25])
        receive(0.25)
        # When the host and the subscription's actor die while merges run
        if wave == 3:
            restart_partition(topic_name, 0)
        if wave == 5:
            restart_subscription(topic_name, "s")

    def merged_down() -> bool:
        receive(0.2)
        stats = _topic_stats(topic_name)
        return stats["merged"] >= 1 and stats["buckets"] <= 3

    wait_until(
        "the partition to merge down to 3 buckets",
        merged_down,
        timeout_s=60,
        got=lambda: _topic_stats(topic_name),
    )
    consumer.ack(list(held.values()))
    receive(1.0, hold=False)
    restart_subscription(topic_name, "s")  # ... and again while the merged buckets deliver
    wanted = {b"w%d-%d" % (w, i) for w in range(8) for i in range(2_000)} - cancelled
    rest = _receive(cluster, consumer, wanted - set(got))
    for k, v in rest.items():
        got[k] += v
    # Then the partition merged down to 3 buckets
    stats = _topic_stats(topic_name)
    assert stats["merged"] >= 1 and stats["buckets"] <= 3, stats
    # and every message arrived, none cancelled, none early, and a second delivery only
    # after a restart, with its redelivery_count raised
    assert set(got) == wanted
    assert all(t >= d for v in got.values() for _, t, d in v), "early"
    assert all(c >= 1 for v in got.values() for c, _, _ in v[1:]), "a duplicate without a count"
