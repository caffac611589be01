"""A wake-up for an actor's event loop at a wall-clock instant, to the tenth of a millisecond.

An asyncio loop's own timers wake through ``epoll_wait``, whose timeout is whole
milliseconds rounded up: a loop told to wake at a due instant wakes 0.5 ms after it on
average and up to 1 ms (and once more when it woke a hair early and found nothing due).
:class:`Alarm` keeps one thread asleep on a condition, whose timed wait has nanosecond
resolution, and sets the loop's event through ``call_soon_threadsafe`` when the instant
comes: measured here, a wake-up 0.05-0.2 ms after the instant.
"""

from __future__ import annotations

import asyncio
import threading
import time


class Alarm:
    """Sets ``event`` (of ``loop``) at the instant last given to :meth:`at`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event, name: str) -> None:
        self._loop = loop
        self._event = event
        self._cv = threading.Condition(threading.Lock())
        self._at_s: float | None = None  # epoch seconds; None: nothing to wake for
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def at(self, at_s: float | None) -> None:
        """Wake the loop at ``at_s`` (epoch seconds) instead of what was set; None: not at
        all (until set again)."""
        with self._cv:
            if at_s != self._at_s:
                self._at_s = at_s
                self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    def _run(self) -> None:
        with self._cv:
            while not self._closed:
                if self._at_s is None:
                    self._cv.wait()
                    continue
                left = self._at_s - time.time()
                if left > 0:
                    self._cv.wait(left)
                    continue
                self._at_s = None
                try:
                    self._loop.call_soon_threadsafe(self._event.set)
                except RuntimeError:  # the loop is closed: the actor is going away
                    return
