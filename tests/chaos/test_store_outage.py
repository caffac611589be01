"""A store outage of a few seconds while producing and consuming loses nothing."""

from __future__ import annotations

import time

from tests.chaos.workload import run_workload


def test_a_three_second_store_outage_delays_but_loses_nothing(cluster, topic_name, outage):
    cluster.create_topic(topic_name, partitions=2)

    def chaos(produced):
        time.sleep(1.5)
        outage.on()  # every actor's store calls fail now
        time.sleep(3.0)
        outage.off()

    ledger = run_workload(
        cluster, topic_name, ["a", "b"], messages=4_000, seconds=6.0, seed=11, chaos=chaos
    )
    report = ledger.check()
    for name, r in report.items():
        assert r["lost"] == 0, (name, r)
        assert r["early"] == 0, (name, r)
        assert r["cancelled_delivered"] == 0, (name, r)
    assert len(ledger.sent) == 4_000
    assert ledger.producer_retries > 0  # the outage was felt, and ridden out
