"""Each actor type killed mid-stream comes back with the state it had (rebuilt from the store)."""

from __future__ import annotations

import time

import numpy as np
import ray

from raydelay.actors.host import HostActor
from raydelay.actors.subscription import SubscriptionHost
from raydelay.log.entries import AppendBatch, Entries, encode_batch
from tests.integration.helpers import (
    now_ms,
    receive_all,
    received_before,
    restart,
    restart_partition,
    send_markers,
    subscription_partition,
    topic_partition,
    unit_host_of,
)


def test_a_restarted_topic_fences_its_open_ledger_and_keeps_its_dedup_state(cluster, topic_name):
    cluster.create_topic(topic_name)
    topic = topic_partition(topic_name, 0)
    batches = [
        encode_batch(AppendBatch("p1", seq, Entries.build([b"%d" % seq] * 300, np.full(300, -1))))
        for seq in range(1, 11)
    ]
    first = [ray.get(topic.submit(HostActor.append, b)) for b in batches]
    before = ray.get(topic.submit(HostActor.stats))
    # When the partition's host dies and Ray restarts it
    topic = restart_partition(topic_name, 0)
    after = ray.get(topic.submit(HostActor.stats))
    # Then the ledger that was open is closed at its last durable entry, a new one is open,
    assert after["ledgers"][:-1] == before["ledgers"][:-1] + [
        (before["ledgers"][-1][0], before["tail"][1] + 1)
    ]
    assert after["ledgers"][-1][1] is None and after["tail"] == before["tail"]
    # re-sent batches are still recognised, and nothing is in the log twice
    assert ray.get(topic.submit(HostActor.append, batches[-1])) == first[-1]
    assert ray.get(topic.submit(HostActor.append, batches[3])) == first[3]
    consumer = cluster.subscribe(topic_name, "s")
    got = receive_all(consumer, 3_000, timeout_s=20)
    assert len(got) == 3_000 and len({m.message_id for m, _ in got}) == 3_000
    # (a copy in the log would come before a marker appended after everything)
    assert received_before(consumer, send_markers(cluster.create_producer(topic_name))) == []


def test_a_restarted_subscription_comes_back_with_its_cursor_and_its_index(cluster, topic_name):
    cluster.create_topic(topic_name)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    immediate = producer.send_many([b"now"] * 1_000)
    due = now_ms() + 6_000
    delayed = producer.send_many([b"later"] * 6_000, deliver_at=due)
    acked = receive_all(consumer, 600, max_messages=600)  # some acked, the rest unacked
    held = consumer.receive(max_messages=100, timeout_s=5)
    assert len(acked) == 600 and held
    name = unit_host_of(topic_name, "s")
    sub = subscription_partition(topic_name, 0, "s")
    topic = topic_partition(topic_name, 0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # it holds every delayed one, and every sealed bucket
        stats = ray.get(sub.submit(SubscriptionHost.stats))
        if (
            stats["delayed"] >= 6_000
            and stats["buckets"] == ray.get(topic.submit(HostActor.stats))["buckets"]
        ):
            break
        time.sleep(0.1)
    ray.get(sub.submit(SubscriptionHost.flush))
    before = ray.get(sub.submit(SubscriptionHost.stats))
    assert before["buckets"] >= 1  # the topic sealed buckets in the store
    # When the subscription actor dies and Ray restarts it
    restart(name)
    sub = subscription_partition(topic_name, 0, "s")
    deadline = time.monotonic() + 10
    while ray.get(sub.submit(SubscriptionHost.stats))["delayed"] < before["delayed"] and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
    after = ray.get(sub.submit(SubscriptionHost.stats))
    # Then its cursor and delayed index are what they were,
    assert after["mark_delete"] == before["mark_delete"]
    assert after["delayed"] == before["delayed"] == 6_000
    assert after["buckets"] == before["buckets"]
    # and it did not re-read the log from mark-delete: the sequential read resumed after
    # the ledgers the topic's buckets cover; of those, only the 400 unacked immediate
    # messages were re-read, one by one
    md = tuple(before["mark_delete"])
    assert tuple(after["recovery"]["read_from"]) > (md[0] + 1, 0)
    assert after["recovery"]["loose"] == 400
    # and the rest arrives: the unacked immediate ones again (count raised), the delayed on time
    rest = receive_all(consumer, 400 + 6_000, timeout_s=30)
    ids = [m.message_id for m, _ in rest]
    assert set(ids) >= set(immediate[600:]) | set(delayed)
    held_ids = {m.message_id for m in held}
    assert all(m.redelivery_count >= 1 for m, _ in rest if m.message_id in held_ids)
    assert all(t >= due for m, t in rest if m.deliver_at_ms is not None)
    assert not {m.message_id for m, _ in acked} & set(ids)  # acked ones never come back


def test_a_graceful_shutdown_persists_cursors_and_closes_ledgers(cluster, topic_name, monkeypatch):
    import raydelay
    from raydelay.client import lifecycle as cluster_module
    from raydelay.dispatch.cursor import Cursor
    from raydelay.storage import make_store
    from raydelay.storage.keys import subscription_prefix

    cluster.create_topic(topic_name)
    producer = cluster.create_producer(topic_name)
    consumer = cluster.subscribe(topic_name, "s")
    producer.send_many([b"m"] * 500)
    assert len(receive_all(consumer, 500)) == 500  # all acked
    topic = topic_partition(topic_name, 0)
    before = ray.get(topic.submit(HostActor.stats))
    # A client that started Ray shuts down (Ray's own shutdown is stubbed: the session's
    # Ray serves the other tests)
    owner = raydelay.connect(config=cluster.config)
    owner._started_ray = True
    monkeypatch.setattr(cluster_module.ray, "shutdown", lambda: None)
    # (stopping every actor is stubbed too: they serve the other tests)
    monkeypatch.setattr(cluster_module.handles, "stop_all", lambda graceful: 0)
    owner.shutdown()
    # Then the open ledger is closed at its size and an empty one follows,
    # (or, every message in it being acked, retention has deleted it already)
    after = ray.get(topic.submit(HostActor.stats))
    open_id = before["ledgers"][-1][0]
    closed = dict(after["ledgers"])
    assert closed.get(open_id, before["tail"][1] + 1) == before["tail"][1] + 1
    assert after["ledgers"][-1][0] > open_id and after["ledgers"][-1][1] is None
    if open_id in closed:
        assert after["tail"] == before["tail"]
    # the cursor in the store has every ack,
    store = make_store(cluster.config)
    key = store.list(f"{subscription_prefix(topic_name, 0, 's')}/cursor/")[-1]
    cursor, _ = Cursor.decode(store.get(key))
    assert cursor.mark_delete >= tuple(before["tail"])
    # and a restart has nothing to fence: no ledger is opened, the open one stays open (the
    # closed one may be gone meanwhile: every message in it is acked, so retention may
    # delete it at any moment)
    topic = restart_partition(topic_name, 0)
    again = ray.get(topic.submit(HostActor.stats))["ledgers"]
    assert again[-1] == after["ledgers"][-1] and set(again) <= set(after["ledgers"])
