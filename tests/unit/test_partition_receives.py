"""A consumer's receives at a unit's partitions: a slow partition does not hold the others,
and what it hands out after the call answered goes out with the consumer's next call."""

from __future__ import annotations

import asyncio

import pytest

from raydelay.actors.subscription import receives
from raydelay.actors.subscription.receives import PartitionReceives


class Partitions:
    """Receives that answer at once, except at partitions held back until released."""

    def __init__(self, held=(), failing=()) -> None:
        self.held = {p: asyncio.Event() for p in held}
        self.failing = set(failing)
        self.begun: list[int] = []

    async def receive(self, p: int):
        self.begun.append(p)
        if p in self.failing:
            raise ConnectionError(f"host of {p} lost")
        if p in self.held:
            await self.held[p].wait()
        return [f"m{p}"], False


def test_a_slow_partition_does_not_hold_back_the_others():
    async def scenario():
        parts = Partitions(held=[1])
        r = PartitionReceives()
        # When a consumer receives at 0, 1 and 2 while partition 1's host is being found
        answers, failed, running = await r.collect("c", [0, 1, 2], parts.receive)
        # Then 0 and 2 answer now, and 1's receive goes on
        assert answers == {0: (["m0"], False), 2: (["m2"], False)} and failed == {}
        assert len(running) == 1 and r.kept() == 1
        # When it ends, the consumer's next call gets what it handed out, without a second
        # receive begun there
        parts.held[1].set()
        await asyncio.wait(running)
        answers, _, running = await r.collect("c", [0, 1, 2], parts.receive)
        assert answers[1] == (["m1"], False) and running == [] and r.kept() == 0
        assert parts.begun.count(1) == 1

    asyncio.run(scenario())


def test_a_kept_receive_goes_to_its_own_consumer_only():
    async def scenario():
        parts = Partitions(held=[0])
        r = PartitionReceives()
        await r.collect("alice", [0], parts.receive)
        parts.held[0].set()
        answers, _, running = await r.collect("bob", [0], parts.receive)
        assert answers == {0: (["m0"], False)} and parts.begun == [0, 0]  # bob's own
        assert r.kept() == 1  # alice's, for her next call
        answers, _, _ = await r.collect("alice", [0], parts.receive)
        assert answers == {0: (["m0"], False)} and r.kept() == 0

    asyncio.run(scenario())


def test_a_failing_partition_is_handed_back_with_its_error():
    async def scenario():
        r = PartitionReceives()
        answers, failed, _ = await r.collect("c", [0, 1], Partitions(failing=[1]).receive)
        assert list(answers) == [0] and isinstance(failed[1], ConnectionError)

    asyncio.run(scenario())


def test_a_receive_nobody_comes_for_is_dropped_after_a_while():
    async def scenario():
        now = [0.0]
        parts = Partitions(held=[0])
        r = PartitionReceives(clock=lambda: now[0])
        await r.collect("gone", [0], parts.receive)
        parts.held[0].set()
        await asyncio.sleep(0)
        await r.collect("other", [], parts.receive)  # (seen done now)
        assert r.kept() == 1
        now[0] += receives.UNCLAIMED_S + 1
        await r.collect("other", [], parts.receive)
        assert r.kept() == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("partitions", [[], [3]])
def test_a_pass_with_nothing_slow_answers_every_partition(partitions):
    async def scenario():
        r = PartitionReceives()
        answers, failed, running = await r.collect("c", partitions, Partitions().receive)
        assert sorted(answers) == partitions and not failed and not running

    asyncio.run(scenario())
