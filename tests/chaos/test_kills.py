"""Chaos: actors killed on a seeded schedule and store outages, while a workload runs.

Short form in ``make test`` (about 30k messages); ``make chaos`` runs the long form
(``CHAOS_MESSAGES=500000``). At the end: nothing published and not cancelled is lost, nothing
is delivered before its deliver_at, no honoured cancel is delivered; duplicates are counted
(they may only follow kills).
"""

from __future__ import annotations

import json
import os
import random
import time

import ray

from raydelay.cluster.names import COORDINATOR, NAMESPACE
from tests.chaos.workload import run_workload
from tests.integration.helpers import host_of, unit_host_of

MESSAGES = int(os.environ.get("CHAOS_MESSAGES", "30000"))
SECONDS = float(os.environ.get("CHAOS_SECONDS", str(max(20.0, MESSAGES / 1_000))))
KILL_EVERY_S = float(os.environ.get("CHAOS_KILL_EVERY_S", "3"))


def test_kills_and_store_outages_lose_nothing_and_deliver_nothing_early(
    cluster, topic_name, outage
):
    partitions, subs = 2, ["email", "push", "analytics"]
    cluster.create_topic(topic_name, partitions=partitions)
    targets = [COORDINATOR]
    # the hosts of the topic's partitions (each holds other partitions too) and the
    # subscription hosts serving the subscriptions (each serves both partitions of one, and
    # other subscriptions' units too), once the workload made them
    targets += sorted({host_of(topic_name, p) for p in range(partitions)})
    rng = random.Random(1234)
    kills: dict[str, int] = {}
    outages = 0

    def chaos(produced):
        nonlocal outages
        time.sleep(2.0)
        targets.extend(sorted({unit_host_of(topic_name, s) for s in subs}))
        while not produced.is_set():
            if rng.random() < 0.2:  # a short outage of the store, for every actor at once
                outage.on()
                time.sleep(rng.uniform(0.5, 1.5))
                outage.off()
                outages += 1
            else:
                name = rng.choice(targets)
                ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=False)
                kind = name.split("/")[0]
                kills[kind] = kills.get(kind, 0) + 1
            time.sleep(rng.uniform(0.5, 1.5) * KILL_EVERY_S)

    ledger = run_workload(
        cluster, topic_name, subs, messages=MESSAGES, seconds=SECONDS, seed=99, chaos=chaos
    )
    report = ledger.check()
    summary = {
        "messages": len(ledger.sent),
        "cancelled": len(ledger.cancelled),
        "kills": kills,
        "store_outages": outages,
        "producer_retries": ledger.producer_retries,
        "subscriptions": report,
    }
    print("CHAOS " + json.dumps(summary))
    assert sum(kills.values()) >= 3
    for name, r in report.items():
        assert r["lost"] == 0, (name, r)
        assert r["early"] == 0, (name, r)
        assert r["cancelled_delivered"] == 0, (name, r, ledger.cancelled_delivered(name))
        # a repeat may come without a count above its first delivery's (a subscription
        # restarted twice in a row: see raydelay.accounting), never with no count at all
        assert r["silent_duplicates"] == 0, (name, r)
