"""raydelay's metrics reach the Prometheus endpoint of the local Ray (ray.util.metrics)."""

from __future__ import annotations

import re
import time
import urllib.request

import ray

from tests.integration.helpers import receive_all

EXPECTED = [
    "ray_raydelay_published_messages_total",
    "ray_raydelay_dispatched_messages_total",
    "ray_raydelay_redeliveries_total",
    "ray_raydelay_dead_lettered_total",
    "ray_raydelay_delayed_messages",
    "ray_raydelay_immutable_buckets",
    "ray_raydelay_loaded_indexes",
    "ray_raydelay_bucket_snapshot_bytes_total",
    "ray_raydelay_bucket_ops_total",
    "ray_raydelay_bucket_op_seconds_bucket",
    "ray_raydelay_dispatch_lateness_ms_bucket",
    "ray_raydelay_lateness_stage_ms_bucket",
]


def scrape() -> str:
    node = ray._private.worker.global_worker.node
    url = f"http://{node.node_ip_address}:{node.metrics_export_port}/metrics"
    return urllib.request.urlopen(url, timeout=10).read().decode()


def series(body: str, name: str, topic: str) -> list[float]:
    """Values of ``name`` samples tagged with ``topic``."""
    out = []
    for line in body.splitlines():
        if line.startswith(name + "{") and f'topic="{topic}"' in line:
            out.append(float(line.rsplit(" ", 1)[1]))
    return out


def test_the_metrics_endpoint_has_raydelays_metrics(cluster, topic_name):
    # Given delayed messages that seal buckets (the session's config: 2,000 per ledger and
    # per bucket), some delivered late-enough to measure, one redelivered and dead-lettered
    cluster.create_topic(topic_name, partitions=1)
    consumer = cluster.subscribe(topic_name, "s", max_redeliveries=1)
    producer = cluster.create_producer(topic_name)
    producer.send_many([b"far-%d" % i for i in range(5_000)], deliver_after=3_600)
    producer.send_many([b"soon-%d" % i for i in range(300)], deliver_after=0.3)
    got = [m for m, _ in receive_all(consumer, 300, ack=False)]
    assert len(got) == 300
    consumer.ack(got[1:])
    consumer.nack(got[0])
    again = receive_all(consumer, 1, ack=False)
    consumer.nack(again[0][0])  # its second redelivery would exceed max_redeliveries: DLQ
    # When the endpoint is scraped (metrics are reported about once a second)
    deadline = time.monotonic() + 60
    missing = EXPECTED
    while missing and time.monotonic() < deadline:
        body = scrape()
        missing = [name for name in EXPECTED if not series(body, name, topic_name)]
        if missing:
            time.sleep(1)
    # Then every metric is there, with values that match what happened
    assert not missing, f"not on the endpoint: {missing}"
    assert sum(series(body, "ray_raydelay_published_messages_total", topic_name)) >= 5_300
    assert max(series(body, "ray_raydelay_immutable_buckets", topic_name)) >= 1
    assert sum(series(body, "ray_raydelay_dispatch_lateness_ms_count", topic_name)) >= 300
    # every stage of those first deliveries: the subscription's, and the consumer's
    # (recorded by this process, the driver)
    stages = {
        m.group(1)
        for m in re.finditer(r'ray_raydelay_lateness_stage_ms_count\{[^}]*stage="(\w+)"', body)
    }
    assert stages == {"written", "reached", "waited", "returned"}, stages
    ops = {
        m.group(1)
        for m in re.finditer(r'ray_raydelay_bucket_ops_total\{[^}]*op="(\w+)"[^}]*\}', body)
    }
    assert "create" in ops  # the topic sealed buckets
