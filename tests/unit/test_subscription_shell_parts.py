"""The parts of a subscription actor's per-partition shell that hold logic of their own,
run without Ray against fakes of the peers they call: the cursor's versions and progress
reports (CursorIO), what recovery cost (RecoveryCost), dead letters (their topic and their
properties), lateness counts (PartitionReport) and the driver's I/O tasks (StepDriver)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.subscription import driver as driver_module
from raydelay.actors.subscription.cursor_io import CursorIO, Fence
from raydelay.actors.subscription.dead_letters import dead_letter_entries, dead_letter_topic
from raydelay.actors.subscription.driver import StepDriver
from raydelay.actors.subscription.recovery import RecoveryCost, seconds_to_ms
from raydelay.actors.subscription.ref import PartitionRef
from raydelay.actors.subscription.reporting import PartitionReport
from raydelay.actors.subscription.shell import _keys
from raydelay.dispatch.cursor import Cursor
from raydelay.dispatch.ports import Delivery
from raydelay.dispatch.stages import Handed, handed_out
from raydelay.errors import InvalidArgument, PartitionMoved
from raydelay.log.entries import NO_DELAY, Entries, Rows
from raydelay.positions import key_of
from raydelay.storage import MemoryObjectStore
from raydelay.storage.keys import cursor_key

REF = PartitionRef("orders", 3, "billing")


class FakeCoordinator:
    """The coordinator calls CursorIO makes, answered in process and recorded."""

    def __init__(self, mark_delete: tuple[int, int] = (4, 7)) -> None:
        self.mark_delete = mark_delete
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def call_from_thread(self, method: Any, *args: Any) -> Any:
        self.calls.append((method.__name__, args))
        if method is CoordinatorActor.mark_delete:
            return list(self.mark_delete)
        if method is CoordinatorActor.progress:
            return {}
        return None

    async def once(self, method: Any, *args: Any) -> Any:
        return self.call_from_thread(method, *args)


def _fake_sub(md: tuple[int, int], lm: tuple[int, int]) -> Any:
    return SimpleNamespace(
        name=REF.name,
        sealed=None,
        buckets=None,
        advance_buckets=lambda: None,
        cursor=SimpleNamespace(mark_delete=md),
        marks=SimpleNamespace(log_cursor=SimpleNamespace(mark_delete=lm)),
    )


def test_partition_ref_names_topic_partition_and_subscription():
    assert REF.name == "orders/3/billing"


def test_a_cursor_with_none_stored_starts_at_the_coordinators_mark_delete():
    io = CursorIO(REF, MemoryObjectStore(), FakeCoordinator((4, 7)))
    cursor, read = io.load()
    assert cursor.mark_delete == (4, 7) and read == (-1, -1) and io.version == 0


def test_cursor_writes_take_the_next_version_and_delete_the_older_ones():
    store = MemoryObjectStore()
    io = CursorIO(REF, store, FakeCoordinator())
    asyncio.run(io.write(Cursor((1, 1)).encode((1, 5))))
    asyncio.run(io.write(Cursor((2, 2)).encode((2, 5))))
    assert store.list(f"{io.prefix}/cursor/") == [cursor_key("orders", 3, "billing", 2)]
    again = CursorIO(REF, store, FakeCoordinator())
    cursor, read = again.load()
    assert cursor.mark_delete == (2, 2) and tuple(read) == (2, 5) and again.version == 2


def _no() -> None:  # (a host that is never fenced here)
    raise AssertionError("not fenced")


def test_a_host_that_lost_the_partition_is_fenced_at_its_next_cursor_write():
    # Given the old host (its node taken for lost) and the new one its unit moved to, both
    # serving the partition from the same cursor, version 1
    store = MemoryObjectStore()
    asyncio.run(CursorIO(REF, store, FakeCoordinator()).write(Cursor((0, 0)).encode((0, 0))))
    serving = {"host": "new"}
    fenced = []
    old = CursorIO(
        REF,
        store,
        FakeCoordinator(),
        Fence(lambda: serving["host"] == "old", lambda: fenced.append(1)),
    )
    new = CursorIO(REF, store, FakeCoordinator(), Fence(lambda: serving["host"] == "new", _no))
    old.load(), new.load()
    assert old.version == new.version == 1
    # When the new host writes version 2, and the old one then tries its own version 2
    asyncio.run(new.write(Cursor((5, 5)).encode((5, 5))))
    with pytest.raises(PartitionMoved, match="served by another host"):
        asyncio.run(old.write(Cursor((3, 3)).encode((3, 3))))
    # Then the old one is fenced: it told its host, and writes nothing more, not even
    # what a reset needs
    assert old.fenced and fenced == [1]
    with pytest.raises(PartitionMoved):
        asyncio.run(old.write(Cursor((9, 9)).encode((9, 9))))
    with pytest.raises(PartitionMoved):
        old.write_reset(_fake_sub((9, 9), (9, 9)), (9, 9))
    # and the new host's cursor is the one the store holds
    cursor, _ = CursorIO(REF, store, FakeCoordinator()).load()
    assert cursor.mark_delete == (5, 5)


def test_the_host_serving_the_partition_goes_past_a_version_an_old_host_took():
    # Given the old host wrote version 2 before it learnt that it lost the partition
    store = MemoryObjectStore()
    fenced = []
    old = CursorIO(REF, store, FakeCoordinator(), Fence(lambda: False, lambda: fenced.append(1)))
    new = CursorIO(REF, store, FakeCoordinator(), Fence(lambda: True, _no))
    asyncio.run(old.write(Cursor((1, 1)).encode((1, 1))))
    new.load()
    asyncio.run(old.write(Cursor((2, 2)).encode((2, 2))))  # (version 2: nobody had it)
    # When the new host writes (its version 2 is taken), it takes the next free number
    asyncio.run(new.write(Cursor((4, 4)).encode((4, 4))))
    assert new.version == 3 and not new.fenced
    # and the old host's next write meets it: fenced
    with pytest.raises(PartitionMoved):
        asyncio.run(old.write(Cursor((3, 3)).encode((3, 3))))
    assert fenced == [1]
    assert store.list(f"{new.prefix}/cursor/") == [cursor_key("orders", 3, "billing", 3)]


def test_an_unreadable_newest_cursor_falls_back_to_an_older_one():
    store = MemoryObjectStore()
    store.put(cursor_key("orders", 3, "billing", 1), Cursor((1, 1)).encode((1, 1)))
    store.put(cursor_key("orders", 3, "billing", 2), b"not a cursor")
    io = CursorIO(REF, store, FakeCoordinator())
    cursor, _ = io.load()
    assert cursor.mark_delete == (1, 1) and io.version == 1


def test_progress_is_reported_only_when_it_changed():
    coordinator = FakeCoordinator()
    io = CursorIO(REF, MemoryObjectStore(), coordinator)

    def report(md, lm) -> bool:
        return asyncio.run(io.report_progress(io.progress_report(_fake_sub(md, lm))))

    assert report((1, 1), (1, 2)) is True
    assert report((1, 1), (1, 2)) is False
    assert report((1, 3), (1, 3)) is True
    reported = [args for name, args in coordinator.calls if name == "set_progress_many"]
    assert reported == [
        ([["orders", 3, "billing", [1, 1], [1, 2], {}]],),
        ([["orders", 3, "billing", [1, 3], [1, 3], {}]],),
    ]


def test_the_progress_of_a_processs_partitions_goes_in_one_call_the_latest_of_each():
    coordinator = FakeCoordinator()
    ios = [CursorIO(PartitionRef("orders", p, "billing"), MemoryObjectStore(), coordinator)
           for p in range(3)]  # fmt: skip

    async def main() -> None:
        # three partitions report at once, the first of them twice: one call
        await asyncio.gather(
            *[
                io.report_progress(io.progress_report(_fake_sub((1, p), (1, p))))
                for p, io in enumerate(ios)
            ],  # fmt: skip
            ios[0].report_progress(ios[0].progress_report(_fake_sub((1, 9), (1, 9)))),
        )

    asyncio.run(main())
    [(name, (reports,))] = coordinator.calls
    assert name == "set_progress_many"
    assert sorted(reports) == [
        ["orders", 0, "billing", [1, 9], [1, 9], {}],  # (the later report of partition 0)
        ["orders", 1, "billing", [1, 1], [1, 1], {}],
        ["orders", 2, "billing", [1, 2], [1, 2], {}],
    ]


def test_a_failed_batch_of_progress_reports_fails_each_caller_and_the_next_sends_again():
    class Failing(FakeCoordinator):
        fail = True

        async def once(self, method: Any, *args: Any) -> Any:
            if self.fail:
                raise ConnectionError("coordinator restarting")
            return await super().once(method, *args)

    coordinator = Failing()
    io = CursorIO(REF, MemoryObjectStore(), coordinator)
    report = io.progress_report(_fake_sub((2, 0), (2, 0)))
    with pytest.raises(ConnectionError):
        asyncio.run(io.report_progress(report))
    coordinator.fail = False
    assert asyncio.run(io.report_progress(report)) is True  # (not taken for sent)
    assert [name for name, _ in coordinator.calls] == ["set_progress_many"]


def test_recovery_cost_counts_log_bytes_until_the_first_delivery():
    cost = RecoveryCost(started=0.0)
    cost.count_log_bytes(10)
    cost.recovered(loose=2, read_from=(5, 0), delayed=7)
    cost.count_log_bytes(5)
    cost.first_receive()
    cost.first_delivery(now_ms=1_000, store_bytes=99)
    cost.count_log_bytes(1_000)  # (after the first delivery: not recovery's)
    cost.first_delivery(now_ms=2_000, store_bytes=0)  # (only the first counts)
    got = cost.as_dict()
    assert "started" not in got and cost.delivered
    assert got["log_bytes"] == 15 and got["loose"] == 2 and got["read_from"] == [5, 0]
    assert got["delayed"] == 7 and got["first_delivery_at_ms"] == 1_000
    assert got["store_bytes"] == 99 and "first_receive_s" in got


def test_recovery_cost_says_when_it_began_and_when_each_step_ended():
    # Given a recovery that began 2 s ago (by the monotonic clock)
    started = time.monotonic() - 2.0
    before_ms = time.time() * 1000
    cost = RecoveryCost(started)
    # When two of its steps end
    cost.step("peers")
    cost.step("cursor")
    got = cost.as_dict()
    # Then it began 2 s before it was made, in epoch ms, and each step ended after that
    assert before_ms - 2_500 < got["began_at_ms"] < before_ms - 1_500
    assert list(got["steps"]) == ["peers", "cursor"]
    assert 2.0 <= got["steps"]["peers"] <= got["steps"]["cursor"]


def test_seconds_to_ms_rounds_and_keeps_none():
    assert seconds_to_ms(None) is None
    assert seconds_to_ms(1.0006) == 1001


def test_keys_from_a_consumer_must_be_a_flat_integer_array():
    assert _keys([1, 2]).dtype == np.int64
    assert len(_keys([])) == 0
    with pytest.raises(InvalidArgument):
        _keys([[1]])
    with pytest.raises(InvalidArgument):
        _keys([1.5])


def test_dead_letters_go_to_the_option_or_the_default_topic():
    assert dead_letter_topic(REF, {}) == "orders-billing-DLQ"
    assert dead_letter_topic(REF, {"dead_letter_topic": "dlq"}) == "dlq"


def test_a_dead_letter_is_due_at_once_and_names_its_origin():
    entries = Entries.build(
        [b"a", b"b"], np.asarray([123, NO_DELAY]), ["k", None], [{"x": "1"}, None]
    )
    keys = np.asarray([key_of(9, 1), key_of(9, 2)], dtype=np.int64)
    out = dead_letter_entries(REF, keys, entries)
    assert out.payloads == [b"a", b"b"] and out.keys == ["k", None]
    assert out.deliver_at_ms.tolist() == [NO_DELAY, NO_DELAY]
    assert out.properties == [
        {
            "x": "1",
            "raydelay.original_message_id": "orders/3/9:1",
            "raydelay.subscription": "billing",
        },
        {"raydelay.original_message_id": "orders/3/9:2", "raydelay.subscription": "billing"},
    ]


def _delivery(deliver_at: list[int], counts: list[int]) -> Delivery:
    n = len(deliver_at)
    rows = Rows(
        np.arange(n, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        Entries.build([b"p"] * n, np.asarray(deliver_at, dtype=np.int64)),
    )
    idx = np.arange(n, dtype=np.int64)
    return Delivery(rows, idx, rows.positions, np.asarray(counts, dtype=np.int64))


def test_lateness_counts_first_deliveries_of_delayed_messages_only():
    # due at 900 (first), due at 990 (redelivered), not delayed
    out = [_delivery([900, 990, NO_DELAY], [0, 1, 0])]
    assert handed_out(out, 1_000).lateness_ms.tolist() == [100]

    class Metrics:
        def __init__(self) -> None:
            self.seen: list[tuple[int, list[int], list[list[int]]]] = []

        def dispatched(self, n: int, got: Handed) -> None:
            self.seen.append((n, got.lateness_ms.tolist(), got.stages_ms.tolist()))

    metrics = Metrics()
    report = PartitionReport(metrics, SimpleNamespace(), deque())
    report.dispatched(out, 1_000)
    # (rows whose arrival was not noted: all of the lateness is the subscription's wait)
    assert metrics.seen == [(3, [100], [[0], [0], [100]])]
    assert report.late_counts.sum() == 1
    assert report.stages.as_dict()["waited"]["sum_ms"] == 100


def test_an_idle_partition_is_not_counted_again_for_the_metrics():
    from tests.unit.test_subscription import make

    c = make()
    counted = []
    stats = c.sub.stats
    c.sub.stats = lambda: counted.append(1) or stats()  # type: ignore[method-assign]
    loads: deque = deque()
    report = PartitionReport(SimpleNamespace(), c.sub, loads)
    first = report.snapshot()
    assert first is not None and first[1]["backlog"] == 0 and len(counted) == 1
    assert report.snapshot() is None and len(counted) == 1  # nothing moved: not counted
    c.sub.step(2_000_000)  # (a step ran: something may have changed)
    assert report.snapshot() is None and len(counted) == 2  # counted, the same: not reported
    loads.append(("load", 0.01))
    again = report.snapshot()
    assert again is not None and again[2] == [("load", 0.01)]


def _driver(wake: asyncio.Event) -> StepDriver:
    sub = SimpleNamespace(name=REF.name)
    return StepDriver(
        sub,
        None,
        wake,
        SimpleNamespace(closed=False),
        None,
        None,
        None,
        60.0,
    )


def test_io_of_one_kind_runs_once_at_a_time_and_wakes_the_driver_unless_idle(monkeypatch):
    monkeypatch.setattr(driver_module, "RETRY_S", 0.0)

    async def scenario() -> list[str]:
        wake = asyncio.Event()
        driver = _driver(wake)
        ran: list[str] = []
        gate = asyncio.Event()

        async def slow() -> None:
            ran.append("slow")
            await gate.wait()

        async def second() -> None:
            ran.append("second")

        driver._start("persisting the cursor", slow())
        driver._start("persisting the cursor", second())  # (busy: closed, never run)
        await asyncio.sleep(0)
        gate.set()
        await asyncio.sleep(0.01)
        assert wake.is_set()
        wake.clear()

        async def idle() -> bool:
            return False

        driver._start("persisting the cursor", idle())
        await asyncio.sleep(0.01)
        assert not wake.is_set()  # (it changed nothing)

        async def failing() -> None:
            raise OSError("store down")

        driver._start("publishing dead letters", failing())
        await asyncio.sleep(0.01)
        assert wake.is_set()  # (a later step retries it)
        driver.close()
        return ran

    assert asyncio.run(scenario()) == ["slow"]
