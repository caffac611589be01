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
