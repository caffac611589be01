"""receive_batch, and ack / nack of a whole MessageBatch, against real actors."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pytest

from raydelay import InvalidArgument, MessageBatch
from tests.integration.helpers import restart_subscription


def receive_batches(consumer, count: int, timeout_s: float = 20.0) -> list[MessageBatch]:
    out, n = [], 0
    deadline = time.monotonic() + timeout_s
    while n < count and time.monotonic() < deadline:
        batch = consumer.receive_batch(max_messages=count - n, timeout_s=0.5)
        if len(batch):
            out.append(batch)
            n += len(batch)
    return out


def test_a_batch_spans_partitions_offers_columns_and_is_acked_in_one_go(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=3)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    keys = [f"order-{i}" for i in range(300)]
    sent = producer.send_many(
        [b"p%d" % i for i in range(300)], keys=keys, properties={"src": "test"}
    )
    # When the messages are received as batches
    batches = receive_batches(consumer, 300)
    # Then together they are every message once, from more than one partition
    assert sum(map(len, batches)) == 300
    assert {p for b in batches for p, _ in b.batches} == {0, 1, 2}
    ids = [mid for b in batches for mid in b.message_ids]
    assert sorted(ids) == sorted(sent)
    # And the columns agree with the lazily built messages, row for row
    for b in batches:
        msgs = list(b)
        assert b.payloads.to_pylist() == [m.payload for m in msgs]
        assert b.keys.to_pylist() == [m.key for m in msgs]
        assert b.message_ids == [m.message_id for m in msgs]
        assert np.array_equal(b.partitions, [m.message_id.partition for m in msgs])
        assert (b.deliver_at_ms == -1).all() and (b.redelivery_count == 0).all()
        assert all(m.properties == {"src": "test"} and m.deliver_at_ms is None for m in msgs)
        table = b.to_arrow()
        assert table.num_rows == len(b) and table.column_names[0] == "partition"
        assert table.schema.metadata[b"topic"] == topic_name.encode()
    by_id = {m.message_id: m for b in batches for m in b}
    assert all(by_id[mid].key == keys[i] for i, mid in enumerate(sent))
    # When each batch is acked whole
    for b in batches:
        consumer.ack(b)
    # Then nothing is left
    stats = cluster.stats(topic_name, "s")
    assert stats["backlog"] == 0 and stats["pending_ack"] == 0 and stats["acked"] == 300


def test_acking_a_batch_twice_acks_once(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "s")
    cluster.create_producer(topic_name).send_many([b"x"] * 50)
    batches = receive_batches(consumer, 50)
    for b in batches:
        consumer.ack(b)
    for b in batches:
        consumer.ack(b)
    stats = cluster.stats(topic_name, "s")
    assert stats["acked"] == 50 and stats["backlog"] == 0


def test_a_nacked_batch_comes_back_as_a_batch_with_raised_counts(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "s")
    sent = cluster.create_producer(topic_name).send_many([b"n%d" % i for i in range(40)])
    first = receive_batches(consumer, 40)
    for b in first:
        consumer.nack(b, delay_s=0.3)
    again = receive_batches(consumer, 40)
    assert sorted(mid for b in again for mid in b.message_ids) == sorted(sent)
    assert all((b.redelivery_count == 1).all() for b in again)
    assert all(m.redelivery_count == 1 for b in again for m in b)
    for b in again:
        consumer.ack(b)
    assert cluster.stats(topic_name, "s")["backlog"] == 0


def test_a_batch_with_redelivered_and_new_messages_keeps_each_count(cluster, topic_name):
    cluster.create_topic(topic_name)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    old = producer.send_many([b"old-%d" % i for i in range(10)])
    for b in receive_batches(consumer, 10):
        consumer.nack(b)  # back at once, ahead of new entries
    new = producer.send_many([b"new-%d" % i for i in range(10)])
    got = {m.message_id: m.redelivery_count for b in receive_batches(consumer, 20) for m in b}
    assert got == {**dict.fromkeys(old, 1), **dict.fromkeys(new, 0)}


def test_acking_a_batch_after_its_subscription_restarted_sticks(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "s")
    cluster.create_producer(topic_name).send_many([b"r%d" % i for i in range(100)])
    batches = receive_batches(consumer, 100)
    # When the subscription's actor (it serves both partitions) dies and comes back first
    restart_subscription(topic_name, "s")
    for b in batches:
        consumer.ack(b)
    # Then the acks hold: nothing is left pending or to redeliver, also once persisted
    cluster.stats(topic_name, "s")
    deadline = time.monotonic() + 20
    while cluster.stats(topic_name, "s")["backlog"] and time.monotonic() < deadline:
        time.sleep(0.2)
    stats = cluster.stats(topic_name, "s")
    assert stats["backlog"] == 0 and stats["redelivery"] == 0


def test_receive_batch_checks_its_arguments_and_times_out_empty(cluster, topic_name):
    cluster.create_topic(topic_name)
    consumer = cluster.subscribe(topic_name, "s")
    empty = consumer.receive_batch(max_messages=10, timeout_s=0.2)
    assert len(empty) == 0 and not empty and empty.payloads.to_pylist() == []
    assert empty.to_arrow().num_rows == 0
    with pytest.raises(InvalidArgument, match="max_messages"):
        consumer.receive_batch(max_messages=0)
    with pytest.raises(InvalidArgument, match="timeout_s"):
        consumer.receive_batch(timeout_s=-1)
    with pytest.raises(InvalidArgument, match="topic"):
        consumer.ack(MessageBatch("other-topic", []))
    with pytest.raises(InvalidArgument, match="messages"):
        consumer.ack(42)


def test_delivered_batches_travel_as_out_of_band_buffers():
    """Ray pickles with protocol 5: an Arrow batch's buffers go out of band, not copied
    element by element into the pickle."""
    import pickle

    from raydelay.dispatch.wire import DELIVERY_SCHEMA

    n = 10_000
    payloads = pa.array([b"x" * 100] * n, pa.binary())
    ints = pa.array(np.arange(n), pa.int64())
    rb = pa.RecordBatch.from_arrays(
        [
            ints,
            ints,
            ints,
            ints,
            ints,
            payloads,
            pa.nulls(n, pa.string()),
            pa.nulls(n, DELIVERY_SCHEMA.field("properties").type),
        ],
        schema=DELIVERY_SCHEMA,
    )
    buffers: list = []
    inband = pickle.dumps(rb, protocol=5, buffer_callback=buffers.append)
    assert len(inband) < 4_096  # the schema and buffer references only
    assert sum(memoryview(b).nbytes for b in buffers) >= 100 * n
    assert pickle.loads(inband, buffers=buffers).equals(rb)


def test_send_many_takes_numpy_due_times_and_checks_them_as_lists(cluster, topic_name):
    from tests.integration.helpers import now_ms

    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    at = now_ms() + 300
    sent = producer.send_many([b"a%d" % i for i in range(20)], deliver_at=np.full(20, at))
    sent2 = producer.send_many([b"b%d" % i for i in range(20)], deliver_after=np.full(20, 0.3))
    assert len(sent) == len(sent2) == 20
    got = [m for b in receive_batches(consumer, 40) for m in b]
    assert {m.message_id for m in got} == set(sent) | set(sent2)
    assert all(m.deliver_at_ms >= at - 300 for m in got)
    with pytest.raises(InvalidArgument, match="message 1"):
        producer.send_many([b"x", b"y"], deliver_at=np.array([at, -5]))
    with pytest.raises(InvalidArgument, match="deliver_after"):
        producer.send_many([b"x", b"y"], deliver_after=np.array([0.5, np.nan]))
    with pytest.raises(InvalidArgument, match="1-d"):
        producer.send_many([b"x"], deliver_at=np.array([[at]]))


def test_send_many_takes_arrow_columns_as_a_parquet_file_gives_them(cluster, topic_name):
    from raydelay.dispatch.keys import key_hash
    from tests.integration.helpers import now_ms

    # Given columns as Arrow arrays: binary payloads, string keys, and due times as epoch
    # ms or as aware timestamps of another unit
    cluster.create_topic(topic_name, partitions=3)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    at = now_ms() + 300
    payloads = pa.array([b"a%d" % i for i in range(30)], pa.large_binary())
    keys = pa.chunked_array([[f"k{i}" for i in range(15)], [f"k{i}" for i in range(15, 30)]])
    sent = producer.send_many(payloads, deliver_at=pa.array([at] * 30, pa.int64()), keys=keys)
    stamps = pa.array([(at + 1) * 1000 + 1] * 5, pa.timestamp("us", tz="UTC"))
    sent2 = producer.send_many(pa.array([b"b%d" % i for i in range(5)]), deliver_at=stamps)
    sent3 = producer.send_many(pa.array([b"c"]), deliver_after=pa.array([0.3], pa.float64()))
    # Then they arrive as the same messages sent as lists would, with keys routed as keys
    got = [m for b in receive_batches(consumer, 36) for m in b]
    assert {m.message_id for m in got} == set(sent) | set(sent2) | set(sent3)
    by_payload = {m.payload: m for m in got}
    assert by_payload[b"a7"].key == "k7" and by_payload[b"a7"].deliver_at_ms == at
    assert by_payload[b"b0"].deliver_at_ms == at + 2  # microseconds rounded up: never early
    assert by_payload[b"a7"].message_id.partition == key_hash("k7") % 3
    # and bad columns are refused, each naming the row or the type, with nothing sent
    with pytest.raises(InvalidArgument, match=r"^payloads: expected an Arrow binary array"):
        producer.send_many(pa.array(["text"]))
    with pytest.raises(InvalidArgument, match=r"^payloads\[1\]: expected bytes, got None"):
        producer.send_many(pa.array([b"x", None]))
    big = cluster.config.topic.max_message_bytes + 1
    with pytest.raises(InvalidArgument, match=r"^payloads\[0\]: \d+ bytes is over"):
        producer.send_many(pa.array([b"x" * big]))
    with pytest.raises(InvalidArgument, match=r"^deliver_at: expected aware timestamps"):
        producer.send_many(pa.array([b"x"]), deliver_at=pa.array([1], pa.timestamp("ms")))
    with pytest.raises(InvalidArgument, match="message 1"):
        producer.send_many(pa.array([b"x", b"y"]), deliver_at=pa.array([at, -5], pa.int64()))
    assert not consumer.receive(max_messages=10, timeout_s=0.5)


def test_acks_sent_just_before_close_stay_acked(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "s")
    cluster.create_producer(topic_name).send_many([b"c%d" % i for i in range(100)])
    for b in receive_batches(consumer, 100):
        consumer.ack(b)  # not waited for
    consumer.close()
    stats = cluster.stats(topic_name, "s")
    assert stats["acked"] == 100 and stats["backlog"] == 0 and stats["redelivery"] == 0


def test_one_send_many_keeps_its_order_within_a_partition_across_chunks(cluster, topic_name):
    # Given more messages of one key than one append may carry (a chunk is at most a ledger)
    per_ledger = cluster.config.topic.max_entries_per_ledger
    cluster.create_topic(topic_name, partitions=2)
    producer = cluster.create_producer(topic_name)
    n = per_ledger * 2 + 7
    sent = producer.send_many([b"%d" % i for i in range(n)], keys=["same"] * n)
    # Then their positions follow the input order, the short last chunk included
    positions = [(m.ledger_id, m.entry_id) for m in sent]
    assert positions == sorted(positions) and len(set(positions)) == n
    assert len({m.partition for m in sent}) == 1


def test_a_prefetching_consumer_that_stops_calling_hands_its_messages_back_on_close(
    cluster, topic_name
):
    cluster.create_topic(topic_name)
    idle = cluster.subscribe(topic_name, "s", prefetch=True)
    busy = cluster.subscribe(topic_name, "s", prefetch=False)
    sent = cluster.create_producer(topic_name).send_many([b"p%d" % i for i in range(300)])
    first = idle.receive_batch(max_messages=100, timeout_s=5)
    assert len(first) == 100
    idle.ack(first)
    # idle now has a call standing and may hold the next round; closing hands it back
    idle.close()
    rest = [m for b in receive_batches(busy, 200) for m in b.message_ids]
    assert sorted(rest) == sorted(set(sent) - set(first.message_ids))
    with pytest.raises(InvalidArgument, match="prefetch"):
        cluster.subscribe(topic_name, "s", prefetch="yes")
