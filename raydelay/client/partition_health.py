"""Which of a consumer's partitions are down, and the calls kept for them.

A partition whose actor fails a call (a restart, a lost node) or stops answering is
*down* for this consumer until its backoff runs out: the retry thread then looks its
actor up again by name, and sends the acks and nacks kept for it meanwhile (they are
idempotent), in their order. The other partitions go on. For its first few seconds down
a partition is tried every 50 ms (an actor Ray restarts is back within about a second),
then with a growing backoff (0.1 s up to 0.5 s).

A failover is said in one line, at INFO, once every partition of the actor answers
again (and a second after, so that a late failure of a call sent before it counts in):
which partitions, how long, and where their actor went (:class:`Outage`). Only an
outage longer than ``SLOW_OUTAGE_S`` is said while it lasts, once, as a warning.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from raydelay.errors import StorageError, Unavailable
from raydelay.retries import Backoff

if TYPE_CHECKING:
    from raydelay.client.links import SubscriptionLink

log = logging.getLogger(__name__)

Nack = tuple[float, int]  # a nack on its way: (delay_s, when it was made, epoch ms)
Work = list[tuple[np.ndarray, Nack | None]]  # kept calls of a partition: (keys, nack or None)

# the waits before a down partition is tried again: every 50 ms (jittered) for its first
# RESTART_POLL_S, the time a restarted actor takes to come back, then 0.1 s doubling up
# to 0.5 s (a poll is one name lookup and one call: it costs little), so a partition back
# after a long outage is found within 0.75 s (jittered)
RESTART_POLL = Backoff(first_s=0.05, max_s=0.05)
RESTART_POLL_S = 3.0
DOWN_BACKOFF = Backoff(first_s=0.1, max_s=0.5)
IDLE_RETRY_S = 1.0  # the retry thread's wait while no partition is down
SLOW_OUTAGE_S = 10.0  # an outage is said while it lasts (a warning) once it is this long
# An outage is said this long after its partitions answered again, and a failure within it
# belongs to the same outage: a call sent to the old actor before the failover may fail
# after it (one failover, one line)
SETTLE_S = 1.0
_UNKNOWN = "?"  # a node not looked up yet


@dataclasses.dataclass
class Outage:
    """An actor whose partitions are down for this consumer: since when, which are still
    down, where the actor was (looked up on the retry thread), the first error."""

    actor: str
    since: float
    error: str
    down: set[int] = dataclasses.field(default_factory=set)
    partitions: set[int] = dataclasses.field(default_factory=set)  # every one it took down
    node: str | None = _UNKNOWN
    ended: float | None = None  # when its last partition answered again
    warned: bool = False


def partition_ranges(partitions: Iterable[int]) -> str:
    """``0-3, 6`` for 0, 1, 2, 3, 6."""
    out: list[str] = []
    run: list[int] = []
    for p in sorted(partitions):
        if run and p == run[-1] + 1:
            run.append(p)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [p]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ", ".join(out)


def _short(node: str | None) -> str:
    return "an unknown node" if node in (None, _UNKNOWN) else f"node {node[:8]}"


class PartitionHealth:
    """The down partitions of one consumer, their backoffs and kept calls, and the
    retry thread's work. ``send(p, work)`` makes the ack and nack calls for kept work."""

    def __init__(
        self,
        link: SubscriptionLink,
        what: str,
        send: Callable[[int, Work], list[Any]],
        stop: threading.Event,
    ) -> None:
        self._link = link
        self._what = what  # "topic/subscription", for the log
        self._send = send
        self._stop = stop
        # partitions found down: when to try again (0: looked up again, may be asked)
        self.down: dict[int, float] = {}
        self._backoff: dict[int, Iterator[float]] = {}  # a down partition's next waits
        self._down_since: dict[int, float] = {}  # when a down partition failed first
        # acks and nacks of down partitions, to send once they answer
        self.deferred: dict[int, Work] = {}
        self.lock = threading.Lock()  # down, deferred (the retry thread too)
        self._retrying = threading.Condition(self.lock)  # notified as _sending empties
        self._sending = 0  # kept calls the retry thread is sending now
        self.retry_now = threading.Event()  # wakes the retry thread before its next tick
        self.outages: dict[str, Outage] = {}  # by actor name (under ``lock``)

    def failed(self, p: int, exc: Exception) -> None:
        """Partition ``p`` failed a call: down until its backoff runs out (the retry thread
        wakes at that instant)."""
        with self.lock:
            now = time.monotonic()
            first = p not in self.down
            if first or p not in self._backoff:
                self._backoff[p] = DOWN_BACKOFF.delays_s()
                self._down_since[p] = now
            if now - self._down_since[p] < RESTART_POLL_S:
                wait_s = next(RESTART_POLL.delays_s())
            else:
                wait_s = next(self._backoff[p])
            self.down[p] = now + wait_s
        log.debug(
            "%s partition %d: call failed (%s); next try in %.3f s",
            self._what, p, exc, self.down[p] - time.monotonic(),
        )  # fmt: skip
        if first:
            actor = self._link.actor_of(p)
            with self.lock:
                outage = self.outages.get(actor)
                if outage is not None and outage.ended is not None:
                    if now - outage.ended < SETTLE_S:
                        outage.ended = None  # (the same failover)
                    else:
                        outage = None
                if outage is None:
                    outage = self.outages[actor] = Outage(actor, now, _plain(exc))
                outage.down.add(p)
                outage.partitions.add(p)
        self.retry_now.set()  # (the retry thread waits for the earliest lapse)

    def up(self, p: int) -> None:
        if p in self.down:
            with self.lock:
                self.down.pop(p, None)
                self._backoff.pop(p, None)
                self._down_since.pop(p, None)
                for outage in self.outages.values():
                    if p in outage.down:
                        outage.down.discard(p)
                        if not outage.down:
                            outage.ended = time.monotonic()  # (said SETTLE_S later)
            log.debug("%s partition %d: answering again", self._what, p)

    def report_outages(self) -> None:
        """On the retry thread: learn where a new outage's actor was, warn once of an
        outage that lasts, and say each one that ended (SETTLE_S ago), in one line."""
        with self.lock:
            outages = list(self.outages.values())
        now = time.monotonic()
        for o in outages:
            if o.node == _UNKNOWN and o.ended is None:
                o.node = self._node_of(o)  # (not re-created yet: the retry thread does that)
            if o.ended is None and not o.warned and now - o.since >= SLOW_OUTAGE_S:
                o.warned = True
                log.warning(
                    "%s: partitions %s down for %.1f s (their unit %s on %s: %s); their "
                    "messages wait, the other partitions go on",
                    self._what, partition_ranges(o.down), now - o.since, o.actor,
                    _short(o.node), o.error,
                )  # fmt: skip
            if o.ended is not None and now - o.ended >= SETTLE_S:
                with self.lock:
                    if self.outages.get(o.actor) is not o or o.ended is None:
                        continue
                    del self.outages[o.actor]
                after = self._node_of(o)
                if o.node in (None, _UNKNOWN):
                    where = f"is on {_short(after)}"
                elif after == o.node:
                    where = f"was restarted on {_short(after)}"
                else:
                    where = f"moved from {_short(o.node)} to {_short(after)}"
                log.info(
                    "%s: partitions %s answer again after %.1f s; their unit %s %s (down "
                    "on: %s)",
                    self._what, partition_ranges(o.partitions), o.ended - o.since,
                    o.actor, where, o.error,
                )  # fmt: skip

    def _node_of(self, outage: Outage) -> str | None:
        try:
            return self._link.node_of(min(outage.partitions))
        except Exception:  # noqa: BLE001 - only for the log line
            return None

    def next_retry_s(self, timeout_s: float) -> float:
        """How long a receive with every partition down waits for the first retry."""
        retry = min(self.down.values(), default=time.monotonic()) - time.monotonic()
        return min(max(retry, 0.01), max(timeout_s, 0.01))

    def defer(self, p: int, keys: np.ndarray, nack: Nack | None) -> None:
        with self.lock:
            self.deferred.setdefault(p, []).append((keys, nack))
        self.retry_now.set()

    def has_kept(self) -> bool:
        """Whether any acks or nacks are kept for a down partition, or being sent again."""
        with self.lock:
            return bool(self.deferred) or self._sending > 0

    def keeps(self, p: int) -> bool:
        """Whether calls of ``p`` are kept now (it is down, or calls wait before them)."""
        return p in self.down or bool(self.deferred.get(p))

    def _refresh(self, p: int) -> bool:
        """Re-resolve a down partition's actor by name (get-or-create); False if that
        failed too (its backoff grows)."""
        started = time.monotonic()
        try:
            self._link.reconnect(p)
        except Exception as exc:  # noqa: BLE001 - this runs on the retry thread: keep it alive
            self.failed(p, exc)
            return False
        log.debug(
            "%s partition %d: looked its actor up again (%.1f s)",
            self._what, p, time.monotonic() - started,
        )  # fmt: skip
        with self.lock:
            self.down[p] = 0.0  # may be asked now; a success brings it up
        return True

    def _refresh_all(self, lapsed: list[int]) -> None:
        """Look the actors of ``lapsed`` partitions up again, each actor once: the other
        down partitions that actor serves (a unit's) share its lookup, lapsed or not, and
        a failed lookup counts for its lapsed ones."""
        failed: dict[str, Exception] = {}
        for p in lapsed:
            actor = self._link.actor_of(p)
            if actor in failed:
                self.failed(p, failed[actor])
                continue
            with self.lock:
                if self.down.get(p) == 0.0:
                    continue  # (looked up with another partition of its actor)
            if not self._refresh(p):
                failed[actor] = Unavailable(f"{actor}: its lookup failed")
                continue
            with self.lock:
                for q in self.down:
                    if self._link.actor_of(q) == actor:
                        self.down[q] = 0.0

    def retry_loop(self) -> None:
        """The retry thread: look the actors of down partitions up again once their
        backoff ran out (receive asks them again after that), and send the acks and nacks
        kept for them; what fails again is kept for the next try."""
        while not self._stop.is_set():
            with self.lock:
                now = time.monotonic()
                waits = [at - now for at in self.down.values() if at > 0]
                pending = bool(self.deferred) or 0.0 in self.down.values()
            # asleep while all is well (a failure or a kept call wakes it at once)
            idle_s = DOWN_BACKOFF.first_s if pending else IDLE_RETRY_S
            self.retry_now.wait(min(waits) if waits else idle_s)
            self.retry_now.clear()
            if self._stop.is_set():
                return
            if self.outages:
                self.report_outages()
            now = time.monotonic()
            with self.lock:
                lapsed = [p for p, at in self.down.items() if 0 < at <= now]
            self._refresh_all(lapsed)
            with self.lock:
                due = [p for p in self.deferred if self.down.get(p, 0.0) == 0.0]
            for p in due:
                with self.lock:
                    work = self.deferred.pop(p, [])
                    self._sending += 1
                try:
                    if work:
                        self._resend(p, work)
                finally:
                    with self.lock:
                        self._sending -= 1
                        self._retrying.notify_all()

    def take_kept(self, timeout_s: float) -> dict[int, Work]:
        """Every kept call, once the retry thread has none in hand (waits up to
        ``timeout_s``); they are the caller's to send now."""
        with self.lock:  # what the retry thread is sending now comes back or goes
            self._retrying.wait_for(lambda: self._sending == 0, timeout=timeout_s)
            deferred, self.deferred = self.deferred, {}
        return deferred

    def keep(self, pending: list[tuple[int, Work]]) -> None:
        """Kept calls that did not go through: for the retry thread, before newer ones."""
        with self.lock:
            for p, work in pending:
                self.deferred[p] = work + self.deferred.get(p, [])

    def _resend(self, p: int, work: Work) -> None:
        """Send kept calls of partition ``p`` (the retry thread)."""
        try:
            self._link.get(self._send(p, work), what=f"subscription {p}", timeout_s=5.0)
            self.up(p)
        except (Unavailable, StorageError) as exc:
            if self._stop.is_set() or not self._link.connected():
                return
            if isinstance(exc, StorageError) and not exc.retriable:
                self._drop_bad(p, work)
                return
            self.keep([(p, work)])  # tried again later
            self.failed(p, exc)
        except Exception:  # noqa: BLE001 - a bad call among them: sort them out
            if self._stop.is_set() or not self._link.connected():
                return
            self._drop_bad(p, work)

    def _drop_bad(self, p: int, work: Work) -> None:
        """Send kept calls one by one: one the partition refuses for good (an ack of no
        message) is reported and dropped; one that fails for now is kept."""
        for item in work:
            try:
                self._link.get(self._send(p, [item]), what=f"subscription {p}", timeout_s=5.0)
            except (Unavailable, StorageError) as exc:
                if isinstance(exc, StorageError) and not exc.retriable:
                    log.error("%s partition %d: dropped a kept call: %s", self._what, p, exc)
                    continue
                with self.lock:
                    self.deferred.setdefault(p, []).append(item)
            except Exception as exc:  # noqa: BLE001 - refused for good: reported, dropped
                log.error("%s partition %d: dropped a kept call: %s", self._what, p, exc)


def _plain(exc: Exception) -> str:
    """An error as a line: its first line, without Ray's long tail."""
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
