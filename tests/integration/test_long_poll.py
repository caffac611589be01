"""The long polls of log reads on a partition's host: the standing reads of shared
subscriptions wait for entries due soon, and a commit ends only the ones it concerns."""

from __future__ import annotations

import ray

from raydelay.actors.host import HostActor
from raydelay.log.entries import DelayedRun
from tests.integration.helpers import now_ms, topic_partition

HOUR_MS = 3_600_000


def _start(cluster, topic: str) -> tuple[int, int]:
    """A one-partition topic with one entry in its log; the position after it."""
    cluster.create_topic(topic, partitions=1)
    cluster.create_producer(topic).send(b"first")
    ledger, entry = ray.get(topic_partition(topic, 0).submit(HostActor.tail))
    return ledger, entry + 1


def _standing_read(topic: str, position: tuple[int, int], within_ms: int = 1_000):
    """A read as a subscription with sealed buckets makes it: delayed-only objects come as
    DelayedRun stand-ins, and the wait ends early only for entries due within_ms."""
    return topic_partition(topic, 0).submit(HostActor.read, position, 1_000, 30.0, True, within_ms)


def test_standing_reads_all_end_at_the_commit_of_an_entry_due_at_once(cluster, topic_name):
    # Given 16 reads standing at the end of the log, each waiting for entries due soon
    position = _start(cluster, topic_name)
    reads = [_standing_read(topic_name, position) for _ in range(16)]
    # When one message due at once is committed
    cluster.create_producer(topic_name).send(b"now")
    # Then every read ends with it, as a whole object (not a stand-in)
    for reply in ray.get(reads, timeout=20):
        assert len(reply.objects) == 1 and not isinstance(reply.objects[0], DelayedRun)
        assert reply.tail == (position[0], position[1])


def test_a_standing_read_ends_for_entries_due_later_with_their_stand_in(cluster, topic_name):
    # Given a read standing at the end of the log, waiting for entries due within 1 s
    position = _start(cluster, topic_name)
    read = _standing_read(topic_name, position)
    # When messages due in an hour are committed (and nothing due sooner)
    due = now_ms() + HOUR_MS
    cluster.create_producer(topic_name).send_many([b"a", b"b", b"c"], deliver_at=[due] * 3)
    # Then the read still ends (a reader learns of entries due later in a while), and
    # carries them as one stand-in of the partition's index, with their earliest time
    reply = ray.get(read, timeout=20)
    assert len(reply.objects) == 1
    run = reply.objects[0]
    assert isinstance(run, DelayedRun)
    assert (run.ledger_id, run.first_entry, run.count) == (position[0], position[1], 3)
    assert run.min_deliver_at_ms == due


def test_a_read_for_any_entry_ends_at_the_commit_of_one_due_later(cluster, topic_name):
    # Given a read standing at the end of the log, waiting for any entry (a reader
    # without sealed buckets)
    position = _start(cluster, topic_name)
    read = topic_partition(topic_name, 0).submit(HostActor.read, position, 1_000, 30.0, False, None)
    # When a message due in an hour is committed
    cluster.create_producer(topic_name).send_many([b"later"], deliver_at=[now_ms() + HOUR_MS])
    # Then the read ends with the whole object
    reply = ray.get(read, timeout=20)
    assert len(reply.objects) == 1 and not isinstance(reply.objects[0], DelayedRun)
    assert reply.tail == position


def test_closing_the_ledger_ends_every_standing_read(cluster, topic_name):
    # Given reads standing at the end of the log, one of them for any entry
    position = _start(cluster, topic_name)
    host = topic_partition(topic_name, 0)
    reads = [_standing_read(topic_name, position) for _ in range(4)]
    reads.append(host.submit(HostActor.read, position, 1_000, 30.0, False, None))
    # When the partition closes its ledger for a planned stop
    ray.get(host.submit(HostActor.close_ledger), timeout=20)
    # Then every read is answered, with nothing past its position
    for reply in ray.get(reads, timeout=20):
        assert reply.objects == []
        assert reply.tail == (position[0], position[1] - 1)


def test_consecutive_objects_due_later_travel_as_one_stand_in(cluster, topic_name):
    # Given three commits of messages due in an hour, then one due at once, then one more
    # due later, after the first entry of the log
    position = _start(cluster, topic_name)
    producer = cluster.create_producer(topic_name)
    due = now_ms() + HOUR_MS
    for i in range(3):
        producer.send_many([b"a%d" % i, b"b%d" % i], deliver_at=[due - i, due - i])
    producer.send(b"now")
    producer.send_many([b"c"], deliver_at=[due])
    # When a reader that takes delayed entries from the index reads them
    reply = ray.get(_standing_read(topic_name, position), timeout=20)
    # Then the three commits come as one stand-in with their earliest time, the
    # immediate one as itself, and the last as a stand-in of its own
    first, middle, last = reply.objects
    assert isinstance(first, DelayedRun) and isinstance(last, DelayedRun)
    assert (first.ledger_id, first.first_entry, first.count) == (position[0], position[1], 6)
    assert first.min_deliver_at_ms == due - 2
    assert not isinstance(middle, DelayedRun)
    assert (last.first_entry, last.count, last.min_deliver_at_ms) == (position[1] + 7, 1, due)
