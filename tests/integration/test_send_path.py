"""The send path and the due path against the session's Ray: group commits without a timer,
send_async, durability of what a send returned, and deliveries staged ahead of their
instant that never go out early."""

from __future__ import annotations

import threading

import ray

from raydelay.actors.host import HostActor
from tests.integration.helpers import now_ms, receive_all, restart_partition, topic_partition


def _objects_written(topic: str, partition: int = 0) -> int:
    return int(ray.get(topic_partition(topic, partition).submit(HostActor.stats))["objects"])


def test_a_lone_send_commits_alone_and_concurrent_appends_share_commits(cluster, topic_name):
    # Given a topic of one partition
    cluster.create_topic(topic_name, partitions=1)
    lone = cluster.create_producer(topic_name)
    lone.send(b"warm-up")
    before = _objects_written(topic_name)
    # When sends come one after another, each waiting for the last
    for i in range(20):
        lone.send(b"lone-%d" % i)
    # Then each is one durable write of its own: nothing waits for company
    assert _objects_written(topic_name) - before == 20
    # When 8 producers send from 4 threads each at once
    producers = [cluster.create_producer(topic_name) for _ in range(8)]
    before = _objects_written(topic_name)

    def work(producer, k: int) -> None:
        for i in range(25):
            producer.send(b"crowd-%d-%d" % (k, i))

    threads = [
        threading.Thread(target=work, args=(p, k))
        for k, p in enumerate(producers)
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then appends that arrived while a commit was in flight went into the next one:
    # fewer objects were written than batches appended
    batches = sum(sum(p.last_sequences) for p in producers)
    written = _objects_written(topic_name) - before
    assert batches >= 8 and 0 < written < batches


def test_what_a_send_returned_survives_a_topic_actor_killed_right_after(cluster, topic_name):
    # Given a subscription, and sends that returned (send and send_async)
    cluster.create_topic(topic_name, partitions=1)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    sent = [producer.send(b"one-%d" % i) for i in range(5)]
    futures = [producer.send_async(b"async-%d" % i) for i in range(500)]
    producer.flush()
    sent += [f.result() for f in futures]
    # When the partition's host is killed at once (Ray restarts it from the store)
    restart_partition(topic_name, 0)
    # Then every message whose id came back is delivered, once
    got = receive_all(consumer, len(sent), timeout_s=60)
    assert sorted(m.message_id for m, _ in got) == sorted(sent)


def test_send_async_through_a_restart_resolves_every_future_and_appends_each_once(
    cluster, topic_name
):
    # Given a stream of send_async calls on two partitions
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name, max_pending_messages=500)
    futures = [producer.send_async(b"m-%d" % i) for i in range(1_000)]
    futures[-1].result(timeout=60)
    # When a partition's actor dies while more are on their way
    killer = threading.Thread(target=restart_partition, args=(topic_name, 1))
    killer.start()
    futures += [producer.send_async(b"m-%d" % i) for i in range(1_000, 3_000)]
    killer.join()
    producer.flush()
    # Then every future holds its message's id (the re-sent batches were recognised)
    ids = [f.result(timeout=0) for f in futures]
    assert len(set(ids)) == 3_000
    got = receive_all(consumer, 3_000, timeout_s=60)
    assert sorted(m.message_id for m, _ in got) == sorted(ids)
    assert sorted(m.payload for m, _ in got) == sorted(b"m-%d" % i for i in range(3_000))


def test_messages_due_within_the_lookahead_never_arrive_early(cluster, topic_name):
    # Given delays from 5 ms to 1.5 s: within the subscription's lookahead, around it,
    # and beyond what wakes its log reader
    cluster.create_topic(topic_name, partitions=2)
    plain = cluster.subscribe(topic_name, "plain")
    ahead = cluster.subscribe(topic_name, "prefetching", prefetch=True)
    producer = cluster.create_producer(topic_name)
    delays_ms = [5 + (i * 37) % 1_500 for i in range(400)]
    futures = [
        producer.send_async(b"d-%d" % i, deliver_after=d / 1000) for i, d in enumerate(delays_ms)
    ]
    producer.flush()
    ids = [f.result() for f in futures]
    # When both consumers receive them as they fall due
    for consumer in (plain, ahead):
        got = receive_all(consumer, len(ids), timeout_s=30)
        # Then each arrived once, none before its deliver_at (strict mode)
        assert sorted(m.message_id for m, _ in got) == sorted(ids)
        early = [(m.message_id, received - m.deliver_at_ms) for m, received in got
                 if received < m.deliver_at_ms]  # fmt: skip
        assert early == []
    assert max(m.deliver_at_ms for m, _ in got) <= now_ms()
