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
from raydelay.tasks.spec import TaskSpec


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


@dataclass
class OverlapOutcome:
    expected: list[int]
    started: dict[int, list[int]] = field(default_factory=dict)  # occurrence -> start times
    skipped: list[int] = field(default_factory=list)  # passed over: another one ran
    most_running: int = 0  # the most live runs at one instant
    most_waiting: int = 0  # the most occurrences held waiting at one instant
    waits_ms: list[int] = field(default_factory=list)  # a held one: start - the other's end
    kills: int = 0

    @property
    def lost(self) -> list[int]:
        return [t for t in self.expected if t not in self.started and t not in self.skipped]


def simulate_overlap(
    expr: str,
    start_ms: int,
    days: float,
    *,
    overlap: str,
    run_ms: tuple[int, int],
    kill_rate: float = 0.0,
    seed: int = 0,
) -> OverlapOutcome:
    """Schedule ``expr`` (catch_up all) under its ``overlap`` policy, each run lasting a
    random ``run_ms`` span, so that runs outlast their interval; the runner takes each
    due occurrence at once and runs any number at a time, as the real one does; a kill
    (probability ``kill_rate`` per occurrence delivered) ends every run and wait of the
    runner, and their messages come back after the lease (10 s). It drives the runner's
    own steps: ``cron.fire``, and the store markers of
    :class:`raydelay.tasks.overlap.Overlaps` over an in-memory store."""
    from raydelay.storage import MemoryObjectStore
    from raydelay.tasks.overlap import Overlaps

    rng = random.Random(seed)
    end = start_ms + int(days * 86_400_000)
    schedule = cron.Schedule(
        name="sim", expr=expr, timezone="UTC", catch_up="all", spec=b"", target="sim",
        generation="g1", created_ms=start_ms, overlap=overlap,
    )  # fmt: skip
    now = [start_ms]
    store = MemoryObjectStore()
    gate = Overlaps(store, clock_s=lambda: now[0] / 1000)
    events: list[tuple[int, int, str, int, int]] = []  # (at, seq, kind, occurrence, life)
    seq = [0]

    def push(at: int, kind: str, occurrence: int, life: int = 0) -> None:
        seq[0] += 1
        heapq.heappush(events, (at, seq[0], kind, occurrence, life))

    class _SimPorts(_Ports):
        def is_done(self, name: str, generation: str, occurrence_ms: int) -> bool:
            return bool(store.exists(cron.done_key(name, generation, occurrence_ms)))

        def arm(self, schedule: cron.Schedule, occurrence_ms: int) -> None:
            if occurrence_ms not in self.armed:
                self.armed.add(occurrence_ms)
                push(schedule.due_ms(occurrence_ms), "deliver", occurrence_ms)

    ports = _SimPorts(schedule, [], now)
    out = OverlapOutcome(schedule.occurrences(start_ms + 1, end, limit=10**7))
    first = schedule.next_after(start_ms)
    if first is not None:
        ports.arm(schedule, first)
    life = [0]  # the runner's life: a kill starts another
    running: dict[int, int] = {}  # occurrence -> when it ends (live runs)
    was_held: set[int] = set()
    ended_at: dict[int, int] = {}

    def mark_done(t: int) -> None:
        store.put(cron.done_key("sim", "g1", t), b"")

    def start(t: int) -> None:
        gate.started(schedule, t)
        out.started.setdefault(t, []).append(now[0])
        before = [e for o, e in ended_at.items() if o < t]
        if t in was_held and out.started[t] == [now[0]] and before:
            out.waits_ms.append(now[0] - max(before))
        running[t] = now[0] + rng.randint(*run_ms)
        push(running[t], "finish", t, life[0])
        out.most_running = max(out.most_running, len(running))

    class _Held:
        def __init__(self, t: int) -> None:
            self.message_id = f"m{t}"

    while events:
        at, _, kind, t, who = heapq.heappop(events)
        if at > end + 10 * 86_400_000:
            break
        now[0] = max(now[0], at)
        if kind == "finish":
            if who == life[0] and t in running:
                del running[t]
                mark_done(t)
                ended_at[t] = now[0]
        elif kind == "deliver":
            if t > end:
                continue
            if rng.random() < kill_rate:  # the runner dies: its runs and waits end
                out.kills += 1
                life[0] += 1
                lost = list(running) + [int(s.occurrence_ms) for _, s, _, _ in gate._held.values()]
                running.clear()
                gate.forget()
                for o in {*lost, t}:
                    push(now[0] + 10_000, "deliver", o)
                continue
            found, decision = cron.fire(ports, "sim", "g1", t, now[0], 10**12)
            if found is None or decision is None or not decision.run:
                continue
            verdict = gate.verdict(schedule, t)
            if verdict == "run":
                start(t)
            elif verdict == "skip":
                out.skipped.append(t)
                mark_done(t)
            else:
                spec = TaskSpec("fn", "sim", occurrence_ms=t)
                gate.hold(_Held(t), spec, b"", schedule)
                was_held.add(t)
                out.most_waiting = max(out.most_waiting, gate.held)
                push(now[0] + 1_000, "look", t)
        elif kind == "look" and gate.held:
            for _, spec, _, _ in gate.turn():
                start(int(spec.occurrence_ms))
            if gate.held:
                push(now[0] + 1_000, "look", t)
    return out
