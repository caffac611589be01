"""Recurring schedules: one delayed message per occurrence, the next armed when one fires.

A schedule is a record in the store (``tasks/schedules/<name>``): the cron expression
(parsed by croniter), its time zone, the catch-up policy, the call to make, whether it is
paused, and a generation that a re-created schedule of the same name does not share.

When occurrence ``T`` fires, in this order:

1. the record is read: a deleted schedule, or another generation, ends the chain here;
2. an occurrence already done (its done marker exists) is acknowledged and nothing runs;
3. the next occurrence is armed: a message due at it, appended by the schedule's named
   producer with the occurrence time as sequence id, so arming it again (after a crash,
   or a redelivery of ``T``) appends nothing;
4. ``T`` runs (or is passed over, by the catch-up policy, or because the schedule is
   paused), and its done marker is written before its message is acknowledged.

So a crash at any point neither skips an occurrence (the next is armed before ``T`` is
acknowledged) nor starts a second chain (arming is idempotent). A crash while ``T``'s call
runs makes it run again, with the same idempotency key: at least once, as for every task.

Catch-up: when ``T`` fires late, after the cluster was down,

- ``all`` runs every missed occurrence, one after the other;
- ``latest`` runs only the most recent one that is due;
- ``none`` runs none that is more than ``grace`` late, and arms the next one to come.

:func:`decide` is the policy, with the clock given: no I/O, tested with a manual clock.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from raydelay.errors import InvalidArgument

CATCH_UP = ("all", "latest", "none")
OVERLAP = ("allow_all", "skip", "buffer_one")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
SCHEDULE_PREFIX = "tasks/schedules/"
DONE_PREFIX = "tasks/done/"
RUNNING_PREFIX = "tasks/cron-running/"  # the occurrence of a schedule that last started
BUFFERED_PREFIX = "tasks/cron-buffered/"  # buffer_one: the occurrence waiting for it


@dataclass
class Schedule:
    name: str
    expr: str
    timezone: str
    catch_up: str
    spec: bytes  # the call (an encoded TaskSpec, without its occurrence)
    target: str  # what it calls, for listings
    generation: str
    paused: bool = False
    created_ms: int = 0
    start_ms: int | None = None  # no occurrence before it
    end_ms: int | None = None  # ... nor after it: the chain ends there
    jitter_ms: int = 0  # each occurrence is due up to this much after its time (see due_ms)
    overlap: str = "allow_all"  # when an occurrence fires while the one before still runs

    def to_bytes(self) -> bytes:
        d = asdict(self)
        d["spec"] = self.spec.hex()
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Schedule:
        d = json.loads(data)
        d["spec"] = bytes.fromhex(d["spec"])
        return cls(**d)  # (a record stored before a field has its default)

    def next_after(self, ms: int) -> int | None:
        """The first occurrence strictly after ``ms`` (epoch ms), not before ``start_ms``;
        None when it would be after ``end_ms`` (the schedule is over)."""
        if self.start_ms is not None:
            ms = max(ms, self.start_ms - 1)
        found = next_occurrence(self.expr, self.timezone, ms)
        if self.end_ms is not None and found > self.end_ms:
            return None
        return found

    def due_ms(self, occurrence_ms: int) -> int:
        """When occurrence ``occurrence_ms`` is due: its time, plus, with ``jitter_ms``, an
        offset in ``[0, jitter_ms)`` drawn from the schedule's name, generation and the
        occurrence, so that arming it again gives the same time, and schedules sharing a
        cron expression spread out."""
        if not self.jitter_ms:
            return occurrence_ms
        seed = f"{self.name}/{self.generation}/{occurrence_ms}".encode()
        draw = int.from_bytes(hashlib.blake2b(seed, digest_size=8).digest(), "big")
        return occurrence_ms + draw % self.jitter_ms

    def occurrences(self, from_ms: int, to_ms: int, limit: int) -> list[int]:
        """The occurrences in ``[from_ms, to_ms]``, at most ``limit`` (InvalidArgument
        when there are more)."""
        out: list[int] = []
        t = self.next_after(from_ms - 1)
        while t is not None and t <= to_ms:
            if len(out) == limit:
                raise InvalidArgument(
                    f"end: the window holds more than {limit:,} occurrences of {self.expr!r}; "
                    "backfill it in parts"
                )
            out.append(t)
            t = self.next_after(t)
        return out


def schedule_key(name: str) -> str:
    return f"{SCHEDULE_PREFIX}{name}"


def done_key(name: str, generation: str, occurrence_ms: int) -> str:
    return f"{DONE_PREFIX}{name}/{generation}/{occurrence_ms}"


def is_name(name: object) -> bool:
    """Whether ``name`` could name a schedule."""
    return isinstance(name, str) and bool(_NAME.match(name))


def check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidArgument(
            f"name: expected 1-128 letters, digits, '_', '.' or '-' (starting with a letter or "
            f"digit), got {name!r}"
        )
    return name


def check_cron(expr: object) -> str:
    """A cron expression croniter accepts: 5 fields, or 6 with seconds last."""
    if not isinstance(expr, str) or not expr.strip():
        raise InvalidArgument(f"cron: expected a cron expression such as '0 2 * * *', got {expr!r}")
    expr = " ".join(expr.split())
    if len(expr.split()) not in (5, 6) or not croniter.is_valid(expr):
        raise InvalidArgument(
            f"cron: {expr!r} is not a valid cron expression (5 fields: minute hour day month "
            "weekday, or 6 with seconds last)"
        )
    return expr


def check_timezone(tz: object) -> str:
    if not isinstance(tz, str) or not tz:
        raise InvalidArgument(
            f"timezone: expected an IANA zone name such as 'Europe/Paris', got {tz!r}"
        )
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument(f"timezone: {tz!r} is not a known time zone") from None
    return tz


def check_overlap(value: object) -> str:
    if value not in OVERLAP:
        raise InvalidArgument(f"overlap: expected one of {', '.join(OVERLAP)}, got {value!r}")
    return str(value)


def marker_key(prefix: str, name: str, generation: str) -> str:
    return f"{prefix}{name}/{generation}"


def check_catch_up(value: object) -> str:
    if value not in CATCH_UP:
        raise InvalidArgument(f"catch_up: expected one of {', '.join(CATCH_UP)}, got {value!r}")
    return str(value)


def next_occurrence(expr: str, tz: str, after_ms: int) -> int:
    """The first occurrence of ``expr`` in zone ``tz`` strictly after ``after_ms``.

    Daylight saving, as cron has it: a time the spring change skips runs at the first
    instant after the gap; a time the autumn change repeats runs once, at its first
    instance, for an expression with fixed hours (``"30 2 * * *"``), while one that runs
    every hour (hour field ``*``) keeps its real-time rhythm through the repeated hour."""
    zone = ZoneInfo(tz)
    fixed_hours = expr.split()[1] != "*"
    ms = after_ms
    while True:
        start = datetime.fromtimestamp(ms / 1000, tz=UTC).astimezone(zone)
        nxt = croniter(expr, start).get_next(datetime)
        found = int(round(nxt.timestamp() * 1000))
        if found <= ms:  # (croniter works in whole seconds)
            ms += 1
            continue
        local = datetime.fromtimestamp(found / 1000, tz=zone)
        if fixed_hours and local.fold == 1 and _repeated(local, zone):
            ms = found  # the second instance of a repeated wall time: it ran at the first
            continue
        return found


def _repeated(local: datetime, zone: ZoneInfo) -> bool:
    """Whether ``local`` (fold 1) is a wall time the clock shows twice."""
    first = local.replace(fold=0)
    return first.utcoffset() != local.utcoffset()


@dataclass(frozen=True)
class Decision:
    """What to do when occurrence ``T`` fires: run it or not, and which occurrence to arm
    next (due at its own time: at once when that has passed; None: none, the schedule
    is over, past its ``end_ms``)."""

    run: bool
    arm_ms: int | None
    why: str  # "due", "catch-up", "paused", "passed over"


def decide(schedule: Schedule, occurrence_ms: int, now_ms: int, grace_ms: int) -> Decision:
    """The policy for occurrence ``occurrence_ms`` firing at ``now_ms`` (late: more than
    ``grace_ms`` after it was due, its jitter included)."""
    t = occurrence_ms
    nxt = schedule.next_after(t)
    if schedule.paused:  # the chain goes on, nothing runs, and nothing is caught up later
        return Decision(False, schedule.next_after(max(t, now_ms)), "paused")
    late = now_ms - schedule.due_ms(t) > grace_ms
    if schedule.catch_up == "all" or not late:
        return Decision(True, nxt, "catch-up" if late else "due")
    if schedule.catch_up == "latest":
        if nxt is None or nxt > now_ms:
            return Decision(True, nxt, "catch-up")  # the most recent one due: it runs
        latest = nxt
        while True:  # the most recent occurrence that is due now
            after = schedule.next_after(latest)
            if after is None or after > now_ms:
                break
            latest = after
        return Decision(False, latest, "passed over")
    return Decision(False, schedule.next_after(now_ms), "passed over")  # none


@dataclass(frozen=True)
class Slot:
    """What a schedule's overlap policy looks at: the occurrence that last started running
    (None: none yet) and whether it is done, and (buffer_one) the occurrence waiting for
    it and whether that one is done."""

    running: int | None = None
    running_done: bool = True
    buffered: int | None = None
    buffered_done: bool = True


def overlap(policy: str, occurrence_ms: int, slot: Slot) -> str:
    """Whether occurrence ``occurrence_ms``, which its catch-up policy lets run, runs
    (``"run"``), is passed over (``"skip"``), or waits for the one still running
    (``"wait"``, buffer_one), given what runs (``slot``).

    - ``allow_all``: it runs, whatever runs already;
    - ``skip``: it is passed over while another occurrence runs (a failed run waiting
      for its retry counts as running: it is not done);
    - ``buffer_one``: it waits until the one running is done, then runs; while one waits
      already, another that comes is passed over.

    Another occurrence is running when ``slot.running`` is not this one and not done; the
    occurrence ``slot.running`` names always runs (again: a kill cut its run short)."""
    if policy == "allow_all" or slot.running == occurrence_ms:
        return "run"  # (the one that last started: a run a kill cut short runs again)
    other_runs = (
        slot.running is not None and slot.running != occurrence_ms and not slot.running_done
    )
    if policy == "skip":
        return "skip" if other_runs else "run"
    queued = (  # another occurrence waits its turn (it has not started, nor ended)
        slot.buffered is not None
        and slot.buffered != occurrence_ms
        and not slot.buffered_done
        and slot.buffered != slot.running
    )
    if queued:
        return "skip"
    return "wait" if other_runs else "run"


class CronPorts(Protocol):
    """What firing an occurrence needs from the cluster (the runner's, or a simulation's)."""

    def load(self, name: str) -> Schedule | None: ...

    def is_done(self, name: str, generation: str, occurrence_ms: int) -> bool: ...

    def arm(self, schedule: Schedule, occurrence_ms: int) -> None: ...


def fire(
    ports: CronPorts,
    name: str,
    generation: str,
    occurrence_ms: int,
    now_ms: int,
    grace_ms: int,
) -> tuple[Schedule | None, Decision | None]:
    """Steps 1 to 3 of an occurrence firing (see the module's docstring): the schedule and
    the decision when the occurrence should run, (None, None) when the chain ends or the
    occurrence is done already. The caller runs it when ``decision.run``, writes its done
    marker, then acknowledges its message."""
    schedule = ports.load(name)
    if schedule is None or schedule.generation != generation:
        return None, None
    if ports.is_done(name, generation, occurrence_ms):
        return schedule, None
    decision = decide(schedule, occurrence_ms, now_ms, grace_ms)
    if decision.arm_ms is not None:  # (None: past end_ms, the chain ends with this one)
        ports.arm(schedule, decision.arm_ms)
    return schedule, decision
