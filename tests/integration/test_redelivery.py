"""Cancel, nack, ack timeout and dead letters against real actors."""

from __future__ import annotations

from tests.integration.helpers import now_ms, receive_all, received_before, send_markers


def test_cancel_before_due_is_honoured_and_after_delivery_returns_false(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "billing")
    producer = cluster.create_producer(topic_name)
    keep, doomed = producer.send_many([b"keep", b"doomed"], deliver_after=0.8)
    due = now_ms() + 800  # no earlier than the doomed one's deliver_at
    # When the doomed one is cancelled before it is due
    assert producer.cancel(doomed) is True
    # Then only the other one is delivered, up to markers due after the doomed one
    got = receive_all(consumer, 1)
    assert [m.message_id for m, _ in got] == [keep]
    assert received_before(consumer, send_markers(producer, [due + 200])) == []
    # And a cancel after delivery has no effect and says so
    assert producer.cancel(keep) is False
    # And cancelling twice is not honoured twice
    assert producer.cancel(doomed) is False
    stats = cluster.stats(topic_name, "billing")
    assert stats["cancelled"] == 1 and stats["backlog"] == 0


def test_cancel_of_an_unknown_message_is_not_found(cluster, topic_name):
    import pytest

    from raydelay import MessageId, NotFound

    cluster.create_topic(topic_name)
    producer = cluster.create_producer(topic_name)
    with pytest.raises(NotFound):
        producer.cancel(MessageId(topic_name, 0, 999_999, 0))


def test_nack_with_delay_redelivers_after_the_delay(cluster, topic_name):
    cluster.create_topic(topic_name)
    consumer = cluster.subscribe(topic_name, "retry")
    producer = cluster.create_producer(topic_name)
    mid = producer.send(b"job")
    [(first, _)] = receive_all(consumer, 1, ack=False)
    nacked_at = now_ms()
    consumer.nack(first, delay_s=0.7)
    [(again, received)] = receive_all(consumer, 1)
    assert again.message_id == mid and again.redelivery_count == 1
    assert received - nacked_at >= 700


def test_ack_timeout_redelivers_unacked_messages_with_a_higher_count(cluster, topic_name):
    cluster.create_topic(topic_name)
    consumer = cluster.subscribe(topic_name, "slow", ack_timeout_s=0.5)
    producer = cluster.create_producer(topic_name)
    mids = producer.send_many([b"a", b"b", b"c"])
    first = receive_all(consumer, 3, ack=False)
    assert {m.redelivery_count for m, _ in first} == {0}
    second = receive_all(consumer, 3, ack=True)
    assert sorted(m.message_id for m, _ in second) == sorted(mids)
    assert {m.redelivery_count for m, _ in second} == {1}
    # acked: no further redelivery, up to a marker due well after their ack deadline
    acked_at = now_ms()
    assert received_before(consumer, send_markers(producer, [acked_at + 1_000])) == []
    assert cluster.stats(topic_name, "slow")["redelivered"] == len(mids)  # the one round


def test_messages_go_to_the_dead_letter_topic_after_max_redeliveries(cluster, topic_name):
    cluster.create_topic(topic_name)
    consumer = cluster.subscribe(topic_name, "s", max_redeliveries=2)
    dlq = cluster.subscribe(f"{topic_name}-s-DLQ", "inspect")
    producer = cluster.create_producer(topic_name)
    mid = producer.send(b"poison", properties={"a": "1"})
    counts = []
    for _ in range(3):  # delivered 1 + max_redeliveries times, nacked every time
        [(m, _)] = receive_all(consumer, 1, ack=False)
        counts.append(m.redelivery_count)
        consumer.nack(m)
    assert counts == [0, 1, 2]
    [(dead, _)] = receive_all(dlq, 1)
    assert dead.payload == b"poison"
    assert dead.properties["a"] == "1"
    assert dead.properties["raydelay.original_message_id"] == (
        f"{topic_name}/0/{mid.ledger_id}:{mid.entry_id}"
    )
    # acked on the source subscription: not handed out again before a later message
    assert received_before(consumer, send_markers(producer)) == []
    assert cluster.stats(topic_name, "s")["backlog"] == 0


def test_closing_a_consumer_hands_its_unacked_messages_to_another(cluster, topic_name):
    cluster.create_topic(topic_name)
    leaving = cluster.subscribe(topic_name, "s")
    staying = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    mids = producer.send_many([b"%d" % i for i in range(10)])
    held = receive_all(leaving, 10, ack=False)
    assert len(held) == 10
    leaving.close()
    got = receive_all(staying, 10)
    assert sorted(m.message_id for m, _ in got) == sorted(mids)
    assert {m.redelivery_count for m, _ in got} == {1}


def test_cancel_many_cancels_across_partitions_in_one_go(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=3)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    mids = producer.send_many(
        [b"%d" % i for i in range(30)], deliver_after=1.0, keys=[f"k{i}" for i in range(30)]
    )
    assert len({m.partition for m in mids}) == 3
    doomed = mids[::2]
    assert producer.cancel_many(doomed) == [True] * len(doomed)
    got = receive_all(consumer, 15)
    assert sorted(m.message_id for m, _ in got) == sorted(mids[1::2])
    # and no cancelled one arrives before markers due after them on every partition
    assert received_before(consumer, send_markers(producer, [now_ms() + 1_000])) == []
    assert producer.cancel_many(doomed[:2] + mids[1:2]) == [False, False, False]
