"""The coordinator's warm standby: which coordinator serves, when a standby takes over, and
how a serving coordinator keeps one on another node (Ray's calls faked)."""

from __future__ import annotations

import pytest

from raydelay.actors.standby import (
    Role,
    StandbyKeeper,
    Standing,
    find_coordinator,
)
from raydelay.cluster.handles import Peer
from raydelay.cluster.names import COORDINATORS
from raydelay.errors import Unavailable

FIRST, SECOND = COORDINATORS


class FakeCoordinators:
    """Coordinator actors by name: each with a node, a role (None: it does not answer),
    and whether its node is gone."""

    def __init__(self) -> None:
        self.actors: dict[str, dict] = {}
        self.ended: list[str] = []
        self.spawned: list[tuple[str, str]] = []
        self.nodes = ["n1", "n2", "n3"]
        self.asked: list[str] = []

    def add(self, name: str, node: str | None, role: Role | None, stranded: bool = False) -> None:
        self.actors[name] = {"node": node, "role": role, "stranded": stranded}

    def lookup(self, name: str):
        return f"handle:{name}" if name in self.actors else None

    def stranded(self, name: str) -> bool:
        return self.actors[name]["stranded"]

    def end(self, name: str, handle) -> None:
        assert handle == f"handle:{name}"
        self.ended.append(name)
        del self.actors[name]

    def roles(self, handles: dict, timeout_s: float) -> dict[str, Role]:
        self.asked.extend(handles)
        out = {}
        for name in handles:
            role = self.actors[name]["role"]
            if role is not None:
                out[name] = role
        return out

    def node_of(self, name: str) -> str | None:
        return self.actors[name]["node"] if name in self.actors else None

    def other_nodes(self, node: str | None) -> list[str]:
        return [n for n in self.nodes if n != node]

    def spawn(self, name: str, node: str) -> None:
        self.spawned.append((name, node))
        self.add(name, None, Role.STANDING_BY)  # (not placed yet)


@pytest.fixture
def fake() -> FakeCoordinators:
    return FakeCoordinators()


# --- which one serves ---------------------------------------------------------------------------


def test_no_coordinator_is_none_so_the_caller_creates_one(fake):
    assert find_coordinator(fake) is None


def test_a_lone_coordinator_is_found_without_asking_it(fake):
    fake.add(SECOND, "n2", Role.STANDING_BY)
    assert find_coordinator(fake) == (SECOND, f"handle:{SECOND}")
    assert fake.asked == []  # (a lone standby takes over on its first call)


def test_of_two_the_one_that_says_it_serves_is_found_whatever_its_name(fake):
    fake.add(FIRST, "n1", Role.STANDING_BY)
    fake.add(SECOND, "n2", Role.SERVING)
    assert find_coordinator(fake).name == SECOND


def test_a_coordinator_whose_node_is_gone_is_ended_and_its_standby_found(fake):
    # Given the serving coordinator's node is lost
    fake.add(FIRST, "n1", None, stranded=True)
    fake.add(SECOND, "n2", Role.STANDING_BY)
    # When a caller looks for the coordinator
    found = find_coordinator(fake)
    # Then the lost one is ended for good, and the standby is the one to call
    assert fake.ended == [FIRST] and found.name == SECOND


def test_two_standing_by_give_the_first_by_name_to_every_caller(fake):
    fake.add(FIRST, "n1", Role.STANDING_BY)
    fake.add(SECOND, "n2", Role.STANDING_BY)
    assert {find_coordinator(fake).name for _ in range(3)} == {FIRST}


def test_one_taking_over_is_found_before_a_standby(fake):
    fake.add(FIRST, "n1", Role.STANDING_BY)
    fake.add(SECOND, "n2", Role.TAKING_OVER)
    assert find_coordinator(fake).name == SECOND


def test_two_that_cannot_be_told_apart_are_unavailable_for_the_caller_to_look_again(fake):
    fake.add(FIRST, "n1", None)  # (a frozen node: no answer, not found gone yet)
    fake.add(SECOND, "n2", Role.STANDING_BY)
    with pytest.raises(Unavailable, match="no answer from coordinator"):
        find_coordinator(fake)
    assert fake.ended == []


# --- taking over --------------------------------------------------------------------------------


def _standby(fake, name=SECOND) -> tuple[Standing, list[str]]:
    activated: list[str] = []
    return Standing(name, serving=False, coordinators=fake), activated


def test_a_standby_takes_over_once_the_coordinator_is_gone(fake):
    standing, activated = _standby(fake)
    standing.take_over(lambda: activated.append("claimed and loaded"))
    assert standing.role is Role.SERVING and activated == ["claimed and loaded"]


def test_a_standby_ends_a_stranded_coordinator_before_it_takes_over(fake):
    fake.add(FIRST, "n1", Role.SERVING, stranded=True)
    standing, activated = _standby(fake)
    standing.take_over(lambda: activated.append("x"))
    assert fake.ended == [FIRST] and standing.role is Role.SERVING


@pytest.mark.parametrize("other", [Role.SERVING, Role.TAKING_OVER, None])
def test_a_standby_takes_nothing_while_the_other_serves_takes_over_or_is_silent(fake, other):
    fake.add(FIRST, "n1", other)
    standing, activated = _standby(fake)
    with pytest.raises(Unavailable, match=f"{SECOND} stands by"):
        standing.take_over(lambda: activated.append("x"))
    assert activated == [] and standing.role is Role.STANDING_BY


def test_a_standby_says_it_is_taking_over_before_it_asks_the_other(fake):
    # (of two standbys asking each other, the second to ask sees the first)
    seen = []
    standing, _ = _standby(fake)
    fake.add(FIRST, "n1", Role.STANDING_BY)
    roles = fake.roles

    def asking(handles, timeout_s):
        seen.append(standing.role)
        return roles(handles, timeout_s)

    fake.roles = asking
    standing.take_over(lambda: None)
    assert seen == [Role.TAKING_OVER]


def test_a_take_over_that_fails_leaves_it_standing_by(fake):
    standing, _ = _standby(fake)

    def store_down():
        raise RuntimeError("store down")

    with pytest.raises(RuntimeError):
        standing.take_over(store_down)
    assert standing.role is Role.STANDING_BY


def test_a_serving_coordinator_takes_over_nothing(fake):
    fake.add(SECOND, "n2", Role.SERVING)
    standing = Standing(FIRST, serving=True, coordinators=fake)
    standing.take_over(lambda: pytest.fail("activated twice"))
    assert fake.asked == []


# --- keeping a standby --------------------------------------------------------------------------


def _keeper(fake, node="n1") -> StandbyKeeper:
    return StandbyKeeper(FIRST, node, fake.spawn, fake)


def test_a_standby_is_started_on_another_node_the_least_loaded_first(fake):
    fake.nodes = ["n2", "n1", "n3"]  # (as other_nodes orders them: least loaded first)
    fake.add(FIRST, "n1", Role.SERVING)
    assert _keeper(fake).keep() == "n2"
    assert fake.spawned == [(SECOND, "n2")]


def test_a_running_standby_on_another_node_is_left_alone(fake):
    fake.add(FIRST, "n1", Role.SERVING)
    fake.add(SECOND, "n3", Role.STANDING_BY)
    assert _keeper(fake).keep() == "n3" and fake.spawned == [] and fake.ended == []


def test_a_standby_being_placed_is_not_started_twice(fake):
    keeper = _keeper(fake)
    keeper.keep()
    keeper.keep()
    assert len(fake.spawned) == 1


def test_a_standby_whose_node_is_gone_is_replaced_on_a_node_left(fake):
    fake.add(SECOND, "n2", Role.STANDING_BY, stranded=True)
    fake.nodes = ["n1", "n3"]
    assert _keeper(fake).keep() == "n3"
    assert fake.ended == [SECOND] and fake.spawned == [(SECOND, "n3")]


def test_a_standby_on_the_coordinators_own_node_is_moved(fake):
    # (one node's loss would take both)
    fake.add(SECOND, "n1", Role.STANDING_BY)
    assert _keeper(fake).keep() == "n2"
    assert fake.ended == [SECOND] and fake.spawned == [(SECOND, "n2")]


def test_on_a_single_node_there_is_no_standby(fake):
    fake.nodes = ["n1"]
    assert _keeper(fake).keep() is None and fake.spawned == []


# --- a peer of the coordinator ------------------------------------------------------------------


def test_a_peer_of_the_coordinator_calls_the_one_found_and_probes_its_node(monkeypatch):
    from raydelay.cluster import placement

    probed = []
    monkeypatch.setattr(placement, "stranded", lambda name: probed.append(name) or False)
    found = iter([(SECOND, "handle-2")])
    peer = Peer(FIRST, lambda: pytest.fail("created"), "coordinator", find=lambda: next(found))
    assert peer.handle == "handle-2" and peer.actor_name == SECOND
    assert not peer.node_lost() and probed == [SECOND]


def test_a_peer_of_the_coordinator_creates_one_when_none_is_found():
    peer = Peer(FIRST, lambda: "made", "coordinator", find=lambda: None)
    assert peer.handle == "made" and peer.actor_name == FIRST
