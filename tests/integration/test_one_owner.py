"""Two processes, one store: the second ``connect()`` attaches to the cluster that owns the
store, a Ray cluster of its own is refused with one clear error, and nothing is lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

HEAD = """
import json, sys, time
import raydelay  # first, as a user's script would: it sets Ray's token mode (raydelay/_auth.py)
import ray
CONFIG = {"storage": {"kind": "local", "local": {"root": sys.argv[1]}}}
"""

OWNER = HEAD + textwrap.dedent(
    """
    cluster = raydelay.connect(config=CONFIG)
    cluster.create_topic("t", partitions=2)
    cluster.create_producer("t").send_many([b"a%d" % i for i in range(1000)])
    print(ray.get_runtime_context().gcs_address, flush=True)
    sys.stdin.readline()  # until told to stop
    cluster.shutdown()
    """
)

SECOND = HEAD + textwrap.dedent(
    """
    cluster = raydelay.connect(config=CONFIG)  # no address: finds the owner, attaches
    cluster.create_producer("t").send_many([b"b%d" % i for i in range(1000)])
    print(ray.get_runtime_context().gcs_address, flush=True)
    cluster.shutdown()
    """
)

OTHER_RAY = HEAD + textwrap.dedent(
    """
    ray.init(namespace="raydelay", include_dashboard=False)  # a Ray cluster of its own
    try:
        raydelay.connect(config=CONFIG)
        print("connected", flush=True)
    except raydelay.StoreOwned as exc:
        print("refused:", exc, flush=True)
    sys.stdin.readline()  # until the owner has stopped
    cluster = raydelay.connect(config=CONFIG)  # now the store is free: this one owns it
    consumer = cluster.subscribe("t", "fresh")
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 2000 and time.monotonic() < deadline:
        msgs = consumer.receive(max_messages=1000, timeout_s=1)
        consumer.ack(msgs)
        got += [m.payload.decode() for m in msgs]
    print(json.dumps(sorted(got)), flush=True)
    cluster.shutdown()
    """
)


def _spawn(script: str, root: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    return subprocess.Popen(
        [sys.executable, "-c", script, root],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_two_processes_on_one_store_share_its_owner_and_lose_nothing(tmp_path):
    root = str(tmp_path / "store")
    owner = _spawn(OWNER, root)
    other = None
    try:
        # Given a process whose connect() started Ray and owns the store
        address = owner.stdout.readline().strip()
        assert address, "the owner process did not come up"
        # When a second process calls connect() on the same store, it attaches to that
        # cluster and its messages go to the same log
        second = subprocess.run(
            [sys.executable, "-c", SECOND, root],
            capture_output=True,
            text=True,
            timeout=120,
            env={k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")},
        )
        assert second.returncode == 0, second.stderr[-2000:]
        assert second.stdout.strip() == address
        # and a process already in another Ray cluster is refused, naming the owner
        other = _spawn(OTHER_RAY, root)
        line = other.stdout.readline().strip()
        assert line.startswith("refused: storage: the store is owned by the raydelay cluster")
        assert address in line
        # Then once the owner stops, the other takes the store and finds all 2,000
        owner.stdin.write("stop\n")
        owner.stdin.flush()
        assert owner.wait(timeout=60) == 0
        other.stdin.write("go\n")
        other.stdin.flush()
        got = json.loads(other.stdout.readline())
        assert got == sorted([f"a{i}" for i in range(1000)] + [f"b{i}" for i in range(1000)])
        assert other.wait(timeout=60) == 0
    finally:
        for proc in (owner, other):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


CLEAN_EXIT = HEAD + textwrap.dedent(
    """
    cluster = raydelay.connect(config=CONFIG)
    cluster.create_topic("t", partitions=2)
    consumers = [cluster.subscribe("t", "s") for _ in range(2)]
    cluster.create_producer("t").send_many([b"m%d" % i for i in range(2000)], deliver_after=0.5)
    got = 0
    while got < 2000:
        for c in consumers:
            msgs = c.receive(max_messages=500, timeout_s=0.2)
            c.ack(msgs)
            got += len(msgs)
    cluster.shutdown()  # while the subscriptions' loops are busy polling the topics
    print("done", flush=True)
    """
)


def test_a_client_that_started_ray_shuts_down_cleanly(tmp_path):
    # Given a process whose connect() started Ray, busy subscriptions, then shutdown()
    result = subprocess.run(
        [sys.executable, "-c", CLEAN_EXIT, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=180,
        env={k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")},
    )
    # Then no actor dies in the middle of a call: no crash dump, no traceback
    assert result.returncode == 0 and result.stdout.strip() == "done", result.stderr[-3000:]
    for sign in ("SIGABRT", "bad_optional_access", "Check failed", "Traceback", "*** "):
        assert sign not in result.stderr, result.stderr[-3000:]
