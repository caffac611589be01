"""The console's reader: a child process that attaches to the Ray cluster and makes every
cluster call of the console, and the messages it exchanges with the web process over a
pipe (:mod:`raydelay.web.attach` starts it and speaks for the web side).

It lives apart because a Ray driver does not survive its cluster going away: its calls
hang until Ray's GCS reconnect timeout (a minute) ends the process, and a driver whose
cluster comes back at the same address aborts on a WrongClusterID check. A reader that
ends so takes nothing of the web server with it; the web side starts another.

Its life: wait until something listens at the cluster's address (a ``ray.init`` of an
address where nothing runs was seen to hang for minutes), attach, say so, then answer
calls (each on a thread of a small pool, so a long redrive does not hold up the pages)
and probes (one GCS round trip) until the pipe closes or the web process is gone.
"""

from __future__ import annotations

import os
import textwrap
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import ray

from raydelay.client.bootstrap import attach_ray, not_listening
from raydelay.client.connection import Cluster, connect
from raydelay.cluster.local import attach_target
from raydelay.config import Config
from raydelay.errors import RaydelayError, Unavailable

# how often a reader that waits for the cluster's address to listen looks again
WAIT_POLL_S = 0.25
# threads answering calls: pages and the rate sampler read while an action may run long
CALL_THREADS = 4
# how often a reader checks that the web process that started it still lives
PARENT_POLL_S = 1.0

# --- what the web process sends ----------------------------------------------------------------


@dataclass(frozen=True)
class AttachTarget:
    """Where the reader attaches: ``raydelay console``'s ``--config`` and ``--address``.
    With no address, each attach looks again, as the other commands do: ``RAYDELAY_ADDRESS``,
    else the Ray that ``raydelay up`` started (its marker is rewritten by the next ``up``),
    else the Ray that a plain ``ray start`` left running on this machine."""

    config: str | None = None
    address: str | None = None

    def resolve(self) -> str | None:
        """The address to attach to now, or None when none is known."""
        return attach_target(self.address)[0]


@dataclass(frozen=True)
class Call:
    """Run ``fn(cluster, *args, **kwargs)`` on the reader's client (or on its view that
    gives up on an unreachable actor after ``retry_deadline_s``); answered by a
    :class:`Reply` or a :class:`Raised` of the same ``call_id``."""

    call_id: int
    fn: Callable[..., Any]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    retry_deadline_s: float | None = None


@dataclass(frozen=True)
class Probe:
    """Is the cluster there? Answered by a :class:`Pong` after one GCS round trip."""

    probe_id: int


# --- what the reader sends ---------------------------------------------------------------------


@dataclass(frozen=True)
class Waiting:
    """Nothing to attach to yet (``reason`` says why); the reader keeps looking."""

    reason: str


@dataclass(frozen=True)
class Attaching:
    """Something listens at ``address``: the reader is attaching to it now."""

    address: str


@dataclass(frozen=True)
class Attached:
    """Attached to ``address``; ``config`` is the cluster's (its coordinator's)."""

    address: str
    config: Config


@dataclass(frozen=True)
class AttachFailed:
    """Attaching failed (``reason``); the reader ends, and the web side starts another."""

    reason: str


@dataclass(frozen=True)
class Reply:
    call_id: int
    value: Any


@dataclass(frozen=True)
class Raised:
    """A call failed: raydelay's own errors as they are (a missing topic stays NotFound),
    any other (Ray's) as Unavailable with its first line."""

    call_id: int
    error: RaydelayError


@dataclass(frozen=True)
class Pong:
    probe_id: int


# --- the process -------------------------------------------------------------------------------


def run(conn: Connection, target: AttachTarget, parent_pid: int) -> None:
    """The reader process's body (``multiprocessing`` spawns it with this target)."""
    threading.Thread(
        target=_parent_watch_routine, args=(parent_pid,), name="reader-parent", daemon=True
    ).start()
    send_lock = threading.Lock()

    def send(message: object) -> None:
        with send_lock:
            try:
                conn.send(message)
            except OSError:  # the web process is gone: nothing to answer
                os._exit(0)

    address = _wait_for_address(target, send)
    send(Attaching(address))
    try:
        # the actors' log lines are not the console's output (its stderr says what the
        # console itself does)
        attach_ray(address, log_to_driver=False)
        cluster = connect(target.config, address=address)
    except BaseException as exc:  # noqa: BLE001 - Ray raises several kinds; the web side says why
        send(AttachFailed(_first_line(exc)))
        return
    send(Attached(cluster._ray_address, cluster.config))
    views: dict[float, Cluster] = {}
    with ThreadPoolExecutor(CALL_THREADS, thread_name_prefix="reader-call") as pool:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            if isinstance(message, Probe):
                pool.submit(_probe, message, send)
            elif isinstance(message, Call):
                view = cluster
                if message.retry_deadline_s is not None:
                    view = views.get(message.retry_deadline_s) or views.setdefault(
                        message.retry_deadline_s,
                        cluster.with_retry_deadline(message.retry_deadline_s),
                    )
                pool.submit(_answer, view, message, send)
    os._exit(0)  # not Ray's shutdown: the cluster may be gone, and it would wait for it


def _wait_for_address(target: AttachTarget, send: Callable[[object], None]) -> str:
    """The cluster's address once something listens there; says why meanwhile, each time
    the reason changes."""
    said = None
    while True:
        address = target.resolve()
        if address is not None:
            why = not_listening(address, timeout_s=1.0)
            if why is None:
                return address
        else:
            why = "no Ray cluster is running here (`raydelay up` starts one)"
        if why != said:
            send(Waiting(why))
            said = why
        time.sleep(WAIT_POLL_S)


def _answer(view: Cluster, call: Call, send: Callable[[object], None]) -> None:
    try:
        value = call.fn(view, *call.args, **call.kwargs)
    except RaydelayError as exc:
        send(Raised(call.call_id, exc))
    except Exception as exc:  # noqa: BLE001 - Ray's errors do not cross to the web side
        send(Raised(call.call_id, Unavailable(_first_line(exc))))
    else:
        send(Reply(call.call_id, value))


def _probe(probe: Probe, send: Callable[[object], None]) -> None:
    ray.nodes()  # a round trip to the GCS: it hangs (and the web side gives up) when Ray is gone
    send(Pong(probe.probe_id))


def _parent_watch_routine(parent_pid: int) -> None:
    """End this process when the web process is gone (killed, so it could not say so):
    a reader stuck attaching reads no pipe and would not notice."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(0)
        time.sleep(PARENT_POLL_S)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    # (raydelay's own errors are one line already, said whole; another library's first
    # line is cut, at a word)
    if not lines:
        return type(exc).__name__
    first = lines[0] if isinstance(exc, RaydelayError) else textwrap.shorten(lines[0], 400)
    return f"{type(exc).__name__}: {first}"
