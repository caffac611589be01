"""What one subscription host process shares between the many units it serves: calls
asked alike (SharedCalls), one alarm thread (AlarmClock) and one metrics loop
(MetricsLoop). Run without Ray."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from raydelay.actors.alarm import Alarm
from raydelay.actors.subscription import unit as unit_module
from raydelay.actors.subscription.shared_calls import SharedCalls
from raydelay.actors.subscription.unit import MetricsLoop


def test_askers_of_the_same_call_share_one_answer_and_the_next_ask_makes_a_new_call():
    calls: list[int] = []

    async def ask(n: int) -> list[int]:
        calls.append(n)
        await asyncio.sleep(0.01)
        return [n]

    async def main() -> None:
        shared = SharedCalls()
        a, b, c = await asyncio.gather(
            shared.call(("read", 1), ask, 1),
            shared.call(("read", 1), ask, 1),
            shared.call(("read", 2), ask, 2),
        )
        assert a is b and a == [1] and c == [2]  # one call for the two alike
        assert calls == [1, 2] and shared.joined == 1 and len(shared) == 0
        assert await shared.call(("read", 1), ask, 1) == [1]
        assert calls == [1, 2, 1]  # (the first was done: asked again)

    asyncio.run(main())


def test_a_failed_shared_call_fails_each_asker_and_one_that_stops_waiting_ends_nothing():
    async def main() -> None:
        shared = SharedCalls()
        gate = asyncio.Event()

        async def fail() -> None:
            await gate.wait()
            raise ConnectionError("host gone")

        first = asyncio.ensure_future(shared.call(("due",), fail))
        second = asyncio.ensure_future(shared.call(("due",), fail))
        await asyncio.sleep(0)
        first.cancel()  # (its unit closed)
        await asyncio.sleep(0)
        assert len(shared) == 1  # the call goes on for the other asker
        gate.set()
        with pytest.raises(ConnectionError):
            await second
        assert first.cancelled() and len(shared) == 0

        async def ok() -> str:
            return "fine"

        assert await shared.call(("due",), ok) == "fine"  # a failure is not kept

    asyncio.run(main())


def test_alarms_of_one_loop_share_one_thread_and_each_wakes_at_its_last_instant():
    async def main() -> list[tuple[int, float]]:
        loop = asyncio.get_running_loop()
        before = {t.name for t in threading.enumerate()}
        events = [asyncio.Event() for _ in range(4)]
        alarms = [Alarm(loop, e) for e in events]
        t0 = time.time()
        for i, alarm in enumerate(alarms):
            alarm.at(t0 + 0.05 * (4 - i))  # 0.2, 0.15, 0.1, 0.05 s
        alarms[0].at(t0 + 0.3)  # moved later
        alarms[1].close()  # cleared
        new = {t.name for t in threading.enumerate()} - before
        assert len([n for n in new if n.startswith("raydelay-alarms")]) == 1
        woke: list[tuple[int, float]] = []

        async def wait(i: int) -> None:
            await events[i].wait()
            woke.append((i, time.time() - t0))

        await asyncio.wait([asyncio.create_task(wait(i)) for i in range(4)], timeout=0.6)
        return woke

    woke = asyncio.run(main())
    assert [i for i, _ in woke] == [3, 2, 0]  # the cleared one never
    for (i, at), want in zip(woke, (0.05, 0.1, 0.3), strict=True):
        assert at >= want, f"alarm {i} woke early"


def test_one_metrics_loop_reports_every_started_unit_and_stops_with_the_last(monkeypatch):
    monkeypatch.setattr(unit_module, "_REPORT_S", 0.01)
    recorded: list[list] = []
    monkeypatch.setattr(unit_module, "_record_all", lambda batch: recorded.append(batch))

    class FakeUnit:
        def __init__(self, name: str, changed: bool) -> None:
            self.name, self.changed = name, changed

        def metrics_snapshots(self) -> list:
            return [self.name] if self.changed else []

    async def main() -> None:
        reporter = MetricsLoop.of_loop()
        assert MetricsLoop.of_loop() is reporter  # one per event loop
        a, b, quiet = FakeUnit("a", True), FakeUnit("b", True), FakeUnit("q", False)
        for u in (a, b, quiet):
            reporter.add(u)  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        assert recorded and all(batch == ["a", "b"] for batch in recorded)
        for u in (a, b, quiet):
            reporter.discard(u)  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        assert reporter._task is not None and reporter._task.done()  # nothing left to report

    asyncio.run(main())


def test_the_metrics_loop_looks_less_often_while_nothing_changes(monkeypatch):
    monkeypatch.setattr(unit_module, "_REPORT_S", 0.01)
    monkeypatch.setattr(unit_module, "_IDLE_REPORT_S", 0.04)
    looked: list[float] = []

    class QuietUnit:
        def metrics_snapshots(self) -> list:
            looked.append(time.monotonic())
            return []

    async def main() -> None:
        reporter = MetricsLoop.of_loop()
        unit = QuietUnit()
        reporter.add(unit)  # type: ignore[arg-type]
        await asyncio.sleep(0.3)
        reporter.discard(unit)  # type: ignore[arg-type]

    asyncio.run(main())
    # every 0.01 s that would be about 30 looks; backing off to 0.04 s, at most about 9
    assert 2 <= len(looked) <= 12
    assert looked[-1] - looked[-2] >= 0.04  # (a sleep is never shorter than asked)
