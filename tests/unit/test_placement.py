"""How raydelay chooses a node for an actor (Ray's node and actor tables faked)."""

from __future__ import annotations

import socket

import pytest

from raydelay.cluster import placement
from raydelay.cluster.names import Unit

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
            meta.hosts.assign(topic, p, meta.hosts.choose_host(topic, p, slots, node_of))
    return {k: node_of[h] for k, h in meta.hosts.assignments().items()}


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


def _place_unit(meta, unit: Unit, running=(), served=None, moving=False) -> str:
    """Assign a unit (as ``CoordinatorActor.locate_unit`` does); its node."""
    if unit.subscription not in meta.subscriptions(unit.topic):
        meta.create_subscription(unit.topic, unit.subscription, {"type": "shared"})
    slots, node_of = placement.host_slots({}, subscriptions=True)
    host = meta.hosts.choose_subhost(unit, slots, node_of, set(running), served or {}, moving)
    meta.hosts.assign_unit(unit, host)
    return node_of[host]


def test_subscription_host_slots_are_one_per_cpu_of_each_worker_and_named_apart(cluster):
    slots, node_of = placement.host_slots({}, subscriptions=True)
    assert len(slots) == 6 and all(s.startswith("subhost/") for s in slots)
    assert sorted(set(node_of.values())) == [W1, W2, W3]
    assert all(placement.choose_node(s, avoid_head=True) == node_of[s] for s in slots)
    assert placement.warm_slots({}, slots) == [s for s in slots if s.endswith("/0")]
    assert placement.warm_slots({"placement": {"warm_subscription_hosts": 0}}, slots) == []
    slots, _ = placement.host_slots(
        {"placement": {"subscription_hosts_per_node": 1}}, subscriptions=True
    )
    assert len(slots) == 3


def test_units_spread_over_the_workers_and_no_node_holds_most(cluster):
    topics = {f"t{i}": 4 for i in range(4)}
    meta = _metadata(topics)
    # Given every partition's host on W1 (the units would all go there, near their hosts)
    served = {W1: 4}
    # When 8 subscriptions' units are placed
    nodes = [_place_unit(meta, Unit(f"t{i % 4}", f"s{i}", 0), served=served) for i in range(8)]
    # Then they spread 3, 3 and 2 over the workers, never on the head
    assert sorted(nodes.count(w) for w in (W1, W2, W3)) == [2, 3, 3]
    # and the first three go to three nodes, the first to its hosts' node
    assert nodes[0] == W1 and len(set(nodes[:3])) == 3


def test_the_units_of_one_subscription_go_to_different_nodes(cluster):
    meta = _metadata({"t": 4})
    # Given five other subscriptions' units: two nodes hold two, one holds one
    others = [_place_unit(meta, Unit("t", f"other{i}", 0)) for i in range(5)]
    assert sorted(others.count(w) for w in (W1, W2, W3)) == [1, 2, 2]
    # When a subscription split into three partition groups places its units
    nodes = [_place_unit(meta, Unit("t", "s", g)) for g in range(3)]
    # Then each goes to its own node, though one node is less loaded than the others
    assert sorted(nodes) == [W1, W2, W3]
    # and a fourth group shares a node only once every node has one
    assert _place_unit(meta, Unit("t", "s", 3)) in (W1, W2, W3)


def test_among_equal_nodes_a_unit_goes_to_a_running_slot_then_near_its_hosts(cluster):
    meta = _metadata({"t": 4})
    slots, node_of = placement.host_slots({}, subscriptions=True)
    # a slot already running wins over a node serving its partitions
    running = [s for s in slots if node_of[s] == W3][:1]
    assert _place_unit(meta, Unit("t", "a", 0), running, served={W2: 4}) == W3
    # among nodes of equal load, the one whose hosts serve most of its partitions
    meta2 = _metadata({"t": 4})
    assert _place_unit(meta2, Unit("t", "s", 0), served={W1: 1, W2: 3}) == W2
    # ... but not over a node with fewer units
    assert _place_unit(meta2, Unit("t", "u", 0), served={W2: 4}) != W2


def test_after_a_node_is_lost_its_units_go_to_running_hosts_of_the_survivors(cluster):
    meta = _metadata({"t": 4})
    nodes = {f"s{i}": _place_unit(meta, Unit("t", f"s{i}", 0)) for i in range(6)}
    lost = sorted(s for s, n in nodes.items() if n == W1)
    assert len(lost) == 2
    cluster["alive"].discard(W1)
    slots, node_of = placement.host_slots({}, subscriptions=True)
    # the warm slot of each survivor runs, and the hosts of the units placed so far
    running = set(placement.warm_slots({}, slots)) | {
        h for h in meta.hosts.unit_assignments().values() if h in node_of
    }
    # When the lost node's units are placed again, one after the other
    again = [_place_unit(meta, Unit("t", s, 0), running, moving=True) for s in lost]
    # Then they go one to each survivor, each to a host already running
    assert sorted(again) == [W2, W3]
    assert all(meta.hosts.unit_host(Unit("t", s, 0)) in running for s in lost)


def test_a_moved_unit_takes_a_running_host_where_a_new_one_takes_an_empty_slot(cluster):
    cluster["alive"] = {HEAD}  # one node, two slots: the warm one serves a unit
    meta = _metadata({"t": 4})
    slots, _ = placement.host_slots({}, subscriptions=True)
    warm, empty = slots
    meta.create_subscription("t", "a", {"type": "shared"})
    meta.hosts.assign_unit(Unit("t", "a", 0), warm)
    _place_unit(meta, Unit("t", "moved", 0), {warm}, moving=True)
    _place_unit(meta, Unit("t", "new", 0), {warm})
    assert meta.hosts.unit_host(Unit("t", "moved", 0)) == warm  # (nothing starts on the way back)
    assert meta.hosts.unit_host(Unit("t", "new", 0)) == empty  # (spread over the node's slots)


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
        host = meta.hosts.choose_host(topic, int(p), slots, node_of)
        meta.hosts.assign(topic, int(p), host)
        again.append(node_of[host])
    assert set(again) == {W2, W3}  # one each, not both on one survivor
    # a host's name says its node: one of the lost node has none to go to
    assert placement.choose_node(placement.host_actor_name(W1, 0), avoid_head=True) is None


def test_a_lost_hosts_partition_goes_to_a_running_host_of_the_survivors(cluster):
    topics, config = {"a": 6}, {"placement": {"hosts_per_node": 3}}
    meta = _metadata(topics)
    nodes = _assign_all(meta, topics, config)
    lost = [k for k, n in nodes.items() if n == W1]
    cluster["alive"].discard(W1)
    slots, node_of = placement.host_slots(config)
    # the hosts serving the survivors' partitions run; each node has an empty slot too
    running = {h for h in meta.hosts.assignments().values() if h in node_of}
    assert set(slots) - running
    for key in lost:
        topic, p = key.rsplit("/", 1)
        meta.hosts.assign(
            topic, int(p), meta.hosts.choose_host(topic, int(p), slots, node_of, running)
        )
    moved = [meta.hosts.host_of("a", int(k.rsplit("/", 1)[1])) for k in lost]
    assert all(h in running for h in moved)  # (nothing starts on the way back)
    assert {node_of[h] for h in moved} == {W2, W3}  # and they spread over the survivors


def test_no_node_at_all_leaves_the_choice_to_ray(cluster):
    cluster["alive"] = set()
    assert placement.choose_node("coordinator", avoid_head=True) is None
    assert placement.host_slots({}) == ([], {})


def test_an_actor_pinned_to_a_lost_node_is_stranded_and_its_host_not_live(cluster):
    host = placement.host_actor_name(W1, 0)
    a, b = placement.subhost_actor_name(W1, 0), placement.subhost_actor_name(W2, 0)
    cluster["actors"] += [
        {"name": host, "class": "HostActor", "node": W1},
        {"name": a, "class": "SubscriptionHost", "node": W1},
        {"name": b, "class": "SubscriptionHost", "node": W2},
        {"name": "coordinator", "class": "CoordinatorActor", "node": W1},
    ]
    assert placement.live_hosts() == {host: W1}
    assert placement.live_hosts("SubscriptionHost") == {a: W1, b: W2}
    assert not placement.stranded(a) and not placement.stranded(host)
    # When W1 is lost (Ray still lists its actors while it tries to restart them there)
    cluster["alive"].discard(W1)
    assert placement.live_hosts() == {}  # its partitions are assigned elsewhere at once
    assert placement.live_hosts("SubscriptionHost") == {b: W2}  # and its units
    assert placement.stranded(host) and placement.stranded(a) and placement.stranded("coordinator")
    assert not placement.stranded(b) and not placement.stranded("runner/0")


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
    a, b = placement.subhost_actor_name(W1, 0), placement.subhost_actor_name(W2, 0)
    cluster["actors"] += [
        {"name": a, "class": "SubscriptionHost", "node": W1},
        {"name": b, "class": "SubscriptionHost", "node": W2},
    ]
    probes = []
    real = placement.refuses
    monkeypatch.setattr(placement, "refuses", lambda a, p: probes.append(p) or real(a, p))
    try:
        # Then the actor on W1 is not stranded, and W1 is probed once a PROBE_EVERY_S
        assert not placement.stranded(a) and not placement.stranded(a)
        assert len(probes) == 1
        # while the one on W2 is: W2 is gone, for every placement from now on
        assert placement.stranded(b)
        assert W2 not in placement.nodes()[0] and W2 not in placement.candidate_nodes(True)
        assert placement.stranded(placement.host_actor_name(W2, 0))
        assert placement.choose_node("coordinator", avoid_head=True) != W2
        for subscriptions in (False, True):
            slots, node_of = placement.host_slots({}, subscriptions=subscriptions)
            assert W2 not in node_of.values()
    finally:
        w1.close()


def test_the_units_of_a_split_subscription_go_to_different_processes_of_a_node(cluster):
    cluster["alive"] = {HEAD}  # one node, two slots; the second already serves 3 units
    meta = _metadata({"t": 4})
    slots, _ = placement.host_slots({}, subscriptions=True)
    for i in range(3):
        meta.create_subscription("t", f"other{i}", {"type": "shared"})
        meta.hosts.assign_unit(Unit("t", f"other{i}", 0), slots[1])
    # When a subscription split into two units places them
    for g in (0, 1):
        _place_unit(meta, Unit("t", "split", g), set(slots))
    # Then each has a process of its own, though one process serves more units
    assert {meta.hosts.unit_host(Unit("t", "split", g)) for g in (0, 1)} == set(slots)


def _coordinator(meta, started: list, adopted: dict):
    """A CoordinatorActor over ``meta`` without Ray or a store (its lookups are what is
    tested): the hosts it starts go to ``started``, what it hands over to ``adopted``."""
    from raydelay.actors.coordinator import KEEP_WARM_EVERY_S, CoordinatorActor, _CallTimes
    from raydelay.config import config_from_dict

    coord = CoordinatorActor.__new__(CoordinatorActor)
    coord._times, coord._meta, coord._config = _CallTimes(), meta, config_from_dict({})
    coord._warm_at = -KEEP_WARM_EVERY_S
    coord._start_host = lambda name, config: started.append(name)
    coord._adopt = lambda host, keys: adopted.setdefault(host, []).extend(keys)
    return coord


def _running(cluster, meta) -> None:
    """Every assigned host, and the first subscription host slot of every node, runs."""
    hosts = set(meta.hosts.assignments().values())
    subhosts = set(meta.hosts.unit_assignments().values())
    subhosts |= {placement.subhost_actor_name(n, 0) for n in (W1, W2, W3)}
    cluster["actors"] += [
        {"name": h, "class": "HostActor", "node": placement.host_node_prefix(h)} for h in hosts
    ] + [{"name": h, "class": "SubscriptionHost", "node": h.split("/")[1]} for h in subhosts]


def _with_units(topics: dict[str, int], subscriptions: list[str]):
    meta = _metadata(topics)
    nodes = _assign_all(meta, topics)
    slots, node_of = placement.host_slots({}, subscriptions=True)
    for topic in topics:
        for s in subscriptions:
            meta.create_subscription(topic, s, {"type": "shared"})
            unit = Unit(topic, s, 0)
            meta.hosts.assign_unit(unit, meta.hosts.choose_subhost(unit, slots, node_of, set(), {}))
    return meta, nodes


def test_one_lookup_after_a_node_loss_moves_all_its_work_and_has_it_adopted(cluster):
    # Given 6 partitions and 4 subscriptions' units spread over three workers, all running
    topics = {"a": 6}
    meta, nodes = _with_units(topics, ["s0", "s1", "s2", "s3"])
    _running(cluster, meta)
    lost_parts = sorted(k for k, n in nodes.items() if n == W1)
    lost_units = sorted(k for k, h in meta.hosts.unit_assignments().items() if W1 in h)
    assert lost_parts and lost_units
    started, adopted = [], {}
    coord = _coordinator(meta, started, adopted)
    # When W1 is lost and one caller looks up one of its partitions
    cluster["alive"].discard(W1)
    topic, p = lost_parts[0].rsplit("/", 1)
    host = coord.locate(topic, int(p))
    # Then every partition and unit W1 served moved at once to running hosts of the others
    assert W1 not in host and host == meta.hosts.host_of(topic, int(p))
    hosts, units = meta.hosts.assignments(), meta.hosts.unit_assignments()
    assert all(W1 not in hosts[k] for k in lost_parts)
    assert all(W1 not in units[k] for k in lost_units)
    assert started == []  # nothing started: each went to a host that runs
    # and each new host was told to open what it got, once
    got = sorted(
        f"{t}/{p}" for keys in adopted.values() for t, p in [k[:2] for k in keys if len(k) == 2]
    )
    got_units = sorted(
        "/".join(map(str, k)) for keys in adopted.values() for k in keys if len(k) == 3
    )
    assert got == lost_parts and got_units == lost_units
    assert all(
        hosts[f"{t}/{p}"] == h
        for h, keys in adopted.items()
        for t, p in [k for k in keys if len(k) == 2]
    )
    # And the next lookups find them where they went, handing nothing over again
    adopted.clear()
    for key in lost_parts:
        t, q = key.rsplit("/", 1)
        assert coord.locate(t, int(q)) == hosts[key]
    for key in lost_units:
        u = Unit.of_key(key)
        assert coord.locate_unit(u.topic, u.subscription, u.group) == units[key]
    assert adopted == {}


def test_a_host_ended_on_a_live_node_or_a_node_of_another_session_moves_alone(cluster):
    topics = {"a": 6}
    meta, nodes = _with_units(topics, ["s0"])
    _running(cluster, meta)
    started, adopted = [], {}
    coord = _coordinator(meta, started, adopted)
    on_w1 = sorted(k for k, n in nodes.items() if n == W1)
    assert len(on_w1) >= 2
    # When one host of W1 ends for good while W1 lives, only what is looked up moves
    gone = meta.hosts.host_of("a", int(on_w1[0].rsplit("/", 1)[1]))
    cluster["actors"] = [a for a in cluster["actors"] if a["name"] != gone]
    before = meta.hosts.assignments()
    coord.locate("a", int(on_w1[0].rsplit("/", 1)[1]))
    after = meta.hosts.assignments()
    assert [k for k in before if before[k] != after[k]] == [on_w1[0]] and adopted == {}
    # And a node this Ray never had (the cluster was started again): the same
    meta.hosts.assign("a", 5, placement.host_actor_name("old-node", 0))
    meta.hosts.assign("a", 4, placement.host_actor_name("old-node", 1))
    coord.locate("a", 5)
    assert "old-node" in meta.hosts.host_of("a", 4) and adopted == {}
    assert "old-node" not in meta.hosts.host_of("a", 5)
