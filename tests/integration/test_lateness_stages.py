"""Lateness by stage, end to end (raydelay.dispatch.stages): a subscription's stats and a
consumer say which stage the lateness of its delayed messages was spent in."""

from __future__ import annotations

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
