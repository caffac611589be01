"""The overlap policy of recurring schedules, as a runner applies it (see
:func:`raydelay.tasks.cron.overlap` for the policy itself).

Two markers per schedule generation live in the store: the occurrence that last started
running, and (``buffer_one``) the occurrence waiting for it. Whether either is still
running is read from its done marker, which every occurrence gets once it ends (run,
dead, or passed over). A waiting occurrence is held by the runner that fired it, its
message unacknowledged, and looked at again once a second; if that runner dies, the
message comes back and waits again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from raydelay.errors import NotFound
from raydelay.tasks import cron

LOOK_AGAIN_S = 1.0


class Overlaps:
    """One runner's side of the overlap policies."""

    def __init__(self, store: Any, clock_s: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._clock_s = clock_s  # (a simulation's manual clock)
        self._held: dict[str, tuple[Any, Any, bytes, cron.Schedule]] = {}  # by message id
        self._looked = -LOOK_AGAIN_S

    def verdict(self, schedule: cron.Schedule, occurrence_ms: int) -> str:
        """``"run"``, ``"skip"`` or ``"wait"`` for the occurrence (see ``cron.overlap``)."""
        if schedule.overlap == "allow_all":
            return "run"
        return cron.overlap(schedule.overlap, occurrence_ms, self._slot(schedule))

    def started(self, schedule: cron.Schedule, occurrence_ms: int) -> None:
        """The occurrence starts running: it is the one the next occurrences look at."""
        if schedule.overlap != "allow_all":
            self._put(cron.RUNNING_PREFIX, schedule, occurrence_ms)

    def hold(self, m: Any, spec: Any, args: bytes, schedule: cron.Schedule) -> None:
        """The occurrence waits its turn (buffer_one)."""
        self._put(cron.BUFFERED_PREFIX, schedule, int(spec.occurrence_ms))
        self._held[str(m.message_id)] = (m, spec, args, schedule)

    @property
    def held(self) -> int:
        return len(self._held)

    def turn(self) -> list[tuple[Any, Any, bytes, cron.Schedule]]:
        """The held occurrences whose turn came (once a second at most): they run now."""
        if not self._held or self._clock_s() - self._looked < LOOK_AGAIN_S:
            return []
        self._looked = self._clock_s()
        out = []
        for mid, (m, spec, args, schedule) in list(self._held.items()):
            if self.verdict(schedule, int(spec.occurrence_ms)) == "run":
                del self._held[mid]
                out.append((m, spec, args, schedule))
        return out

    def forget(self) -> None:
        """Stopping: the consumer's close hands the held messages back."""
        self._held.clear()

    def _slot(self, schedule: cron.Schedule) -> cron.Slot:
        running = self._get(cron.RUNNING_PREFIX, schedule)
        buffered = self._get(cron.BUFFERED_PREFIX, schedule)
        return cron.Slot(
            running=running,
            running_done=running is None or self._done(schedule, running),
            buffered=buffered,
            buffered_done=buffered is None or self._done(schedule, buffered),
        )

    def _done(self, schedule: cron.Schedule, occurrence_ms: int) -> bool:
        key = cron.done_key(schedule.name, schedule.generation, occurrence_ms)
        return bool(self._store.exists(key))

    def _put(self, prefix: str, schedule: cron.Schedule, occurrence_ms: int) -> None:
        key = cron.marker_key(prefix, schedule.name, schedule.generation)
        self._store.put(key, json.dumps({"occurrence": int(occurrence_ms)}).encode())

    def _get(self, prefix: str, schedule: cron.Schedule) -> int | None:
        key = cron.marker_key(prefix, schedule.name, schedule.generation)
        try:
            return int(json.loads(self._store.get(key))["occurrence"])
        except NotFound:
            return None
