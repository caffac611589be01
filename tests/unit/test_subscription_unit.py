"""A unit serves each partition as soon as that partition is recovered: one whose own
host was lost too (its recovery waits for the host) does not hold the others up.

The unit's partitions are fakes here (no Ray, no store): each recovers when the test
lets it, and hands out what the test put in it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.subscription import unit as unit_module
from raydelay.actors.subscription.unit import SubscriptionUnit
from raydelay.cluster.names import Unit
from raydelay.errors import InvalidArgument, NotFound


class _Coordinator:
    def call_from_thread(self, method: Any, *args: Any) -> Any:
        if method is CoordinatorActor.partitions:
            return 3
        if method is CoordinatorActor.subscription:
            return {"type": "shared"}
        raise AssertionError(method)


class _Shell:
    """A recovered partition holding ``rows`` for the next receive."""

    def __init__(self, p: int) -> None:
        self.p, self.rows, self.started = p, [f"row-{p}"], False
        self.on_available = None

    def ensure_started(self) -> None:
        self.started = True

    def begin_receive(self, consumer_id: str) -> None:
        pass

    async def receive_now(self, consumer_id: str, max_messages: int, rewinds: int, ahead_ms=0):
        out, self.rows = self.rows, []
        return out, bool(out)  # (a receive answers once it has something)

    async def heartbeat(self, consumer_id: str) -> bool:
        return True

    async def close(self) -> None:
        pass

    def metrics_snapshot(self):
        return None


@pytest.fixture
def unit(monkeypatch):
    """A unit of 3 partitions whose recoveries wait for ``gates[p]``; ``fail`` names
    partitions whose recovery raises NotFound."""
    gates = {p: threading.Event() for p in range(3)}
    fail: set[int] = set()

    def open_one(self, p: int, options: dict | None = None) -> _Shell:
        # (an open hands each partition the options the unit read: one coordinator call)
        assert options == {"type": "shared"}
        assert gates[p].wait(10)
        if p in fail:
            raise NotFound(f"partition {p}: gone")
        return _Shell(p)

    monkeypatch.setattr(SubscriptionUnit, "_open_one", open_one)
    monkeypatch.setattr(unit_module, "delivery_batch", lambda rows, handed_ms=None: list(rows))
    made = SubscriptionUnit(Unit("t", "s", 0), {}, _Coordinator())  # type: ignore[arg-type]
    return made, gates, fail


def test_a_receive_gets_the_recovered_partitions_and_the_others_join_as_they_come(unit):
    made, gates, _ = unit

    async def run():
        made.open_partitions()
        gates[0].set()
        gates[2].set()
        await asyncio.sleep(0.05)
        # partition 1 is still recovering: a receive at all three gets 0 and 2 at once
        first = await made.receive_many("c", [0, 1, 2], 10, timeout_s=5)
        assert sorted(p for p, _ in first.got) == [0, 2] and first.failed == []
        # and a receive standing when 1 is recovered gets it, before its timeout
        standing = asyncio.ensure_future(made.receive_many("c", [0, 1, 2], 10, timeout_s=5))
        await asyncio.sleep(0.05)
        assert not standing.done()
        gates[1].set()
        second = await asyncio.wait_for(standing, 2)
        assert [(p, rows) for p, rows in second.got] == [(1, ["row-1"])]
        assert made.partitions() == [0, 1, 2]

    asyncio.run(run())


def test_a_call_at_a_recovering_partition_waits_for_it_and_a_failed_one_raises(unit):
    made, gates, fail = unit
    fail.add(2)

    async def run():
        made.open_partitions()
        gates[0].set()
        waiting = asyncio.ensure_future(made.heartbeat(1, "c"))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # (it waits for partition 1's recovery)
        gates[1].set()
        assert await asyncio.wait_for(waiting, 2) is True
        gates[2].set()
        with pytest.raises(NotFound, match="partition 2: gone"):
            await made.heartbeat(2, "c")
        reply = await made.receive_many("c", [0, 2], 10, timeout_s=1)
        assert [p for p, _ in reply.failed] == [2]
        with pytest.raises(InvalidArgument, match="partition: .* not 7"):
            await made.heartbeat(7, "c")

    asyncio.run(run())


@pytest.mark.parametrize(
    ("ahead_ms", "says"),
    [(True, "expected an int, got bool"), ("50", "expected an int, got str"),
     (-1, "must be 0..60000, got -1"), (60_001, "must be 0..60000, got 60001")],
)  # fmt: skip
def test_a_receive_asking_an_absurd_ahead_is_refused_naming_it(ahead_ms, says):
    with pytest.raises(InvalidArgument, match=f"^ahead_ms: {says}$"):
        unit_module.check_ahead_ms(ahead_ms)
    assert unit_module.check_ahead_ms(0) == 0 and unit_module.check_ahead_ms(60_000) == 60_000
