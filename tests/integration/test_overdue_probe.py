"""A call to a named actor that is late has its node looked at (``rpc.probing``,
``rpc.wait_probing``): given up with Unavailable once the node is lost (the caller's retry
then re-creates the actor elsewhere, without waiting for Ray's verdict on the node), and
waited for while the node is up, however long the call takes."""

from __future__ import annotations

import asyncio
import threading

import pytest
import ray

from raydelay.cluster import rpc
from raydelay.errors import Unavailable


@ray.remote
class Slow:
    def __init__(self) -> None:
        self._release = threading.Event()

    def answer_when_released(self) -> str:
        self._release.wait(60)
        return "answered"

    def release(self) -> None:
        self._release.set()


class Probe:
    """A node that is up until ``lost_after`` probes (None: up for good)."""

    def __init__(self, lost_after: int | None = None) -> None:
        self.lost_after, self.probes = lost_after, 0

    def __call__(self) -> bool:
        self.probes += 1
        return self.lost_after is not None and self.probes >= self.lost_after


@pytest.fixture
def slow(ray_cluster):
    actor = Slow.options(max_concurrency=2).remote()
    yield actor
    ray.kill(actor)


@pytest.mark.parametrize("wait", [rpc.get, rpc.get_blocking], ids=["get", "get_blocking"])
def test_a_late_call_is_given_up_once_its_node_is_found_lost(slow, wait):
    probe = Probe(lost_after=3)
    waiting = rpc.probing(wait, probe, every_s=0.05)
    with pytest.raises(Unavailable, match="coordinator is unavailable: its node is lost"):
        waiting(slow.answer_when_released.remote(), what="coordinator")
    assert probe.probes == 3


@pytest.mark.parametrize("wait", [rpc.get, rpc.get_blocking], ids=["get", "get_blocking"])
def test_a_late_call_is_waited_for_while_its_node_is_up(slow, wait):
    probe = Probe()
    ref = slow.answer_when_released.remote()

    def release_after_some_probes() -> bool:
        lost = probe()  # (never: lost_after is None)
        if probe.probes == 4:
            slow.release.remote()
        return lost

    waiting = rpc.probing(wait, release_after_some_probes, every_s=0.05)
    assert waiting(ref, what="coordinator") == "answered"
    assert probe.probes >= 4


def test_an_async_actors_late_call_is_given_up_once_its_node_is_found_lost(slow):
    probe = Probe(lost_after=2)

    async def call() -> str:
        return await rpc.wait_probing(
            slow.answer_when_released.remote(), probe, what="coordinator", every_s=0.05
        )

    with pytest.raises(Unavailable, match="its node is lost"):
        asyncio.run(call())
    assert probe.probes == 2
    # and one whose node is up is answered
    up = Probe()
    ref = slow.answer_when_released.remote()
    slow.release.remote()
    assert asyncio.run(rpc.wait_probing(ref, up, every_s=0.05)) == "answered"
