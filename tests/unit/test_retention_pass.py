"""A partition host's retention pass (``retention_pass``): a topic deleted while the pass
runs is no failure, but a NotFound of a topic that still exists is reported."""

from __future__ import annotations

import asyncio
import logging

from raydelay.actors.host import retention_pass
from raydelay.errors import NotFound


class Part:
    def __init__(self, error: Exception | None = None) -> None:
        self.error, self.trims = error, 0

    async def trim(self) -> list[int]:
        self.trims += 1
        if self.error is not None:
            raise self.error
        return []


def run_pass(parts, topics: set[str]) -> dict:
    retries: dict = {}

    async def exists(topic: str) -> bool:
        return topic in topics

    asyncio.run(retention_pass(parts, retries, exists))
    return retries


def test_a_topic_deleted_during_the_pass_is_no_failure_and_the_others_are_trimmed(caplog):
    # Given two partitions of a topic the coordinator deleted mid-pass, and one of another
    gone = NotFound("topic orders-demo: not found")
    parts = {("orders-demo", 0): Part(gone), ("orders-demo", 1): Part(gone), ("keep", 0): Part()}
    with caplog.at_level(logging.WARNING, logger="raydelay.actors.host"):
        retries = run_pass(parts, topics={"keep"})
    # Then nothing is reported, and the other topic's partition was trimmed all the same
    assert caplog.records == []
    assert [r.failures for r in retries.values()] == [0, 0, 0]
    assert parts[("keep", 0)].trims == 1


def test_a_not_found_of_a_topic_that_still_exists_is_reported(caplog):
    # Given a partition whose trim meets NotFound (a missing ledger, say) of a live topic
    parts = {("orders", 0): Part(NotFound("ledger 7: not found")), ("orders", 1): Part()}
    with caplog.at_level(logging.WARNING, logger="raydelay.actors.host"):
        retries = run_pass(parts, topics={"orders"})
    # Then it counts as a failure, reported with what it was
    assert retries[("orders", 0)].failures == 1 and retries[("orders", 1)].failures == 0
    assert any("ledger 7: not found" in r.getMessage() or r.exc_info for r in caplog.records)
    assert any("retention of orders/0" in r.getMessage() for r in caplog.records)


def test_a_partition_dropped_by_the_host_during_the_pass_is_no_failure(caplog):
    parts: dict = {}

    class Dropping(Part):
        async def trim(self) -> list[int]:
            del parts[("orders", 0)]  # (drop_topic took it off meanwhile)
            raise NotFound("topic orders: not found")

    parts[("orders", 0)] = Dropping()
    with caplog.at_level(logging.WARNING, logger="raydelay.actors.host"):
        retries = run_pass(parts, topics={"orders"})
    assert caplog.records == [] and retries[("orders", 0)].failures == 0


class DroppedPart(Part):
    """A partition that drop_topic takes off and closes while its trim runs."""

    def __init__(self, parts: dict, key: tuple[str, int]) -> None:
        super().__init__()
        self.parts, self.key = parts, key

    async def trim(self) -> list[int]:
        self.trims += 1
        del self.parts[self.key]  # (drop_topic: popped, then its thread pools shut down)
        raise RuntimeError("cannot schedule new futures after shutdown")


def test_a_partition_closed_under_its_trim_is_no_failure(caplog):
    parts: dict = {("keep", 0): Part()}
    parts[("demo-orders", 0)] = DroppedPart(parts, ("demo-orders", 0))
    with caplog.at_level(logging.WARNING, logger="raydelay.actors.host"):
        run_pass(parts, topics={"keep"})
    assert not [r for r in caplog.records if "retention" in r.getMessage()]
    assert parts[("keep", 0)].trims == 1


def test_the_same_error_of_a_partition_still_served_is_reported(caplog):
    parts = {("keep", 0): Part(RuntimeError("cannot schedule new futures after shutdown"))}
    with caplog.at_level(logging.WARNING, logger="raydelay.actors.host"):
        run_pass(parts, topics={"keep"})
    assert any("retention of keep/0" in r.getMessage() for r in caplog.records)
