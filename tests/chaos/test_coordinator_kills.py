"""The coordinator killed in the middle of a topic creation and of bucket seals: afterwards
nothing is half made (every registered thing is whole) and nothing is orphaned."""

from __future__ import annotations

import threading
import time

import ray

from raydelay.actors.subscription import SubscriptionHost
from raydelay.cluster.names import COORDINATOR, NAMESPACE
from raydelay.delayed.sealed import THROUGH_KEY, decode_meta, registry_name
from raydelay.storage import make_store
from tests.integration.helpers import (
    now_ms,
    receive_all,
    received_before,
    restart,
    send_markers,
    subscription_partition,
)


def test_topics_created_while_the_coordinator_dies_are_whole(cluster, topic_name):
    coordinator = ray.get_actor(COORDINATOR, namespace=NAMESPACE)
    names: list[str] = []
    errors: list[BaseException] = []

    def create(name: str) -> None:
        try:
            cluster.create_topic(name, partitions=2)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    for wave, pause_s in enumerate((0.0, 0.01, 0.05)):
        batch = [f"{topic_name}-{wave}-{i}" for i in range(2)]
        names += batch
        threads = [threading.Thread(target=create, args=(n,)) for n in batch]
        for t in threads:
            t.start()
        time.sleep(pause_s)
        coordinator = restart(COORDINATOR)  # When the coordinator dies mid-creation
        for t in threads:
            t.join(timeout=60)
        assert errors == []  # the callers' retries finish the job
    # Then each topic is registered whole (both partitions) and works end to end
    topics = ray.get(coordinator.topics.remote())
    assert all(topics[n] == 2 for n in names)
    for name in names[::3]:  # two of them
        producer = cluster.create_producer(name)
        consumer = cluster.subscribe(name, "s")
        ids = producer.send_many([b"m"] * 10)
        assert sorted(m.message_id for m, _ in receive_all(consumer, 10)) == sorted(ids)
    # and every partition assigned to a host is one the coordinator knows, and each of
    # these topics' partitions is assigned once
    assigned = ray.get(coordinator.assignments.remote())
    for key in assigned:
        topic, partition = key.rsplit("/", 1)
        assert int(partition) < topics[topic], key
    for name in names[::3]:
        assert {f"{name}/0", f"{name}/1"} <= set(assigned)
    # and the journal replays to the same state after one more restart
    coordinator = restart(COORDINATOR)
    assert ray.get(coordinator.topics.remote()) == topics


def test_bucket_seals_while_the_coordinator_dies_leave_no_half_registered_bucket(
    cluster, topic_name
):
    cluster.create_topic(topic_name)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    # all due at one instant far enough ahead that the check below sees every one still
    # waiting on a loaded machine too (the sends and kills took 58 s at a load of 27)
    due = now_ms() + 45_000
    sent: list = []
    kills_done = threading.Event()

    def produce() -> None:  # ~10k/s (a seal every 2 ledgers of 2,000) until the kills end
        while len(sent) < 20_000 or (not kills_done.is_set() and len(sent) < 80_000):
            sent.extend(producer.send_many([b"d"] * 1_000, deliver_at=due))
            time.sleep(0.1)

    writer = threading.Thread(target=produce)
    writer.start()
    for _ in range(3):  # When the coordinator dies again and again during the seals
        time.sleep(0.3)
        restart(COORDINATOR)
    kills_done.set()
    writer.join()
    n = len(sent)
    assert n >= 20_000
    sub = subscription_partition(topic_name, 0, "s")
    deadline = time.monotonic() + 20
    while (
        ray.get(sub.submit(SubscriptionHost.stats))["delayed"] < n
        and time.monotonic() < deadline
        and now_ms() < due - 1_000
    ):
        time.sleep(0.2)
    stats = ray.get(sub.submit(SubscriptionHost.stats))
    # every one indexed and still waiting (a message due already would be missing here)
    assert stats["delayed"] == n and stats["buckets"] >= 3, (stats, n, due - now_ms())
    # Then every bucket the topic registered is whole in the store, and every bucket in
    # the store is registered (none orphaned)
    coordinator = ray.get_actor(COORDINATOR, namespace=NAMESPACE)
    name = registry_name(topic_name, 0)
    registered = set(ray.get(coordinator.registry_list.remote(name))) - {THROUGH_KEY}
    store = make_store(cluster.config)
    stored: dict[str, set[str]] = {}
    for key in store.list(f"{name}/"):
        bucket, obj = key[len(name) + 1 :].split("/")
        stored.setdefault(bucket, set()).add(obj)
    # (a merged bucket is a meta over the runs of the buckets it merged, whose data and
    # index objects stay under their own keys)
    runs: set[str] = set()
    for key in registered:
        meta = decode_meta(store.get(f"{name}/{key}/meta"))
        for run in meta.runs:
            data = store.get(f"{name}/{run.key}/data")
            assert sum(s.length for s in run.segments) == len(data)
            runs.add(run.key)
    assert set(stored) == registered | runs
    for key, objects in stored.items():
        assert objects == ({"meta"} if key in registered else set()) | (
            {"index", "data"} if key in runs else set()
        ), key
    # and every message arrives once it is due, none before
    got = receive_all(consumer, n, timeout_s=60, max_messages=5_000)
    assert {m.message_id for m, _ in got} == set(sent)
    assert all(t >= due for _, t in got)
    # and none twice: not before markers read after them and due after them
    assert received_before(consumer, send_markers(producer, [None, now_ms() + 300])) == []
