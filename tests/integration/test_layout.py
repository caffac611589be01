"""Processes follow load, not layout: partitions of many topics live in a few hosts, and
subscriptions' units in a few subscription hosts. Each test checks what a user sees when
one of those shared processes dies under load: nothing lost, nothing early, no cancel
broken; and that the layout costs processes by the host, never by the topic, the
partition or the subscription."""

from __future__ import annotations

import textwrap
import threading
import time
from collections.abc import Callable

import ray

from raydelay.cluster import placement
from raydelay.cluster.names import NAMESPACE
from raydelay.errors import NotFound
from tests.chaos.workload import run_workload
from tests.integration.helpers import host_of, run_child, unit_assignments, unit_host_of


def _check(ledger) -> None:
    for name, r in ledger.check().items():
        assert (r["lost"], r["early"], r["cancelled_delivered"]) == (0, 0, 0), (name, r)
        assert r["unmarked_duplicates"] == 0, (name, r)


def _kill_once(name: str | Callable[[], str], after_s: float, kills: list[str]):
    """A chaos function for ``run_workload``: SIGKILL actor ``name`` (or the one
    ``name()`` names then) once; Ray restarts it."""

    def chaos(produced: threading.Event) -> None:
        time.sleep(after_s)
        target = name if isinstance(name, str) else name()
        ray.kill(ray.get_actor(target, namespace=NAMESPACE), no_restart=False)
        kills.append(target)

    return chaos


def test_a_host_with_partitions_of_several_topics_killed_under_load_loses_nothing(
    cluster, topic_name
):
    # Given two topics whose partitions share a host
    topics = [f"{topic_name}-a", f"{topic_name}-b"]
    for t in topics:
        cluster.create_topic(t, partitions=2)
    hosts = [{host_of(t, p) for p in range(2)} for t in topics]
    shared = sorted(hosts[0] & hosts[1])
    assert shared, hosts
    # When that host is killed while both topics are produced to and consumed
    kills: list[str] = []
    ledgers = {}

    def load(topic: str, chaos) -> None:
        ledgers[topic] = run_workload(
            cluster, topic, ["s1", "s2"], messages=4_000, seconds=6, seed=5, chaos=chaos
        )

    other = threading.Thread(target=load, args=(topics[1], None))
    other.start()
    load(topics[0], _kill_once(shared[0], 2.0, kills))
    other.join()
    # Then both topics lost nothing and delivered nothing early
    assert kills == [shared[0]]
    for topic in topics:
        _check(ledgers[topic])
    # and the host came back holding the same partitions
    assert {host_of(t, p) for t in topics for p in range(2)} == hosts[0] | hosts[1]


def test_a_subscription_host_serving_8_partitions_killed_under_load_loses_nothing(
    cluster, topic_name
):
    cluster.create_topic(topic_name, partitions=8)
    # (one unit serves the 8 partitions of each subscription; the host of s1's is killed)
    kills: list[str] = []
    ledger = run_workload(
        cluster,
        topic_name,
        ["s1", "s2"],
        messages=6_000,
        seconds=6,
        seed=11,
        chaos=_kill_once(lambda: unit_host_of(topic_name, "s1"), 2.5, kills),
    )
    assert len(kills) == 1
    _check(ledger)
    served = {r["name"]: r["serves"] for r in cluster.placement()}
    # and s1's unit came back whole in one host (which may also serve s2's unit: a moved
    # unit prefers a host that is already running)
    mine = [x for x in served[unit_host_of(topic_name, "s1")] if x.startswith(f"{topic_name}/s1/")]
    assert sorted(mine) == sorted(f"{topic_name}/s1/{p}" for p in range(8))


def test_partitions_per_actor_splits_a_subscription_into_units(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=5)
    consumer = cluster.subscribe(topic_name, "s", partitions_per_actor=2)
    ids = cluster.create_producer(topic_name).send_many([b"%d" % i for i in range(50)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 50 and time.monotonic() < deadline:
        msgs = consumer.receive(max_messages=50, timeout_s=1)
        consumer.ack(msgs)
        got += msgs
    assert sorted(m.message_id for m in got) == sorted(ids)
    units = {k: h for k, h in unit_assignments().items() if k.startswith(f"{topic_name}/")}
    assert sorted(units) == [f"{topic_name}/s/{g}" for g in range(3)]
    served = {r["name"]: r["serves"] for r in cluster.placement()}
    # each unit's partitions, on the host it is assigned to; the host holds no others of s
    mine = {
        h: sorted(x for x in served[h] if x.startswith(f"{topic_name}/"))
        for h in set(units.values())
    }
    groups = [["0", "1"], ["2", "3"], ["4"]]
    for g, parts in enumerate(groups):
        assert all(f"{topic_name}/s/{p}" in mine[units[f"{topic_name}/s/{g}"]] for p in parts)
    assert sorted(x for v in mine.values() for x in v) == [f"{topic_name}/s/{p}" for p in range(5)]


SHUTDOWN = textwrap.dedent(
    """
    import json, sys, time, psutil
    import raydelay

    TOPICS, PARTITIONS, SUBS = 4, 16, 4
    cluster = raydelay.connect(config={"storage": {"kind": "local", "local": {"root": sys.argv[1]}}})
    for t in range(TOPICS):
        cluster.create_topic(f"t{t}", PARTITIONS)
        for s in range(SUBS):
            cluster.subscribe(f"t{t}", f"s{s}").close()
    producer = cluster.create_producer("t0")
    producer.send_many([b"x"] * 100, deliver_after=3600)
    rows = cluster.placement()
    mine = {r["pid"] for r in rows}
    kinds = {}
    for r in rows:
        kinds[r["class"]] = kinds.get(r["class"], 0) + 1
    sub_partitions = sum(r["partitions"] for r in rows if r["class"] == "SubscriptionHost")
    cluster.shutdown()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        left = [p for p in mine if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
        if not left:
            break
        time.sleep(0.2)
    print("RESULT " + json.dumps({"kinds": kinds, "sub_partitions": sub_partitions, "left": left}))
    """
)


def test_a_warm_subscription_host_that_ended_for_good_is_started_again(cluster, topic_name):
    # Given the warm subscription host of the node (slot 0, kept running even when idle)
    cluster.create_topic(topic_name, partitions=1)
    cluster.subscribe(topic_name, "s")
    warm = [n for n in placement.live_hosts("SubscriptionHost") if n.endswith("/0")]
    assert len(warm) == 1, warm
    # When it ends for good (Ray will not restart it)
    ray.kill(ray.get_actor(warm[0], namespace=NAMESPACE), no_restart=True)
    # Then the lookups of units start it again (they look at the warm slots every few
    # seconds), and the subscription's unit is served by a running host
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        host = unit_host_of(topic_name, "s")
        if warm[0] in placement.live_hosts("SubscriptionHost"):
            break
        time.sleep(0.2)
    assert warm[0] in placement.live_hosts("SubscriptionHost")
    assert unit_host_of(topic_name, "s") in placement.live_hosts("SubscriptionHost")
    assert host in placement.live_hosts("SubscriptionHost")


def test_shutdown_leaves_no_process_behind_with_hundreds_of_subscription_partitions(tmp_path):
    out = run_child(SHUTDOWN, tmp_path, str(tmp_path / "store"))
    # 4 topics x 16 partitions x 4 subscriptions: 256 subscription-partitions in 16 units,
    # in a few subscription hosts (one per CPU, at most 4), and the hosts of the 64
    # partitions (a few per node)
    assert out["sub_partitions"] == 256
    assert 1 <= out["kinds"]["SubscriptionHost"] <= 4
    assert 1 <= out["kinds"]["HostActor"] <= 4
    # and after shutdown() none of those processes runs
    assert out["left"] == [], out


def test_a_committed_object_reaches_every_reader_by_one_reference(cluster, topic_name):
    from raydelay.actors.host import HostActor
    from tests.integration.helpers import topic_partition

    cluster.create_topic(topic_name)
    cluster.create_producer(topic_name).send_many([b"p" * 200] * 2_000)  # one 400 kB object
    part = topic_partition(topic_name, 0)
    first, second = (ray.get(part.submit(HostActor.read, (0, 0), 10_000)) for _ in range(2))
    # Then a big object is a reference into Ray's object store, the same one for both
    # reads (put once), and it decodes in place to the messages sent
    [ref] = [o for o in first.objects if isinstance(o, ray.ObjectRef)]
    [again] = [o for o in second.objects if isinstance(o, ray.ObjectRef)]
    assert ref.hex() == again.hex()
    from raydelay.log.entries import decode_object

    obj = decode_object(ray.get(ref))
    assert obj.count == 2_000 and obj.entries.batch.column(0)[0].as_py() == b"p" * 200
    # and the subscriptions deliver from it
    consumer = cluster.subscribe(topic_name, "s")
    got = 0
    deadline = time.monotonic() + 30
    while got < 2_000 and time.monotonic() < deadline:
        batch = consumer.receive_batch(max_messages=2_000, timeout_s=1)
        consumer.ack(batch)
        got += len(batch)
    assert got == 2_000


def test_placement_skips_a_subscription_deleted_while_it_is_read(cluster, topic_name, monkeypatch):
    # Given two subscriptions, one of them deleted between the reads of the placement
    # (its unit still in the assignments read first)
    cluster.create_topic(topic_name, partitions=2)
    for name in ("kept", "gone"):
        cluster.subscribe(topic_name, name)
        unit_host_of(topic_name, name)
    peers = cluster._topics.peers
    per_actor = peers.per_actor

    def deleted_meanwhile(topic: str, subscription: str) -> int:
        if (topic, subscription) == (topic_name, "gone"):
            raise NotFound(f"subscription {topic}/{subscription} does not exist")
        return per_actor(topic, subscription)

    monkeypatch.setattr(peers, "per_actor", deleted_meanwhile)
    # Then the placement answers, with the kept one's partitions and none of the other's
    units = (f"{topic_name}/kept/", f"{topic_name}/gone/")
    served = [x for r in cluster.placement() for x in r["serves"] if x.startswith(units)]
    assert sorted(served) == [f"{topic_name}/kept/0", f"{topic_name}/kept/1"]


def test_a_running_host_adopts_what_it_is_handed_without_a_call_for_it(cluster, topic_name):
    # (what the coordinator does with a lost node's partitions and units: CoordinatorActor
    # ._evacuate hands each to a running host, which opens it before its callers come back)
    from raydelay.actors.coordinator import CoordinatorActor
    from raydelay.actors.handles import coordinator_handle
    from raydelay.actors.host import HostActor, adopt_on_host
    from raydelay.actors.subscription.host import SubscriptionHost
    from raydelay.cluster.handles import Peer
    from raydelay.cluster.names import Unit
    from tests.integration.helpers import wait_until

    # Given a topic whose partition's host ended for good, and other hosts running
    cluster.create_topic(topic_name + "-a")
    consumer = cluster.subscribe(topic_name + "-a", "s")
    subhost = unit_host_of(topic_name + "-a", "s")
    cluster.create_topic(topic_name)
    coordinator = coordinator_handle()
    gone = ray.get(coordinator.submit(CoordinatorActor.assignments))[topic_name + "/0"]
    ray.kill(ray.get_actor(gone, namespace=NAMESPACE), no_restart=True)
    wait_until("the host to end", lambda: gone not in placement.live_hosts())
    host = sorted(placement.live_hosts())[0]
    # When a running host is handed the partition
    adopt_on_host(host, [(topic_name, 0)])
    peer = Peer.of_running(host)
    assert peer is not None
    # Then it opens it at once, claimed from the coordinator as on a first call
    wait_until(
        "the host to open the partition",
        lambda: (topic_name, 0) in [tuple(k) for k in ray.get(peer.submit(HostActor.partitions))],
    )
    assert ray.get(coordinator.submit(CoordinatorActor.assignments))[topic_name + "/0"] == host
    # (a unit is released first: a subscription's units are assigned when it is created)
    sub = cluster.subscribe(topic_name, "t")
    unit = Unit(topic_name, "t", 0)
    serving = unit_host_of(topic_name, "t")
    sub_peer = Peer.of_running(serving)
    assert sub_peer is not None
    sub.close()
    ray.get(sub_peer.submit(SubscriptionHost.drop, [tuple(unit)]))
    ray.get(coordinator.submit(CoordinatorActor.release_units, [unit.key]))
    adopt_on_host(subhost, [tuple(unit)])
    sub_peer = Peer.of_running(subhost)
    assert sub_peer is not None
    wait_until(
        "the subscription host to open the unit",
        lambda: unit.key in ray.get(sub_peer.submit(SubscriptionHost.units)),
    )
    assert unit_assignments()[unit.key] == subhost
    consumer.close()
