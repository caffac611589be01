"""The Producer and the Consumer against fake links (no Ray): routing, retries that do not
append twice, acks to the right partition, and a down partition that does not hold up the
others."""

from __future__ import annotations

import logging
import time

import pytest

from raydelay.client.consumer import Consumer
from raydelay.client.producer import Producer
from raydelay.clock import now_ms
from raydelay.config import load_config
from raydelay.errors import InvalidArgument, StorageError, Unavailable
from tests.unit.fakes import FakeSubscription, FakeTopic


@pytest.fixture
def config():
    return load_config(None)


def test_a_producer_routes_each_key_to_one_partition_and_returns_the_positions(config):
    topic = FakeTopic(partitions=3)
    producer = Producer(topic, "orders", config, name="p")
    keys = [f"customer-{i % 5}" for i in range(60)]
    ids = producer.send_many([f"m{i}".encode() for i in range(60)], keys=keys)
    partition_of_key = {}
    for key, mid in zip(keys, ids, strict=True):
        assert partition_of_key.setdefault(key, mid.partition) == mid.partition
    assert sum(len(v) for v in topic.payloads.values()) == 60
    for mid in ids:  # each id points at its own payload
        assert topic.payloads[mid.partition][mid.entry_id] == f"m{ids.index(mid)}".encode()


def test_an_append_retried_after_a_failure_sends_the_same_batch_and_is_not_appended_twice(
    config, caplog
):
    caplog.set_level(logging.DEBUG, logger="raydelay.client.producer")
    topic = FakeTopic(partitions=1)
    producer = Producer(topic, "orders", config, name="p")
    topic.down.add(0)  # the first append fails; the retry reconnects and sends it again
    ids = producer.send_many([b"a", b"b", b"c"])
    appends = [args for method, _, args in topic.calls if method == "append"]
    assert len(appends) >= 2 and all(a == appends[0] for a in appends)  # same bytes, same id
    assert topic.reconnects == [0]
    assert topic.payloads[0] == [b"a", b"b", b"c"]
    assert [m.entry_id for m in ids] == [0, 1, 2]
    assert producer.retries == 1
    # and the failover is said once, at INFO, when appends go through again
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert len(said) == 1 and said[0][0] == "INFO", said
    assert said[0][1].startswith("orders partition 0: appends go through again after")


def test_a_named_producer_goes_on_from_the_sequence_ids_its_partitions_hold(config):
    topic = FakeTopic(partitions=2)
    first = Producer(topic, "orders", config, name="p")
    for _ in range(3):
        first.send_many([b"x"] * 40, keys=[f"k{i}" for i in range(40)])
    held = [topic._last_sequence(p, "p") for p in range(2)]
    assert min(held) > 0  # both partitions hold batches of "p"
    assert Producer(topic, "orders", config, name="p").last_sequences == held
    assert Producer(topic, "orders", config, name="other").last_sequences == [0, 0]


def test_a_closed_producer_reports_once_and_refuses_sends(config):
    closed = []
    producer = Producer(FakeTopic(1), "orders", config, on_close=closed.append)
    producer.close()
    producer.close()
    assert closed == [producer]
    with pytest.raises(InvalidArgument, match="producer"):
        producer.send(b"late")


def consumer_of(subscription: FakeSubscription) -> Consumer:
    return Consumer(subscription, "orders", "billing", lease_s=60.0)


def test_a_cancel_by_key_and_a_replace_ask_for_the_subscriptions_while_the_markers_are_written(
    config,
):
    # Given pending keyed messages on two partitions
    topic = FakeTopic(partitions=2)
    producer = Producer(topic, "orders", config)
    later = [now_ms() + 3_600_000] * 4
    producer.send_many([b"a", b"b", b"c", b"d"], deliver_at=later, keys=["k0", "k1", "k2", "k3"])
    # When two are cancelled by key and one is replaced
    del topic.calls[:]
    assert producer.cancel_keys(["k0", "k1"]) == [True, True]
    producer.send(b"c2", deliver_at=later[0], key="k2", on_duplicate="replace")
    # Then each asked for the subscriptions once, while its markers were written (the
    # cancel before its calls, the replace beside its append), and applied the markers with
    # that lookup's answer
    methods = [m for m, _, _ in topic.calls]
    cancels = methods.index("append_keyed")
    assert methods[0] == "subscriptions" and set(methods[1:cancels]) == {"cancel_keys"}
    assert methods[cancels:] == ["append_keyed", "subscriptions"]
    assert len(topic.applied) == 2
    assert topic.applied_with == [topic.listed, topic.listed]


def test_a_consumer_receives_from_every_partition_and_acks_each_message_where_it_came_from():
    sub = FakeSubscription(partitions=2)
    sub.publish(0, b"a0", b"b0")
    sub.publish(1, b"a1")
    consumer = consumer_of(sub)
    try:
        got = consumer.receive(max_messages=10, timeout_s=0)
        assert sorted(m.payload for m in got) == [b"a0", b"a1", b"b0"]
        consumer.ack(got)
        consumer.flush()
        assert sub.acked == {0: {sub.key(0), sub.key(1)}, 1: {sub.key(0)}}
        assert all(consumer.consumer_id in sub.consumers[p] for p in (0, 1))
    finally:
        consumer.close()
    assert not sub.consumers[0] and not sub.consumers[1]


def test_partitions_that_share_an_actor_are_asked_in_one_receive_call():
    sub = FakeSubscription(partitions=4, actors=2)  # actor 0: partitions 0, 2; 1: 1, 3
    for p in range(4):
        sub.publish(p, f"m{p}".encode())
    consumer = consumer_of(sub)
    try:
        sub.calls.clear()
        got = consumer.receive(max_messages=40, timeout_s=0)
        assert sorted(m.payload for m in got) == [b"m0", b"m1", b"m2", b"m3"]
        asked = [(m, args) for m, _, args in sub.calls if m.startswith("receive")]
        assert asked == [("receive_many", ((0, 2),)), ("receive_many", ((1, 3),))]
        sub.calls.clear()
        consumer.ack(got)
        consumer.flush()  # one call per actor; each ack applied at its message's partition
        assert [(m, args) for m, _, args in sub.calls] == [
            ("ack_many", ((0, 2),)),
            ("ack_many", ((1, 3),)),
        ]
        assert all(sub.acked[p] == {sub.key(0)} for p in range(4))
        for _ in range(20):  # past _ACKS_IN_FLIGHT: answers shared by partitions reaped
            for p in range(4):
                sub.publish(p, b"more")
            consumer.ack(consumer.receive(max_messages=40, timeout_s=0))
        consumer.flush()
        assert all(sub.acked[p] == {sub.key(i) for i in range(21)} for p in range(4))
    finally:
        consumer.close()


def test_an_ack_that_fails_at_one_partition_of_a_shared_call_is_sent_again_there_alone():
    sub = FakeSubscription(partitions=2, actors=1)
    sub.publish(0, b"a")
    sub.publish(1, b"b")
    consumer = consumer_of(sub)
    try:
        got = consumer.receive(max_messages=10, timeout_s=0)
        sub.down.add(1)  # partition 1's ack fails inside the one call; partition 0's holds
        sub.calls.clear()
        consumer.ack(got)
        consumer.flush()  # partition 1's ack kept, and sent again once it is back
        assert sub.acked == {0: {sub.key(0)}, 1: {sub.key(0)}}
        first, *again = [(m, p) for m, p, _ in sub.calls if m.startswith("ack")]
        assert first == ("ack_many", 0) and again and set(again) == {("ack", 1)}
        sub.publish(0, b"c")
        sub.publish(1, b"d")
        later = consumer.receive(max_messages=10, timeout_s=0)
        consumer.nack(later, delay_s=2.0)
        consumer.flush()
        assert sub.nacked == {0: [sub.key(1)], 1: [sub.key(1)]}
        assert sorted((p, d) for p, d, _ in sub.nacks) == [(0, 2.0), (1, 2.0)]
    finally:
        consumer.close()


def test_one_partition_failing_in_a_shared_receive_leaves_the_others_messages_delivered():
    sub = FakeSubscription(partitions=3, actors=1)
    for p in range(3):
        sub.publish(p, f"m{p}".encode())
    consumer = consumer_of(sub)
    try:
        sub.down.add(1)  # its receive fails (Unavailable); the other two answer
        got = consumer.receive(max_messages=30, timeout_s=0)
        assert sorted(m.payload for m in got) == [b"m0", b"m2"]
        assert 1 in consumer._health.down  # asked again once the retry thread looked it up
        sub.down.discard(1)
        consumer._health.down[1] = 0  # (the retry thread's mark: looked up again)
        assert [m.payload for m in consumer.receive(max_messages=30, timeout_s=0)] == [b"m1"]
        # an error that is not a passing one is raised, after the others' messages are
        # taken in: the next receive hands them out
        sub.publish(0, b"n0")
        sub.publish(1, b"n1")
        real = sub._receive

        def broken(partition, consumer_id, max_messages):
            if partition == 1:
                raise StorageError("corrupt object", retriable=False)
            return real(partition, consumer_id, max_messages)

        sub._receive = broken
        with pytest.raises(StorageError, match="corrupt"):
            consumer.receive(max_messages=30, timeout_s=0)
        assert [m.payload for m in consumer.receive(max_messages=30, timeout_s=0)] == [b"n0"]
    finally:
        consumer.close()


def test_a_down_partition_keeps_its_acks_until_it_answers_while_the_others_go_on():
    sub = FakeSubscription(partitions=2)
    sub.publish(0, b"p0")
    sub.publish(1, b"p1")
    consumer = consumer_of(sub)
    try:
        got = consumer.receive(max_messages=10, timeout_s=0)
        sub.down.add(0)
        consumer.ack(got)  # partition 0's ack fails; partition 1's goes through
        sub.publish(1, b"more")
        assert [m.payload for m in consumer.receive(max_messages=10, timeout_s=0)] == [b"more"]
        assert sub.acked[1] == {sub.key(0)}
        consumer.flush()  # reconnects partition 0 and sends the kept ack
        assert sub.acked[0] == {sub.key(0)}
        assert 0 in sub.reconnects
    finally:
        consumer.close()


def test_a_nack_goes_to_the_partition_of_each_message():
    sub = FakeSubscription(partitions=2)
    sub.publish(1, b"x", b"y")
    consumer = consumer_of(sub)
    try:
        got = consumer.receive(max_messages=10, timeout_s=0)
        before = now_ms()
        consumer.nack(got[1:], delay_s=0.5)
        consumer.flush()
        assert sub.nacked == {1: [sub.key(1)]}
        # the delay counts from the nack itself (the consumer's clock goes along)
        [(partition, delay_s, nacked_at_ms)] = sub.nacks
        assert (partition, delay_s) == (1, 0.5) and before <= nacked_at_ms <= now_ms()
    finally:
        consumer.close()


def test_a_consumer_that_cannot_join_every_partition_leaves_none_joined():
    sub = FakeSubscription(partitions=3)
    sub.down.add(2)
    sub.comes_back = False  # partition 2 cannot be reached at all
    with pytest.raises(Unavailable):
        consumer_of(sub)
    assert not any(sub.consumers[p] for p in range(3))


def _health_lines(caplog) -> list[tuple[str, str]]:
    return [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name == "raydelay.client.partition_health" and r.levelno >= logging.INFO
    ]


def _receive_until(consumer, n: int, timeout_s: float = 10.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += consumer.receive(max_messages=100, timeout_s=0.2)
    return got


def _receive_until_said(consumer, timeout_s: float = 5.0) -> None:
    """Receive on (as a consumer does) until every outage it saw has been said."""
    deadline = time.monotonic() + timeout_s
    while consumer._health.outages and time.monotonic() < deadline:
        consumer.receive(max_messages=10, timeout_s=0.05)


def test_a_failover_is_said_in_one_info_line_naming_what_moved_and_where(caplog):
    # Given a subscription whose one actor serves 4 partitions, on node aaaaaaaa1
    caplog.set_level(logging.DEBUG, logger="raydelay.client.partition_health")
    sub = FakeSubscription(partitions=4, actors=1)
    sub.nodes["sub/t/s/0"] = "aaaaaaaa1"
    consumer = consumer_of(sub)
    try:
        # When its node is lost: every partition's calls fail with Ray's long error
        sub.down |= {0, 1, 2, 3}
        for p in range(4):
            sub.publish(p, f"m{p}".encode())
        assert consumer.receive(max_messages=10, timeout_s=0) == []
        assert consumer._health.down.keys() == {0, 1, 2, 3}
        # and the actor comes back on node bbbbbbbb2 (re-created when the retry thread
        # looks it up again)
        sub.moves["sub/t/s/0"] = "bbbbbbbb2"
        got = _receive_until(consumer, 4)
        assert sorted(m.payload for m in got) == [b"m0", b"m1", b"m2", b"m3"]
        # and a call sent to the old actor fails late, right after: the same failover
        sub.down.add(0)
        sub.publish(0, b"late")
        assert [m.payload for m in _receive_until(consumer, 1)] == [b"late"]
        _receive_until_said(consumer)
    finally:
        consumer.close()
    # Then the client said it once, at INFO: the partitions, the actor, from where to where
    lines = _health_lines(caplog)
    assert len(lines) == 1, lines
    level, text = lines[0]
    assert level == "INFO"
    assert "partitions 0-3 answer again after" in text
    assert "sub/t/s/0 moved from node aaaaaaaa to node bbbbbbbb" in text


def test_a_lost_actor_is_looked_up_once_for_all_the_partitions_it_serves():
    # Given two actors serving 3 partitions each, both lost (every call fails)
    sub = FakeSubscription(partitions=6, actors=2)
    consumer = consumer_of(sub)
    try:
        sub.down |= set(range(6))
        for p in range(6):
            sub.publish(p, f"m{p}".encode())
        assert consumer.receive(max_messages=10, timeout_s=0) == []
        # When they come back, and the consumer receives on
        got = _receive_until(consumer, 6)
        # Then every message came, and each actor was looked up once, not once per partition
        assert sorted(m.payload for m in got) == [f"m{p}".encode() for p in range(6)]
        assert sorted(sub.actor_of(p) for p in sub.reconnects) == ["sub/t/s/0", "sub/t/s/1"]
    finally:
        consumer.close()


def test_an_outage_that_lasts_is_warned_of_once_while_it_lasts(caplog, monkeypatch):
    from raydelay.client import partition_health

    monkeypatch.setattr(partition_health, "SLOW_OUTAGE_S", 0.3)
    caplog.set_level(logging.INFO, logger="raydelay.client.partition_health")
    sub = FakeSubscription(partitions=2, actors=1)
    sub.nodes["sub/t/s/0"] = "cccccccc3"
    consumer = consumer_of(sub)
    try:
        sub.down |= {0, 1}
        sub.comes_back = False  # it cannot be looked up again for a while
        consumer.receive(max_messages=10, timeout_s=0)
        deadline = time.monotonic() + 5
        while not _health_lines(caplog) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.6)  # the outage lasts twice the threshold more: still one warning
        # the one warning names the partitions, the actor, its node and the error
        assert [lvl for lvl, _ in _health_lines(caplog)] == ["WARNING"]
        text = _health_lines(caplog)[0][1]
        assert "partitions 0-1 down for" in text and "sub/t/s/0 on node cccccccc" in text
        assert "are down" in text  # (the first error, as the fake raised it)
        # and once it is back, the same actor on the same node: restarted
        sub.comes_back = True
        sub.publish(0, b"x")
        assert [m.payload for m in _receive_until(consumer, 1)] == [b"x"]
        _receive_until_said(consumer)
    finally:
        consumer.close()
    lines = _health_lines(caplog)
    assert [lvl for lvl, _ in lines] == ["WARNING", "INFO"], lines
    assert "partitions 0-1 answer again" in lines[1][1]
    assert "was restarted on node cccccccc" in lines[1][1]
