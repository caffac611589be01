"""A Peer looks its actor up again (creating it when it ended) after a call found it
unavailable; fakes stand in for Ray's handles."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from raydelay.cluster import handles, placement
from raydelay.errors import InvalidArgument, Unavailable


class FakeActor:
    """A handle whose calls return ``(actor, method, args)``; a dead one's calls fail."""

    ids = itertools.count(1)

    def __init__(self, dead: bool) -> None:
        self.dead, self.ident = dead, next(self.ids)

    def __getattr__(self, method: str):
        actor = self

        class Method:
            @staticmethod
            def remote(*args):
                return (actor, method, args)

        return Method


class Actor:
    """The methods the peers below call (a Peer names the method, the fake answers)."""

    def append(self, batch: bytes) -> None: ...

    def tail(self) -> None: ...

    def ping(self) -> None: ...

    def create_topic(self) -> None: ...

    async def read(self, n: int) -> None: ...


def fake_wait(ref, what=""):
    actor, method, args = ref
    if actor.dead:
        raise Unavailable(f"{what} is unavailable: the actor died")
    return (actor.ident, method, args)


@pytest.fixture
def actors(monkeypatch):
    """The actors ``create`` hands out, dead or alive, in order; no name is registered.
    A blocking call waits with ``fake_wait``."""
    monkeypatch.setattr(placement, "lookup_or_none", lambda name: None)
    monkeypatch.setattr(handles.rpc, "get", fake_wait)
    made: list[FakeActor] = []
    plan: list[bool] = []

    def create():
        made.append(FakeActor(dead=plan.pop(0) if plan else False))
        return made[-1]

    return made, plan, create


def test_a_call_to_an_ended_actor_re_creates_it_and_succeeds(actors):
    made, plan, create = actors
    plan += [True]  # the first actor is dead for good; the re-created one answers
    peer = handles.Peer("topic/t/0", create, deadline_s=5, sleep=lambda s: None)
    out = peer.call(Actor.append, b"x")
    assert out == (made[1].ident, "append", (b"x",))
    assert len(made) == 2 and peer.re_resolved == 1
    # the new handle is kept: the next call creates nothing
    peer.call(Actor.tail)
    assert len(made) == 2


def test_a_call_gives_up_with_unavailable_after_its_deadline(actors):
    made, plan, create = actors
    plan += [True] * 1000
    peer = handles.Peer("coordinator", create, "coordinator", deadline_s=0.2, sleep=lambda s: None)
    with pytest.raises(Unavailable, match="coordinator still failing after 0 s"):
        peer.call(Actor.ping)
    assert len(made) >= 2  # each failed attempt looked the actor up again


def test_a_call_across_peers_looks_up_again_the_ones_it_went_through(actors, monkeypatch):
    # Given two partitions whose actors ended for good (their handles dead for ever), and
    # a third peer that the call does not use
    made, plan, create = actors

    def wait_all(refs, what=""):
        return [fake_wait(r, what) for r in refs] if isinstance(refs, list) else fake_wait(refs)

    monkeypatch.setattr(handles.rpc, "get", wait_all)
    a, b, idle = (handles.Peer(f"topic/t/{p}", create, deadline_s=5) for p in range(3))
    idle.call(Actor.ping)
    plan += [True, True]
    tries = []

    def submit():
        tries.append(1)
        return [a.submit(Actor.append, b"x"), b.submit(Actor.append, b"y")]

    # When one call goes to both, retried
    out = handles.retried_across(submit, what="topic t", deadline_s=5, sleep=lambda s: None)
    # Then its retry reached the actors serving now (each looked up once), and the peer
    # it did not use kept its handle
    assert [o[2] for o in out] == [(b"x",), (b"y",)] and len(tries) == 2
    assert (a.re_resolved, b.re_resolved, idle.re_resolved) == (1, 1, 0)
    # and while no actor answers, it gives up after its deadline, with each try's peers
    # looked up again
    plan += [True] * 1000
    a.lost(), b.lost()
    with pytest.raises(Unavailable, match="topic t still failing after 0 s"):
        handles.retried_across(submit, what="topic t", deadline_s=0.2, sleep=lambda s: None)
    assert a.re_resolved > 3


def test_other_errors_are_raised_at_once_and_keep_the_handle(actors, monkeypatch):
    made, plan, create = actors
    peer = handles.Peer("coordinator", create, deadline_s=5, sleep=lambda s: None)

    def refuses(ref, what=""):
        raise InvalidArgument("topic: bad")

    monkeypatch.setattr(handles.rpc, "get", refuses)
    with pytest.raises(InvalidArgument):
        peer.call(Actor.create_topic)
    assert len(made) == 1 and peer.re_resolved == 0


def test_an_async_caller_re_resolves_on_its_next_try(actors, monkeypatch):
    made, plan, create = actors
    plan += [True]

    async def wait(ref, what=""):
        return fake_wait(ref, what)

    monkeypatch.setattr(handles.rpc, "wait", wait)
    peer = handles.Peer("topic/t/0", create)

    async def run():
        with pytest.raises(Unavailable):
            await peer.once(Actor.read, 1)  # one try: the caller's own loop retries
        return await peer.once(Actor.read, 1)

    assert asyncio.run(run()) == (made[1].ident, "read", (1,))


def test_a_lookup_that_fails_is_unavailable(monkeypatch):
    def broken(name):
        raise ValueError("Failed to look up actor: GCS unreachable")

    monkeypatch.setattr(placement, "lookup_or_none", broken)
    peer = handles.Peer("coordinator", lambda: None, "coordinator")
    with pytest.raises(Unavailable, match="coordinator: cannot look it up"):
        peer.submit(Actor.ping)


def test_a_refresh_lets_the_actors_other_calls_go_on_with_the_handle_held():
    # Given a peer of an actor that serves several partitions, whose lookup is slow (its
    # host is found through a coordinator being replaced)
    import threading

    answers = iter(["old", "new"])
    release = threading.Event()

    def resolve():
        handle = next(answers)
        if handle == "new":
            release.wait(5)
        return handle

    peer = handles.Peer("sub/t/s/0", lambda: None, resolve=resolve)
    assert peer.handle == "old"
    # When one partition's failure has it looked up again
    refreshing = threading.Thread(target=peer.refresh)
    refreshing.start()
    # Then the other partitions' calls meanwhile get the handle held, without waiting
    assert peer.handle == "old"
    release.set()
    refreshing.join(5)
    assert peer.handle == "new" and peer.re_resolved == 1
