"""raydelay.aio (#49): the asyncio client keeps the sync client's guarantees (each message
once, none early, none lost when a partition's host dies mid-send, keys in order), batches
concurrent sends, never blocks the event loop while it waits, and checks its input at the
call."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
import ray

import raydelay.aio as aio
from raydelay.errors import InvalidArgument, ProducerQueueIsFull
from tests.integration.helpers import host_of

pytestmark = pytest.mark.timeout(180)


def run(coro):
    return asyncio.run(coro)


def test_send_receive_ack_round_trip(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=2)

    async def main():
        acluster = aio.Cluster(cluster)
        consumer = await acluster.subscribe(topic_name, "s")
        async with await acluster.create_producer(topic_name) as producer:
            sent_at = int(time.time() * 1000)
            mid = await producer.send(b"due soon", deliver_after=0.5, key="k")
            ids = await producer.send_many([b"a", b"b", b"c"], keys=["x", "y", "x"])
        got = []
        while len(got) < 4:
            got += await consumer.receive(max_messages=10, timeout_s=5.0)
        await consumer.ack(got)
        await consumer.flush()
        stats = await acluster.stats(topic_name, "s")
        await consumer.close()
        return sent_at, mid, ids, got, stats

    sent_at, mid, ids, got, stats = run(main())
    by_id = {str(m.message_id): m for m in got}
    assert set(by_id) == {str(mid), *(str(i) for i in ids)}
    late = by_id[str(mid)]
    assert late.payload == b"due soon" and late.key == "k"
    assert late.deliver_at_ms >= sent_at + 500  # (due half a second after the send)
    assert sorted(m.payload for m in got) == [b"a", b"b", b"c", b"due soon"]
    assert stats["pending_ack"] == 0 and stats["acked"] == 4


def test_concurrent_sends_go_as_batches_and_each_lands_once(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=2)
    sub = cluster.subscribe(topic_name, "s")
    calls = Counter()

    async def main():
        producer = await aio.Cluster(cluster).create_producer(topic_name)
        append = producer.sync.link.append

        def counted(partition, batches):
            calls[partition] += 1
            return append(partition, batches)

        producer.sync.link.append = counted
        ids = await asyncio.gather(
            *(producer.send(f"m{i}".encode(), key=f"k{i % 7}") for i in range(2_000))
        )
        await producer.close()
        return ids

    ids = run(main())
    assert len({str(i) for i in ids}) == 2_000
    # one append call per partition per round, not one per send
    assert sum(calls.values()) < 200, calls
    got = []
    while len(got) < 2_000:
        more = sub.receive(max_messages=1_000, timeout_s=5.0)
        assert more, f"only {len(got)} of 2000 arrived"
        got += more
        sub.ack(more)
    assert Counter(m.payload for m in got) == Counter(f"m{i}".encode() for i in range(2_000))
    # one key's messages in the order they were sent
    for k in range(7):
        mine = [int(m.payload[1:]) for m in got if m.key == f"k{k}"]
        assert mine == sorted(mine)


def test_a_receive_leaves_the_event_loop_free(cluster, topic_name):
    # Given a receive that waits (nothing is due), a send made on the same loop meanwhile
    # must reach it: a receive that held the loop would time out empty instead
    cluster.create_topic(topic_name)

    async def main():
        acluster = aio.Cluster(cluster)
        consumer = await acluster.subscribe(topic_name, "s")
        producer = await acluster.create_producer(topic_name)
        waiting = asyncio.create_task(consumer.receive(max_messages=1, timeout_s=30.0))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await producer.send(b"now")
        got = await waiting
        await consumer.ack(got)
        await consumer.close()
        await producer.close()
        return got

    got = run(main())
    assert [m.payload for m in got] == [b"now"]


def test_async_for_ends_when_the_consumer_closes(cluster, topic_name):
    cluster.create_topic(topic_name)

    async def main():
        acluster = aio.Cluster(cluster)
        consumer = await acluster.subscribe(topic_name, "s")
        async with await acluster.create_producer(topic_name) as producer:
            await producer.send_many([b"1", b"2", b"3"])
        seen = []

        async def read():
            async for message in consumer:
                seen.append(message.payload)
                await consumer.ack(message)
                if len(seen) == 3:
                    await consumer.close()

        await asyncio.wait_for(read(), timeout=60)
        return seen

    assert sorted(run(main())) == [b"1", b"2", b"3"]


def test_sends_survive_a_host_killed_mid_stream(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=2)
    sub = cluster.subscribe(topic_name, "s")

    async def main():
        producer = await aio.Cluster(cluster).create_producer(topic_name)
        first = await asyncio.gather(*(producer.send(b"before-%d" % i) for i in range(300)))
        ray.kill(ray.get_actor(host_of(topic_name, 0), namespace="raydelay"), no_restart=False)
        second = await asyncio.gather(*(producer.send(b"after-%d" % i) for i in range(300)))
        many = await producer.send_many([b"many-%d" % i for i in range(300)])
        await producer.close()
        return first, second, many

    first, second, many = run(main())
    sent = 900
    assert len({str(i) for i in [*first, *second, *many]}) == sent
    got = []
    deadline = time.monotonic() + 60
    while len(got) < sent and time.monotonic() < deadline:
        more = sub.receive(max_messages=1_000, timeout_s=2.0)
        got += more
        sub.ack(more)
    payloads = Counter(m.payload for m in got)
    assert len(payloads) == sent and max(payloads.values()) == 1  # all of them, once


def test_bad_input_raises_at_the_call_and_queues_nothing(cluster, topic_name):
    cluster.create_topic(topic_name)

    async def main():
        acluster = aio.Cluster(cluster)
        producer = await acluster.create_producer(topic_name)
        with pytest.raises(InvalidArgument, match="payload"):
            await producer.send("text, not bytes")
        with pytest.raises(InvalidArgument, match="deliver_after"):
            await producer.send(b"x", deliver_after=-5)
        with pytest.raises(InvalidArgument, match="keys"):
            await producer.send_many([b"a", b"b"], keys=["only one"])
        with pytest.raises(InvalidArgument, match="topic"):
            await acluster.subscribe([topic_name], "s")
        consumer = await acluster.subscribe(topic_name, "s")
        with pytest.raises(InvalidArgument, match="max_messages"):
            await consumer.receive(max_messages=0)
        pending = producer._pending
        await producer.close()
        with pytest.raises(InvalidArgument, match="closed"):
            await producer.send(b"late")
        await consumer.close()
        with pytest.raises(InvalidArgument, match="closed"):
            await consumer.receive()
        return pending

    assert run(main()) == 0
    assert cluster.stats(topic_name)["partitions"][0]["tail"] is None


def test_a_full_queue_refuses_without_blocking_when_asked_to(cluster, topic_name):
    cluster.create_topic(topic_name)

    async def main():
        producer = await aio.Cluster(cluster).create_producer(
            topic_name, max_pending_messages=1, block_if_queue_full=False
        )
        first = asyncio.create_task(producer.send(b"1"))
        await asyncio.sleep(0)  # (queued: one send pending)
        with pytest.raises(ProducerQueueIsFull):
            await producer.send(b"2")
        await first
        await producer.send(b"3")  # room again
        await producer.close()

    run(main())
    assert cluster.stats(topic_name)["partitions"][0]["entries"] == 2
