"""Wake-ups for an actor's event loop at wall-clock instants, to the tenth of a millisecond.

An asyncio loop's own timers wake through ``epoll_wait``, whose timeout is whole
milliseconds rounded up: a loop told to wake at a due instant wakes 0.5 ms after it on
average and up to 1 ms (and once more when it woke a hair early and found nothing due).
One thread per event loop (:class:`AlarmClock`) sleeps on a condition, whose timed wait
has nanosecond resolution, until the earliest instant any :class:`Alarm` of that loop was
given, and sets that alarm's event through ``call_soon_threadsafe`` when it comes:
measured here, a wake-up 0.05-0.2 ms after the instant. A host of a hundred subscription
partitions keeps one such thread, not a hundred, and moving an alarm later wakes nobody.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
import weakref

_IDLE_CHECK_S = 60.0  # with nothing to wake, the thread looks this often whether its loop ended


class AlarmClock:
    """The alarm thread of one event loop (see the module docstring)."""

    _clocks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AlarmClock] = (
        weakref.WeakKeyDictionary()
    )
    _clocks_lock = threading.Lock()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._cv = threading.Condition(threading.Lock())
        self._at: dict[int, tuple[float, asyncio.Event]] = {}  # alarm id -> (epoch s, event)
        self._heap: list[tuple[float, int]] = []  # (epoch s, alarm id); stale ones skipped
        self._ids = itertools.count()
        self._closed = False
        name = f"raydelay-alarms-{id(loop):x}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> AlarmClock:
        with cls._clocks_lock:
            clock = cls._clocks.get(loop)
            if clock is None or clock._closed:
                clock = cls._clocks[loop] = cls(loop)
            return clock

    def new_id(self) -> int:
        return next(self._ids)

    def set(self, alarm_id: int, event: asyncio.Event, at_s: float | None) -> None:
        """Set ``event`` at ``at_s`` (epoch seconds) instead of what alarm ``alarm_id`` was
        given; None: not at all."""
        with self._cv:
            old = self._at.get(alarm_id)
            if old is not None and old[0] == at_s:
                return
            if at_s is None:
                self._at.pop(alarm_id, None)  # (its heap entry is skipped when it comes up)
                return
            earliest = self._heap[0][0] if self._heap else None
            self._at[alarm_id] = (at_s, event)
            heapq.heappush(self._heap, (at_s, alarm_id))
            if len(self._heap) > 4 * len(self._at) + 64:  # stale entries: rebuild
                self._heap = [(t, i) for i, (t, _) in self._at.items()]
                heapq.heapify(self._heap)
            if earliest is None or at_s < earliest:
                self._cv.notify()  # (a later instant does not need the thread awake)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    def _run(self) -> None:
        with self._cv:
            while not self._closed:
                if not self._heap:
                    if self._loop.is_closed():  # (a test's loop: nothing can be woken now)
                        self._closed = True
                        return
                    self._cv.wait(_IDLE_CHECK_S)
                    continue
                at_s, alarm_id = self._heap[0]
                current = self._at.get(alarm_id)
                if current is None or current[0] != at_s:
                    heapq.heappop(self._heap)  # moved or cleared since
                    continue
                left = at_s - time.time()
                if left > 0:
                    self._cv.wait(left)
                    continue
                heapq.heappop(self._heap)
                del self._at[alarm_id]
                try:
                    self._loop.call_soon_threadsafe(current[1].set)
                except RuntimeError:  # the loop is closed: the actor is going away
                    self._closed = True
                    return


class Alarm:
    """Sets ``event`` (of ``loop``) at the instant last given to :meth:`at`, through the
    loop's :class:`AlarmClock`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
        self._clock = AlarmClock.of(loop)
        self._id = self._clock.new_id()
        self._event = event

    def at(self, at_s: float | None) -> None:
        """Wake the loop at ``at_s`` (epoch seconds) instead of what was set; None: not at
        all (until set again)."""
        self._clock.set(self._id, self._event, at_s)

    def close(self) -> None:
        self._clock.set(self._id, self._event, None)
