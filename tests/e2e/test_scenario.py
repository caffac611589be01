"""End to end: 4 partitions, 2 shared subscriptions, 50k delayed (1-8 s) + 10k immediate.

Every message reaches each subscription, none before its deliver_at (strict mode),
and, in a run without failures, none twice.
"""

from __future__ import annotations

import random
import threading
import time

from raydelay.accounting import Ledger
from raydelay.clock import now_ms
from tests.integration.helpers import send_markers

DELAYED, IMMEDIATE = 50_000, 10_000


def test_sixty_thousand_messages_reach_two_subscriptions_on_time_exactly_once(cluster, topic_name):
    assert cluster.config.delayed.strict
    cluster.create_topic(topic_name, partitions=4)
    consumers = {name: cluster.subscribe(topic_name, name) for name in ("email", "push")}
    producer = cluster.create_producer(topic_name)
    rng = random.Random(7)

    ledger = Ledger()
    carried: dict[str, list] = {name: [] for name in consumers}  # (id, deliver_at it came with)
    done = threading.Event()

    def consume(name: str) -> None:
        consumer = consumers[name]
        while not done.is_set():
            msgs = consumer.receive(max_messages=2_000, timeout_s=0.5)
            if msgs:
                t = now_ms()
                ids = [m.message_id for m in msgs]
                ledger.record_received(
                    ids, t, [m.redelivery_count for m in msgs], subscription=name
                )
                carried[name].extend((m.message_id, m.deliver_at_ms) for m in msgs)
                consumer.ack(msgs)

    threads = [threading.Thread(target=consume, args=(n,), daemon=True) for n in consumers]
    for t in threads:
        t.start()

    def wait_for_everything(timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(ledger.missing(n) for n in consumers):
            time.sleep(0.25)

    # Given 50k messages due 1-8 s from now and 10k immediate ones, interleaved
    sent: dict = {}
    total = DELAYED + IMMEDIATE
    kinds = [True] * DELAYED + [False] * IMMEDIATE
    rng.shuffle(kinds)
    for lo in range(0, total, 5_000):
        base = now_ms()
        ats = [base + rng.randint(1_000, 8_000) if k else None for k in kinds[lo : lo + 5_000]]
        mids = producer.send_many([b"%d" % i for i in range(lo, lo + len(ats))], deliver_at=ats)
        ledger.record_sent(mids, ats)
        sent.update(zip(mids, ats, strict=True))

    # When the consumers run until everything arrived (or a generous deadline), and then
    # until markers arrive on every partition, read after everything and due after
    # everything: a duplicate, from the log or from the delayed index, comes before them
    wait_for_everything(timeout_s=120)
    last_due = max(at for at in sent.values() if at is not None)
    markers = send_markers(producer, [None, max(last_due, now_ms()) + 300])
    ledger.record_sent(list(markers), list(markers.values()))
    wait_for_everything(timeout_s=60)
    done.set()
    for t in threads:
        t.join(timeout=10)

    # Then each subscription got every message exactly once, never early
    for name in consumers:
        result = ledger.result(name)
        assert result.duplicates == 0, f"{name}: {result.duplicates} duplicates"
        assert not result.lost, f"{name}: {len(result.lost)} missing"
        assert not result.unknown, f"{name}: {len(result.unknown)} never sent"
        assert result.early == (), f"{name}: delivered early: {result.early[:5]}"
        assert all(at == sent[mid] for mid, at in carried[name] if mid in sent)
    stats = cluster.stats(topic_name, "email")
    assert stats["backlog"] == 0 and stats["delayed"] == 0 and stats["pending_ack"] == 0
