"""A whole raydelay round trip over a real S3 server (SeaweedFS), in a child process: this
session's own Ray already has a coordinator, over a local-dir store."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid

CHILD = textwrap.dedent(
    """
    import json, random, sys, time
    import ray
    import raydelay

    config = json.loads(sys.argv[1])
    n, cancels = 2_000, 100
    now_ms = lambda: time.time_ns() // 1_000_000
    ray.init(address="local", num_cpus=2, namespace="raydelay", include_dashboard=False,
             logging_level="WARNING", log_to_driver=False)
    rd = raydelay.connect(config=config)
    rd.create_topic("orders", 2)
    consumer = rd.subscribe("orders", "s")
    producer = rd.create_producer("orders")
    rng = random.Random(7)
    payloads = [b"m%05d" % i for i in range(n)]
    afters = [rng.uniform(0.0, 2.0) for _ in range(n)]
    ids = []
    for lo in range(0, n, 250):
        ids.extend(producer.send_many(payloads[lo:lo + 250], deliver_after=afters[lo:lo + 250]))
    last_due_ms = now_ms() + 2_000
    # cancel a few of those due last (at least 1.5 s out), so most cancels come first
    late = [i for i in range(n) if afters[i] >= 1.5]
    doomed = rng.sample(late, cancels)
    taken = producer.cancel_many([ids[i] for i in doomed])
    cancelled = {payloads[i] for i, ok in zip(doomed, taken) if ok}
    expected = set(payloads) - cancelled
    seen, early, duplicates = set(), 0, 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (expected - seen or now_ms() < last_due_ms + 1_000):
        batch = consumer.receive_batch(max_messages=1_000, timeout_s=0.5)
        at_ms = now_ms()
        if not len(batch):
            continue
        early += int((at_ms < batch.deliver_at_ms).sum())
        for payload in batch.payloads.to_pylist():
            duplicates += payload in seen
            seen.add(payload)
        consumer.ack(batch)
    consumer.flush()
    result = {
        "sent": n,
        "cancelled": len(cancelled),
        "delivered": len(seen),
        "lost": len(expected - seen),
        "early": early,
        "cancelled_delivered": len(cancelled & seen),
        "duplicates": duplicates,
    }
    consumer.close()
    producer.close()
    rd.shutdown()
    ray.shutdown()
    print("RESULT " + json.dumps(result), flush=True)
    """
)


def test_a_round_trip_over_seaweedfs_loses_nothing_and_delivers_nothing_early_or_cancelled(
    seaweed_server, tmp_path
):
    bucket = seaweed_server.bucket(f"rd-it-{uuid.uuid4().hex[:12]}")
    config = {
        "storage": seaweed_server.storage_config(bucket),
        "topic": {"max_entries_per_ledger": 1_000, "retention_interval_ms": 300},
        "subscription": {"cursor_persist_interval_ms": 200},
    }
    # the actors' boto3 reads the key from the environment Ray's workers inherit
    env = seaweed_server.child_env()
    for name in ("RAY_ADDRESS", "RAYDELAY_ADDRESS"):
        env.pop(name, None)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(config)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["lost"] == 0, result
    assert result["early"] == 0, result
    assert result["cancelled_delivered"] == 0, result
    assert result["cancelled"] > 0 and result["delivered"] == 2_000 - result["cancelled"], result
    # and the log really is in the bucket
    listed = seaweed_server.client().list_objects_v2(Bucket=bucket, Prefix="topics/orders/")
    assert listed.get("KeyCount", 0) > 0
