"""What an operator does to a running subscription: peek at what is scheduled.

The session's config has small ledgers (2,000 entries) and buckets sealed from 2,000
delayed entries, so a few thousand messages spread over sealed buckets, the unsealed tail
and the subscription's own nacks: every place a peek has to look.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
import ray

from raydelay.errors import InvalidArgument, NotFound
from tests.integration.helpers import now_ms, topic_partition, wait_until


def _buckets(topic: str) -> int:
    return ray.get(topic_partition(topic, 0).stats.remote())["buckets"]


def _order(m) -> tuple:
    return (m.deliver_at_ms, m.message_id.ledger_id, m.message_id.entry_id)


def _state(cluster, topic: str, sub: str) -> dict:
    """What a peek could change if it delivered, acked or moved the cursor."""
    s = cluster.stats(topic, sub)
    keep = ("pending_ack", "redelivery", "delivered", "acked", "redelivered", "mark_delete")
    return {k: s[k] for k in keep}


def test_peek_shows_the_schedule_in_the_order_it_is_then_delivered(cluster, topic_name):
    # Given 5,000 delayed messages due at 15 instants 200 ms apart on one partition (in
    # sealed buckets and the unsealed tail), 10 keys, 50 of them cancelled
    cluster.create_topic(topic_name, partitions=1)
    consumer = cluster.subscribe(topic_name, "billing")
    producer = cluster.create_producer(topic_name)
    start = now_ms() + 6_000
    due = [start + 200 * ((i * 7) % 15) for i in range(5_000)]
    ids = producer.send_many(
        [b"p%d" % i for i in range(5_000)],
        deliver_at=due,
        keys=[f"k{i % 10}" for i in range(5_000)],
    )
    assert all(producer.cancel_many(ids[:50]))
    wait_until("a sealed bucket", lambda: _buckets(topic_name) >= 1)
    before = _state(cluster, topic_name, "billing")

    # When the whole schedule is peeked, then the first 100, one key, and a window
    everything = cluster.peek(topic_name, "billing", limit=-1)
    first = cluster.peek(topic_name, "billing", limit=100)
    k3 = cluster.peek(topic_name, "billing", limit=-1, key="k3")
    window = cluster.peek(
        topic_name, "billing", limit=-1, due_after=start + 1_000, due_before=start + 2_000
    )

    # Then it holds every message not cancelled, with payload, key and due time, in
    # delivery order; the limit, the key and the window select from that same list
    sent = {mid: (b"p%d" % i, f"k{i % 10}", due[i]) for i, mid in enumerate(ids)}
    assert len(everything) == 4_950
    assert {m.message_id for m in everything} == set(ids[50:])
    assert all((m.payload, m.key, m.deliver_at_ms) == sent[m.message_id] for m in everything)
    assert [_order(m) for m in everything] == sorted(_order(m) for m in everything)
    assert first == everything[:100]
    assert k3 == [m for m in everything if m.key == "k3"]
    assert window == [m for m in everything if start + 1_000 <= m.deliver_at_ms < start + 2_000]
    assert all(m.redelivery_count == 0 for m in everything)
    # And the peeks changed nothing: nothing was handed out, acked or moved, and a
    # second look sees the same
    assert _state(cluster, topic_name, "billing") == before
    assert cluster.peek(topic_name, "billing", limit=-1) == everything

    # When they fall due and are received
    batches = []
    while sum(map(len, batches)) < 4_950:
        got = consumer.receive(max_messages=10_000, timeout_s=10.0)
        assert got, "the scheduled messages stopped arriving"
        batches.append(got)
        consumer.ack(got)
    # Then they are the messages peeked, in the order peeked: instant by instant (those
    # due at one instant come in one or more receives, in no promised order among them)
    delivered = [m for b in batches for m in sorted(b, key=_order)]
    assert sorted(m.message_id for m in delivered) == sorted(m.message_id for m in everything)
    assert [m.deliver_at_ms for m in delivered] == [m.deliver_at_ms for m in everything]
    # And nothing is scheduled any more
    assert cluster.peek(topic_name, "billing") == []


def test_peek_leaves_out_what_consumers_hold_and_shows_nacks_at_their_new_time(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "s", ack_timeout_s=None)
    producer = cluster.create_producer(topic_name)
    soon, later = now_ms() + 500, now_ms() + 60_000
    early = producer.send_many([b"soon-%d" % i for i in range(20)], deliver_at=soon)
    late = producer.send_many([b"later-%d" % i for i in range(20)], deliver_at=later)
    got = []
    while len(got) < 20:
        got += consumer.receive(max_messages=100, timeout_s=5.0)
    assert {m.message_id for m in got} == set(early)
    # Given the 20 due ones received and held, 5 of them acked, 5 nacked for 30 s
    consumer.ack(got[:5])
    consumer.nack(got[5:10], delay_s=30.0)
    consumer.flush()
    nacked_at = now_ms()
    # When the subscription is peeked
    seen = cluster.peek(topic_name, "s", limit=-1)
    # Then the held and the acked are not in it, the nacked are, due when their nack says
    ids = [m.message_id for m in seen]
    assert set(ids) == set(late) | {m.message_id for m in got[5:10]}
    for m in seen:
        if m.message_id in set(late):
            assert m.deliver_at_ms == later and m.redelivery_count == 0
        else:
            assert nacked_at + 25_000 <= m.deliver_at_ms <= nacked_at + 31_000
            assert m.redelivery_count == 1
    assert set(ids[:5]) == {m.message_id for m in got[5:10]}  # due in 30 s, before 60 s
    assert [m.deliver_at_ms for m in seen] == sorted(m.deliver_at_ms for m in seen)


def test_peek_refuses_bad_input_and_fifo_subscriptions(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=1)
    cluster.subscribe(topic_name, "s")
    cluster.subscribe(topic_name, "fifo", subscription_type="exclusive")
    naive = datetime(2030, 1, 1)
    cases = [
        ({"limit": 0}, "limit: must be > 0, or -1"),
        ({"limit": "10"}, "limit: expected an int"),
        ({"limit": True}, "limit: expected an int"),
        ({"due_after": naive}, "due_after: a naive datetime"),
        ({"due_before": -5}, "due_before: must be >= 0"),
        ({"due_after": 2**70}, "due_after: "),
        ({"due_after": 2_000, "due_before": 1_000}, "due_before: must be after due_after"),
        ({"key": 7}, "key: expected a str"),
    ]
    for kwargs, message in cases:
        with pytest.raises(InvalidArgument, match=message):
            cluster.peek(topic_name, "s", **kwargs)
    with pytest.raises(InvalidArgument, match="exclusive: it delivers in log order"):
        cluster.peek(topic_name, "fifo")
    with pytest.raises(NotFound):
        cluster.peek(topic_name, "nobody")
    with pytest.raises(NotFound):
        cluster.peek("no-such-topic", "s")
    aware = datetime(2030, 1, 1, tzinfo=timezone.utc)
    assert cluster.peek(topic_name, "s", due_after=aware) == []


# --- reset and seek -----------------------------------------------------------------------


def _drain(consumer, *, quiet_s: float = 1.5, timeout_s: float = 60.0) -> list:
    """Receive and ack until nothing comes for ``quiet_s``; the messages in arrival order."""
    got, deadline = [], time.monotonic() + timeout_s
    quiet_until = time.monotonic() + quiet_s
    while time.monotonic() < min(deadline, quiet_until):
        msgs = consumer.receive(max_messages=2_000, timeout_s=0.3)
        if msgs:
            consumer.ack(msgs)
            got += msgs
            quiet_until = time.monotonic() + quiet_s
    consumer.flush()
    return got


def test_reset_by_time_and_by_id_delivers_again_what_follows_and_cancels_stay(cluster, topic_name):
    # Given two partitions: 200 immediate messages, then (from a known time) 200 more
    # and 100 delayed ones due in 2 s, 10 of those cancelled; all received and acked
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "billing")
    producer = cluster.create_producer(topic_name)
    first = producer.send_many([b"a%d" % i for i in range(200)], keys=[f"k{i}" for i in range(200)])
    time.sleep(0.05)
    middle = datetime.now(timezone.utc)
    time.sleep(0.05)
    second = producer.send_many(
        [b"b%d" % i for i in range(200)], keys=[f"k{i}" for i in range(200)]
    )
    delayed = producer.send_many(
        [b"d%d" % i for i in range(100)], deliver_after=2.0, keys=[f"k{i}" for i in range(100)]
    )
    assert all(producer.cancel_many(delayed[:10]))
    got = _drain(consumer, quiet_s=3.0)
    assert len(got) == 490 and all(m.redelivery_count == 0 for m in got)
    # When the cursor is reset to the time between the two halves while it has consumers
    with pytest.raises(InvalidArgument, match="has 1 consumer"):
        cluster.reset_cursor(topic_name, "billing", middle)
    consumer.close()
    marks = cluster.reset_cursor(topic_name, "billing", middle)
    assert sorted(marks) == [0, 1]
    # Then a new consumer gets everything published after it again, counted as
    # redelivered, the cancelled ones still not; nothing from before
    again = _drain(cluster.subscribe(topic_name, "billing"), quiet_s=3.0)
    assert sorted(m.message_id for m in again) == sorted([*second, *delayed[10:]])
    assert all(m.redelivery_count >= 1 for m in again)
    # When it is reset to one message of partition 0 (a string id, as the CLI takes)
    mid = next(m for m in first if m.partition == 0)
    for c in list(cluster._consumers):
        c.close()
    cluster.reset_cursor(topic_name, "billing", str(mid))
    again = _drain(cluster.subscribe(topic_name, "billing"))
    # Then that partition goes again from that message on, the other one not at all
    want = [m for m in [*first, *second, *delayed[10:]] if m.partition == 0 and m >= mid]
    assert sorted(m.message_id for m in again) == sorted(want)
    # And "latest" skips everything, "earliest" brings all of it back
    for c in list(cluster._consumers):
        c.close()
    cluster.reset_cursor(topic_name, "billing", "earliest")
    c = cluster.subscribe(topic_name, "billing")
    assert len(_drain(c)) == 490
    c.close()
    cluster.reset_cursor(topic_name, "billing", "latest")
    c = cluster.subscribe(topic_name, "billing")
    assert c.receive(timeout_s=1.0) == []


def test_a_reset_reaches_back_into_sealed_buckets(cluster, topic_name):
    # Given 5,000 delayed messages (sealed into buckets, kept because a second
    # subscription has not read them), all delivered to "billing" and acked
    cluster.create_topic(topic_name, partitions=1)
    consumer = cluster.subscribe(topic_name, "billing")
    cluster.subscribe(topic_name, "slow").close()
    producer = cluster.create_producer(topic_name)
    ids = producer.send_many([b"p%d" % i for i in range(5_000)], deliver_after=2.0)
    assert all(producer.cancel_many(ids[:20]))
    assert len(_drain(consumer, quiet_s=3.0)) == 4_980
    assert ray.get(topic_partition(topic_name, 0).stats.remote())["buckets"] >= 1
    # When its cursor goes back to the earliest entry
    consumer.close()
    cluster.reset_cursor(topic_name, "billing", "earliest")
    # Then every message comes again from the buckets (overdue: at once), but the cancelled
    again = _drain(cluster.subscribe(topic_name, "billing"), quiet_s=3.0)
    assert sorted(m.message_id for m in again) == sorted(ids[20:])


@pytest.mark.parametrize("kind", ["shared", "key_shared", "failover"])
def test_seek_from_a_consumer_during_a_subscription_restart(cluster, topic_name, kind):
    # Given 300 messages received and acked by a consumer
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "s", subscription_type=kind)
    producer = cluster.create_producer(topic_name)
    keys = [f"k{i % 7}" for i in range(300)]
    ids = producer.send_many([b"m%d" % i for i in range(300)], keys=keys)
    cancelled = producer.send_many([b"c%d" % i for i in range(5)], deliver_after=1.0, keys=keys[:5])
    assert all(producer.cancel_many(cancelled))
    assert len(_drain(consumer)) == 300
    # When the subscription's actor is killed (Ray restarts it) and the consumer seeks to
    # its first message, by id, while it comes back
    actor = ray.get_actor(f"sub/{topic_name}/s/0", namespace="raydelay")
    ray.kill(actor, no_restart=False)
    first = min(m for m in ids if m.partition == 0)
    consumer.seek(first)
    # Then partition 0 delivers all of its messages again, once each, and no cancelled one
    again = _drain(consumer, quiet_s=2.0)
    want = sorted(m for m in ids if m.partition == 0)
    assert sorted({m.message_id for m in again}) == want
    assert len(again) == len(want)
    # And a seek by time to before everything brings both partitions back
    consumer.seek(0)
    assert sorted(m.message_id for m in _drain(consumer)) == sorted(ids)


def test_reset_refuses_bad_targets_and_changes_nothing(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=2)
    producer = cluster.create_producer(topic_name)
    ids = producer.send_many([b"x"] * 10)
    cluster.subscribe(topic_name, "s").close()
    before = cluster.stats(topic_name, "s")["mark_delete"]
    mid = ids[0]
    cases = [
        (3.5, InvalidArgument, "to: expected 'earliest', 'latest', a MessageId"),
        (True, InvalidArgument, "to: expected"),
        ("yesterday", InvalidArgument, "message_id: 'yesterday' is not"),
        (datetime(2030, 1, 1), InvalidArgument, "to: a naive datetime"),
        (-1, InvalidArgument, "to: must be >= 0"),
        (mid._replace(topic="other"), InvalidArgument, "is of topic 'other'"),
        (mid._replace(partition=5), InvalidArgument, "has partitions 0..1, not 5"),
        (mid._replace(entry_id=10_000), InvalidArgument, "past the end"),
        (mid._replace(ledger_id=mid.ledger_id + 50), InvalidArgument, "past the end"),
    ]
    for to, error, message in cases:
        with pytest.raises(error, match=message):
            cluster.reset_cursor(topic_name, "s", to)
    with pytest.raises(NotFound):
        cluster.reset_cursor(topic_name, "nobody", "earliest")
    assert cluster.stats(topic_name, "s")["mark_delete"] == before
