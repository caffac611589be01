"""Messages flow: produce, store, index, deliver on time, ack (one local Ray per session)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from raydelay import MessageId
from tests.integration.helpers import now_ms, receive_all, received_before, send_markers


def test_immediate_and_delayed_messages_interleaved_arrive_once_and_never_early(
    cluster, topic_name
):
    # Given a shared subscription and a mix of immediate and delayed messages
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    base = now_ms()
    delays = [None if i % 2 else 300 + 10 * i for i in range(200)]
    mids = producer.send_many(
        [b"m%d" % i for i in range(200)],
        deliver_at=[None if d is None else base + d for d in delays],
    )
    # When the consumer drains it
    got = receive_all(consumer, 200)
    # Then each message arrived exactly once, and no delayed one before its deliver_at
    assert sorted(m.message_id for m, _ in got) == sorted(mids)
    for m, received_ms in got:
        if m.deliver_at_ms is not None:
            assert received_ms >= m.deliver_at_ms
            assert m.payload == b"m%d" % mids.index(m.message_id)
    assert {m.redelivery_count for m, _ in got} == {0}
    # and nothing comes twice: not before markers read after them, and due after them
    assert received_before(consumer, send_markers(producer, [None, now_ms() + 300])) == []


def test_a_message_handed_out_ahead_is_held_by_the_client_until_it_is_due(cluster, topic_name):
    # Given a shared consumer that asks for messages 5 s ahead of their due time (more than
    # the subscription's 250 ms lookahead: it gets each as soon as the subscription has it)
    cluster.create_topic(topic_name)
    consumer = cluster.subscribe(topic_name, "s")
    consumer.receiver.ahead_ms = 5_000
    producer = cluster.create_producer(topic_name)
    mid = producer.send(b"due in 2 s", deliver_after=2.0)
    # When it receives in short calls until the message is in its client
    held_at, got = None, []
    deadline = now_ms() + 10_000
    while not got and now_ms() < deadline:
        got = consumer.receive(timeout_s=0.05)
        if not got and held_at is None and consumer.receiver.held():
            held_at = now_ms()
            # a cancel now finds it handed out: False, and it is still delivered
            assert producer.cancel(mid) is False
    received_ms = now_ms()
    # Then the client held it before its due time, and returned it no earlier than that
    assert [m.message_id for m in got] == [mid]
    assert held_at is not None and held_at < got[0].deliver_at_ms <= received_ms
    assert consumer.receiver.held() == 0
    # and it comes once
    assert received_before(consumer, send_markers(producer, [None])) == []


def test_deliver_after_deliver_at_and_aware_datetime_agree(cluster, topic_name):
    cluster.create_topic(topic_name)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    t0 = now_ms()
    a = producer.send(b"after", deliver_after=0.6)
    b = producer.send(b"at", deliver_at=t0 + 600)
    c = producer.send(
        b"dt", deliver_at=datetime.now(timezone(timedelta(hours=2))) + timedelta(milliseconds=600)
    )
    t1 = now_ms()
    got = receive_all(consumer, 3)
    by_id = {m.message_id: (m, t) for m, t in got}
    assert set(by_id) == {a, b, c}
    # each is due 600 ms after the moment it was sent (the datetime is rounded to the ms)
    assert by_id[b][0].deliver_at_ms == t0 + 600
    for m, t in by_id.values():
        assert t0 + 600 <= m.deliver_at_ms <= t1 + 601
        assert t >= m.deliver_at_ms


def test_message_fields_round_trip(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=3)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    mid = producer.send(b"\x00payload", key="order-17", properties={"k": "v"})
    [(m, _)] = receive_all(consumer, 1)
    assert m.message_id == mid and isinstance(mid, MessageId)
    assert (m.payload, m.key, m.properties, m.deliver_at_ms) == (
        b"\x00payload",
        "order-17",
        {"k": "v"},
        None,
    )
    assert m.publish_time_ms > 0 and m.redelivery_count == 0
    # the same key always lands on the same partition
    assert {producer.send(b"x", key="order-17").partition for _ in range(3)} == {mid.partition}


def test_two_subscriptions_each_receive_everything(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=2)
    first = cluster.subscribe(topic_name, "email")
    second = cluster.subscribe(topic_name, "push")
    producer = cluster.create_producer(topic_name)
    mids = producer.send_many([b"%d" % i for i in range(300)], deliver_after=0.3)
    for consumer in (first, second):
        got = receive_all(consumer, 300)
        assert sorted(m.message_id for m, _ in got) == sorted(mids)


def test_shared_subscription_spreads_messages_over_consumers(cluster, topic_name):
    cluster.create_topic(topic_name)
    # without prefetch: c2 stops calling after one receive and must not hold any more
    c1 = cluster.subscribe(topic_name, "s", prefetch=False)
    c2 = cluster.subscribe(topic_name, "s", prefetch=False)
    producer = cluster.create_producer(topic_name)
    mids = producer.send_many([b"x"] * 400)
    got1 = c1.receive(max_messages=100, timeout_s=5)
    got2 = c2.receive(max_messages=100, timeout_s=5)
    assert got1 and got2
    assert not {m.message_id for m in got1} & {m.message_id for m in got2}
    c1.ack(got1)
    c2.ack(got2)
    rest = receive_all(c1, 400 - len(got1) - len(got2))
    assert len(got1) + len(got2) + len(rest) == len(mids)


@pytest.mark.parametrize("kind", ["exclusive", "failover"])
def test_fifo_subscriptions_ignore_deliver_at_and_keep_log_order(cluster, topic_name, kind):
    cluster.create_topic(topic_name)
    consumer = cluster.subscribe(topic_name, "fifo", subscription_type=kind)
    producer = cluster.create_producer(topic_name)
    far = now_ms() + 3_600_000
    mids = producer.send_many(
        [b"%d" % i for i in range(50)], deliver_at=[far if i % 3 == 0 else None for i in range(50)]
    )
    got = receive_all(consumer, 50, timeout_s=10)
    assert [m.message_id for m, _ in got] == mids  # an hour early, and in log order


def test_exclusive_subscription_refuses_a_second_consumer(cluster, topic_name):
    from raydelay import RaydelayError

    cluster.create_topic(topic_name)
    first = cluster.subscribe(topic_name, "x", subscription_type="exclusive")
    with pytest.raises(RaydelayError, match="exclusive"):
        cluster.subscribe(topic_name, "x", subscription_type="exclusive")
    first.close()
    again = cluster.subscribe(topic_name, "x", subscription_type="exclusive")  # free again
    again.close()


def test_failover_standby_takes_over_when_the_active_consumer_leaves(cluster, topic_name):
    cluster.create_topic(topic_name)
    active = cluster.subscribe(topic_name, "f", subscription_type="failover")
    standby = cluster.subscribe(topic_name, "f", subscription_type="failover")
    producer = cluster.create_producer(topic_name)
    mids = producer.send_many([b"%d" % i for i in range(20)])
    taken = active.receive(max_messages=5, timeout_s=5)  # delivered, never acked
    assert [m.message_id for m in taken] == mids[: len(taken)]
    # the rest is ready to go (the active one just got the first), yet not to the standby
    assert standby.receive(max_messages=100, timeout_s=0.5) == []
    active.close()
    got = receive_all(standby, 20)
    assert [m.message_id for m, _ in got] == mids  # the unacked ones first, in order
    assert all(m.redelivery_count == 1 for m, _ in got[: len(taken)])
