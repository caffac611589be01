"""How raydelay chooses a node for an actor (Ray's node and actor tables faked)."""

from __future__ import annotations

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
                "Resources": {"node:__internal_head__": 1.0} if n == HEAD else {},
            }
            for n in (HEAD, W1, W2, W3)
        ]

    monkeypatch.setattr(placement.ray, "nodes", nodes)
    monkeypatch.setattr(placement, "actors", lambda: list(state["actors"]))
    return state


def place(state, name: str, near: str | None = None) -> str:
    node = placement.choose_node(name, avoid_head=True, near=near)
    kind = placement._class_of(name)
    state["actors"].append({"name": name, "class": kind, "node": node})
    return node


def test_topic_actors_spread_evenly_over_the_workers_and_never_on_the_head(cluster):
    nodes = [place(cluster, f"topic/t/{p}") for p in range(6)]
    assert HEAD not in nodes
    assert sorted(nodes.count(w) for w in (W1, W2, W3)) == [2, 2, 2]


def test_a_subscription_actor_goes_to_its_topic_actors_node(cluster):
    topic_node = place(cluster, "topic/t/0")
    assert place(cluster, "sub/t/0/a", near="topic/t/0") == topic_node


def test_the_head_is_used_when_it_is_the_only_node_or_when_allowed(cluster):
    cluster["alive"] = {HEAD}
    assert placement.choose_node("topic/t/0", avoid_head=True) == HEAD
    cluster["alive"] = {HEAD, W1}
    assert placement.choose_node("coordinator", avoid_head=False) in (HEAD, W1)
    cluster["actors"].append({"name": "topic/t/0", "class": "TopicActor", "node": W1})
    assert placement.choose_node("topic/t/1", avoid_head=False) == HEAD  # the emptier one


def test_after_a_node_is_lost_its_actors_spread_over_the_survivors(cluster):
    for p in range(6):
        place(cluster, f"topic/t/{p}")
    lost = [a for a in cluster["actors"] if a["node"] == W1]
    cluster["alive"].discard(W1)
    cluster["actors"] = [a for a in cluster["actors"] if a["node"] != W1]
    again = [place(cluster, a["name"]) for a in lost]
    assert set(again) == {W2, W3}  # one each, not both on one survivor


def test_no_node_at_all_leaves_the_choice_to_ray(cluster):
    cluster["alive"] = set()
    assert placement.choose_node("topic/t/0", avoid_head=True) is None
