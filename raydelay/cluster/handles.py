"""Handles to raydelay's named actors that outlive the actor behind them.

A Ray handle is bound to one actor. Ray restarts a crashed actor behind the same
handle, but an actor that ended for good (its node was lost, or its constructor
failed during a restart) leaves its handles dead, and every call on them fails.
A :class:`Peer` holds the current handle to one named actor; after a call found the
actor unavailable, the next use looks the name up again and, when there is no such
actor any more, re-creates it (``raydelay.cluster.placement`` chooses its node and
the new actor recovers from the store). :func:`stop` and :func:`stop_all` end actors for
good, the one place that does. Every actor-to-actor and client-to-actor
handle goes through one; the actor modules make them (``coordinator_peer`` and
``partition_peer`` in ``raydelay.actors.host``: a partition on its host, found through
the coordinator's assignment). A call names a method of the actor's class, never a
method name: see :class:`Peer`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

import ray
from ray.exceptions import RayError

from raydelay.cluster import placement, rpc
from raydelay.cluster.names import (
    COORDINATORS,
    NAMESPACE,
    SUBHOST_PREFIX,
)
from raydelay.errors import Unavailable

log = logging.getLogger(__name__)

DEFAULT_DEADLINE_S = 30.0  # how long a blocking call is retried (``client.retry_deadline_s``)

ActorT = TypeVar("ActorT")  # the class of the actor a Peer calls
P = ParamSpec("P")
R = TypeVar("R")

_noting = threading.local()  # .peers: the list the peers submitted through are noted in


def retried_across(
    submit: Callable[[], Any],
    *,
    what: str,
    deadline_s: float,
    sleep: Callable[[float], None] = time.sleep,
    wait: Any = None,
) -> Any:
    """:func:`raydelay.cluster.rpc.call` of a ``submit()`` that calls several peers (one call
    on each of many partitions): after a failed attempt, every peer it submitted through
    is looked up again (:func:`refresh_all`), so an actor that ended for good (its handle dead
    for ever) is replaced by the one serving now instead of failing every retry."""
    used: list[Peer[Any]] = []

    def attempt() -> Any:
        used.clear()
        outer, _noting.peers = getattr(_noting, "peers", None), used
        try:
            return submit()
        finally:
            _noting.peers = outer  # (a call across peers may make one inside its submit)

    return rpc.call(
        attempt,
        what=what,
        deadline_s=deadline_s,
        sleep=sleep,
        wait=wait,
        on_failure=lambda: refresh_all(used),
    )


def refresh_all(peers: Sequence[Peer[Any]]) -> None:
    """Look each of ``peers`` up again, in place (:meth:`Peer.refresh_or_drop`), after a
    retried call of them failed: the peers are a client's, which its consumers share, and
    one partition failing, its host lost, must not leave a consumer's thread looking its
    unit up through the coordinator while the others wait."""
    for peer in {id(p): p for p in peers}.values():  # (a unit's partitions share one)
        peer.refresh_or_drop()


class Peer(Generic[ActorT]):
    """One named actor: ``create()`` returns a handle to it, creating it when it does not
    exist (``get_if_exists``). ``ActorT`` is the actor's class: a call names one of its
    methods (``peer.submit(HostActor.append, topic, partition, batches)``), so mypy checks
    the arguments against that method's signature and the reply against its return type;
    the Ray handle is asked for the method of that name.

    With ``resolve``, the handle is what ``resolve()`` returns instead of a lookup by name
    (a partition's host is found through the coordinator's assignment, again after a
    failure). With ``find``, the actor is the one ``find()`` names, ``(name, handle)`` or
    None to create it (the coordinator, which goes by either of two names:
    ``raydelay.actors.standby``). A blocking call is retried for up to ``deadline_s``
    seconds."""

    def __init__(
        self,
        name: str,
        create: Callable[[], Any],
        what: str | None = None,
        handle: Any = None,
        *,
        resolve: Callable[[], Any] | None = None,
        find: Callable[[], tuple[str, Any] | None] | None = None,
        actor_name: str | None = None,
        deadline_s: float = DEFAULT_DEADLINE_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.name = name
        self.actor_name = actor_name or name  # the actor behind the handle
        self.what = what or name
        self.deadline_s = deadline_s  # how long a blocking call is retried
        self._create = create
        self._resolve = resolve
        self._find = find or self._by_name
        self._sleep = sleep
        self._handle: Any = handle
        self._lock = threading.Lock()
        self.re_resolved = 0  # how many times a lost handle was looked up again

    @classmethod
    def of_running(cls, name: str, what: str | None = None) -> Peer[Any] | None:
        """A Peer of the running actor called ``name`` (looked up, never created here);
        None when it does not run."""
        handle = placement.lookup_or_none(name)
        return None if handle is None else cls(name, lambda: handle, what, handle)

    @property
    def handle(self) -> Any:
        h = self._handle
        if h is None:
            with self._lock:
                if self._handle is None:
                    self.actor_name, self._handle = self._look_up()
                h = self._handle
        return h

    def _look_up(self) -> tuple[str, Any]:
        """The actor's name and a handle to it, found (resolved, or created) now."""
        try:
            if self._resolve is not None:
                return self.actor_name, self._resolve()
            found = self._find()
            return (self.name, self._create()) if found is None else found
        except (RayError, ValueError) as exc:  # Ray's control service in trouble
            raise Unavailable(f"{self.what}: cannot look it up: {exc}") from None

    def refresh(self) -> None:
        """Look the actor up again now, and call what is found from then on. Calls meanwhile
        go on with the handle held: a partition that failed at an actor that answers for
        its other partitions must not hold those up while its actor is looked up (through
        the coordinator, which may be being replaced)."""
        name, handle = self._look_up()
        with self._lock:
            self.actor_name, self._handle = name, handle
            self.re_resolved += 1

    def _by_name(self) -> tuple[str, Any] | None:
        """The live actor called ``name``; one stranded on a lost node is ended first."""
        found = placement.lookup_or_none(self.name)
        if found is not None and placement.stranded(self.name):
            placement.end_stranded(self.name, found)
            found = None
        return None if found is None else (self.name, found)

    def refresh_or_drop(self) -> None:
        """:meth:`refresh`, or when that fails, :meth:`lost` (after a failed call of one
        partition of an actor that may serve others: they go on meanwhile)."""
        try:
            self.refresh()
        except Exception:  # noqa: BLE001 - the next use looks it up again
            self.lost()

    def lost(self) -> None:
        """A call found the actor unavailable: the next use looks it up again."""
        with self._lock:
            if self._handle is not None:
                self._handle = None
                self.re_resolved += 1

    def submit(
        self, method: Callable[Concatenate[ActorT, P], Any], /, *args: P.args, **kwargs: P.kwargs
    ) -> Any:
        """Submit one call of ``method`` (an ObjectRef); a failure to submit marks the handle
        lost."""
        noted = getattr(_noting, "peers", None)
        if noted is not None:
            noted.append(self)
        try:
            return getattr(self.handle, method.__name__).remote(*args, **kwargs)
        except Exception:
            self.lost()
            raise

    def retried(
        self, submit: Callable[[], Any], *, deadline_s: float | None = None, wait: Any = None
    ) -> Any:
        """Submit (``submit()`` returns an ObjectRef of this actor) and wait, again (with the
        handle looked up again) while the actor is unavailable or the store fails
        retriably, for up to ``deadline_s`` (default: the peer's). Only for idempotent
        calls. ``wait``: see :func:`raydelay.cluster.rpc.call`."""
        wait = wait or rpc.get
        if self._resolve is None and wait in (rpc.get, rpc.get_blocking):
            wait = rpc.probing(wait, self.node_lost)
        return rpc.call(
            submit,
            what=self.what,
            deadline_s=self.deadline_s if deadline_s is None else deadline_s,
            sleep=self._sleep,
            wait=wait,
            on_failure=self.lost,
        )

    def node_lost(self) -> bool:
        """Whether the named actor's node is lost (asked while a call to it is late: see
        :data:`raydelay.cluster.rpc.OVERDUE_PROBE_S`); never raises."""
        try:
            return placement.stranded(self.actor_name)
        except Exception:  # noqa: BLE001 - Ray's control service in trouble: wait on
            return False

    @overload
    def call(
        self,
        method: Callable[Concatenate[ActorT, P], Coroutine[Any, Any, R]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R: ...

    @overload
    def call(
        self, method: Callable[Concatenate[ActorT, P], R], /, *args: P.args, **kwargs: P.kwargs
    ) -> R: ...

    def call(self, method: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """A blocking call of ``method``, :meth:`retried`. Only for idempotent calls."""
        return self.retried(lambda: self.submit(method, *args, **kwargs))

    @overload
    def call_from_thread(
        self,
        method: Callable[Concatenate[ActorT, P], Coroutine[Any, Any, R]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R: ...

    @overload
    def call_from_thread(
        self, method: Callable[Concatenate[ActorT, P], R], /, *args: P.args, **kwargs: P.kwargs
    ) -> R: ...

    def call_from_thread(self, method: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """:meth:`call` from a thread of an async actor (not its event loop's)."""
        return self.retried(lambda: self.submit(method, *args, **kwargs), wait=rpc.get_blocking)

    @overload
    async def once(
        self,
        method: Callable[Concatenate[ActorT, P], Coroutine[Any, Any, R]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R: ...

    @overload
    async def once(
        self, method: Callable[Concatenate[ActorT, P], R], /, *args: P.args, **kwargs: P.kwargs
    ) -> R: ...

    async def once(self, method: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """One call of ``method`` from an async actor; an unavailable actor marks the handle
        lost (and the error is raised for the caller's own retry loop)."""
        if self._handle is None:  # looking up (or creating) asks Ray's control service:
            await rpc.off_loop(lambda: self.handle)  # never on the event loop
        try:
            ref = self.submit(method, *args, **kwargs)
            if self._resolve is None:
                return await rpc.wait_probing(ref, self.node_lost, what=self.what)
            return await rpc.wait(ref, what=self.what)
        except Unavailable:
            self.lost()
            raise


def named_actors() -> list[str]:
    """The names of raydelay's live named actors (in its namespace)."""
    return [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == NAMESPACE
    ]


def stop(names: list[str], *, graceful: bool = False, timeout_s: float = 10) -> int:
    """Stop the named actors for good and wait (up to ``timeout_s``) until they are gone:
    killed at once, or, ``graceful``, ended between calls (``__ray_terminate__`` waits for
    the calls queued before it). The coordinator is always killed: Ray retries its calls,
    so a terminate call would be "retried"; it is idle by the time it is stopped. Returns
    how many were running."""
    stopping = []
    for name in names:
        handle = placement.lookup_or_none(name)
        if handle is None:
            continue  # not running
        if graceful and name not in COORDINATORS:
            handle.__ray_terminate__.remote()
        else:
            ray.kill(handle, no_restart=True)
        stopping.append(name)
    stopped = len(stopping)
    # gone once its name is free (no call to a dying actor: Ray would retry the
    # coordinator's, and say so)
    deadline = time.monotonic() + timeout_s
    while stopping and time.monotonic() < deadline:
        alive = set(named_actors())
        stopping = [n for n in stopping if n in alive]
        if stopping:
            time.sleep(0.05)
    if stopping:
        log.warning("still stopping after %.0f s: %s", timeout_s, ", ".join(stopping))
    return stopped


def stop_all(*, graceful: bool) -> int:
    """Stop every raydelay actor: subscriptions first (they call the hosts), the
    coordinator last (everyone calls it). Returns how many were running.

    ``graceful`` ends the subscriptions between calls; the hosts are stopped at once even
    then, once no subscription is left to call them: a graceful stop would wait behind the
    long polls standing there, which a subscription ended while it waited (a deleted
    topic's) left behind, for up to ``_LONG_POLL_S`` of its own (30 s)."""
    names = named_actors()
    subs = [n for n in names if n.startswith(SUBHOST_PREFIX)]
    others = [n for n in names if not n.startswith(SUBHOST_PREFIX) and n not in COORDINATORS]
    coordinator = [n for n in names if n in COORDINATORS]
    return (
        stop(subs, graceful=graceful)
        + stop(others, graceful=False)
        + stop(coordinator, graceful=False)
    )


class PartitionPeers(Generic[ActorT]):
    """The partitions of one topic or one subscription, one :class:`Peer` each: the
    waiting and retrying half of ``raydelay.client.links``'s protocols. The calls, typed
    by the actor's methods, are in ``raydelay.actors.handles``."""

    def __init__(self, peers: Sequence[Peer[ActorT]], *, deadline_s: float) -> None:
        self._peers = peers
        self.partitions = len(peers)
        self.deadline_s = deadline_s  # how long a retried call goes on

    def ready(self, replies: Any, num: int, timeout_s: float) -> list[Any]:
        if not replies:
            return []
        return ray.wait(list(replies), num_returns=num, timeout=timeout_s)[0]

    def future(self, reply: Any) -> Future:
        return reply.future()

    def get(self, replies: Any, what: str, timeout_s: float | None = None) -> Any:
        return rpc.get(replies, what=what, timeout_s=timeout_s)

    def retried(
        self,
        submit: Callable[[], Any],
        what: str,
        *,
        partition: int | None = None,
        deadline_s: float | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        wait = None
        if timeout_s is not None:

            def wait(refs: Any, what: str) -> Any:
                return rpc.get(refs, what=what, timeout_s=timeout_s)

        deadline_s = self.deadline_s if deadline_s is None else deadline_s
        if partition is None:  # (the peers it went through are looked up again)
            return retried_across(submit, what=what, deadline_s=deadline_s, wait=wait)
        return rpc.call(
            submit,
            what=what,
            deadline_s=deadline_s,
            wait=wait,
            on_failure=self._peers[partition].refresh_or_drop,
        )

    def reconnect(self, partition: int) -> None:
        self._peers[partition].refresh()  # (raises if the lookup fails)

    def connected(self) -> bool:
        return ray.is_initialized()
