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


class Chaos:
    """Kills and store outages on a seeded schedule until the workload has produced: the
    actors of ``targets``, and the subscription hosts serving ``subs`` once they exist."""

    def __init__(self, topic: str, subs: list[str], targets: list[str], outage, seed: int):
        self.topic, self.subs, self.targets, self.outage = topic, subs, targets, outage
        self.rng = random.Random(seed)
        self.kills: dict[str, int] = {}
        self.outages = 0

    def run(self, produced) -> None:
        rng = self.rng
        time.sleep(2.0)
        self.targets.extend(sorted({unit_host_of(self.topic, s) for s in self.subs}))
        while not produced.is_set():
            if rng.random() < 0.2:  # a short outage of the store, for every actor at once
                self.outage.on()
                time.sleep(rng.uniform(0.5, 1.5))
                self.outage.off()
                self.outages += 1
            else:
                name = rng.choice(self.targets)
                ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=False)
                kind = name.split("/")[0]
                self.kills[kind] = self.kills.get(kind, 0) + 1
            time.sleep(rng.uniform(0.5, 1.5) * KILL_EVERY_S)


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
    chaos = Chaos(topic_name, subs, targets, outage, seed=1234)
    ledger = run_workload(
        cluster, topic_name, subs, messages=MESSAGES, seconds=SECONDS, seed=99, chaos=chaos.run
    )
    report = ledger.check()
    kills = chaos.kills
    summary = {
        "messages": len(ledger.sent),
        "cancelled": len(ledger.cancelled),
        "kills": kills,
        "store_outages": chaos.outages,
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


def test_keyed_cancels_and_replaces_under_kills_lose_nothing(cluster, topic_name, outage):
    """Every delayed message keyed: cancels by key, replaces and repeated sends of pending
    keys while the topic's hosts and the subscription hosts are killed and the store goes
    away: nothing lost or early, no cancelled or replaced message delivered after its
    cancel or replace answered, and every repeat of a pending key answered its first id."""
    partitions, subs = 2, ["email", "push"]
    cluster.create_topic(topic_name, partitions=partitions)
    targets = sorted({host_of(topic_name, p) for p in range(partitions)})
    chaos = Chaos(topic_name, subs, targets, outage, seed=4321)
    n = max(5_000, MESSAGES // 3)
    ledger = run_workload(
        cluster, topic_name, subs, messages=n, seconds=max(15.0, SECONDS / 2), seed=7,
        chaos=chaos.run, keyed=True,
    )  # fmt: skip
    report = ledger.check()
    kills = chaos.kills
    summary = {
        "messages": len(ledger.sent),
        "cancelled_by_key": ledger.cancelled_by_key,
        "replaced": len(ledger.replaced),
        "repeats_ignored": ledger.ignored,
        "repeats_answered_wrong": len(ledger.ignored_wrong),
        "kills": kills,
        "subscriptions": report,
    }
    print("CHAOS KEYS " + json.dumps(summary))
    assert sum(kills.values()) >= 2
    assert ledger.cancelled_by_key > 0 and ledger.replaced and ledger.ignored > 0
    assert ledger.ignored_wrong == [], ledger.ignored_wrong[:5]
    for name, r in report.items():
        assert r["lost"] == 0, (name, r)
        assert r["early"] == 0, (name, r)
        # cancelled-delivered counts replaced-delivered-old too (a replaced one is cancelled)
        assert r["cancelled_delivered"] == 0, (name, r, ledger.cancelled_delivered(name))
        assert r["silent_duplicates"] == 0, (name, r)
