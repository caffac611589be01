"""raydelay on a Ray cluster of several nodes (``ray.cluster_utils.Cluster``, in a child
process: this session's own Ray is a single node)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import sys, tempfile
    import raydelay  # first, as a user's program would
    import ray
    from ray.cluster_utils import Cluster
    from raydelay.errors import InvalidArgument

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="raydelay")
    root = tempfile.mkdtemp()
    try:
        raydelay.connect(config={"storage": {"kind": "local", "local": {"root": root}}})
        print("accepted")
    except InvalidArgument as exc:
        print("refused:", exc)
    config = {"storage": {"kind": "local", "local": {"root": root, "shared": True}}}
    c = raydelay.connect(config=config)
    c.create_topic("t", 1)
    consumer = c.subscribe("t", "s")
    c.create_producer("t").send(b"x")
    print("shared:", [m.payload for m in consumer.receive(max_messages=1, timeout_s=30)])
    c.shutdown()
    ray.shutdown()
    cluster.shutdown()
    """
)


def test_a_local_store_is_refused_on_two_nodes_unless_it_is_shared(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAYDELAY_ADDRESS")}
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [
        ln for ln in out.stdout.splitlines() if ln.startswith(("refused", "accepted", "shared"))
    ]
    assert lines[0].startswith("refused: storage.kind: a local store"), out.stdout + out.stderr
    assert "2 nodes" in lines[0] and "storage.local.shared = true" in lines[0] and "S3" in lines[0]
    assert lines[1] == "shared: [b'x']", out.stdout + out.stderr


NODE_LOSS = textwrap.dedent(
    """
    import json, sys, tempfile, time
    import raydelay
    import ray
    from ray.cluster_utils import Cluster
    from raydelay.cluster.local import RAY_SYSTEM_CONFIG
    from raydelay.config import RayConfig

    system = {**RAY_SYSTEM_CONFIG, **RayConfig().system_config()}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": system})
    workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="raydelay")
    root = tempfile.mkdtemp()
    c = raydelay.connect(config={"storage": {"kind": "local", "local": {"root": root, "shared": True}}})
    c.create_topic("t", 4)
    consumer = c.subscribe("t", "s")
    producer = c.create_producer("t")
    due = int(time.time() * 1000) + 6_000
    sent = {str(m): due for m in producer.send_many([b"d%d" % i for i in range(400)], deliver_at=due)}
    sent |= {str(m): None for m in producer.send_many([b"n%d" % i for i in range(400)])}
    before = {r["name"]: (r["node"], r["serves"]) for r in c.placement() if r["class"] == "HostActor"}
    # the node whose host serves partition 0 is lost (SIGKILL of its processes)
    lost = next(n for n, serves in before.values() if "t/0" in serves)
    victim = next(w for w in workers if w.node_id == lost)
    got = {}
    killed_at = None
    deadline = time.monotonic() + 120
    while len(got) < len(sent) and time.monotonic() < deadline:
        for m in consumer.receive(max_messages=200, timeout_s=0.5):
            got.setdefault(str(m.message_id), int(time.time() * 1000))
            consumer.ack(m)
        if killed_at is None and len(got) >= 100:
            killed_at = int(time.time() * 1000)
            cluster.remove_node(victim, allow_graceful=False)
    after = {r["name"]: (r["node"], r["serves"]) for r in c.placement() if r["class"] == "HostActor"}
    early = [m for m, at in sent.items() if at is not None and m in got and got[m] < at]
    p0 = [t for m, t in got.items() if m.startswith("t/0/") and t > killed_at]
    print("RESULT " + json.dumps({
        "lost_node": lost,
        "missing": len(set(sent) - set(got)),
        "early": len(early),
        "after": after,
        "partition0_back_s": (min(p0) - killed_at) / 1000 if p0 else None,
    }), flush=True)
    c.shutdown()
    ray.shutdown()
    cluster.shutdown()
    """
)


def test_a_lost_nodes_partitions_move_to_a_surviving_host(tmp_path):
    from tests.integration.helpers import run_child

    result = run_child(NODE_LOSS, tmp_path)
    # every message arrived, none early, and every partition is served by a host on a node
    # that survived
    assert result["missing"] == 0 and result["early"] == 0, result
    served = sorted(k for node, serves in result["after"].values() for k in serves)
    assert served == ["t/0", "t/1", "t/2", "t/3"], result
    assert all(node != result["lost_node"] for node, _ in result["after"].values()), result
    print("partition 0 delivered again", result["partition0_back_s"], "s after the node loss")
