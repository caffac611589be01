"""What an operator does to a running subscription: peek at what is scheduled.

The session's config has small ledgers (2,000 entries) and buckets sealed from 2,000
delayed entries, so a few thousand messages spread over sealed buckets, the unsealed tail
and the subscription's own nacks: every place a peek has to look.
"""

from __future__ import annotations

import collections
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest
import ray

from raydelay.actors.host import HostActor
from raydelay.client.message import MessageId
from raydelay.errors import InvalidArgument, NotFound
from tests.integration.helpers import (
    Until,
    join_subscription,
    now_ms,
    receive_and_join,
    topic_partition,
    unit_host_of,
    wait_cursor_recorded,
    wait_until,
)


def _buckets(topic: str) -> int:
    return ray.get(topic_partition(topic, 0).submit(HostActor.stats))["buckets"]


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
        on_duplicate="allow",  # (ten keys label the messages: many share one)
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
    # Given the 20 due ones received and held, 5 of them acked, 5 nacked for 30 s, and
    # 10 immediate messages received and nacked at once (waiting for a consumer again)
    consumer.ack(got[:5])
    consumer.nack(got[5:10], delay_s=30.0)
    now = producer.send_many([b"now-%d" % i for i in range(10)])
    backlog = []
    while len(backlog) < 10:
        backlog += consumer.receive(max_messages=100, timeout_s=5.0)
    assert {m.message_id for m in backlog} == set(now)
    consumer.nack(backlog)
    consumer.flush()
    nacked_at = now_ms()
    # When the subscription is peeked
    seen = cluster.peek(topic_name, "s", limit=-1)
    # Then the held and the acked are not in it, nor the immediate ones (backlog, not
    # schedule); the nacked are, due when their nack says
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
    aware = datetime(2030, 1, 1, tzinfo=UTC)
    assert cluster.peek(topic_name, "s", due_after=aware) == []


# --- reset and seek -----------------------------------------------------------------------


def _receive(cluster, consumer, until: Until) -> list:
    """What the subscription delivers (received and acked, in arrival order) when it is to
    deliver ``until``: it has nothing left, and one more receive found nothing more or the
    extra is returned too (see ``receive_and_join``)."""
    return [m for m, _ in receive_and_join(cluster, consumer, until)]


def test_reset_by_time_and_by_id_delivers_again_what_follows_and_cancels_stay(cluster, topic_name):
    # Given two partitions: 200 immediate messages, then (from a known time) 200 more
    # and 100 delayed ones due in 2 s, 10 of those cancelled; all received and acked
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "billing")
    producer = cluster.create_producer(topic_name)
    first = producer.send_many([b"a%d" % i for i in range(200)], keys=[f"k{i}" for i in range(200)])
    time.sleep(0.05)
    middle = datetime.now(UTC)
    time.sleep(0.05)
    second = producer.send_many(
        [b"b%d" % i for i in range(200)], keys=[f"k{i}" for i in range(200)]
    )
    delayed = producer.send_many(
        [b"d%d" % i for i in range(100)], deliver_after=2.0, keys=[f"k{i}" for i in range(100)]
    )
    assert all(producer.cancel_many(delayed[:10]))
    got = _receive(cluster, consumer, [*first, *second, *delayed[10:]])
    assert len(got) == 490 and all(m.redelivery_count == 0 for m in got)
    # When the cursor is reset to the time between the two halves while it has consumers
    with pytest.raises(InvalidArgument, match="has 1 consumer"):
        cluster.reset_cursor(topic_name, "billing", middle)
    consumer.close()
    marks = cluster.reset_cursor(topic_name, "billing", middle)
    assert sorted(marks) == [0, 1]
    # Then a new consumer gets everything published after it again, counted as
    # redelivered, the cancelled ones still not; nothing from before
    again = _receive(cluster, cluster.subscribe(topic_name, "billing"), [*second, *delayed[10:]])
    assert sorted(m.message_id for m in again) == sorted([*second, *delayed[10:]])
    assert all(m.redelivery_count >= 1 for m in again)
    # When it is reset to one message of partition 0 (a string id, as the CLI takes)
    mid = next(m for m in first if m.partition == 0)
    for c in list(cluster._consumers):
        c.close()
    cluster.reset_cursor(topic_name, "billing", str(mid))
    # Then that partition goes again from that message on, the other one not at all
    want = [m for m in [*first, *second, *delayed[10:]] if m.partition == 0 and m >= mid]
    again = _receive(cluster, cluster.subscribe(topic_name, "billing"), want)
    assert sorted(m.message_id for m in again) == sorted(want)
    # And "latest" skips everything, "earliest" brings all of it back
    for c in list(cluster._consumers):
        c.close()
    cluster.reset_cursor(topic_name, "billing", "earliest")
    c = cluster.subscribe(topic_name, "billing")
    assert len(_receive(cluster, c, 490)) == 490
    c.close()
    cluster.reset_cursor(topic_name, "billing", "latest")
    c = cluster.subscribe(topic_name, "billing")
    join_subscription(cluster, topic_name, "billing")
    assert c.receive(timeout_s=0) == []


def test_a_reset_reaches_back_into_sealed_buckets(cluster, topic_name):
    # Given 5,000 delayed messages (sealed into buckets, kept because a second
    # subscription has not read them), all delivered to "billing" and acked
    cluster.create_topic(topic_name, partitions=1)
    consumer = cluster.subscribe(topic_name, "billing")
    cluster.subscribe(topic_name, "slow").close()
    producer = cluster.create_producer(topic_name)
    ids = producer.send_many([b"p%d" % i for i in range(5_000)], deliver_after=2.0)
    assert all(producer.cancel_many(ids[:20]))
    assert len(_receive(cluster, consumer, ids[20:])) == 4_980
    assert ray.get(topic_partition(topic_name, 0).submit(HostActor.stats))["buckets"] >= 1
    # When its cursor goes back to the earliest entry
    consumer.close()
    cluster.reset_cursor(topic_name, "billing", "earliest")
    # Then every message comes again from the buckets (overdue: at once), but the cancelled
    again = _receive(cluster, cluster.subscribe(topic_name, "billing"), ids[20:])
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
    assert len(_receive(cluster, consumer, ids)) == 300
    wait_cursor_recorded(cluster, topic_name, "s")
    # When the subscription's actor is killed (Ray restarts it) and the consumer seeks to
    # its first message, by id, while it comes back
    actor = ray.get_actor(unit_host_of(topic_name, "s"), namespace="raydelay")
    ray.kill(actor, no_restart=False)
    first = min(m for m in ids if m.partition == 0)
    consumer.seek(first, inclusive=True)
    # Then partition 0 delivers all of its messages again, once each, and no cancelled one
    want = sorted(m for m in ids if m.partition == 0)
    again = _receive(cluster, consumer, want)
    assert sorted({m.message_id for m in again}) == want
    assert len(again) == len(want)
    # And a seek by time to before everything brings both partitions back
    consumer.seek(0)
    assert sorted(m.message_id for m in _receive(cluster, consumer, ids)) == sorted(ids)
    # and a seek to a message id without inclusive goes on after it, as Pulsar's does
    tenth = sorted(m for m in ids if m.partition == 1)[10]
    consumer.seek(tenth)
    after = [m for m in ids if m.partition == 1 and m > tenth]
    assert sorted(m.message_id for m in _receive(cluster, consumer, after)) == sorted(after)


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


# --- readers ----------------------------------------------------------------------------------


def _read_all(reader, timeout_s: float = 1.0) -> list:
    got = []
    while batch := reader.read_batch(1_000, timeout_s=timeout_s):
        got += batch
    return got


def test_a_reader_reads_every_partition_in_log_order_ignoring_deliver_at(cluster, topic_name):
    # Given three partitions: 150 messages now, 150 due in an hour, 5 of those cancelled
    cluster.create_topic(topic_name, partitions=3)
    producer = cluster.create_producer(topic_name)
    now_ids = producer.send_many(
        [b"n%d" % i for i in range(150)], keys=[f"k{i}" for i in range(150)]
    )
    later = producer.send_many(
        [b"l%d" % i for i in range(150)], deliver_after=3600, keys=[f"k{i}" for i in range(150)]
    )
    assert all(producer.cancel_many(later[:5]))
    # When a reader reads from the earliest
    reader = cluster.create_reader(topic_name)
    got = _read_all(reader)
    # Then it reads all 300 at once, in log order on each partition, with their due times
    # (the cancel markers are not messages; the cancelled messages are still in the log)
    assert sorted(m.message_id for m in got) == sorted([*now_ids, *later])
    for p in range(3):
        mine = [m.message_id for m in got if m.message_id.partition == p]
        assert mine == sorted(mine)
    due = {m.message_id: m.deliver_at_ms for m in got}
    assert all(due[i] is None for i in now_ids) and all(due[i] > now_ms() for i in later)
    # and it has nothing more until something is sent
    assert not reader.has_message_available() and reader.read_next(timeout_s=0.2) is None
    fresh = producer.send_many([b"f%d" % i for i in range(6)])
    assert reader.has_message_available()
    assert sorted(m.message_id for m in _read_all(reader)) == sorted(fresh)
    # When it seeks to one message by id, it reads that partition from there again
    mid = sorted(i for i in now_ids if i.partition == 1)[10]
    reader.seek(mid)
    again = _read_all(reader)
    assert [m.message_id for m in again] == sorted(
        i for i in [*now_ids, *later, *fresh] if i.partition == 1 and i >= mid
    )
    # and the last ids are each partition's last entry (a cancel marker may be one)
    last = reader.last_message_ids()
    assert len(last) == 3 and all(x.partition == p for p, x in enumerate(last))
    sent = [*now_ids, *later, *fresh]
    assert last == [max(i for i in [*sent, *last] if i.partition == p) for p in range(3)]
    with pytest.raises(InvalidArgument, match="has 3 partitions; last_message_ids"):
        reader.get_last_message_id()
    reader.close()
    with pytest.raises(InvalidArgument, match="reader: it was closed"):
        reader.read_next(timeout_s=0)


def test_readers_start_where_they_are_told(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=1)
    producer = cluster.create_producer(topic_name)
    ids = list(producer.send_many([b"a%d" % i for i in range(20)]))
    time.sleep(0.05)
    middle = now_ms()
    time.sleep(0.05)
    ids += producer.send_many([b"b%d" % i for i in range(20)])
    consumer = cluster.subscribe(topic_name, "s")
    assert consumer.get_last_message_id() == ids[-1]
    latest = cluster.create_reader(topic_name, "latest")
    after = cluster.create_reader(topic_name, ids[4])
    at = cluster.create_reader(topic_name, str(ids[4]), inclusive=True)
    by_time = cluster.create_reader(topic_name, middle)
    assert [m.message_id for m in _read_all(after)] == ids[5:]
    assert [m.message_id for m in _read_all(at)] == ids[4:]
    assert [m.message_id for m in _read_all(by_time)] == ids[20:]
    assert latest.read_next(timeout_s=0.3) is None
    more = producer.send_many([b"c"])
    assert latest.read_next(timeout_s=10).message_id == more[0]
    assert latest.get_last_message_id() == more[0]
    for bad, message in [
        (3.5, "start: expected 'earliest', 'latest', a MessageId"),
        ("soon", "message_id: 'soon' is not"),
        (ids[0]._replace(entry_id=999), "past the end"),
    ]:
        with pytest.raises(InvalidArgument, match=message):
            cluster.create_reader(topic_name, bad)
    with pytest.raises(InvalidArgument, match="inclusive: expected True or False"):
        cluster.create_reader(topic_name, inclusive="yes")
    with pytest.raises(NotFound):
        cluster.create_reader("no-such-topic")


# --- dead-letter redrive ------------------------------------------------------------------------


def test_dead_letters_go_back_once_with_their_key_and_properties(cluster, topic_name):
    # Given 40 messages dead-lettered after one redelivery (nacked twice)
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "s", max_redeliveries=1)
    producer = cluster.create_producer(topic_name)
    ids = producer.send_many(
        [b"m%d" % i for i in range(40)],
        keys=[f"k{i}" for i in range(40)],
        properties=[{"n": str(i)} for i in range(40)],
    )
    dlq = f"{topic_name}-s-DLQ"
    for _ in range(2):
        got = []
        while len(got) < 40:
            got += consumer.receive(max_messages=100, timeout_s=5.0)
        consumer.nack(got)
    wait_until("the dead letters", lambda: cluster.stats(dlq)["partitions"][0]["tail"])
    wait_until(
        "40 dead letters",
        lambda: len(_read_all(cluster.create_reader(dlq), timeout_s=0.3)) == 40,
    )
    # When they are redriven
    moved = []
    assert cluster.redrive(dlq, progress=moved.append) == 40 and moved[-1] == 40
    # Then the subscription gets each again, on its partition, counted from 0, with its
    # key and properties, and a note of where it was
    back = []
    while len(back) < 40:
        msgs = consumer.receive(max_messages=100, timeout_s=5.0)
        assert msgs, "the redriven messages did not come"
        back += msgs
        consumer.ack(msgs)
    by_payload = {m.payload: m for m in back}
    assert len(by_payload) == 40 and all(m.redelivery_count == 0 for m in back)
    for i, mid in enumerate(ids):
        m = by_payload[b"m%d" % i]
        assert m.key == f"k{i}" and m.properties["n"] == str(i)
        assert m.properties["raydelay.redriven_from"].startswith(f"{dlq}/0/")
        assert m.message_id.partition == mid.partition and m.message_id > mid
    # and a second redrive finds nothing left
    assert cluster.redrive(dlq) == 0


def test_a_redrive_killed_in_the_middle_and_run_again_moves_each_once(cluster, topic_name):
    # Given 3,000 dead letters of a two-partition topic
    cluster.create_topic(topic_name, partitions=2)
    dlq = f"{topic_name}-DLQ"
    cluster.create_topic(dlq, partitions=1)
    origins = [f"{topic_name}/{i % 2}/1:{i}" for i in range(3_000)]
    dead = cluster.create_producer(dlq).send_many(
        [b"d%d" % i for i in range(3_000)],
        properties=[
            {"raydelay.original_message_id": o, "n": str(i)} for i, o in enumerate(origins)
        ],
    )
    # When a redrive is SIGKILLed after its first batch went back
    address = ray.get_runtime_context().gcs_address
    proc = subprocess.Popen(
        [sys.executable, "-m", "raydelay.cli", "--address", address, "redrive", dlq],
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in proc.stderr:
        if line.startswith("moved "):
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    # and run again (it waits for the killed one's lease on the dead-letter topic)
    rest = cluster.redrive(dlq)
    # Then every dead letter is in its topic exactly once, on the partition it came from
    back = _read_all(cluster.create_reader(topic_name))
    sources = collections.Counter(m.properties["raydelay.redriven_from"] for m in back)
    assert sorted(sources) == sorted(str(i) for i in dead) and set(sources.values()) == {1}
    assert all(m.message_id.partition == int(m.properties["n"]) % 2 for m in back)
    assert 0 < rest < 3_000


def test_redrive_refuses_bad_input(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=1)
    cluster.create_topic(f"{topic_name}-x", partitions=3)
    cluster.create_producer(topic_name).send_many([b"no origin"])
    with pytest.raises(NotFound):
        cluster.redrive("no-such-dlq")
    with pytest.raises(NotFound):
        cluster.redrive(topic_name, to_topic="deleted-or-never-made")
    with pytest.raises(InvalidArgument, match="limit: must be > 0, or -1"):
        cluster.redrive(topic_name, limit=0)
    with pytest.raises(InvalidArgument, match="to_topic: .* must match"):
        cluster.redrive(topic_name, to_topic="a/b")
    # a dead letter that does not say where it came from needs to_topic, and nothing moves
    with pytest.raises(InvalidArgument, match="has no raydelay.original_message_id"):
        cluster.redrive(topic_name)
    # and the failed redrive leaves no subscription behind to pin the topic's log
    assert "raydelay-redrive" not in cluster.stats(topic_name)["subscriptions"]
    with pytest.raises(InvalidArgument, match="is the dead-letter topic itself"):
        cluster.redrive(topic_name, to_topic=topic_name)
    assert cluster.redrive(topic_name, to_topic=f"{topic_name}-x") == 1
    assert cluster.redrive(topic_name, to_topic=f"{topic_name}-x") == 0


# --- multi-topic consumers --------------------------------------------------------------------


def test_one_consumer_reads_a_list_of_topics(cluster, topic_name):
    a, b = f"{topic_name}-a", f"{topic_name}-b"
    cluster.create_topic(a, partitions=2)
    cluster.create_topic(b, partitions=1)
    consumer = cluster.subscribe([a, b], "s")
    sent = {
        a: set(cluster.create_producer(a).send_many([b"a%d" % i for i in range(100)])),
        b: set(
            cluster.create_producer(b).send_many([b"b%d" % i for i in range(60)], deliver_after=0.5)
        ),
    }
    # When it receives in batches: each batch draws from both topics, each message says its own
    got = []
    while len(got) < 160:
        batch = consumer.receive_batch(max_messages=50, timeout_s=5.0)
        assert batch, "the messages stopped coming"
        assert len(batch) <= 50
        got += list(batch)
        table = batch.to_arrow()
        assert table.column_names[:2] == ["topic", "partition"] and table.num_rows == len(batch)
        consumer.ack(batch)
    assert {m.message_id for m in got if m.message_id.topic == a} == sent[a]
    assert {m.message_id for m in got if m.message_id.topic == b} == sent[b]
    # and a nack of messages of both topics brings each back from its own
    more = [
        *cluster.create_producer(a).send_many([b"x"]),
        *cluster.create_producer(b).send_many([b"y"]),
    ]
    twice = []
    while len(twice) < 2:
        twice += consumer.receive(timeout_s=5.0)
    consumer.nack(twice)
    back = []
    while len(back) < 2:
        back += consumer.receive(timeout_s=5.0)
    assert sorted(m.message_id for m in back) == sorted(more)
    assert all(m.redelivery_count == 1 for m in back)
    consumer.ack(back)
    consumer.flush()
    assert cluster.stats(a, "s")["backlog"] == 0 and cluster.stats(b, "s")["backlog"] == 0


def test_a_pattern_subscription_picks_up_a_topic_made_later(cluster, topic_name):
    first = f"{topic_name}-1"
    cluster.create_topic(first)
    cluster.create_topic(f"other-{topic_name}")
    consumer = cluster.subscribe(re.compile(f"{topic_name}-.*"), "s", max_redeliveries=3)
    assert consumer.topics == [first]
    cluster.create_producer(first).send_many([b"one"])
    # When a matching topic is made after the consumer, and a message sent to it at once
    later = f"{topic_name}-2"
    cluster.create_topic(later, partitions=2)
    sent = cluster.create_producer(later).send_many([b"two"])
    # Then the consumer finds it and gets its message (sent before it was found)
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        got += consumer.receive(timeout_s=1.0)
    assert sorted(m.payload for m in got) == [b"one", b"two"]
    assert [m.message_id for m in got if m.payload == b"two"] == list(sent)
    # and its own dead-letter topics match the pattern but are left out
    assert consumer.topics == [first, later]
    assert f"{first}-s-DLQ" in cluster.topics()
    consumer.close()


def test_multi_topic_subscribe_refuses_bad_input(cluster, topic_name):
    cluster.create_topic(topic_name)
    with pytest.raises(InvalidArgument, match="an empty list"):
        cluster.subscribe([], "s")
    with pytest.raises(InvalidArgument, match="listed twice"):
        cluster.subscribe([topic_name, topic_name], "s")
    with pytest.raises(NotFound):
        cluster.subscribe([topic_name, "no-such-topic"], "s")
    assert "s" not in cluster.stats(topic_name)["subscriptions"]  # (nothing half made)
    with pytest.raises(InvalidArgument, match=r"for a pattern pass re.compile\('orders-\.\*'\)"):
        cluster.subscribe("orders-.*", "s")
    consumer = cluster.subscribe([topic_name], "s")
    with pytest.raises(InvalidArgument, match="is not one this consumer reads"):
        consumer.ack(MessageId("elsewhere", 0, 1, 1))
    with pytest.raises(InvalidArgument, match="max_messages: must be 1.."):
        consumer.receive(max_messages=0)


def test_a_view_with_a_shorter_retry_deadline_finds_the_host_serving_now(cluster, topic_name):
    """What the console reads through (its giving up after the shorter deadline is
    tests/unit/test_handles.py's): a subscription host that ended for good is replaced on
    the view's next call, and the client itself and its other topics are untouched."""
    from datetime import timedelta

    from raydelay.cluster import placement
    from raydelay.cluster.names import NAMESPACE

    for bad, problem in (
        (0, "positive"),
        (-1, "positive"),
        (float("inf"), "finite"),
        ("2s", "expected seconds"),
        (None, "expected seconds"),
    ):
        with pytest.raises(InvalidArgument, match=f"seconds: .*{problem}"):
            cluster.with_retry_deadline(bad)
    cluster.create_topic(topic_name, partitions=1)
    cluster.subscribe(topic_name, "gone").close()
    view = cluster.with_retry_deadline(timedelta(seconds=1))
    assert view.stats(topic_name, "gone")["backlog"] == 0
    actor = ray.get_actor(unit_host_of(topic_name, "gone"), namespace=NAMESPACE)
    ray.kill(actor, no_restart=True)

    def ended() -> bool:  # (ray.kill only asks: a call right after it may still be served)
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            return False
        return False

    wait_until("the killed host's handle dead for ever", ended)
    assert view.stats(topic_name, "gone")["backlog"] == 0
    assert unit_host_of(topic_name, "gone") in placement.live_hosts("SubscriptionHost")
    assert topic_name in view.topics() and topic_name in cluster.topics()
    with pytest.raises(InvalidArgument, match="view"):
        view.shutdown()
    assert cluster.delete_topic(topic_name, force=True) > 0
