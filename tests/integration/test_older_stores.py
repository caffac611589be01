"""Stores written by older raydelay come up under this code with nothing lost: every
unacknowledged message is delivered once, with its key and properties, and no cancelled
one is (see tests/data/ for how each was made):

- format 2: before the Arrow ledger format;
- subscription buckets: while each subscription indexed the log by itself (its own
  buckets under subs/.../buckets/). The topic re-indexes the retained ledgers into
  sealed buckets, the subscriptions delete their own, and messages due in 2100 stay
  pending;
- partition actors: while every partition, and every (subscription, partition), was an
  actor of its own. Its partitions come up on hosts, its subscription on one actor;
- hosts, before merges: partition hosts, each partition's sealed buckets never merged.
  It comes up with ``max_num_buckets = 1``: each partition merges its buckets into one
  as it starts, under the subscription reading them.

It runs in its own process with its own local Ray, because the session's coordinator
is bound to the session's store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

DATA = Path(__file__).parent.parent / "data"

SCRIPT = r"""
import json, sys, time
import raydelay

cluster = raydelay.connect(config={
    "storage": {"kind": "local", "local": {"root": sys.argv[1]}},
    "topic": {"max_entries_per_ledger": 1_000},
    "delayed": {"min_index_count_per_bucket": 500, "max_indexes_per_segment": 200}
    | json.loads(sys.argv[3]),
})
consumer = cluster.subscribe("orders", "billing")
got = []
deadline = time.monotonic() + 120

def take(timeout_s):
    batch = consumer.receive_batch(max_messages=5_000, timeout_s=timeout_s)
    for m in batch:
        got.append([m.payload.decode(), m.key, m.properties, m.redelivery_count])
    if len(batch):
        consumer.ack(batch)
    consumer.flush()

def nothing_left():
    # every entry acknowledged but the delayed ones, none held, read ahead or to redeliver
    s = cluster.stats("orders", "billing")
    busy = s["pending_ack"] or s["read_ahead"] or s["redelivery"]
    return s["backlog"] == s["delayed"] and not busy

# the expected number arrives, then the subscription has nothing left (what still comes
# meanwhile is taken too), and one more receive without waiting
while len(got) < int(sys.argv[2]) and time.monotonic() < deadline:
    take(2.0)
while time.monotonic() < deadline:
    take(0)
    if nothing_left():
        break
    time.sleep(0.2)
take(0)
stats = cluster.stats("orders", "billing")
import os
own = [os.path.join(d, f) for d, _, fs in os.walk(sys.argv[1]) for f in fs if "/subs/" in d and "/buckets" in d]
sealed = [os.path.join(d, f) for d, _, fs in os.walk(sys.argv[1]) for f in fs if "/topics/" in d and "/buckets/" in d]
placed = [[r["class"], r["serves"]] for r in cluster.placement()]
from raydelay.actors.handles import topic_partition
from raydelay.actors.host import HostActor
import ray
def topic_stats():
    return [ray.get(topic_partition("orders", p).submit(HostActor.stats)) for p in (0, 1)]
# with a bucket limit, each partition merges down to it (waited for, with the deadline)
limit = json.loads(sys.argv[3]).get("max_num_buckets")
topics = topic_stats()
while limit and any(t["buckets"] > limit for t in topics) and time.monotonic() < deadline:
    time.sleep(0.2)
    topics = topic_stats()
merged = [[t["buckets"], t["merged"]] for t in topics]
print(json.dumps({"got": got, "stats": stats, "own": own, "sealed": sealed, "placed": placed,
                  "merged": merged}, default=str))
cluster.shutdown()
"""


@pytest.mark.parametrize(
    "fixture",
    [
        "format2-store.tar.gz",
        "subscription-buckets-store.tar.gz",
        "partition-actors-store.tar.gz",
        "hosts-store.tar.gz",
    ],
)
def test_an_older_store_comes_up_with_nothing_lost(tmp_path, fixture):
    with tarfile.open(DATA / fixture) as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "store"
    expected_acked = set(json.loads((root / "EXPECTED.json").read_text())["acked"])
    wanted = {f"now-{i}" for i in range(2_000)} - expected_acked
    wanted |= {f"later-{i}" for i in range(100, 2_000)}  # 0..99 were cancelled
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    merges = fixture.startswith("hosts")
    delayed = {"max_num_buckets": 1} if merges else {}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(root), str(len(wanted)), json.dumps(delayed)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    payloads = [g[0] for g in out["got"]]
    assert len(payloads) == len(set(payloads)), "a message was delivered twice"
    assert set(payloads) == wanted
    for payload, key, props, _ in out["got"]:
        i = int(payload.split("-")[1])
        if payload.startswith("now-"):
            assert key == f"k{i % 7}" and props == {}
        else:
            assert key is None and props == {"n": str(i)}
    future = fixture.startswith(("subscription-buckets", "partition-actors", "hosts"))
    if future:
        # the 1,000 due in 2100 are pending in sealed buckets or the unsealed tail, and
        # the subscription's own buckets are gone
        assert out["stats"]["delayed"] == 1_000
        assert out["own"] == []
        assert out["sealed"], "the topic sealed no bucket from the retained ledgers"
    assert out["stats"]["backlog"] == (1_000 if future else 0)
    # under the new layout: the partitions on hosts, the subscription one unit in one
    # subscription host (the others, kept warm, serve nothing)
    subs = [serves for kind, serves in out["placed"] if kind == "SubscriptionHost" and serves]
    assert subs == [["orders/billing/0", "orders/billing/1"]]
    hosted = sorted(k for kind, serves in out["placed"] if kind == "HostActor" for k in serves)
    assert hosted == ["orders/0", "orders/1"]
    if merges:
        # the buckets each partition sealed before merges existed are merged into one
        assert [buckets for buckets, _ in out["merged"]] == [1, 1], out["merged"]
        assert sum(n for _, n in out["merged"]) >= 1
