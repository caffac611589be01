"""Every Ray call of raydelay goes through here (STYLE.md 2).

Errors raised inside an actor reach the caller as the raydelay error that was
raised (not as a Ray traceback); a dead or unreachable actor becomes
:class:`~raydelay.errors.Unavailable`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import ray
from ray.exceptions import (
    ActorUnavailableError,
    ActorUnschedulableError,
    GetTimeoutError,
    RayActorError,
    RayTaskError,
)

from raydelay.errors import RaydelayError, StorageError, Unavailable
from raydelay.retries import PEER_CALL, RECOVERY, Retries, is_transient, retry  # noqa: F401

log = logging.getLogger(__name__)

_RAY_ERRORS = (RayTaskError, RayActorError, ActorUnavailableError, ActorUnschedulableError)


def translate(exc: BaseException, what: str = "") -> BaseException:
    """The raydelay error a Ray error stands for."""
    if isinstance(exc, RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, RaydelayError):
            return cause
        if isinstance(cause, (RayActorError, ActorUnschedulableError)):
            return Unavailable(f"{what or 'actor'} is unavailable: {cause}")
        return RaydelayError(f"{what or 'actor call'} failed: {cause!r}")
    if isinstance(exc, (RayActorError, ActorUnavailableError, ActorUnschedulableError)):
        # (unschedulable: the node it was pinned to is gone, and Ray ended it)
        return Unavailable(f"{what or 'actor'} is unavailable: {exc}")
    if isinstance(exc, GetTimeoutError):
        return Unavailable(f"{what or 'actor call'} timed out")
    return exc


def get(refs: Any, *, what: str = "", timeout_s: float | None = None) -> Any:
    """``ray.get`` with errors translated."""
    try:
        return ray.get(refs, timeout=timeout_s)
    except _RAY_ERRORS + (GetTimeoutError,) as exc:
        raise translate(exc, what) from None


async def wait(ref: Any, *, what: str = "") -> Any:
    """Await an ObjectRef inside an async actor, errors translated."""
    try:
        return await ref
    except _RAY_ERRORS as exc:
        raise translate(exc, what) from None


# Waits that may last seconds while an actor is replaced (a handle looked up through the
# coordinator, a node probed) run on threads of their own, not on the event loop's default
# executor: that one has 6 threads on a 2-core node (CPUs + 4) and the store's I/O shares
# it (cursor writes), which a few partitions waiting for their lost host must not take.
LOOKUPS = ThreadPoolExecutor(32, thread_name_prefix="raydelay-lookup")


async def off_loop(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` on a LOOKUPS thread, awaited (from an async actor's event loop)."""
    return await asyncio.get_running_loop().run_in_executor(LOOKUPS, fn, *args)


# A call to a named actor unanswered this long has its actor's node looked at, and again
# as often while it stays unanswered: Ray holds a call to an actor on a lost node until it
# declares the node dead (about 3 s with raydelay's health checks, 15 s with Ray's own),
# while a node whose raylet refuses connections is known lost at once (see
# placement.node_gone).
OVERDUE_PROBE_S = 0.5


def probing(wait: Any, gone: Any, every_s: float = OVERDUE_PROBE_S) -> Any:
    """``wait`` (:func:`get` or :func:`get_blocking`) for one ObjectRef, asking ``gone()``
    every ``every_s`` while the reply is late whether the actor's node is lost: then the
    call is given up with Unavailable (for the caller's retry, which looks the actor up
    again and re-creates it elsewhere). A list of refs is waited for as ``wait`` does."""

    def waiting(ref: Any, *, what: str = "") -> Any:
        if not isinstance(ref, ray.ObjectRef):
            return wait(ref, what=what)
        future = ref.future() if wait is get_blocking else None
        while True:
            if future is not None:
                try:
                    return future.result(timeout=every_s)
                except FutureTimeout:
                    pass
                except _RAY_ERRORS as exc:
                    raise translate(exc, what) from None
            else:
                ready, _ = ray.wait([ref], timeout=every_s, fetch_local=False)
                if ready:
                    return get(ref, what=what)
            if gone():
                raise Unavailable(f"{what or 'actor'} is unavailable: its node is lost")

    return waiting


async def wait_probing(
    ref: Any, gone: Any, *, what: str = "", every_s: float = OVERDUE_PROBE_S
) -> Any:
    """:func:`wait` inside an async actor, with ``gone()`` (blocking: run on a thread) asked
    while the reply is late, as :func:`probing` does."""
    task = asyncio.ensure_future(wait(ref, what=what))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every_s)
            if done:
                return task.result()
            if await off_loop(gone):
                raise Unavailable(f"{what or 'actor'} is unavailable: its node is lost")
    finally:
        if not task.done():  # (given up, or the caller was cancelled: nothing waits on)
            task.cancel()


def in_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn`` on a fresh thread and return its result (for blocking work in an async
    actor's constructor, which Ray runs on the event loop's thread)."""
    with ThreadPoolExecutor(1, thread_name_prefix="raydelay-init") as pool:
        return pool.submit(fn, *args, **kwargs).result()


def recover(fn: Any, *args: Any, what: str, sleep=time.sleep) -> Any:
    """Run an actor's recovery ``fn(*args)`` until it gets past transient errors (see
    :func:`is_transient`), with a jittered backoff; other errors are raised. In Ray, a
    constructor that raises while the actor restarts ends the actor for good, so a store
    outage must not make recovery raise."""
    retries = Retries(log, f"{what}: recovery")
    out = retry(lambda: fn(*args), RECOVERY, sleep=sleep, on_failure=retries.failed)
    retries.ok()
    return out


def get_blocking(ref: Any, *, what: str = "", timeout_s: float | None = None) -> Any:
    """Wait for one ObjectRef from a thread of an async actor (through its future, so Ray
    does not warn about blocking its event loop: this thread is not the loop's)."""
    try:
        return ref.future().result(timeout=timeout_s)
    except _RAY_ERRORS as exc:
        raise translate(exc, what) from None
    except TimeoutError:
        raise Unavailable(f"{what or 'actor call'} timed out") from None


def call(
    submit: Any,
    *,
    what: str,
    deadline_s: float,
    sleep=time.sleep,
    wait: Any = None,
    on_failure: Any = None,
) -> Any:
    """Submit (``submit()`` returns an ObjectRef or a list of them) and wait; while the actor is
    dead or restarting, or the store fails retriably, submit again after a jittered backoff,
    until ``deadline_s`` seconds have passed. Only for idempotent calls. ``wait`` is how to
    wait for the reply (default :func:`get`; :func:`get_blocking` on an async actor's thread).
    ``on_failure()`` runs after each failed attempt (a Peer looks its actor up again)."""
    wait = wait or get
    give_up = time.monotonic() + deadline_s
    delays = PEER_CALL.delays_s()
    while True:
        try:
            return wait(submit(), what=what)
        except (Unavailable, StorageError) as exc:
            if isinstance(exc, StorageError) and not exc.retriable:
                raise
            if on_failure is not None and isinstance(exc, Unavailable):
                on_failure()
            delay = next(delays)
            if time.monotonic() + delay > give_up:
                raise Unavailable(
                    f"{what} still failing after {deadline_s:.0f} s (client.retry_deadline_s): "
                    f"{exc}"
                ) from exc
            sleep(delay)
