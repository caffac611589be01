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
import textwrap
import uuid
from pathlib import Path

import pytest

from raydelay.cluster.owner import current_claim
from raydelay.cluster.placement import ACTOR_CLASSES
from raydelay.config import config_from_dict
from raydelay.demo import DemoReport
from raydelay.storage import LocalDirObjectStore, make_s3_client, make_store

# raydelay's warnings, as they reach a driver's stderr: the driver's own in the CLI's log
# format ("WARNING raydelay.x: ..."; the scripts below set the same), and any line of a
# raydelay actor, forwarded by Ray behind "(ActorClass pid=N)": the actors print nothing,
# and their loggers reach stderr only at WARNING and above (Python's last-resort handler).
DRIVER_WARNING = re.compile(r"^(WARNING|ERROR|CRITICAL) raydelay\b")
ACTOR_LINE = re.compile(r"\((" + "|".join(ACTOR_CLASSES) + r")\b[^)]*pid=\d+")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
LOGGING = 'import logging; logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")'


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

    storage, barrier, me, n = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])

    def meet(step):
        # every process of the test reaches ``step`` before any goes on
        open(os.path.join(barrier, f"{step}-{me}"), "w").close()
        while len([f for f in os.listdir(barrier) if f.startswith(step + "-")]) < n:
            time.sleep(0.005)

    meet("start")
    cluster = raydelay.connect(config={"storage": storage})
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
    # the process that started Ray stops it at its shutdown: it goes after the others, which
    # leave that Ray at theirs (else its stop could end them before they exit)
    meet("done")
    if not cluster._started_ray:
        cluster.shutdown()
    meet("closed")
    started = cluster._started_ray
    if started:
        cluster.shutdown()
    mine = sum(g.startswith(me + "-") for g in got)
    left = not ray.is_initialized()
    print(json.dumps({"address": address, "mine": mine, "started": started, "left": left}))
    """
)


def _start_at_once(storage: dict, n: int, env: dict, barrier: Path) -> list[tuple[str, str]]:
    """Run AT_ONCE in ``n`` processes released at the same instant; their (stdout, stderr)
    once each has exited 0 having received its own messages."""
    barrier.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", AT_ONCE, json.dumps(storage), str(barrier), f"p{i}", str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
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
    for proc, (out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err[-3000:]
        last = json.loads(out.strip().splitlines()[-1])
        assert last["mine"] == 100, err[-3000:]
        assert last["left"], "a client's shutdown left its process attached to Ray"
    return outs


def test_processes_started_at_once_on_one_store_attach_to_one_owner(tmp_path, own_ray_env):
    # Given a fresh local-dir store and three processes released at the same instant
    root = tmp_path / "store"
    storage = {"kind": "local", "local": {"root": str(root)}}
    # When each connect()s, sends 100 messages and receives them on its own subscription
    outs = _start_at_once(storage, 3, own_ray_env, tmp_path / "barrier")
    # Then every one of them succeeded quietly, on one Ray cluster: the one whose claim the
    # store holds, made once
    for _, err in outs:
        assert "StoreOwned" not in err and "Traceback" not in err, err[-3000:]
        assert _raydelay_warnings(err) == [], err[-3000:]
    lasts = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert len({last["address"] for last in lasts}) == 1, lasts
    assert sum(last["started"] for last in lasts) == 1, lasts
    addresses = {last["address"] for last in lasts}
    claim = current_claim(LocalDirObjectStore(root))
    assert claim is not None and claim.address in addresses
    assert claim.epoch == 1


@pytest.mark.s3
def test_processes_started_at_once_on_one_s3_store_attach_to_one_owner(
    tmp_path, own_ray_env, moto_server
):
    # Given a fresh bucket (no start turn on S3: each process starts a Ray, and the one
    # whose coordinator loses the claim's put_new stops its Ray and attaches to the owner)
    bucket = f"rd-{uuid.uuid4().hex[:16]}"
    make_s3_client(endpoint_url=moto_server, region="us-east-1").create_bucket(Bucket=bucket)
    storage = {
        "kind": "s3",
        "s3": {"bucket": bucket, "endpoint_url": moto_server, "region": "us-east-1"},
    }
    # (moto's fake credentials, which its fixture put in this process's environment)
    env = {**own_ray_env, **{k: v for k, v in os.environ.items() if k.startswith("AWS_")}}
    # When two processes released at once connect, send and receive
    outs = _start_at_once(storage, 2, env, tmp_path / "barrier")
    # Then both succeeded on one Ray cluster, the store's owner
    addresses = {json.loads(out.strip().splitlines()[-1])["address"] for out, _ in outs}
    assert len(addresses) == 1, [err[-2000:] for _, err in outs]
    claim = current_claim(make_store(config_from_dict({"storage": storage})))
    assert claim is not None and claim.address in addresses


# --- a planned shutdown ------------------------------------------------------------------------

FAN_OUT = LOGGING + textwrap.dedent(
    """
    import sys, time
    import raydelay

    cluster = raydelay.connect(config={"storage": {"kind": "local", "local": {"root": sys.argv[1]}}})
    cluster.create_topic("fan", partitions=2)
    consumers = [cluster.subscribe("fan", s) for s in ("email", "push", "analytics")]
    producer = cluster.create_producer("fan")
    producer.send_many([b"now-%d" % i for i in range(2000)])
    producer.send_many([b"soon-%d" % i for i in range(2000)], deliver_after=1.0)
    producer.send_many([b"later-%d" % i for i in range(2000)], deliver_after=600.0)
    producer.flush()
    counts = []
    for consumer in consumers:
        got = set()
        deadline = time.monotonic() + 120
        while len(got) < 4000 and time.monotonic() < deadline:
            msgs = consumer.receive(max_messages=1000, timeout_s=1)
            consumer.ack(msgs)
            got |= {m.payload for m in msgs}
        counts.append(len(got))
    # a topic deleted first leaves its subscription's long polls standing at the hosts
    cluster.create_topic("gone", partitions=2)
    cluster.subscribe("gone", "s").receive(max_messages=1, timeout_s=0.5)
    cluster.delete_topic("gone", force=True)
    cluster.shutdown()  # with messages still delayed, and every subscription reading the log
    print(counts, flush=True)
    """
)


def test_a_planned_shutdown_of_a_fan_out_logs_no_warning(tmp_path, own_ray_env):
    # Given a process that starts Ray, fans a topic of 2 partitions out to 3 subscriptions
    # and leaves messages delayed, and a deleted topic behind
    result = subprocess.run(
        [sys.executable, "-c", FAN_OUT, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=300,
        env=own_ray_env,
    )
    # When it shuts down, then it has received everything due, and stderr holds no
    # traceback and no raydelay warning (the actors' reach it through Ray's forwarding)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[4000, 4000, 4000]", result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert _raydelay_warnings(result.stderr) == [], result.stderr[-3000:]


def test_the_warning_check_sees_the_driver_and_the_actors():
    # Given stderr as a driver sees it: its own log lines, and Ray's forwarded actor lines
    stderr = "\n".join(
        [
            "2026-11-25 23:19:28,544\tINFO worker.py:2038 -- Started a local Ray instance.",
            "WARNING raydelay.cluster.handles: still stopping after 10 s: host/a/0",
            "INFO raydelay.client.connection: the store is owned by ...",
            "\x1b[36m(SubscriptionHost pid=31404)\x1b[0m t/0/s: reading the log failed (x)",
            "\x1b[36m(RayDPSparkMaster pid=6903)\x1b[0m [I gcs_client.cc:96] GcsClient ...",
            "26/11/25 23:19:24 WARN Utils: Your hostname, vm resolves to a loopback address",
        ]
    )
    # Then exactly raydelay's warning and its actor's line are picked out
    assert _raydelay_warnings(stderr) == [
        "WARNING raydelay.cluster.handles: still stopping after 10 s: host/a/0",
        "(SubscriptionHost pid=31404) t/0/s: reading the log failed (x)",
    ]


# --- make demo ---------------------------------------------------------------------------------


@pytest.mark.timeout(900)
def test_make_demo_ends_on_its_report_with_nothing_alarming_on_stderr(tmp_path, own_ray_env):
    # Given the command `make demo` runs, in a fresh directory (its default store is
    # ./.raydelay/data there), with stdout and stderr in one stream as a terminal shows them
    raydelay = Path(sys.executable).parent / "raydelay"
    env = {**own_ray_env, "PYTHONUNBUFFERED": "1"}  # (lines in the order they were written)
    result = subprocess.run(
        [str(raydelay), "demo"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=840,
        env=env,
    )
    output = result.stdout
    # Then it succeeds, on the store in that directory,
    assert result.returncode == 0, output[-5000:]
    assert f"store: {tmp_path.resolve()}/.raydelay/data" in output
    # nothing it printed is a traceback or a warning of raydelay's,
    assert "Traceback" not in output, output[-5000:]
    assert _raydelay_warnings(output) == [], output[-5000:]
    # and the last lines are its report, in full: the rows of DemoReport.table, in order
    lines = [ANSI.sub("", line).rstrip() for line in output.splitlines() if line.strip()]
    expected = [_label(line) for line in DemoReport(messages=1).table().splitlines()]
    assert [_label(line) for line in lines[-len(expected) :]] == expected, output[-3000:]


def _label(row: str) -> str:
    """A report row's first column (columns are two or more spaces apart)."""
    return re.split(r"\s{2,}", row.strip())[0]
