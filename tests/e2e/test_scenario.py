"""End to end: 4 partitions, 2 shared subscriptions, 50k delayed (1-8 s) + 10k immediate.

Every message reaches each subscription, none before its deliver_at (strict mode),
and, in a run without failures, none twice.
"""

from __future__ import annotations

import random
import threading
import time

from tests.integration.helpers import now_ms

DELAYED, IMMEDIATE = 50_000, 10_000


def test_sixty_thousand_messages_reach_two_subscriptions_on_time_exactly_once(cluster, topic_name):
    assert cluster.config.delayed.strict
    cluster.create_topic(topic_name, partitions=4)
    consumers = {name: cluster.subscribe(topic_name, name) for name in ("email", "push")}
    producer = cluster.create_producer(topic_name)
    rng = random.Random(7)

    received: dict[str, list] = {name: [] for name in consumers}
    done = threading.Event()

    def consume(name: str) -> None:
        consumer = consumers[name]
        while not done.is_set():
            msgs = consumer.receive(max_messages=2_000, timeout_s=0.5)
            if msgs:
                t = now_ms()
                received[name].extend((m.message_id, m.deliver_at_ms, t) for m in msgs)
                consumer.ack(msgs)

    threads = [threading.Thread(target=consume, args=(n,), daemon=True) for n in consumers]
    for t in threads:
        t.start()

    # Given 50k messages due 1-8 s from now and 10k immediate ones, interleaved
    sent: dict = {}
    total = DELAYED + IMMEDIATE
    kinds = [True] * DELAYED + [False] * IMMEDIATE
    rng.shuffle(kinds)
    for lo in range(0, total, 5_000):
        base = now_ms()
        ats = [base + rng.randint(1_000, 8_000) if k else None for k in kinds[lo : lo + 5_000]]
        mids = producer.send_many([b"%d" % i for i in range(lo, lo + len(ats))], deliver_at=ats)
        sent.update(zip(mids, ats, strict=True))

    # When the consumers run until everything arrived (or a generous deadline)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and any(len(r) < total for r in received.values()):
        time.sleep(0.25)
    time.sleep(1.0)  # anything extra (a duplicate) would arrive now
    done.set()
    for t in threads:
        t.join(timeout=10)

    # Then each subscription got every message exactly once, never early
    for name, got in received.items():
        ids = [mid for mid, _, _ in got]
        assert len(ids) == len(set(ids)), f"{name}: duplicates"
        assert set(ids) == set(sent), f"{name}: {len(set(sent) - set(ids))} missing"
        early = [(mid, at, t) for mid, at, t in got if at is not None and t < at]
        assert early == [], f"{name}: delivered early: {early[:5]}"
        assert all(at == sent[mid] for mid, at, _ in got)
    stats = cluster.stats(topic_name, "email")
    assert stats["backlog"] == 0 and stats["delayed"] == 0 and stats["pending_ack"] == 0
