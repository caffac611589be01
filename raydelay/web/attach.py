"""The console's link to its cluster: the web process never attaches to Ray itself, so
that an outage cannot hang or end it.

- :class:`ClusterLink` supervises one reader process (:mod:`raydelay.web.reader`) at a
  time. It probes the reader every ``PROBE_EVERY_S``, and drops it when it ends, leaves a
  probe unanswered for ``PROBE_WAIT_S``, fails to attach, or attaches for longer than
  ``ATTACH_WAIT_S``. The next reader starts at once (after ``BACKOFF_S`` when attaching
  keeps failing) and attaches as soon as the cluster listens again.
- :class:`RemoteCluster` stands in for a :class:`~raydelay.client.connection.Cluster` in
  :class:`~raydelay.web.model.ConsoleData`: every call it makes goes to the reader. A read
  waits at most ``READ_WAIT_S`` for its answer, an action until it is answered or the
  reader is dropped. While the cluster is down, each call raises :class:`ClusterDown` at
  once: the page is a 503 saying so, and when the cluster was last reachable.
"""

from __future__ import annotations

import enum
import itertools
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Concatenate, ParamSpec, TypeVar

from raydelay.client.connection import Cluster
from raydelay.client.message import Message
from raydelay.config import Config
from raydelay.errors import Unavailable
from raydelay.web import reader
from raydelay.web.reader import AttachTarget

# how long a page's read waits for the reader's answer before the page is a 503
READ_WAIT_S = 2.0
# how often an attached reader is asked whether the cluster is there
PROBE_EVERY_S = 1.0
# a probe unanswered this long: the cluster is down, and the reader is replaced
PROBE_WAIT_S = 3.0
# a reader attaching this long (something listens, but Ray does not answer) is replaced
ATTACH_WAIT_S = 60.0
# the wait before starting the 1st, 2nd, ... reader after one was dropped (the last
# repeats while attaching keeps failing; a reader waiting for the address costs nothing)
BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 5.0)
# how often the supervisor looks at its reader
TICK_S = 0.1

P = ParamSpec("P")
T = TypeVar("T")


class LinkState(enum.Enum):
    STARTING = "starting"  # the first reader has not attached yet
    UP = "up"  # attached, and the last probe was answered
    UNSURE = "unsure"  # a call went unanswered: a probe is out to tell
    DOWN = "down"  # the cluster is unreachable: a new reader waits for it


@dataclass(frozen=True)
class LinkStatus:
    """Where the link stands. Times are epoch seconds."""

    state: LinkState
    address: str | None  # the cluster's address, once known
    since_s: float  # when this state began
    last_reachable_s: float | None  # the last answer from the cluster (None: never)
    reason: str  # why it is not up ("" when it is)

    def describe(self) -> str:
        """What a 503 page says."""
        where = f"The Ray cluster at {self.address}" if self.address else "The Ray cluster"
        seen = (
            f" It was last reachable at {_utc(self.last_reachable_s)}."
            if self.last_reachable_s is not None
            else " It has not been reachable since the console started."
        )
        if self.state is LinkState.UNSURE:
            return f"{where} did not answer in time ({self.reason}).{seen}"
        if self.state is LinkState.STARTING:
            return f"The console is attaching to the Ray cluster ({self.reason})."
        return (
            f"{where} is down: unreachable since {_utc(self.since_s)} ({self.reason}).{seen} "
            "The console attaches again on its own when the cluster is back."
        )


class ClusterDown(Unavailable):
    """The console cannot reach its cluster now; ``status`` says since when and why."""

    def __init__(self, status: LinkStatus) -> None:
        super().__init__(status.describe())
        self.status = status


@dataclass(frozen=True)
class Wait:
    """How a call waits: ``retry_deadline_s`` for the reader's client (None: the client's
    own), ``wait_s`` for the answer here (None: until answered or the reader is dropped)."""

    retry_deadline_s: float | None = None
    wait_s: float | None = None


class _Pending:
    """A call sent to the reader, waiting for its answer."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def settle(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error
        self.done.set()


@dataclass(frozen=True)
class _Gone:
    """The reader's end of the pipe closed: it ended."""


class _ReaderProcess:
    """One reader process and this end of its pipe; a thread hands each message it sends
    to ``deliver`` (and :class:`_Gone` when it ends)."""

    def __init__(
        self, target: AttachTarget, deliver: Callable[[_ReaderProcess, object], None]
    ) -> None:
        # spawn, not fork: the web process has threads, and the reader a fresh interpreter
        ctx = multiprocessing.get_context("spawn")
        self._conn, theirs = ctx.Pipe()
        self._send_lock = threading.Lock()
        self.process = ctx.Process(
            target=reader.run,
            args=(theirs, target, os.getpid()),
            name="raydelay-console-reader",
            daemon=True,  # ends with the web process
        )
        self.process.start()
        theirs.close()
        threading.Thread(
            target=self._listen_routine, args=(deliver,), name="console-reader-pipe", daemon=True
        ).start()

    def _listen_routine(self, deliver: Callable[[_ReaderProcess, object], None]) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                deliver(self, _Gone())
                return
            deliver(self, message)

    def send(self, message: object) -> bool:
        """False when the reader is gone."""
        with self._send_lock:
            try:
                self._conn.send(message)
                return True
            except (OSError, ValueError):
                return False

    def kill(self) -> None:
        self.process.kill()  # not terminate: a Ray driver may wait on its cluster at exit
        self.process.join(timeout=10)
        self._conn.close()


class ClusterLink:
    """The console's one way to its cluster: a supervised reader process (see the module)."""

    def __init__(
        self,
        target: AttachTarget,
        *,
        on_change: Callable[[LinkStatus], None] | None = None,
        probe_every_s: float = PROBE_EVERY_S,
        probe_wait_s: float = PROBE_WAIT_S,
        attach_wait_s: float = ATTACH_WAIT_S,
    ) -> None:
        self._target = target
        self._on_change = on_change
        self._probe_every_s = probe_every_s
        self._probe_wait_s = probe_wait_s
        self._attach_wait_s = attach_wait_s
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._status = LinkStatus(LinkState.STARTING, target.address, time.time(), None, "")
        self._reader: _ReaderProcess | None = None
        self._config: Config | None = None
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._probe: tuple[int, float] | None = None  # (id, sent at, monotonic)
        self._last_probe_m = 0.0
        self._attaching_since_m: float | None = None
        self._drops = 0  # readers dropped since the last attach
        self._next_start_m = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch_routine, name="console-link")

    # --- the web side's calls ----------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def wait_attached(self, timeout_s: float) -> None:
        """Return once the first reader has attached; Unavailable with the reason when it
        cannot (nothing runs at the address, say), or has not within ``timeout_s``."""
        with self._changed:
            attached = self._changed.wait_for(
                lambda: self._status.state is not LinkState.STARTING or self._status.reason,
                timeout_s,
            )
            status = self._status
        if status.state is LinkState.UP:
            return
        if not attached:
            raise Unavailable(f"attaching to the Ray cluster took more than {timeout_s:g} s")
        raise Unavailable(status.reason)

    def stop(self) -> None:
        self._stop.set()
        self._on_change = None  # the console's end is no outage
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        with self._lock:
            gone = self._drop("the console stopped")
        if gone is not None:
            gone.kill()

    def status(self) -> LinkStatus:
        with self._lock:
            return self._status

    def config(self) -> Config:
        """The cluster's config, as its coordinator gave it at the last attach."""
        with self._lock:
            if self._config is None:
                raise ClusterDown(self._status)
            return self._config

    def call(
        self,
        wait: Wait,
        fn: Callable[Concatenate[Cluster, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """``fn(cluster, *args, **kwargs)`` made by the reader; ClusterDown when the
        cluster is not up, or the answer does not come within ``wait.wait_s``."""
        with self._lock:
            if self._status.state is not LinkState.UP or self._reader is None:
                raise ClusterDown(self._status)
            call_id = next(self._ids)
            pending = self._pending[call_id] = _Pending()
            to = self._reader
        if not to.send(reader.Call(call_id, fn, args, dict(kwargs), wait.retry_deadline_s)):
            with self._lock:
                self._pending.pop(call_id, None)
                raise ClusterDown(self._status)
        if not pending.done.wait(wait.wait_s):
            with self._lock:
                self._pending.pop(call_id, None)
                if self._reader is to and self._status.state is LinkState.UP:
                    # the supervisor probes at once; calls fail fast until it is answered
                    self._set(LinkState.UNSURE, f"no answer within {wait.wait_s:g} s")
                raise ClusterDown(self._status)
        if pending.error is not None:
            raise pending.error
        return pending.value

    # --- the reader's messages ---------------------------------------------------------------

    def _deliver(self, source: _ReaderProcess, message: object) -> None:
        gone = None
        with self._lock:
            if source is not self._reader:
                return  # a dropped reader's last words
            if isinstance(message, (reader.Reply, reader.Raised)):
                pending = self._pending.pop(message.call_id, None)
                self._reached()
                if pending is not None:
                    if isinstance(message, reader.Reply):
                        pending.settle(value=message.value)
                    else:
                        pending.settle(error=message.error)
            elif isinstance(message, reader.Pong):
                if self._probe is not None and self._probe[0] == message.probe_id:
                    self._probe = None
                    self._reached()
            elif isinstance(message, reader.Waiting):
                starting = self._status.state is LinkState.STARTING
                self._set(LinkState.STARTING if starting else LinkState.DOWN, message.reason)
            elif isinstance(message, reader.Attaching):
                self._attaching_since_m = time.monotonic()
            elif isinstance(message, reader.Attached):
                self._config = message.config
                self._attaching_since_m = None
                self._drops = 0
                self._status = replace(self._status, address=message.address)
                self._reached()
            elif isinstance(message, reader.AttachFailed):
                gone = self._drop(message.reason)
            elif isinstance(message, _Gone):
                gone = self._drop("the console's reader process ended")
        if gone is not None:
            gone.kill()

    # --- the supervisor ------------------------------------------------------------------------

    def _watch_routine(self) -> None:
        """Start a reader when there is none (after its backoff), probe the attached one,
        and drop one that stopped answering or attaches for too long. It polls, rather
        than wait on events, because a reader that hangs sends nothing to wait on."""
        while not self._stop.wait(TICK_S):
            gone = None
            with self._lock:
                now_m = time.monotonic()
                if self._reader is None:
                    if now_m >= self._next_start_m:
                        self._reader = _ReaderProcess(self._target, self._deliver)
                        self._probe, self._attaching_since_m = None, None
                elif self._probe is not None:
                    if now_m - self._probe[1] > self._probe_wait_s:
                        gone = self._drop(f"no answer for {self._probe_wait_s:g} s")
                elif self._status.state in (LinkState.UP, LinkState.UNSURE):
                    due = self._status.state is LinkState.UNSURE
                    if due or now_m - self._last_probe_m >= self._probe_every_s:
                        probe_id = next(self._ids)
                        self._probe = (probe_id, now_m)
                        self._last_probe_m = now_m
                        self._reader.send(reader.Probe(probe_id))
                elif (
                    self._attaching_since_m is not None
                    and now_m - self._attaching_since_m > self._attach_wait_s
                ):
                    gone = self._drop(f"attaching took more than {self._attach_wait_s:g} s")
            if gone is not None:
                gone.kill()

    # --- state (under the lock) ----------------------------------------------------------------

    def _reached(self) -> None:
        """An answer came from the cluster: it is up."""
        now = time.time()
        self._status = replace(self._status, last_reachable_s=now)
        if self._status.state is not LinkState.UP:
            self._set(LinkState.UP, "")

    def _set(self, state: LinkState, reason: str) -> None:
        before = self._status
        since = before.since_s if state is before.state else time.time()
        self._status = replace(before, state=state, since_s=since, reason=reason)
        self._changed.notify_all()
        if self._on_change is not None and (state, reason) != (before.state, before.reason):
            self._on_change(self._status)

    def _drop(self, reason: str) -> _ReaderProcess | None:
        """Let go of the reader (the caller kills what this returns, outside the lock):
        its calls fail, and the next one starts after the backoff."""
        gone, self._reader = self._reader, None
        self._probe, self._attaching_since_m, self._config = None, None, None
        state = self._status.state
        if state is not LinkState.STARTING or self._drops > 0:
            state = LinkState.DOWN
        self._set(state, reason)
        down = ClusterDown(self._status)
        for pending in self._pending.values():
            pending.settle(error=down)
        self._pending.clear()
        self._next_start_m = time.monotonic() + BACKOFF_S[min(self._drops, len(BACKOFF_S) - 1)]
        self._drops += 1
        return gone


class RemoteCluster:
    """What :class:`~raydelay.web.model.ConsoleData` holds in place of a Cluster when the
    console serves a cluster through a :class:`ClusterLink`: the calls it makes, each made
    by the reader. A view from :meth:`with_retry_deadline` is how the pages read (each
    answer awaited ``READ_WAIT_S`` at most); the client itself serves the actions."""

    def __init__(self, link: ClusterLink, wait: Wait | None = None) -> None:
        self._link = link
        self._wait = wait or Wait()

    @property
    def config(self) -> Config:
        return self._link.config()

    def with_retry_deadline(self, seconds: float) -> RemoteCluster:
        return RemoteCluster(self._link, Wait(retry_deadline_s=seconds, wait_s=READ_WAIT_S))

    def topics(self) -> dict[str, int]:
        return self._link.call(self._wait, Cluster.topics)

    def stats(self, topic: str, subscription: str | None = None) -> dict:
        return self._link.call(self._wait, Cluster.stats, topic, subscription)

    def partition_hosts(self, topic: str) -> list[str]:
        return self._link.call(self._wait, Cluster.partition_hosts, topic)

    def _subscription_options(self, topic: str, subscription: str) -> dict:
        return self._link.call(self._wait, Cluster._subscription_options, topic, subscription)

    def due_histogram(
        self, topic: str, subscription: str, windows_s: tuple[float, ...] = (60, 3600, 86400)
    ) -> list[tuple[str, int]]:
        return self._link.call(self._wait, Cluster.due_histogram, topic, subscription, windows_s)

    def peek(
        self,
        topic: str,
        subscription: str,
        limit: int = 100,
        due_after: int | None = None,
        due_before: int | None = None,
        key: str | None = None,
    ) -> list[Message]:
        return self._link.call(
            self._wait, Cluster.peek, topic, subscription, limit, due_after, due_before, key
        )

    def cancel(self, message_ids: list[str]) -> list[bool]:
        return self._link.call(self._wait, Cluster.cancel, message_ids)

    def reset_cursor(self, topic: str, subscription: str, to: Any) -> dict[int, list[int]]:
        return self._link.call(self._wait, Cluster.reset_cursor, topic, subscription, to)

    def redrive(self, dead_letter_topic: str, to_topic: str | None = None, limit: int = -1) -> int:
        return self._link.call(self._wait, Cluster.redrive, dead_letter_topic, to_topic, limit)


def _utc(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
