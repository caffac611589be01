"""A quiet first hour (#30): processes started at the same moment on one store end up in
one cluster, a planned shutdown logs no warning, and ``make demo`` ends on its report with
nothing alarming on stderr.

Every test runs its raydelay processes as subprocesses with a Ray of their own: no
``RAY_ADDRESS``, and ``RAY_TMPDIR`` in a fresh directory, so that neither the session's
Ray (tests/conftest.py) nor a ``ray start`` of someone else on this machine is attached to.
Whatever Ray process is left in that directory at the end is stopped."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator

import psutil
import pytest

from raydelay.cluster.owner import current_claim
from raydelay.cluster.placement import ACTOR_CLASSES
from raydelay.storage import LocalDirObjectStore

# raydelay's warnings, as they reach a driver's stderr: the driver's own in the CLI's log
# format ("WARNING raydelay.x: ..."; the scripts below set the same), and any line of a
# raydelay actor, forwarded by Ray behind "(ActorClass pid=N)": the actors print nothing,
# and their loggers reach stderr only at WARNING and above (Python's last-resort handler).
DRIVER_WARNING = re.compile(r"^(WARNING|ERROR|CRITICAL) raydelay\b")
ACTOR_LINE = re.compile(r"\((" + "|".join(ACTOR_CLASSES) + r")\b[^)]*pid=\d+")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
LOGGING = 'import logging; logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")'


@pytest.fixture
def own_ray_env() -> Iterator[dict[str, str]]:
    """The environment of a subprocess that starts (or finds) a Ray of its own: its Ray
    files, and Ray's note of the last ``ray start``, under a fresh short directory (Unix
    socket paths must stay short). Ray processes left there are stopped afterwards."""
    ray_tmp = tempfile.mkdtemp(prefix="rdq-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env["RAY_TMPDIR"] = ray_tmp
    try:
        yield env
    finally:
        _stop_processes_under(ray_tmp)


def _stop_processes_under(directory: str) -> None:
    procs = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(directory in part for part in proc.info["cmdline"] or ()):
                procs.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def _raydelay_warnings(stderr: str) -> list[str]:
    """The lines of ``stderr`` that raydelay logged at WARNING or above, by the driver or
    by one of its actors."""
    lines = [ANSI.sub("", line) for line in stderr.splitlines()]
    return [line for line in lines if DRIVER_WARNING.match(line) or ACTOR_LINE.search(line)]


# --- processes that start at the same moment ---------------------------------------------------

AT_ONCE = LOGGING + textwrap.dedent(
    """
    import json, os, sys, time
    import raydelay  # first, as a user's script would: it sets Ray's token mode
    import ray

    root, barrier, me, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

    def meet(step):
        # every process of the test reaches ``step`` before any goes on
        open(os.path.join(barrier, f"{step}-{me}"), "w").close()
        while len([f for f in os.listdir(barrier) if f.startswith(step + "-")]) < n:
            time.sleep(0.005)

    meet("start")
    cluster = raydelay.connect(config={"storage": {"kind": "local", "local": {"root": root}}})
    cluster.create_topic("t", partitions=2)
    consumer = cluster.subscribe("t", f"sub-{me}")
    producer = cluster.create_producer("t")
    producer.send_many([f"{me}-{i}".encode() for i in range(100)])
    producer.flush()
    got = set()
    deadline = time.monotonic() + 120
    while not {f"{me}-{i}" for i in range(100)} <= got and time.monotonic() < deadline:
        msgs = consumer.receive(max_messages=500, timeout_s=1)
        consumer.ack(msgs)
        got |= {m.payload.decode() for m in msgs}
    address = ray.get_runtime_context().gcs_address
    # the process that started Ray stops it at its shutdown: it goes after the others
    meet("done")
    if not cluster._started_ray:
        cluster.shutdown()
    meet("closed")
    if cluster._started_ray:
        cluster.shutdown()
    print(json.dumps({"address": address, "mine": sum(g.startswith(me + "-") for g in got)}))
    """
)


def test_processes_started_at_once_on_one_store_attach_to_one_owner(tmp_path, own_ray_env):
    # Given a fresh local-dir store and three processes released at the same instant
    root, barrier = tmp_path / "store", tmp_path / "barrier"
    barrier.mkdir()
    n = 3
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", AT_ONCE, str(root), str(barrier), f"p{i}", str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=own_ray_env,
        )
        for i in range(n)
    ]
    try:
        outs = [proc.communicate(timeout=300) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # When each connect()s, sends 100 messages and receives them on its own subscription
    for proc, (_, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err[-3000:]
        assert "StoreOwned" not in err and "Traceback" not in err, err[-3000:]
        assert _raydelay_warnings(err) == [], err[-3000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    # Then every one of them succeeded, on one Ray cluster: the one whose claim the store holds
    assert [r["mine"] for r in results] == [100] * n
    addresses = {r["address"] for r in results}
    assert len(addresses) == 1, results
    claim = current_claim(LocalDirObjectStore(root))
    assert claim is not None and claim.address in addresses
    assert claim.epoch == 1  # one coordinator claimed the store, once

