"""A store written before the Arrow ledger format (format 2, see tests/data/) comes up
under this code with nothing lost: every unacknowledged message is delivered once,
with its key and properties, and no cancelled one is.

It runs in its own process with its own local Ray, because the session's coordinator
is bound to the session's store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

DATA = Path(__file__).parent.parent / "data" / "format2-store.tar.gz"

SCRIPT = r"""
import json, sys, time
import raydelay

cluster = raydelay.connect(config={
    "storage": {"kind": "local", "local": {"root": sys.argv[1]}},
    "topic": {"max_entries_per_ledger": 1_000},
    "delayed": {"min_index_count_per_bucket": 500, "max_indexes_per_segment": 200},
})
consumer = cluster.subscribe("orders", "billing")
got = []
quiet_until = time.monotonic() + 60
while time.monotonic() < quiet_until:
    batch = consumer.receive_batch(max_messages=5_000, timeout_s=2.0)
    if len(batch) == 0 and len(got) >= 3_400:
        break
    for m in batch:
        got.append([m.payload.decode(), m.key, m.properties, m.redelivery_count])
    consumer.ack(batch)
print(json.dumps({"got": got, "stats": cluster.stats("orders", "billing")}, default=str))
cluster.shutdown()
"""


def test_a_format_2_store_comes_up_with_nothing_lost(tmp_path):
    with tarfile.open(DATA) as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "store"
    expected_acked = set(json.loads((root / "EXPECTED.json").read_text())["acked"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(root)],
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
    wanted = {f"now-{i}" for i in range(2_000)} - expected_acked
    wanted |= {f"later-{i}" for i in range(100, 2_000)}  # 0..99 were cancelled
    assert set(payloads) == wanted
    for payload, key, props, _ in out["got"]:
        i = int(payload.split("-")[1])
        if payload.startswith("now-"):
            assert key == f"k{i % 7}" and props == {}
        else:
            assert key is None and props == {"n": str(i)}
    assert out["stats"]["backlog"] == 0
