"""Producer dedup, ledger rollover, retention, bad input and coordinator restarts."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

import pytest
import ray

from raydelay import InvalidArgument, NotFound
from raydelay.actors.host import HostActor
from raydelay.cluster import rpc
from raydelay.log.entries import AppendBatch, Entries, encode_batch
from tests.integration.helpers import receive_all, restart, topic_partition


def test_a_re_sent_batch_is_not_appended_twice(cluster, topic_name):
    import numpy as np

    cluster.create_topic(topic_name)
    topic = topic_partition(topic_name, 0)
    entries = Entries.build([b"a", b"b"], np.array([-1, -1], dtype=np.int64))
    batch = encode_batch(AppendBatch("producer-1", 7, entries))
    # Given a batch that was appended
    first = ray.get(topic.submit(HostActor.append, batch))
    # When the producer re-sends it (say, after a timeout)
    again = ray.get(topic.submit(HostActor.append, batch))
    # Then it gets the same positions and the log holds it once
    assert again == first
    consumer = cluster.subscribe(topic_name, "s")
    got = receive_all(consumer, 3, timeout_s=3)
    assert [m.payload for m, _ in got] == [b"a", b"b"]
    assert ray.get(topic.submit(HostActor.stats))["duplicates"] == 1


def test_ledgers_roll_over_and_fully_acked_ones_are_deleted(cluster, topic_name, ray_cluster):
    per_ledger = cluster.config.topic.max_entries_per_ledger
    cluster.create_topic(topic_name)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    mids = producer.send_many([b"x"] * (per_ledger * 3 + 10))
    ledgers = sorted({m.ledger_id for m in mids})
    assert len(ledgers) >= 4
    stats = cluster.stats(topic_name)["partitions"][0]
    assert all(count == per_ledger for _, count in stats["ledgers"][:3]), stats["ledgers"]
    # When everything is acked
    assert len(receive_all(consumer, len(mids), timeout_s=30)) == len(mids)
    # Then the closed ledgers disappear from the store and the metadata
    root = cluster.config.storage.local.root
    deadline = time.monotonic() + 15
    left = None
    while time.monotonic() < deadline:
        left = [x[0] for x in cluster.stats(topic_name)["partitions"][0]["ledgers"]]
        if set(left).isdisjoint(ledgers[:3]):
            break
        time.sleep(0.2)
    assert set(left).isdisjoint(ledgers[:3])
    from pathlib import Path

    on_disk = {
        int(p.name)
        for p in (Path(root) / "topics" / topic_name / "0" / "ledgers").iterdir()
        if any(p.iterdir())
    }
    assert on_disk.isdisjoint(ledgers[:3])


def test_bad_input_is_refused_and_nothing_is_written(cluster, topic_name):
    cluster.create_topic(topic_name)
    producer = cluster.create_producer(topic_name)
    limit = cluster.config.topic.max_message_bytes
    bad = [
        (dict(payload=b"x", deliver_after=-1), "deliver_after"),
        (dict(payload=b"x", deliver_after=1, deliver_at=1), "not both"),
        (dict(payload=b"x", deliver_at=datetime(2030, 1, 1)), "naive"),
        (dict(payload=b"x", deliver_at="tomorrow"), "deliver_at"),
        (dict(payload=b"x", deliver_at=1.5), "deliver_at"),
        (dict(payload="text"), "payload"),
        (dict(payload=b"x" * (limit + 1)), "max_message_bytes"),
        (dict(payload=b"x", key=5), "key"),
        (dict(payload=b"x", properties={"a": 1}), "properties"),
    ]
    for kwargs, words in bad:
        payload = kwargs.pop("payload")
        with pytest.raises(InvalidArgument, match=words):
            producer.send(payload, **kwargs)
    # a batch with one bad message writes nothing at all
    with pytest.raises(InvalidArgument, match="message 2"):
        producer.send_many([b"a", b"b", b"c"], deliver_after=[1, 1, -5])
    assert cluster.stats(topic_name)["partitions"][0]["tail"] is None
    for name in ("", "a/b", "..", "x" * 200, 5):
        with pytest.raises(InvalidArgument):
            cluster.create_topic(name)
        with pytest.raises(InvalidArgument):
            cluster.subscribe(topic_name, name)
    with pytest.raises(InvalidArgument, match="subscription_type"):
        cluster.subscribe(topic_name, "s", subscription_type="broadcast")
    with pytest.raises(NotFound):
        cluster.create_producer("no-such-topic")
    with pytest.raises(NotFound):
        cluster.subscribe("no-such-topic", "s")


def test_an_absurd_time_fails_its_own_send_only(cluster, topic_name):
    # Given eight threads sending 100 good messages each (a timedelta delay)
    cluster.create_topic(topic_name, partitions=2)
    producer = cluster.create_producer(topic_name)
    sent: list = []

    def good() -> None:
        for j in range(100):
            sent.append(producer.send(b"ok%d" % j, deliver_after=timedelta(seconds=60)))

    threads = [threading.Thread(target=good) for _ in range(8)]
    for t in threads:
        t.start()
    # When other callers send times past year 9999, at once and in a batch
    for bad in (dict(deliver_at=2**63), dict(deliver_after=1e300)):
        with pytest.raises(InvalidArgument, match="after year 9999"):
            producer.send(b"bad", **bad)
    with pytest.raises(InvalidArgument, match="message 1"):
        producer.send_many([b"a", b"b"], deliver_at=[1, 2**63])
    for t in threads:
        t.join()
    # Then each bad send failed alone: all 800 good ones are durable
    assert len(sent) == 800
    entries = sum(p["entries"] for p in cluster.stats(topic_name)["partitions"])
    assert entries == 800


def test_max_delay_is_enforced_when_configured(cluster, topic_name, monkeypatch):
    # Given a producer built under delayed.max_delay_ms = 60 s (the session's cluster has none)
    cluster.create_topic(topic_name)
    producer = cluster.create_producer(topic_name)
    monkeypatch.setattr(producer, "_max_delay_ms", 60_000)
    with pytest.raises(InvalidArgument, match="max_delay_ms"):
        producer.send(b"x", deliver_after=61)
    producer.send(b"x", deliver_after=59)  # within the limit


def test_the_coordinator_restarts_with_its_metadata_intact(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=3)
    consumer = cluster.subscribe(topic_name, "kept", subscription_type="failover")
    producer = cluster.create_producer(topic_name)
    producer.send_many([b"x"] * 30)
    receive_all(consumer, 30)
    coordinator = ray.get_actor("coordinator", namespace="raydelay")

    def metadata():
        return (
            ray.get(coordinator.topics.remote())[topic_name],
            ray.get(coordinator.subscriptions.remote(topic_name)),
            [ray.get(coordinator.ledgers.remote(topic_name, p)) for p in range(3)],
        )

    before = metadata()
    # When the coordinator process dies, Ray restarts it and it replays its journal
    coordinator = restart("coordinator")
    assert metadata() == before
    assert before[0] == 3
    # and the data path keeps working
    mid = producer.send(b"after")
    got = receive_all(consumer, 1)
    assert [m.message_id for m, _ in got] == [mid]


def test_a_deleted_topics_producer_gets_not_found_at_once(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=2)
    cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    producer.send(b"before")
    cluster.delete_topic(topic_name, force=True)
    # a retry never re-creates the deleted topic's actors: NotFound, not 30 s of retries
    started = time.monotonic()
    with pytest.raises(NotFound, match=topic_name):
        producer.send(b"after")
    took = time.monotonic() - started
    names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
    assert not any(topic_name in n for n in names)
    print(f"NotFound after {took:.2f} s")


def test_a_retried_cancel_gets_its_markers_back_after_its_target_left_the_log(cluster, topic_name):
    # Given a cancel sent by producer "p" as its batch 1, whose target sits in a full ledger
    per_ledger = cluster.config.topic.max_entries_per_ledger
    cluster.create_topic(topic_name)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    mids = producer.send_many([b"x"] * (per_ledger + 10))
    target = (mids[0].ledger_id, mids[0].entry_id)
    topic = topic_partition(topic_name, 0)
    markers = ray.get(topic.submit(HostActor.cancel, [target], "p", 1))
    # When every message is acknowledged and the target's ledger is trimmed
    receive_all(consumer, len(mids), timeout_s=30)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        ledgers = [x[0] for x in cluster.stats(topic_name)["partitions"][0]["ledgers"]]
        if target[0] not in ledgers:
            break
        time.sleep(0.2)
    assert target[0] not in ledgers
    # Then the same cancel, re-sent (its reply was lost), gets the same markers back
    assert ray.get(topic.submit(HostActor.cancel, [target], "p", 1)) == markers
    # and a new cancel of that message (one held up while it was delivered and trimmed,
    # say by a host restarting) answers "not cancelled", as for any delivered message
    assert producer.cancel(mids[0]) is False
    # while a position past the partition's end is still not found
    with pytest.raises(NotFound, match="is not in the log"):
        rpc.get(
            topic.submit(HostActor.cancel, [(mids[-1].ledger_id, mids[-1].entry_id + 5)], "p", 2)
        )
    # and a cancel whose first send failed (a host restarting), sent again once its target
    # left the log (the first send may have landed, its record gone with its ledger),
    # answers "not cancelled" too: the subscription says it was delivered
    from raydelay.actors.handles import fan_out_cancel
    from raydelay.actors.host import partition_peer
    from raydelay.config import config_to_dict

    real = partition_peer(topic_name, 0, config_to_dict(cluster.config))

    class FirstSendFails:
        name, sends = real.name, 0

        def submit(self, method, *args):
            self.sends += 1
            if self.sends == 1:
                return _unavailable.remote()
            return real.submit(method, *args)

        def refresh_or_drop(self):  # (what a failed send asks of its peers)
            real.refresh_or_drop()

    peer = FirstSendFails()
    out, resent = fan_out_cancel(
        topic_name,
        lambda p: peer,
        lambda p, s: cluster._subscription_peer(topic_name, p, s),
        lambda: ["s"],
        {0: ([target], 3)},
        "p",
        deadline_s=20,
    )
    assert (out, resent, peer.sends) == ({0: [False]}, 1, 2)


@ray.remote
def _unavailable():
    from raydelay.errors import Unavailable

    raise Unavailable("host restarting")


def test_the_coordinator_counts_each_methods_calls_and_their_time(cluster, topic_name):
    from raydelay.actors.coordinator import CoordinatorActor
    from raydelay.actors.handles import coordinator_handle

    def times() -> dict:
        return rpc.get(coordinator_handle().submit(CoordinatorActor.call_times))

    before = times().get("create_topic", {"calls": 0})["calls"]
    cluster.create_topic(topic_name, partitions=2)
    row = times()["create_topic"]
    assert row["calls"] >= before + 1
    assert row["seconds"] >= row["longest_s"] > 0
