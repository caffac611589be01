"""How raydelay chooses a node for an actor (Ray's node and actor tables faked)."""

from __future__ import annotations

import socket

import pytest

from raydelay.cluster import placement

HEAD, W1, W2, W3 = "head0", "w1", "w2", "w3"


@pytest.fixture
def cluster(monkeypatch):
    """A head and three workers; ``state`` holds the live nodes and the actors."""
    state = {"alive": {HEAD, W1, W2, W3}, "actors": []}

    def nodes():
        return [
            {
                "NodeID": n,
                "Alive": n in state["alive"],
                "Resources": {"CPU": 2.0} | ({"node:__internal_head__": 1.0} if n == HEAD else {}),
                **state.get("raylets", {}).get(n, {}),
            }
            for n in (HEAD, W1, W2, W3)
        ]

    monkeypatch.setattr(placement.ray, "nodes", nodes)
    monkeypatch.setattr(placement, "actors", lambda: list(state["actors"]))
    monkeypatch.setattr(placement, "_gone", set())
    monkeypatch.setattr(placement, "_probed", {})
    return state


def place(state, name: str, calls: dict[str, int] | None = None) -> str:
    node = placement.choose_node(name, avoid_head=True, calls=calls)
    kind = placement._class_of(name)
    state["actors"].append({"name": name, "class": kind, "node": node})
    return node


def _metadata(topics: dict[str, int]):
    from raydelay.cluster.metadata import Metadata
    from raydelay.storage import MemoryObjectStore

    meta = Metadata(MemoryObjectStore())
    for topic, n in topics.items():
        meta.create_topic(topic, n)
    return meta


def _assign_all(meta, topics: dict[str, int], config=None) -> dict[str, str]:
    """Assign every partition (as ``CoordinatorActor.locate`` does); partition -> node."""
    slots, node_of = placement.host_slots(config or {})
    for topic, n in topics.items():
        for p in range(n):
            meta.assign(topic, p, meta.choose_host(topic, p, slots, node_of))
    return {k: node_of[h] for k, h in meta.assignments().items()}


def test_host_slots_are_one_per_cpu_of_each_worker_and_never_on_the_head(cluster):
    slots, node_of = placement.host_slots({})
    assert sorted(set(node_of.values())) == [W1, W2, W3]
    assert len(slots) == 6  # 2 CPUs each
    assert all(placement.choose_node(s, avoid_head=True) == node_of[s] for s in slots)
    slots, _ = placement.host_slots({"placement": {"hosts_per_node": 3}})
    assert len(slots) == 9


def test_partitions_spread_evenly_over_nodes_then_slots(cluster):
    topics = {"a": 4, "b": 4, "c": 4}
    nodes = _assign_all(_metadata(topics), topics)
    assert HEAD not in nodes.values()
    assert sorted(list(nodes.values()).count(w) for w in (W1, W2, W3)) == [4, 4, 4]
    # and the first three partitions of a topic go to three nodes
    assert len({nodes["a/0"], nodes["a/1"], nodes["a/2"]}) == 3


def test_subscription_actors_spread_over_the_workers_and_no_node_holds_most(cluster):
    # Given every partition's host on W1 (the actors would all go there, near their hosts)
    host = placement.host_actor_name(W1, 0)
    # When 8 subscriptions' actors are placed
    nodes = [place(cluster, f"sub/t{i % 4}/s{i}/0", calls={host: 4}) for i in range(8)]
    # Then they spread 3, 3 and 2 over the workers, never on the head
    assert sorted(nodes.count(w) for w in (W1, W2, W3)) == [2, 3, 3]
    # and the first three go to three nodes, the first to its hosts' node
    assert nodes[0] == W1 and len(set(nodes[:3])) == 3


def test_the_actors_of_one_subscription_go_to_different_nodes(cluster):
    # Given W2 and W3 busier than W1 with other subscriptions' actors
    cluster["actors"] += [
        {"name": f"sub/t/other{i}/0", "class": "SubscriptionActor", "node": n}
        for i, n in enumerate([W2, W3])
    ]
    # When a subscription split into three partition groups places its actors
    nodes = [place(cluster, f"sub/t/s/{g}") for g in range(3)]
    # Then each goes to its own node, though W1 is the least loaded
    assert sorted(nodes) == [W1, W2, W3]
    # and a fourth group shares a node only once every node has one
    assert place(cluster, "sub/t/s/3") in (W1, W2, W3)


def test_among_equally_loaded_nodes_a_subscription_actor_goes_near_its_hosts(cluster):
    slots, node_of = placement.host_slots({})
    a, b = slots[0], slots[3]  # on two different workers
    assert node_of[a] != node_of[b]
    # the host serving 3 of its partitions wins over the one serving 1
    assert place(cluster, "sub/t/s/0", calls={a: 1, b: 3}) == node_of[b]
    # ... but not over a node with fewer subscription actors
    assert place(cluster, "sub/t/u/0", calls={b: 4}) != node_of[b]


def test_after_a_node_is_lost_its_subscription_actors_spread_over_the_survivors(cluster):
    lost = [f"sub/t/s{i}/0" for i in range(3)]
    for name, n in zip([*lost, "sub/t/s3/0"], [W1, W1, W1, W3], strict=True):
        cluster["actors"].append({"name": name, "class": "SubscriptionActor", "node": n})
    cluster["alive"].discard(W1)
    cluster["actors"] = [a for a in cluster["actors"] if a["node"] != W1]
    # When the lost node's three actors are placed again, one after the other
    nodes = [place(cluster, name) for name in lost]
    # Then the first goes to the empty W2, and they end two and two
    assert nodes[0] == W2
    assert sorted(a["node"] for a in cluster["actors"]).count(W2) == 2


def test_the_head_is_used_when_it_is_the_only_node_or_when_allowed(cluster):
    cluster["alive"] = {HEAD}
    slots, node_of = placement.host_slots({})
    assert set(node_of.values()) == {HEAD}
    cluster["alive"] = {HEAD, W1}
    assert placement.choose_node("coordinator", avoid_head=False) in (HEAD, W1)
    slots, node_of = placement.host_slots({"placement": {"avoid_head": False}})
    assert set(node_of.values()) == {HEAD, W1}


def test_after_a_node_is_lost_its_partitions_spread_over_the_survivors(cluster):
    topics = {"a": 6}
    meta = _metadata(topics)
    nodes = _assign_all(meta, topics)
    lost = [k for k, n in nodes.items() if n == W1]
    cluster["alive"].discard(W1)
    slots, node_of = placement.host_slots({})
    again = []
    for key in lost:
        topic, p = key.rsplit("/", 1)
        host = meta.choose_host(topic, int(p), slots, node_of)
        meta.assign(topic, int(p), host)
        again.append(node_of[host])
    assert set(again) == {W2, W3}  # one each, not both on one survivor
    # a host's name says its node: one of the lost node has none to go to
    assert placement.choose_node(placement.host_actor_name(W1, 0), avoid_head=True) is None


def test_no_node_at_all_leaves_the_choice_to_ray(cluster):
    cluster["alive"] = set()
    assert placement.choose_node("sub/t/a/0", avoid_head=True) is None
    assert placement.host_slots({}) == ([], {})


def test_an_actor_pinned_to_a_lost_node_is_stranded_and_its_host_not_live(cluster):
    host = placement.host_actor_name(W1, 0)
    cluster["actors"] += [
        {"name": host, "class": "HostActor", "node": W1},
        {"name": "sub/t/a/0", "class": "SubscriptionActor", "node": W1},
        {"name": "sub/t/b/0", "class": "SubscriptionActor", "node": W2},
    ]
    assert placement.live_hosts() == {host: W1}
    assert not placement.stranded("sub/t/a/0") and not placement.stranded(host)
    # When W1 is lost (Ray still lists its actors while it tries to restart them there)
    cluster["alive"].discard(W1)
    assert placement.live_hosts() == {}  # its partitions are assigned elsewhere at once
    assert placement.stranded(host) and placement.stranded("sub/t/a/0")
    assert not placement.stranded("sub/t/b/0") and not placement.stranded("sub/t/none/0")


def _listening() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def test_a_port_nothing_listens_on_refuses_and_a_listening_one_does_not():
    server = _listening()
    port = server.getsockname()[1]
    assert not placement.refuses("127.0.0.1", port)
    server.close()
    assert placement.refuses("127.0.0.1", port)


def test_a_node_whose_raylet_refuses_is_gone_before_ray_says_so(cluster, monkeypatch):
    # Given W1's raylet listening, W2's gone (Ray still says both are alive), and a
    # subscription actor on each
    w1, w2 = _listening(), _listening()
    cluster["raylets"] = {
        n: {"NodeManagerAddress": "127.0.0.1", "NodeManagerPort": s.getsockname()[1]}
        for n, s in ((W1, w1), (W2, w2))
    }
    w2.close()
    cluster["actors"] += [
        {"name": "sub/t/a/0", "class": "SubscriptionActor", "node": W1},
        {"name": "sub/t/b/0", "class": "SubscriptionActor", "node": W2},
    ]
    probes = []
    real = placement.refuses
    monkeypatch.setattr(placement, "refuses", lambda a, p: probes.append(p) or real(a, p))
    try:
        # Then the actor on W1 is not stranded, and W1 is probed once a PROBE_EVERY_S
        assert not placement.stranded("sub/t/a/0") and not placement.stranded("sub/t/a/0")
        assert len(probes) == 1
        # while the one on W2 is: W2 is gone, for every placement from now on
        assert placement.stranded("sub/t/b/0")
        assert W2 not in placement.nodes()[0] and W2 not in placement.candidate_nodes(True)
        assert placement.stranded(placement.host_actor_name(W2, 0))
        assert all(place(cluster, f"sub/t/n{i}/0") != W2 for i in range(6))
        slots, node_of = placement.host_slots({})
        assert W2 not in node_of.values()
    finally:
        w1.close()
