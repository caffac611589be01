"""The cron path of a runner under a manual clock, with kills: what ``tests/unit/test_cron.py``
and ``bench/cron_sim.py`` run for months of simulated time in seconds.

It drives the production code (:func:`raydelay.tasks.cron.fire`, the same steps in the same
order as :class:`raydelay.client.runner.TaskRunner`) against in-memory stand-ins for what
the runner talks to:

- the tasks topic: a message per armed occurrence, delivered when due, held by the runner
  until acknowledged, and delivered again when the runner dies holding it;
- the schedule's named producer: arming an occurrence twice appends it once;
- the store: the schedule record and the done markers.

A kill can fall between any two steps of an occurrence (after it is armed, after its call
ran, after its done marker): the runner loses what it held, and its messages come back.
The cluster can also be down for a while; occurrences due meanwhile fire when it is back,
under the schedule's catch-up policy.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter
from dataclasses import dataclass, field

from raydelay.tasks import cron


@dataclass
class Outcome:
    expected: list[int]  # the occurrences that should have run (all of them, catch_up=all)
    runs: Counter = field(default_factory=Counter)  # occurrence -> times its call ran
    completed: Counter = field(default_factory=Counter)  # ... and reached its done marker
    kills: int = 0
    kills_after_run: int = 0  # kills between a call's end and its done marker
    fired: int = 0  # occurrence messages handled
    early: list[int] = field(default_factory=list)  # occurrences run before they were due
    started_ms: dict[int, int] = field(default_factory=dict)  # occurrence -> its first run

    @property
    def skipped(self) -> list[int]:
        return [t for t in self.expected if self.runs[t] == 0]

    @property
    def ran_twice(self) -> list[int]:
        return [t for t, n in self.runs.items() if n > 1]

    @property
    def unexpected(self) -> list[int]:
        want = set(self.expected)
        return [t for t in self.runs if t not in want]


class _Ports:
    def __init__(self, schedule: cron.Schedule, queue: list, now: list[int]) -> None:
        self.schedule = schedule
        self.queue = queue
        self.now = now
        self.armed: set[int] = set()
        self.done: set[int] = set()

    def load(self, name: str) -> cron.Schedule | None:
        return self.schedule if name == self.schedule.name else None

    def is_done(self, name: str, generation: str, occurrence_ms: int) -> bool:
        return occurrence_ms in self.done

    def arm(self, schedule: cron.Schedule, occurrence_ms: int) -> None:
        if occurrence_ms not in self.armed:  # the named producer's dedup
            self.armed.add(occurrence_ms)
            heapq.heappush(self.queue, (schedule.due_ms(occurrence_ms), occurrence_ms))


def simulate(
    expr: str,
    tz: str,
    start_ms: int,
    days: float,
    *,
    catch_up: str = "all",
    kill_rate: float = 0.02,
    outages: list[tuple[int, int]] = (),  # type: ignore[assignment]
    grace_ms: int = 60_000,
    seed: int = 0,
    start_at_ms: int | None = None,
    end_at_ms: int | None = None,
    jitter_ms: int = 0,
) -> Outcome:
    """Run schedule ``expr`` from ``start_ms`` for ``days``: each step of each occurrence
    is followed by a kill with probability ``kill_rate``; during each ``(from, to)`` of
    ``outages`` (epoch ms) nothing runs. ``start_at_ms``, ``end_at_ms`` and ``jitter_ms``
    are the schedule's."""
    rng = random.Random(seed)
    end = start_ms + int(days * 86_400_000)
    schedule = cron.Schedule(
        name="sim",
        expr=expr,
        timezone=tz,
        catch_up=catch_up,
        spec=b"",
        target="sim",
        generation="g1",
        created_ms=start_ms,
        start_ms=start_at_ms,
        end_ms=end_at_ms,
        jitter_ms=jitter_ms,
    )
    queue: list[tuple[int, int]] = []  # (due, occurrence)
    now = [start_ms]
    ports = _Ports(schedule, queue, now)
    out = Outcome(schedule.occurrences(start_ms + 1, end, limit=10**7))
    first = schedule.next_after(start_ms)
    if first is not None:
        ports.arm(schedule, first)  # schedule_cron arms the first

    def down_until(ms: int) -> int | None:
        for a, b in outages:
            if a <= ms < b:
                return b
        return None

    while queue:
        due, occurrence = queue[0]
        if due > end:
            break
        now[0] = max(now[0], due)
        back = down_until(now[0])
        if back is not None:
            now[0] = back  # the cluster is down: the message waits until it is back
            continue
        heapq.heappop(queue)  # delivered: held until acknowledged

        def killed(occurrence: int = occurrence) -> bool:
            if rng.random() < kill_rate:
                out.kills += 1
                # the runner dies holding it: delivered again once its lease lapses
                heapq.heappush(queue, (now[0] + 10_000, occurrence))
                now[0] += rng.randint(0, 10_000)
                return True
            return False

        out.fired += 1
        _, decision = cron.fire(ports, "sim", "g1", occurrence, now[0], grace_ms)
        if killed():
            continue
        if decision is not None and decision.run:
            out.runs[occurrence] += 1
            out.started_ms.setdefault(occurrence, now[0])
            if now[0] < schedule.due_ms(occurrence):
                out.early.append(occurrence)
            now[0] += rng.randint(0, 2_000)  # the call takes a while
            if killed():
                out.kills_after_run += 1
                continue
            ports.done.add(occurrence)
            out.completed[occurrence] += 1
            if killed():
                continue
        # acknowledged
    return out
