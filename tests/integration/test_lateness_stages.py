"""Lateness by stage, end to end (raydelay.dispatch.stages): a subscription's stats and a
consumer say which stage the lateness of its delayed messages was spent in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import ray

from raydelay.clock import now_ms
from raydelay.dispatch.stages import summary
from tests.integration.helpers import receive_all


def _ms(stages: dict, stage: str) -> int:
    return int(stages[stage]["sum_ms"])


def test_messages_written_after_their_due_time_are_late_by_their_writing(cluster, topic_name):
    # Given 50 messages sent 3 s after their due time, and 50 due 0.5 s after they are sent
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "s")
    producer = cluster.create_producer(topic_name)
    producer.send_many([b"old-%d" % i for i in range(50)], deliver_at=now_ms() - 3_000)
    producer.send_many([b"new-%d" % i for i in range(50)], deliver_after=0.5)
    # When a consumer receives them all
    got = receive_all(consumer, 100)
    assert len(got) == 100
    # Then the subscription counts each first delivery once in each of its stages
    stages = cluster.stats(topic_name, "s")["lateness"]["stages"]
    assert {s: sum(v["counts"]) for s, v in stages.items()} == {
        "written": 100,
        "reached": 100,
        "waited": 100,
    }
    # and the 50 written late account for at least their 3 s each in "written", the
    # 50 written in time for none
    assert 50 * 3_000 <= _ms(stages, "written") < 50 * 3_000 + 50 * 2_000
    late = [at - m.deliver_at_ms for m, at in got]
    subscription_ms = sum(_ms(stages, s) for s in stages)
    # the three stages end where the reply was made: before the consumer had it
    assert subscription_ms <= sum(late)
    # and the consumer counted the last stage of every one of them
    mine = consumer.lateness_stages()
    assert sum(mine["returned"]["counts"]) == 100
    rows = {r["stage"]: r for r in summary(stages | mine)}
    assert rows["written"]["share"] > 0.5  # (the producer's part is the largest here)
    consumer.close()
    producer.close()


FIRST_DELIVERY = textwrap.dedent(
    """
    import json, sys, time
    import raydelay

    address, topic = sys.argv[1], sys.argv[2]
    cluster = raydelay.connect(address=address)
    consumer = cluster.subscribe(topic, "s")
    reader = cluster.create_reader(topic)
    cluster.create_producer(topic).send(b"first", deliver_after=1.0)
    before = set(sys.modules)
    got = []
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        got = consumer.receive(timeout_s=0.5)
    consumer.ack(got)
    read = reader.read_next(timeout_s=30)
    print(json.dumps({
        "received": [m.payload.decode() for m in got],
        "read": None if read is None else read.payload.decode(),
        "imported": sorted(set(sys.modules) - before),
    }), flush=True)
    cluster.shutdown()
    """
)


def test_a_new_process_imports_nothing_on_its_first_delivery(cluster, topic_name):
    # pyarrow imports pandas on its first conversion to numpy (0.25-0.4 s): a consumer
    # that paid it on its first delivery handed its first messages out that much late
    cluster.create_topic(topic_name, partitions=2)
    address = ray.get_runtime_context().gcs_address
    # Given a fresh process with a consumer and a reader, and a message due in 1 s
    child = subprocess.run(
        [sys.executable, "-c", FIRST_DELIVERY, address, topic_name],
        capture_output=True,
        text=True,
        timeout=180,
        # (no autoscaler events printed: Ray's log thread imports its autoscaler package,
        # click and colorful for the first one, which a loaded suite's other tests cause)
        env={
            **{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
            "RAY_SCHEDULER_EVENTS": "0",
        },
    )
    assert child.returncode == 0, child.stderr[-3000:]
    out = json.loads(child.stdout.strip().splitlines()[-1])
    # When the consumer receives it and the reader reads it: both have it
    assert out["received"] == ["first"]
    assert out["read"] == "first"
    # Then nothing was imported between the consumer's first receive and the reader's
    # first message: what a first delivery needs was loaded when they were made
    assert out["imported"] == []
