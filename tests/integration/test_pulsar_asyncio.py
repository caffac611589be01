"""raydelay.compat.pulsar.asyncio (#49): pulsar-client's asyncio API with the sync compat's
guarantees: every message once and none early, a receive or a read bounded by
``asyncio.wait_for`` loses nothing when it is cancelled, and failures are
``PulsarException`` with pulsar's result codes."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from datetime import timedelta

import pytest

import raydelay.compat.pulsar as pulsar
from raydelay.compat.pulsar.asyncio import Client, PulsarException

URL = "pulsar://localhost:6650"

pytestmark = pytest.mark.timeout(180)


def topic() -> str:
    return f"persistent://public/default/pa-{uuid.uuid4().hex[:8]}"


def run(cluster, body):
    async def main():
        client = Client(URL, cluster=cluster)
        try:
            return await body(client)
        finally:
            await client.close()

    return asyncio.run(main())


def test_send_receive_acknowledge_and_a_delay(cluster):
    name = topic()

    async def body(client):
        consumer = await client.subscribe(name, "s", consumer_type=pulsar.ConsumerType.Shared)
        producer = await client.create_producer(name, producer_name="maker")
        sent_ms = int(time.time() * 1000)
        # (far enough ahead that "now" is in first on a loaded machine, at a cold start too)
        later = await producer.send(b"later", deliver_after=timedelta(seconds=2))
        now = await producer.send(b"now", properties={"a": "1"}, partition_key="k")
        first = await consumer.receive()
        second = await consumer.receive()
        received_ms = int(time.time() * 1000)
        await consumer.acknowledge(first)
        await consumer.acknowledge(second)
        return sent_ms, received_ms, later, now, first, second, producer.last_sequence_id()

    sent_ms, received_ms, later, now, first, second, last = run(cluster, body)
    assert (first.data(), first.properties(), first.partition_key()) == (b"now", {"a": "1"}, "k")
    assert first.message_id() == now and second.message_id() == later
    assert second.data() == b"later" and received_ms - sent_ms >= 2_000  # not early
    assert last == 1


def test_concurrent_sends_each_arrive_once(cluster):
    name = topic()

    async def body(client):
        consumer = await client.subscribe(name, "s", consumer_type=pulsar.ConsumerType.Shared)
        producer = await client.create_producer(name)
        ids = await asyncio.gather(*(producer.send(b"m%d" % i) for i in range(500)))
        got = Counter()
        for _ in range(500):
            msg = await asyncio.wait_for(consumer.receive(), 30)
            got[msg.data()] += 1
            await consumer.acknowledge(msg)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(consumer.receive(), 0.5)
        return ids, got

    ids, got = run(cluster, body)
    assert len(set(ids)) == 500
    assert got == Counter(b"m%d" % i for i in range(500))


def test_receives_cut_short_by_wait_for_lose_nothing(cluster):
    # A receive bounded by a timeout far shorter than a round trip is cancelled again and
    # again while messages flow; each message still arrives once
    names = [topic(), [topic(), topic()]]  # one topic (awaited refs), several (a thread)

    async def body(client):
        out = []
        for name in names:
            consumer = await client.subscribe(name, "s", consumer_type=pulsar.ConsumerType.Shared)
            targets = name if isinstance(name, list) else [name]
            producers = [await client.create_producer(t) for t in targets]
            for i in range(100):
                await producers[i % len(producers)].send(b"c%d" % i)
            got = Counter()
            deadline = time.monotonic() + 60
            while sum(got.values()) < 100 and time.monotonic() < deadline:
                try:
                    msg = await asyncio.wait_for(consumer.receive(), 0.005)
                except TimeoutError:
                    continue
                got[msg.data()] += 1
                await consumer.acknowledge(msg)
            out.append(got)
            await consumer.close()
        return out

    for got in run(cluster, body):
        assert got == Counter(b"c%d" % i for i in range(100))


def test_reads_cut_short_by_wait_for_lose_nothing_and_keep_order(cluster):
    name = topic()

    async def body(client):
        producer = await client.create_producer(name)
        for i in range(60):
            await producer.send(b"r%d" % i)
        reader = await client.create_reader(name, pulsar.MessageId.earliest)
        seen = []
        deadline = time.monotonic() + 60
        while len(seen) < 60 and time.monotonic() < deadline:
            try:
                msg = await asyncio.wait_for(reader.read_next(), 0.01)
            except TimeoutError:
                continue
            seen.append(msg.data())
        available = await reader.has_message_available()
        await reader.close()
        return seen, available

    seen, available = run(cluster, body)
    assert seen == [b"r%d" % i for i in range(60)] and available is False


def test_failures_carry_pulsar_result_codes(cluster):
    name = topic()

    async def body(client):
        producer = await client.create_producer(name)
        with pytest.raises(PulsarException) as big:
            await producer.send(b"x" * (cluster.config.topic.max_message_bytes + 1))
        with pytest.raises(ValueError, match="properties"):  # (pulsar's type checks)
            await producer.send(b"x", properties="not a dict")
        await producer.close()
        with pytest.raises(PulsarException) as closed:
            await producer.close()
        with pytest.raises(PulsarException) as sent_closed:
            await producer.send(b"late")
        consumer = await client.subscribe(name, "s")
        with pytest.raises(ValueError):
            await consumer.seek("tomorrow")
        shared = await client.subscribe(name, "shared", consumer_type=pulsar.ConsumerType.Shared)
        message = await (await client.create_producer(name)).send(b"one")
        with pytest.raises(PulsarException) as cumulative:
            await shared.acknowledge_cumulative(message)
        return big.value, closed.value, sent_closed.value, cumulative.value

    big, closed, sent_closed, cumulative = run(cluster, body)
    assert big.error() == pulsar.Result.MessageTooBig
    assert closed.error() == pulsar.Result.AlreadyClosed
    assert sent_closed.error() == pulsar.Result.AlreadyClosed
    assert cumulative.error() == pulsar.Result.CumulativeAcknowledgementNotAllowedError
    assert str(closed).startswith("15 AlreadyClosed")  # pulsar's value and name


def test_an_exclusive_subscription_acks_cumulatively_and_resumes_after_it(cluster):
    name = topic()

    async def body(client):
        consumer = await client.subscribe(name, "s")
        producer = await client.create_producer(name)
        for i in range(5):
            await producer.send(b"e%d" % i)
        last = None
        for _ in range(5):
            last = await consumer.receive()
        await consumer.acknowledge_cumulative(last)
        await consumer.close()
        again = await client.subscribe(name, "s")
        await producer.send(b"after")
        return (await asyncio.wait_for(again.receive(), 30)).data()

    assert run(cluster, body) == b"after"
