"""raydelay.compat.pulsar against the session's cluster: the behaviour a Pulsar program
relies on (timeouts, initial positions, negative acks, dead letters, batch receive,
sequence ids, argument errors, Key_Shared order) with only its import changed."""

from __future__ import annotations

import re
import time
import uuid
from collections import defaultdict
from datetime import timedelta

import pytest

import raydelay.compat.pulsar as pulsar
from raydelay.compat.pulsar import (
    Client,
    ConsumerBatchReceivePolicy,
    ConsumerDeadLetterPolicy,
    ConsumerKeySharedPolicy,
    ConsumerType,
    InitialPosition,
    KeySharedMode,
    MessageId,
)

URL = "pulsar://localhost:6650"


@pytest.fixture
def client(cluster):
    c = Client(URL, cluster=cluster)
    yield c
    c.close()


@pytest.fixture
def topic():
    return f"persistent://public/default/pc-{uuid.uuid4().hex[:8]}"


def drain(consumer, timeout_ms=300, ack=True) -> list:
    out = []
    while True:
        try:
            m = consumer.receive(timeout_ms)
        except pulsar.Timeout:
            return out
        out.append(m)
        if ack:
            consumer.acknowledge(m)


def test_send_receive_ids_properties_and_a_timeout(client, topic):
    consumer = client.subscribe(topic, "s", consumer_type=ConsumerType.Shared)
    producer = client.create_producer(topic, producer_name="maker")
    mid = producer.send(b"hello", properties={"a": "1"}, partition_key="k", event_timestamp=7)
    msg = consumer.receive(10_000)
    assert (msg.data(), msg.value(), msg.properties()) == (b"hello", b"hello", {"a": "1"})
    assert msg.message_id() == mid and isinstance(mid, MessageId)
    assert (msg.producer_name(), msg.partition_key(), msg.event_timestamp()) == ("maker", "k", 7)
    assert msg.topic_name() == topic and msg.encryption_context() is None
    assert msg.redelivery_count() == 0 and msg.publish_timestamp() > 0
    assert MessageId.deserialize(mid.serialize()) == mid
    consumer.acknowledge(msg)
    started = time.monotonic()
    with pytest.raises(pulsar.Timeout):
        consumer.receive(150)
    assert time.monotonic() - started >= 0.15  # it waited its timeout, no less


def test_string_schema_null_values_and_send_async(client, topic):
    consumer = client.subscribe(topic, "s", schema=pulsar.schema.StringSchema())
    producer = client.create_producer(topic, schema=pulsar.schema.StringSchema())
    results = []
    for i in range(5):
        producer.send_async(f"m{i}", lambda res, mid: results.append((res, mid)))
    producer.send(None, properties={"action": "delete"})
    producer.flush()
    assert [r for r, _ in results] == [pulsar.Result.Ok] * 5
    got = [consumer.receive(10_000) for _ in range(6)]
    assert [m.value() for m in got] == ["m0", "m1", "m2", "m3", "m4", None]
    assert [m.message_id() for m in got[:5]] == [mid for _, mid in results]
    assert got[5].has_null_value() and got[5].properties() == {"action": "delete"}


def test_latest_skips_what_came_before_and_earliest_gets_it(client, topic):
    producer = client.create_producer(topic)
    for i in range(3):
        producer.send(b"old-%d" % i)
    latest = client.subscribe(topic, "late")  # Pulsar's default: Latest
    earliest = client.subscribe(topic, "early", initial_position=InitialPosition.Earliest)
    producer.send(b"new")
    assert [m.data() for m in drain(latest)] == [b"new"]
    assert [m.data() for m in drain(earliest)] == [b"old-0", b"old-1", b"old-2", b"new"]


def test_unsubscribe_deletes_the_subscription(client, topic):
    producer = client.create_producer(topic)
    consumer = client.subscribe(topic, "s")
    producer.send(b"never acked")
    assert consumer.receive(10_000).data() == b"never acked"
    consumer.unsubscribe()
    again = client.subscribe(topic, "s")  # a new subscription: Latest, nothing left over
    with pytest.raises(pulsar.Timeout):
        again.receive(300)


def test_deliver_at_and_after_on_shared_never_early_and_ignored_on_exclusive(client, topic):
    shared = client.subscribe(topic, "shared", consumer_type=ConsumerType.Shared)
    exclusive = client.subscribe(topic, "excl")
    producer = client.create_producer(topic)
    sent = time.time()
    producer.send(b"at", deliver_at=int(sent * 1000) + 1_200)
    producer.send(b"after", deliver_after=timedelta(milliseconds=800))
    assert [m.data() for m in drain(exclusive, 200)] == [b"at", b"after"]  # log order, at once
    got = []
    for _ in range(2):
        m = shared.receive(10_000)
        got.append((m.data(), time.time() - sent))
        shared.acknowledge(m)
    assert [d for d, _ in got] == [b"after", b"at"]
    assert got[0][1] >= 0.8 and got[1][1] >= 1.2


def test_negative_acks_come_back_in_order_after_the_delay(client, topic):
    consumer = client.subscribe(
        topic, "s", consumer_type=ConsumerType.Shared, negative_ack_redelivery_delay_ms=400
    )
    producer = client.create_producer(topic)
    for i in range(5):
        producer.send_async(b"m%d" % i, None)
    producer.flush()
    nacked_at = {}
    for i in range(5):
        m = consumer.receive(10_000)
        assert m.data() == b"m%d" % i
        if i % 2:
            consumer.negative_acknowledge(m.message_id())  # by id, as Pulsar allows
        else:
            consumer.negative_acknowledge(m)
        nacked_at[m.data()] = time.monotonic()
    for i in range(5):
        m = consumer.receive(10_000)
        assert m.data() == b"m%d" % i and m.redelivery_count() == 1
        assert time.monotonic() - nacked_at[m.data()] >= 0.4
        consumer.acknowledge(m)
    with pytest.raises(pulsar.Timeout):
        consumer.receive(200)


def test_dead_letters_after_max_redeliver_count(client, topic):
    dlq = topic + "-dead"
    consumer = client.subscribe(
        topic,
        "s",
        consumer_type=ConsumerType.Shared,
        dead_letter_policy=ConsumerDeadLetterPolicy(2, dlq, "init-sub"),
    )
    producer = client.create_producer(topic)
    for i in range(4):
        producer.send(b"m%d" % i)
    counts = []
    for _ in range(3):  # the first delivery and two redeliveries
        batch = [consumer.receive(10_000) for _ in range(4)]
        counts.append(sorted(m.redelivery_count() for m in batch))
        consumer.redeliver_unacknowledged_messages()
    assert counts == [[0] * 4, [1] * 4, [2] * 4]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(300)
    # the initial subscription was there before the dead letters went out
    dead = client.subscribe(dlq, "init-sub", consumer_type=ConsumerType.Shared)
    assert sorted(m.data() for m in drain(dead)) == [b"m0", b"m1", b"m2", b"m3"]


def test_batch_receive_by_count_and_by_timeout(client, topic):
    consumer = client.subscribe(
        topic,
        "s",
        consumer_type=ConsumerType.Shared,
        batch_receive_policy=ConsumerBatchReceivePolicy(10, -1, -1),
    )
    producer = client.create_producer(topic)
    for i in range(12):
        producer.send_async(b"m%d" % i, None)
    producer.flush()
    assert [m.data() for m in consumer.batch_receive()] == [b"m%d" % i for i in range(10)]
    timed = client.subscribe(
        topic,
        "t",
        consumer_type=ConsumerType.Shared,
        initial_position=InitialPosition.Earliest,
        batch_receive_policy=ConsumerBatchReceivePolicy(100, -1, 500),
    )
    assert len(timed.batch_receive()) == 12  # fewer than 100: the timeout ends it


def test_sequence_ids_dedup_across_a_producer_of_the_same_name(client, topic):
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(topic, producer_name="p")
    assert producer.last_sequence_id() == -1
    for i in range(3):
        producer.send(b"m%d" % i, sequence_id=i)
    producer.send(b"m1", sequence_id=1)  # a repeat: not stored again
    producer.send(b"m2", sequence_id=2)
    assert producer.last_sequence_id() == 2
    producer.close()
    again = client.create_producer(topic, producer_name="p")
    assert again.last_sequence_id() == 2
    again.send(b"m2", sequence_id=2)
    again.send(b"m3")  # the next id: 3
    assert again.last_sequence_id() == 3
    ids = []
    for i in range(4, 44):  # queued together: they share log batches, ids 4..43
        again.send_async(b"m%d" % i, lambda res, mid: ids.append(mid))
    again.flush()
    assert again.last_sequence_id() == 43 and len(set(ids)) == 40
    again.close()
    assert client.create_producer(topic, producer_name="p").last_sequence_id() == 43
    got = drain(consumer)
    assert [m.data() for m in got] == [b"m%d" % i for i in range(44)]
    assert [m.message_id() for m in got[4:]] == ids


def test_argument_errors_are_pulsars(client, topic):
    producer = client.create_producer(topic)
    with pytest.raises(TypeError):
        producer.send(5)
    for bad in (
        {"properties": "x"},
        {"partition_key": 5},
        {"sequence_id": "x"},
        {"event_timestamp": "x"},
        {"deliver_at": "x"},
        {"deliver_after": "x"},
        {"deliver_after": 5},  # a timedelta, not seconds
        {"replication_clusters": 5},
        {"disable_replication": "x"},
    ):
        with pytest.raises(ValueError):
            producer.send(b"x", **bad)
    for bad_client in ("fake", None):
        with pytest.raises(ValueError):
            Client(bad_client)
    with pytest.raises(ValueError):
        Client(URL, authentication="x")
    with pytest.raises(ValueError):
        Client(URL, io_threads="x")
    with pytest.raises(ValueError):
        client.create_producer(None)
    with pytest.raises(ValueError):
        client.create_producer(topic, producer_name=5)
    with pytest.raises(ValueError):
        client.subscribe(topic, None)
    with pytest.raises(ValueError):
        client.subscribe(topic, "s", consumer_type=None)
    with pytest.raises(ValueError):
        client.subscribe(topic, "s", receiver_queue_size="x")
    with pytest.raises(ValueError):
        ConsumerDeadLetterPolicy(0)
    with pytest.raises(ValueError):
        ConsumerKeySharedPolicy(KeySharedMode.Sticky)
    with pytest.raises(ValueError):
        ConsumerKeySharedPolicy(KeySharedMode.Sticky, sticky_ranges=[(0, 100), (50, 150)])


@pytest.mark.parametrize(
    "call, feature",
    [
        (lambda c, t: Client("pulsar+ssl://h:6651"), "TLS"),
        (lambda c, t: Client(URL, authentication=pulsar.AuthenticationToken("x")), "auth"),
        (lambda c, t: c.create_reader(t, MessageId.earliest, is_read_compacted=True), "compacted"),
        (lambda c, t: c.create_table_view(t), "table views"),
        (lambda c, t: c.create_producer(t, compression_type=pulsar.CompressionType.LZ4), "compr"),
        (
            lambda c, t: c.subscribe(
                [t, t + "2"], "s", dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(3)
            ),
            "dead letter policies on several topics",
        ),
        (
            lambda c, t: c.subscribe(
                t,
                "k",
                consumer_type=ConsumerType.KeyShared,
                key_shared_policy=ConsumerKeySharedPolicy(
                    KeySharedMode.Sticky, sticky_ranges=[(0, 100)]
                ),
            ),
            "sticky",
        ),
        (lambda c, t: pulsar.schema.JsonSchema(pulsar.schema.Record), "JSON"),
    ],
)
def test_what_is_not_supported_says_so(client, topic, call, feature):
    with pytest.raises(NotImplementedError, match=feature):
        call(client, topic)


def test_cumulative_ack_on_exclusive_and_refused_on_shared(client, topic):
    producer = client.create_producer(topic)
    excl = client.subscribe(topic, "e")
    shared = client.subscribe(topic, "s", consumer_type=ConsumerType.Shared)
    for i in range(4):
        producer.send(b"m%d" % i)
    got = [excl.receive(10_000) for _ in range(4)]
    excl.acknowledge_cumulative(got[2])
    excl.close()
    again = client.subscribe(topic, "e")
    assert [m.data() for m in drain(again)] == [b"m3"]
    m = shared.receive(10_000)
    with pytest.raises(pulsar.CumulativeAcknowledgementNotAllowedError):
        shared.acknowledge_cumulative(m)


def test_an_exclusive_consumer_forgets_what_it_acknowledged_one_at_a_time(client, topic):
    # (what a FIFO consumer handed out and no ack covered is kept for acknowledge_cumulative;
    # an individual ack must take its message out, or that set grows with every message)
    producer = client.create_producer(topic)
    excl = client.subscribe(topic, "e")
    for i in range(4):
        producer.send(b"m%d" % i)
    got = [excl.receive(10_000) for _ in range(4)]
    excl.acknowledge(got[0])
    excl.acknowledge(got[1].message_id())
    assert sum(len(held) for held in excl._handed.values()) == 2
    excl.acknowledge_cumulative(got[3])
    assert sum(len(held) for held in excl._handed.values()) == 0
    excl.close()
    assert drain(client.subscribe(topic, "e")) == []


def test_key_shared_keeps_each_key_in_order_on_one_consumer_while_one_leaves(cluster, client):
    local = f"ks-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(local, 2)
    consumers = {
        name: client.subscribe(
            local,
            "ks",
            consumer_type=ConsumerType.KeyShared,
            consumer_name=name,
            receiver_queue_size=5,
        )
        for name in ("c1", "c2", "c3")
    }
    producer = client.create_producer(local)
    keys, per_key = [f"key-{i}" for i in range(24)], 20
    for n in range(per_key):
        for k in keys:
            producer.send_async(b"%d" % n, None, partition_key=k)
    producer.flush()
    seen: dict[str, list[int]] = defaultdict(list)  # key -> sequence numbers, as received
    owners: dict[str, list[str]] = defaultdict(list)  # key -> consumers, in receive order
    received_by: dict[str, int] = defaultdict(int)
    total, left, idle = len(keys) * per_key, None, 0
    while sum(map(len, seen.values())) < total and idle < 40:
        idle += 1
        for name, c in list(consumers.items()):
            try:
                m = c.receive(50)
            except pulsar.Timeout:
                continue
            idle = 0
            received_by[name] += 1
            seen[m.partition_key()].append(int(m.data()))
            if not owners[m.partition_key()] or owners[m.partition_key()][-1] != name:
                owners[m.partition_key()].append(name)
            c.acknowledge(m)
        # c2 leaves once it took 20 messages: its keys are sent round-robin, 20 each, so it
        # is then partway through every one of them (leaving at a third of the total, it
        # could have finished all of its own already, when the others were slower)
        if left is None and received_by["c2"] >= 20:
            left = "c2"
            done_before = {k for k, v in seen.items() if len(v) == per_key}
            consumers.pop("c2").close()  # what it holds unacked goes back
    assert sum(map(len, seen.values())) == total  # every message, none twice
    for k in keys:
        assert seen[k] == list(range(per_key)), f"{k} out of order: {seen[k]}"
    moved = {k for k, o in owners.items() if len(o) > 1}
    assert moved, "c2's keys should have moved"
    for k in moved:  # only c2's keys changed hands, once, when it left
        assert owners[k][0] == "c2" and len(owners[k]) == 2, (k, owners[k])
    # every key not finished when c2 left ends with the two that stayed, spread over both
    assert {o[-1] for k, o in owners.items() if k not in done_before} == {"c1", "c3"}


def test_the_migration_example_runs_as_written(cluster, capsys, monkeypatch, tmp_path):
    # its Client attaches to the session's Ray, as a second program would
    import runpy
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    example = Path(__file__).resolve().parents[2] / "examples" / "pulsar_migration.py"
    runpy.run_path(str(example), run_name="__main__")
    out = capsys.readouterr().out
    assert "handled 4 timeouts, order-3 failed 3 times and went to the DLQ" in out
    assert "timeout order-3 (from billing)" in out


def test_a_reader_reads_from_where_it_is_told_and_seeks_like_pulsar(client, topic):
    producer = client.create_producer(topic)
    ids = [producer.send(b"m%d" % i, deliver_after=timedelta(hours=1)) for i in range(10)]
    # a reader ignores deliver_at, and starts after the id it is given (or at it, inclusive)
    reader = client.create_reader(topic, MessageId.earliest)
    assert [reader.read_next(5_000).data() for _ in range(10)] == [b"m%d" % i for i in range(10)]
    with pytest.raises(pulsar.Timeout):
        reader.read_next(100)
    after = client.create_reader(topic, ids[3])
    at = client.create_reader(topic, ids[3], start_message_id_inclusive=True)
    assert after.read_next(5_000).data() == b"m4" and at.read_next(5_000).data() == b"m3"
    # seek by id (after it), by publish time (the first at or after it), to the latest
    reader.seek(ids[6])
    assert reader.read_next(5_000).data() == b"m7"
    first = after.read_next(5_000)
    reader.seek(first.publish_timestamp())
    assert reader.read_next(5_000).message_id() <= first.message_id()
    reader.seek(MessageId.latest)
    assert not reader.has_message_available()
    assert reader.get_last_message_id() == ids[-1]
    with pytest.raises(ValueError, match="invalid seek_arg type"):
        reader.seek(1.5)
    reader.close()
    assert not reader.is_connected()


def test_a_consumer_seeks_and_reads_several_topics(client, topic):
    producer = client.create_producer(topic)
    ids = [producer.send(b"m%d" % i) for i in range(5)]
    consumer = client.subscribe(
        topic,
        "s",
        consumer_type=ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    got = drain(consumer)
    assert [m.data() for m in got] == [b"m%d" % i for i in range(5)]
    consumer.seek(ids[1])  # (after it, as Pulsar's)
    assert consumer.receive(5_000).data() == b"m2"
    assert consumer.get_last_message_id() == ids[-1]
    consumer.close()
    # several topics: a list, then a pattern over the full names
    other = topic + "-b"
    client.create_producer(other).send(b"b0")
    both = client.subscribe([topic, other], "t", initial_position=pulsar.InitialPosition.Earliest)
    names = sorted(m.topic_name() for m in drain(both))
    assert names == sorted([topic] * 5 + [other])
    with pytest.raises(pulsar.OperationNotSupported):
        both.acknowledge(ids[0])  # (an id from send() names no topic)
    both.close()
    by_pattern = client.subscribe(
        re.compile(re.escape(topic) + ".*"),
        "u",
        initial_position=pulsar.InitialPosition.Earliest,
        pattern_auto_discovery_period=1,
    )
    assert len(drain(by_pattern)) == 6
    by_pattern.close()


def test_a_pattern_reads_persistent_and_non_persistent_topics_by_mode(client, topic):
    base = topic.split("/")[-1]
    durable = f"persistent://public/default/{base}-re-1"
    fleeting = f"non-persistent://public/default/{base}-re-2"
    for name in (durable, fleeting):
        client.create_producer(name).send(name.encode())
    pattern = re.compile(f"public/default/{re.escape(base)}-re-.*")

    def topics_read(mode):
        c = client.subscribe(
            pattern,
            f"s-{mode.name}",
            initial_position=pulsar.InitialPosition.Earliest,
            regex_subscription_mode=mode,
        )
        got = sorted(m.topic_name() for m in drain(c))
        c.close()
        return got

    assert topics_read(pulsar.RegexSubscriptionMode.PersistentOnly) == [durable]
    assert topics_read(pulsar.RegexSubscriptionMode.NonPersistentOnly) == [fleeting]
    assert topics_read(pulsar.RegexSubscriptionMode.AllTopics) == sorted([durable, fleeting])
