"""Writes tests/data/subscription-buckets-store.tar.gz: a store written by raydelay while
each subscription indexed the log by itself (commit 1afa916, ledger object format 3,
buckets under subs/.../buckets/). Kept to show how the fixture was made; it only runs
against that code:

    git worktree add /tmp/old 1afa916
    cd "$(mktemp -d)" && PYTHONPATH=/tmp/old python /path/to/make_subscription_buckets_store.py OUT.tar.gz

The same script, run against commit b1562e6 (an actor per partition and per
(subscription, partition), before partition hosts; the topic indexed the log into sealed
buckets under topics/.../buckets/), wrote tests/data/partition-actors-store.tar.gz; run
against commit 9ee1534 (partition hosts, before merges), it wrote
tests/data/hosts-store.tar.gz.

What the store holds (tests/integration/test_format2_store.py checks it all comes back):
topic ``orders`` with 2 partitions and the shared subscription ``billing``;
2,000 immediate messages ``now-<i>`` (the first 500 received and acked), 2,000 delayed
ones ``later-<i>`` due 120 s after they were written (sealed into buckets: ledgers of
1,000 entries, buckets from 500), cancels of ``later-0`` .. ``later-99``, and 1,000
``future-<i>`` due in 2100 (never delivered by the test; they must stay pending).
"""

import json
import sys
import tarfile
import time

import raydelay

ROOT = "store"
config = {
    "storage": {"kind": "local", "local": {"root": ROOT}},
    "topic": {"max_entries_per_ledger": 1_000},
    "delayed": {"min_index_count_per_bucket": 500, "max_indexes_per_segment": 200},
    "subscription": {"cursor_persist_interval_ms": 100},
}
cluster = raydelay.connect(config=config)
cluster.create_topic("orders", partitions=2)
consumer = cluster.subscribe("orders", "billing")
producer = cluster.create_producer("orders")
now_ids = producer.send_many(
    [b"now-%d" % i for i in range(2_000)], keys=[f"k{i % 7}" for i in range(2_000)]
)
due = int(time.time() * 1000) + 120_000
later_ids = producer.send_many(
    [b"later-%d" % i for i in range(2_000)],
    deliver_at=due,
    properties=[{"n": str(i)} for i in range(2_000)],
)
assert all(producer.cancel_many(later_ids[:100]))
producer.send_many([b"future-%d" % i for i in range(1_000)], deliver_at=4_102_444_800_000)
got = []
while len(got) < 500:
    got += consumer.receive(max_messages=500 - len(got), timeout_s=5)
consumer.ack(got)
assert all(m.payload.startswith(b"now-") for m in got)
time.sleep(1)
print(json.dumps(cluster.stats("orders", "billing"), default=str))
cluster.shutdown()
with open(f"{ROOT}/EXPECTED.json", "w") as f:
    json.dump({"acked": sorted(m.payload.decode() for m in got), "due_ms": due}, f)
with tarfile.open(sys.argv[1], "w:gz") as tar:
    tar.add(ROOT, arcname="store")
