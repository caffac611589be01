"""The driver of one subscription partition: the loop that runs ``Subscription.step`` and
starts the I/O each step asks for.

:class:`StepDriver` steps the subscription whenever something changed (its ``wake`` event
is set) or the step's wake time comes, and starts what the step asks for (sealed segments
to load, a due query of the host's unsealed index, dead letters to publish, the cursor
to write and report to the coordinator), each as a task that wakes it when done, so a
slow store or peer never holds up a due delivery. It wakes the waiting ``receive`` calls
when something is deliverable; with nothing due it wakes once a second at most. An alarm
thread (:mod:`raydelay.actors.alarm`) wakes it at each due instant. It also owns the
partition's tasks, the log reader's among them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from raydelay.actors.alarm import Alarm
from raydelay.actors.subscription.cursor_io import CursorIO
from raydelay.actors.subscription.log_reader import LogReader
from raydelay.actors.subscription.ref import RETRY_S
from raydelay.actors.subscription.sealed_io import SealedIO
from raydelay.clock import Clock
from raydelay.cluster import rpc
from raydelay.dispatch.subscription import Step, Subscription

log = logging.getLogger(__name__)

# The driver's longest sleep with nothing scheduled: every time-driven thing it does says
# when it comes (Step.wake_at_ms), and every change sets its event, so this is only a
# backstop (an idle subscription's loop wakes this seldom).
_IDLE_WAIT_S = 30.0
_ALARM_SLACK_S = 0.002  # the loop's own timer, a fallback should the alarm be late
# the kinds of background I/O, each reported (and its failures retried) on its own
_KINDS = (
    "step",
    "loading sealed segments",
    "querying the unsealed index",
    "publishing dead letters",
    "persisting the cursor",
    "reporting progress",
)


class StepDriver:
    """Runs one partition's ``Subscription.step`` loop and the I/O it asks for; ``wake``
    is the event that makes it step again (set by the log reader, by the calls that
    changed something, and by each piece of I/O that ends)."""

    def __init__(
        self,
        sub: Subscription,
        clock: Clock,
        wake: asyncio.Event,
        reader: LogReader,
        sealed_io: SealedIO,
        cursor_io: CursorIO,
        notify: Callable[[], Awaitable[None]],
        consumer_lease_s: float,
    ) -> None:
        self._sub = sub
        self._clock = clock
        self._wake = wake
        self._reader = reader
        self._sealed_io = sealed_io
        self._cursor_io = cursor_io
        self._notify = notify
        self._consumer_lease_s = consumer_lease_s
        self._tasks: set[asyncio.Task[None]] = set()  # strong references until done
        self._busy: set[str] = set()  # kinds of background I/O under way
        self._retries = {kind: rpc.Retries(log, f"{sub.name}: {kind}") for kind in _KINDS}
        self._loops: list[asyncio.Task[None]] = []
        self._alarm: Alarm | None = None
        self._closed = False

    def start(self) -> None:
        """Start the driver and the log reader (on the running loop)."""
        self._alarm = Alarm(asyncio.get_running_loop(), self._wake)
        self._loops = [
            self.spawn(self._drive()),
            # The log reader long-polls the host for up to a long poll: beside the driver.
            self.spawn(self._reader.run()),
        ]

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` as one of the partition's tasks (stopped with them)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def close(self) -> None:
        """Stop every task (a standing log read among them)."""
        self._stopping()
        for task in list(self._tasks):
            task.cancel()

    async def stop(self) -> None:
        """Stop the loops, and let the I/O under way finish."""
        self._stopping()
        for task in self._loops:
            task.cancel()
        rest = [t for t in self._tasks if t not in self._loops]
        await asyncio.gather(*rest, return_exceptions=True)

    def _stopping(self) -> None:
        self._closed = self._reader.closed = True
        if self._alarm is not None:
            self._alarm.close()

    async def _drive(self) -> None:
        """Step the subscription whenever something changed or its wake time comes; start
        the I/O the step asks for; wake receivers. It never spins: with nothing scheduled
        it waits for a change (or _IDLE_WAIT_S, a backstop)."""
        assert self._alarm is not None  # (started)
        retries = self._retries["step"]
        while not self._closed:
            self._wake.clear()  # (a change while this step runs makes the next one at once)
            wait_s, at_s = _IDLE_WAIT_S, None
            try:
                now = self._clock.now_ms()
                step = self._sub.step(now)
                self._start_io(step)
                if step.wants_read:
                    self._reader.make_room()
                if step.deliverable:
                    await self._notify()
                retries.ok()
                if step.wake_at_ms is not None:
                    at_s = step.wake_at_ms / 1000
            except Exception as exc:  # noqa: BLE001 - reported and retried
                retries.failed(exc)
                wait_s = RETRY_S
            if at_s is not None:
                # the alarm thread wakes the loop on the dot (the loop's own timer, a
                # whole-ms epoll timeout rounded up, would be up to 1 ms late)
                self._alarm.at(at_s)
                wait_s = min(max(at_s - time.time(), 0.0) + _ALARM_SLACK_S, _IDLE_WAIT_S)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=wait_s)
            except TimeoutError:
                pass

    def _start_io(self, step: Step) -> None:
        """Start the I/O ``step`` asks for, each as a task that wakes the driver when done
        (a slow store or peer never holds up a due delivery)."""
        for consumer_id, handed_back in step.expired:
            log.warning(
                "%s: consumer %s not heard from for %.0f s (subscription.consumer_lease_s): "
                "removed, %d unacknowledged messages go back for redelivery",
                self._sub.name,
                consumer_id,
                self._consumer_lease_s,
                handed_back,
            )
        sealed = self._sub.sealed
        if step.loads and sealed is not None:
            self._start(
                "loading sealed segments", self._sealed_io.load(sealed, step.loads), once=False
            )
        if step.tail_query is not None and sealed is not None:
            # (one at a time already: the subscription asks again only once it is answered)
            query = self._sealed_io.query_tail(sealed, step.tail_query)
            self._start("querying the unsealed index", query, once=False)
        if step.dead_letters:
            flush = self._sub.flush_dead_letters(self._reader.read_rows)
            self._start("publishing dead letters", flush)
        if step.persist:
            self._start("persisting the cursor", self._persist())

    async def _persist(self) -> bool:
        """The periodic cursor write, the deliver_at of rows settled without it read from
        the log first: it is persisted with them, before retention may delete their
        ledgers (see :mod:`raydelay.dispatch.settled`). Then the progress report to the
        coordinator, as I/O of its own: a coordinator that is being replaced (seconds,
        after a lost node) must not hold up the next cursor write, which moves the delayed
        mark that due delayed rows wait for."""
        learned = False
        if self._sub.sealed is not None:
            try:
                learned = await self._sub.settled.learn_unknown(self._reader.read_rows)
            except Exception as exc:  # noqa: BLE001 - the cursor is written all the same
                log.info("%s: reading settled rows' deliver_at: %s", self._sub.name, exc)
        report = self._cursor_io.progress_report(self._sub)  # (what this write covers)
        state = self._sub.marks.state()
        wrote = await self._sub.persist()
        if not (wrote or learned or self._cursor_io.to_report(report)):
            self._sub.marks.quiet(state)  # (an idle subscription: look again much later)
        self._start("reporting progress", self._cursor_io.report_progress(report))
        return wrote or learned

    def _start(self, kind: str, coro: Coroutine[Any, Any, Any], once: bool = True) -> None:
        """Run ``coro`` as a task reported under ``kind``; with ``once``, not while another
        of its kind is under way."""
        if once and kind in self._busy:
            coro.close()
            return
        self._busy.add(kind)
        task = self.spawn(self._io(kind, coro))
        # a task cancelled before it ran (the partition closing) never awaited ``coro``:
        # closed here, it is not reported as "never awaited" when it is collected
        task.add_done_callback(lambda _: coro.close())

    async def _io(self, kind: str, coro: Coroutine[Any, Any, Any]) -> None:
        """Run one piece of I/O; then the driver steps again, unless it returned False (it
        changed nothing: an idle cursor check, which would otherwise wake it twice a
        second)."""
        changed: Any = True
        try:
            changed = await coro
            self._retries[kind].ok()
        except Exception as exc:  # noqa: BLE001 - reported and retried by a later step
            self._retries[kind].failed(exc)
            await asyncio.sleep(RETRY_S)  # (still busy: the next step does not retry at once)
        finally:
            self._busy.discard(kind)
            if changed is not False:
                self._wake.set()
