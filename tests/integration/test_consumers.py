"""Consumers that die or give messages back: a consumer whose process is SIGKILLed loses its
lease, and what it held goes to another consumer (shared, failover and exclusive, with a
real process killed mid-work); ``redeliver_unacknowledged`` in both forms for each type,
across partitions and after a subscription restart; acks of positions that hold no message."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import ray

from raydelay.actors.subscription import SubscriptionHost
from raydelay.client.message import MessageId
from raydelay.errors import ConsumerBusy, InvalidArgument
from tests.integration.helpers import receive_all, restart, subscription_partition, unit_host_of

N = 30
TYPES = {"s-shared": "shared", "s-failover": "failover", "s-exclusive": "exclusive"}

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import raydelay

    address, topic, subs, n = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
    cluster = raydelay.connect(address=address)
    held = {}
    for name, kind in subs.items():
        consumer = cluster.subscribe(topic, name, subscription_type=kind)
        got = []
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            got += consumer.receive(max_messages=n - len(got), timeout_s=1)
        held[name] = sorted(str(m.message_id) for m in got)  # never acked
    print(json.dumps(held), flush=True)
    time.sleep(3600)
    """
)


def _receive(consumer, want: int, deadline: float) -> list:
    got = []
    while len(got) < want and time.monotonic() < deadline:
        got += consumer.receive(max_messages=want - len(got), timeout_s=0.5)
    return got


def test_a_sigkilled_consumers_messages_reach_another_consumer(cluster, topic_name):
    lease_s = cluster.config.subscription.consumer_lease_s
    cluster.create_topic(topic_name, partitions=2)
    for name, kind in TYPES.items():  # the subscriptions exist before the messages
        cluster.subscribe(topic_name, name, subscription_type=kind).close()
    cluster.create_producer(topic_name).send_many([b"m%d" % i for i in range(N)])
    # Given a consumer process holding every message of three subscriptions, unacked
    address = ray.get_runtime_context().gcs_address
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, address, topic_name, json.dumps(TYPES), str(N)],
        stdout=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
    )
    try:
        line = child.stdout.readline()
        assert line, "the consumer process ended before it held its messages"
        held = json.loads(line)
        assert {k: len(v) for k, v in held.items()} == {name: N for name in TYPES}
        # and a second consumer of the shared subscription and a failover standby
        shared = cluster.subscribe(topic_name, "s-shared")
        standby = cluster.subscribe(topic_name, "s-failover", subscription_type="failover")
        with pytest.raises(ConsumerBusy):
            cluster.subscribe(topic_name, "s-exclusive", subscription_type="exclusive")
        stats = cluster.stats(topic_name, "s-shared")
        assert sum(c["unacked"] for c in stats["consumers"].values()) == N
        # When the process is SIGKILLed, with no close()
        child.send_signal(signal.SIGKILL)
        killed = time.monotonic()
    finally:
        child.kill()
        child.wait()
    deadline = killed + lease_s + 30
    # Then the shared consumer and the failover standby get every message it held, with
    # redelivery_count raised, and the exclusive subscription takes a new consumer
    arrived = {}
    got = {"s-shared": _receive(shared, N, deadline)}
    arrived["s-shared"] = time.monotonic() - killed
    got["s-failover"] = _receive(standby, N, deadline)
    arrived["s-failover"] = time.monotonic() - killed
    while True:
        try:
            exclusive = cluster.subscribe(topic_name, "s-exclusive", subscription_type="exclusive")
            break
        except ConsumerBusy:
            assert time.monotonic() < deadline, "the dead consumer kept the exclusive slot"
            time.sleep(0.2)
    got["s-exclusive"] = _receive(exclusive, N, deadline)
    arrived["s-exclusive"] = time.monotonic() - killed
    print(f"\nlease {lease_s} s; seconds from SIGKILL to the last message: {arrived}")
    for name in TYPES:
        assert sorted(str(m.message_id) for m in got[name]) == held[name], name
        assert all(m.redelivery_count >= 1 for m in got[name]), name
    # and the dead consumer is gone from stats (from every partition: one that held none
    # of its messages removes it when its own timer sees the lapsed lease)
    for name in TYPES:
        consumers = cluster.stats(topic_name, name)["consumers"]
        while len(consumers) > 1 and time.monotonic() < deadline:
            time.sleep(0.2)
            consumers = cluster.stats(topic_name, name)["consumers"]
        assert len(consumers) == 1 and all(c["unacked"] == N for c in consumers.values())


def _ids(msgs) -> list[str]:
    return sorted(str(m.message_id) for m in msgs)


def _in_log_order(msgs) -> bool:
    """Within each partition, the messages came in log order."""
    by_partition: dict[int, list] = {}
    for m in msgs:
        by_partition.setdefault(m.message_id.partition, []).append(
            (m.message_id.ledger_id, m.message_id.entry_id)
        )
    return all(p == sorted(p) for p in by_partition.values())


@pytest.mark.parametrize("kind", ["shared", "failover", "exclusive"])
def test_redeliver_unacknowledged_on_demand(cluster, topic_name, kind):
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "s", subscription_type=kind)
    keys = [f"k{i}" for i in range(20)]  # keys spread the messages over both partitions
    cluster.create_producer(topic_name).send_many([b"m%d" % i for i in range(20)], keys=keys)
    held = [m for m, _ in receive_all(consumer, 20, ack=False)]
    assert len(held) == 20 and {m.message_id.partition for m in held} == {0, 1}
    # Given one acknowledged message, asking for it back is an error naming it
    consumer.ack(held[0])
    with pytest.raises(InvalidArgument, match="acknowledged"):
        consumer.redeliver_unacknowledged([held[0], held[1]])
    # When two held messages of different partitions are asked back
    held = held[1:]
    two = [next(m for m in held if m.message_id.partition == p) for p in (0, 1)]
    n = consumer.redeliver_unacknowledged(two)
    again = [m for m, _ in receive_all(consumer, n, ack=False)]
    # Then shared redelivers those two; exclusive and failover rewind to the first unacked
    # and go on in log order
    if kind == "shared":
        assert n == 2 and _ids(again) == _ids(two)
    else:
        assert n == 19 and _ids(again) == _ids(held) and _in_log_order(again)
    assert all(m.redelivery_count == 1 for m in again)
    # When everything held is asked back (no argument), across both partitions
    assert consumer.redeliver_unacknowledged() == 19
    last = [m for m, _ in receive_all(consumer, 19, ack=False)]
    assert _ids(last) == _ids(held)
    twice = set(_ids(again))
    assert all(m.redelivery_count == (2 if str(m.message_id) in twice else 1) for m in last)
    # After a restart the subscription forgot who held what: asking back is accepted, and
    # the messages come again (redelivery_count raised by the restart)
    # (the acks so far are persisted first: a kill loses what the last cursor write did not
    # hold, and those messages would come back too, as at-least-once delivery allows)
    name = unit_host_of(topic_name, "s")
    consumer.flush()
    ray.get(
        [subscription_partition(topic_name, p, "s").submit(SubscriptionHost.flush) for p in (0, 1)]
    )
    restart(name)  # (its unit serves both partitions: both forgot)
    mine = list(last)
    consumer.redeliver_unacknowledged(mine)
    back = [m for m, _ in receive_all(consumer, len(mine), ack=True)]
    assert _ids(back) == _ids(mine)
    assert all(m.redelivery_count >= 1 for m in back)


def test_an_ack_of_no_message_is_an_invalid_argument(cluster, topic_name):
    cluster.create_topic(topic_name)
    consumer = cluster.subscribe(topic_name, "s")
    cluster.create_producer(topic_name).send(b"x")
    [(msg, _)] = receive_all(consumer, 1, ack=False)
    # a position no key can hold is refused at once
    with pytest.raises(InvalidArgument, match="no message position"):
        consumer.ack(MessageId(topic_name, 0, 2**40, 5))
    # one past the end of the log is refused by the subscription (acks are sent without
    # waiting: the error comes at the next flush), and nothing of that ack is counted
    consumer.ack([msg, MessageId(topic_name, 0, msg.message_id.ledger_id + 1000, 0)])
    with pytest.raises(InvalidArgument, match="past the end of .*no such message"):
        consumer.flush()
    assert cluster.stats(topic_name, "s")["acked"] == 0
    consumer.ack(msg)
    consumer.flush()
    assert cluster.stats(topic_name, "s")["acked"] == 1


def _key_for(partition: int, partitions: int) -> str:
    import itertools

    from raydelay.client.producer import partition_of

    return next(
        k
        for k in (f"k{i}" for i in itertools.count())
        if partition_of(k, partitions, itertools.count()) == partition
    )


def test_a_partition_that_stops_answering_holds_up_only_its_own_messages(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=2)
    # (an actor per partition: one that stops answering holds up only its own partition)
    consumer = cluster.subscribe(topic_name, "s", partitions_per_actor=1)
    producer = cluster.create_producer(topic_name)
    keys = [_key_for(0, 2), _key_for(1, 2)]
    for p in (0, 1):
        producer.send_many([b"first-%d-%d" % (p, i) for i in range(50)], keys=[keys[p]] * 50)
    held = []
    deadline = time.monotonic() + 30
    while len(held) < 100 and time.monotonic() < deadline:
        held += consumer.receive(max_messages=100, timeout_s=0.5)
    assert len(held) == 100
    actors = [subscription_partition(topic_name, p, "s") for p in (0, 1)]
    # Given partition 1's actor stops answering (SIGSTOP: as a node cut off from the network)
    pid = ray.get(actors[1].pid())
    assert pid != ray.get(actors[0].pid())  # (an actor each)
    os.kill(pid, signal.SIGSTOP)
    try:
        consumer.ack(held)  # partition 1's ack cannot be applied now
        producer.send_many([b"more-0-%d" % i for i in range(100)], keys=[keys[0]] * 100)
        # When the consumer goes on, acking one message at a time
        more = []
        deadline = time.monotonic() + 60
        while len(more) < 100 and time.monotonic() < deadline:
            for m in consumer.receive(max_messages=10, timeout_s=0.5):
                more.append(m)
                consumer.ack(m)
        # Then partition 0 delivered everything and has every ack, while partition 1 hangs
        assert sorted(m.payload for m in more) == sorted(b"more-0-%d" % i for i in range(100))
        deadline = time.monotonic() + 30
        while (
            ray.get(actors[0].submit(SubscriptionHost.stats))["acked"] < 150
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert ray.get(actors[0].submit(SubscriptionHost.stats))["acked"] == 150
    finally:
        os.kill(pid, signal.SIGCONT)
    # And once partition 1 answers again, its ack (kept meanwhile) is applied
    consumer.flush()
    assert ray.get(actors[1].submit(SubscriptionHost.stats))["acked"] == 50
    assert cluster.stats(topic_name, "s")["backlog"] == 0
