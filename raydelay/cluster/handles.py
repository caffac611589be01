"""Handles to raydelay's named actors that outlive the actor behind them.

A Ray handle is bound to one actor. Ray restarts a crashed actor behind the same
handle, but an actor that ended for good (its node was lost, or its constructor
failed during a restart) leaves its handles dead, and every call on them fails.
A :class:`Peer` holds the current handle to one named actor; after a call found the
actor unavailable, the next use looks the name up again and, when there is no such
actor any more, re-creates it (``raydelay.cluster.placement`` chooses its node and
the new actor recovers from the store). :func:`stop` and :func:`stop_all` end actors for
good, the one place that does. Every actor-to-actor and client-to-actor
handle goes through one; the actor modules make them (``coordinator_peer`` in
``raydelay.actors.coordinator``, ``partition_peer`` in ``raydelay.actors.host``: a
partition on its host, found through the coordinator's assignment).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayError

from raydelay.cluster import placement, rpc
from raydelay.cluster.names import (
    COORDINATOR,
    NAMESPACE,
    SUBSCRIPTION_PREFIX,
    subscription_actor_name,
    subscription_group,
)
from raydelay.errors import Unavailable

log = logging.getLogger(__name__)


class Peer:
    """One named actor: ``create()`` returns a handle to it, creating it when it does not
    exist (``get_if_exists``).

    With ``route``, the peer is one part of an actor that holds many (a partition of a
    host, a partition of a subscription's actor): its calls go to the actor's ``call``
    method with ``route`` first (``call(*route, method, *args)``). With ``resolve``, the
    handle is what ``resolve()`` returns instead of a lookup by name (a partition's host
    is found through the coordinator's assignment, again after a failure)."""

    def __init__(
        self,
        name: str,
        create: Callable[[], Any],
        what: str | None = None,
        handle: Any = None,
        *,
        route: tuple = (),
        resolve: Callable[[], Any] | None = None,
    ) -> None:
        self.name = name
        self.what = what or name
        self._create = create
        self._resolve = resolve
        self.route = tuple(route)
        self._handle: Any = handle
        self._lock = threading.Lock()
        self.re_resolved = 0  # how many times a lost handle was looked up again

    @property
    def handle(self) -> Any:
        h = self._handle
        if h is None:
            with self._lock:
                if self._handle is None:
                    try:
                        if self._resolve is not None:
                            self._handle = self._resolve()
                        else:
                            found = placement.lookup_or_none(self.name)
                            if found is not None and placement.stranded(self.name):
                                placement.end_stranded(self.name, found)
                                found = None
                            self._handle = found or self._create()
                    except (RayError, ValueError) as exc:  # Ray's control service in trouble
                        raise Unavailable(f"{self.what}: cannot look it up: {exc}") from None
                h = self._handle
        return h

    def lost(self) -> None:
        """A call found the actor unavailable: the next use looks it up again."""
        with self._lock:
            if self._handle is not None:
                self._handle = None
                self.re_resolved += 1

    def remote(self, method: str, *args: Any) -> Any:
        """Submit one call (an ObjectRef); a failure to submit marks the handle lost."""
        try:
            if self.route:
                return self.handle.call.remote(*self.route, method, *args)
            return getattr(self.handle, method).remote(*args)
        except Exception:
            self.lost()
            raise

    def call(
        self, method: str, *args: Any, deadline_s: float, wait: Any = None, sleep=time.sleep
    ) -> Any:
        """A blocking call, retried (with the handle looked up again) while the actor is
        unavailable or the store fails retriably, for up to ``deadline_s``. Only for
        idempotent calls."""
        return rpc.call(
            lambda: self.remote(method, *args),
            what=self.what,
            deadline_s=deadline_s,
            sleep=sleep,
            wait=wait,
            on_failure=self.lost,
        )

    def call_from_thread(self, method: str, *args: Any, deadline_s: float) -> Any:
        """:meth:`call` from a thread of an async actor (not its event loop's)."""
        return self.call(method, *args, deadline_s=deadline_s, wait=rpc.get_blocking)

    async def once(self, method: str, *args: Any) -> Any:
        """One call from an async actor; an unavailable actor marks the handle lost (and
        the error is raised for the caller's own retry loop)."""
        if self._handle is None:  # looking up (or creating) asks Ray's control service:
            await asyncio.to_thread(lambda: self.handle)  # never on the event loop
        try:
            return await rpc.wait(self.remote(method, *args), what=self.what)
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
        if graceful and name != COORDINATOR:
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


def subscription_actors() -> list[str]:
    """The names of the live subscription actors (of every topic and subscription)."""
    return [n for n in named_actors() if n.startswith(SUBSCRIPTION_PREFIX)]


def stop_all(*, graceful: bool) -> int:
    """Stop every raydelay actor: subscriptions first (they call the hosts), the
    coordinator last (everyone calls it). Returns how many were running.

    ``graceful`` ends the subscriptions between calls; the hosts are stopped at once even
    then, once no subscription is left to call them: a graceful stop would wait behind the
    long polls standing there, which a subscription ended while it waited (a deleted
    topic's) left behind, for up to ``_LONG_POLL_S`` of its own (30 s)."""
    names = named_actors()
    subs = [n for n in names if n.startswith(SUBSCRIPTION_PREFIX)]
    others = [n for n in names if not n.startswith(SUBSCRIPTION_PREFIX) and n != COORDINATOR]
    coordinator = [n for n in names if n == COORDINATOR]
    return (
        stop(subs, graceful=graceful)
        + stop(others, graceful=False)
        + stop(coordinator, graceful=False)
    )


class PartitionPeers:
    """The partition actors of one topic or one subscription, one :class:`Peer` each: the
    Ray side of ``raydelay.client.links`` (a Producer or Consumer calls these)."""

    def __init__(self, peers: list[Peer], *, deadline_s: float) -> None:
        self._peers = peers
        self.partitions = len(peers)
        self.deadline_s = deadline_s  # how long a retried call goes on

    def _submit(self, partition: int, method: str, *args: Any) -> Any:
        return self._peers[partition].remote(method, *args)

    def ready(self, replies: Any, num: int, timeout_s: float) -> list[Any]:
        if not replies:
            return []
        return ray.wait(list(replies), num_returns=num, timeout=timeout_s)[0]

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

        return rpc.call(
            submit,
            what=what,
            deadline_s=self.deadline_s if deadline_s is None else deadline_s,
            wait=wait,
            on_failure=None if partition is None else self._peers[partition].lost,
        )

    def reconnect(self, partition: int) -> None:
        peer = self._peers[partition]
        peer.lost()
        peer.handle  # noqa: B018 - looks it up (or re-creates it) now; raises if that fails

    def connected(self) -> bool:
        return ray.is_initialized()


class TopicPartitions(PartitionPeers):
    """A topic's partition actors, as a producer calls them (``links.TopicLink``)."""

    def __init__(self, peers: list[Peer], *, deadline_s: float, cancel: Callable) -> None:
        super().__init__(peers, deadline_s=deadline_s)
        self.cancel = cancel  # markers through the topic, outcomes from every subscription

    def append(self, partition: int, batches: list[bytes]) -> Any:
        return self._submit(partition, "append", batches)

    def last_sequence(self, partition: int, producer: str) -> Any:
        return self._submit(partition, "last_sequence", producer)


class SubscriptionPartitions(PartitionPeers):
    """A subscription's partition actors, as a consumer calls them
    (``links.SubscriptionLink``)."""

    def receive(self, partition: int, consumer: str, max_messages: int, timeout_s: float,
                rewinds: int) -> Any:  # fmt: skip
        return self._actor_call(
            partition, "receive", partition, consumer, max_messages, timeout_s, rewinds
        )

    def _actor_call(self, partition: int, method: str, *args: Any) -> Any:
        """Call ``method`` of the actor serving ``partition`` itself (a call for several of
        its partitions); a failure to submit marks the handle lost."""
        peer = self._peers[partition]
        try:
            return getattr(peer.handle, method).remote(*args)
        except Exception:
            peer.lost()
            raise

    def receive_many(self, partitions: list[int], consumer: str, max_messages: int,
                     timeout_s: float, rewinds: int) -> Any:  # fmt: skip
        return self._actor_call(
            partitions[0], "receive_many", consumer, list(partitions), max_messages, timeout_s,
            rewinds,
        )  # fmt: skip

    def ack(self, partition: int, consumer: str, keys: Any) -> Any:
        return self._submit(partition, "ack", consumer, keys)

    def ack_many(self, acks: list[tuple[int, Any]], consumer: str, nack: Any = None) -> Any:
        return self._actor_call(acks[0][0], "ack_many", consumer, acks, nack)

    def nack(
        self, partition: int, consumer: str, keys: Any, delay_s: float, nacked_at_ms: int
    ) -> Any:
        return self._submit(partition, "nack", consumer, keys, delay_s, nacked_at_ms)

    def heartbeat_groups(self) -> list[list[int]]:
        groups: dict[str, list[int]] = {}
        for p, peer in enumerate(self._peers):
            groups.setdefault(peer.name, []).append(p)
        return list(groups.values())

    def heartbeat(self, partitions: list[int], consumer: str) -> Any:
        return self._actor_call(partitions[0], "heartbeat_many", consumer, list(partitions))

    def add_consumer(self, partition: int, consumer: str) -> Any:
        return self._submit(partition, "add_consumer", consumer)

    def remove_consumer(self, partition: int, consumer: str) -> Any:
        return self._submit(partition, "remove_consumer", consumer)

    def redeliver(self, partition: int, consumer: str, keys: Any, rewinds: int = 0,
                  check_only: bool = False) -> Any:  # fmt: skip
        return self._submit(partition, "redeliver", consumer, keys, rewinds, check_only)


def fan_out_cancel(
    topic_peer: Callable[[int], Peer],
    subscription_peer: Callable[[int, str], Peer],
    subscriptions: list[str],
    batches: dict[int, tuple[list[tuple[int, int]], int]],
    producer: str,
    *,
    deadline_s: float,
) -> tuple[dict[int, list[bool]], int]:
    """A cancel, end to end: for each partition p, ``batches[p]`` = (target positions,
    sequence id). First the durable cancel markers, one call per partition (deduplicated
    by producer and sequence id, so a retry gets the same markers); then every subscription
    applies them at once, one call per subscription actor for all its partitions
    (``cancel_many``). A target counts as cancelled (True) when no subscription had it
    delivered. Also returns how many times the markers were sent again (a host restarting,
    the store failing). Retried, with handles looked up again, for ``deadline_s``."""
    parts = list(batches)
    sends = 0

    def send_markers() -> list:
        nonlocal sends
        sends += 1
        return [
            topic_peer(p).remote("cancel", batches[p][0], producer, batches[p][1]) for p in parts
        ]

    def lost_all(peers: list[Peer]) -> Callable[[], None]:
        def lost() -> None:
            for peer in peers:
                peer.lost()

        return lost

    markers = dict(
        zip(
            parts,
            rpc.call(
                send_markers,
                what="cancel markers",
                deadline_s=deadline_s,
                on_failure=lost_all([topic_peer(p) for p in parts]),
            ),
            strict=True,
        )
    )
    out = {p: [True] * len(batches[p][0]) for p in parts}
    # one call per subscription actor: its partitions' targets and markers together
    groups: dict[str, tuple[Peer, dict[int, tuple[list, list]]]] = {}
    peers = []
    for sub in subscriptions:
        for p in parts:
            peer = subscription_peer(p, sub)
            peers.append(peer)
            groups.setdefault(peer.name, (peer, {}))[1][p] = (batches[p][0], markers[p])
    if not groups:
        return out, sends - 1

    def apply() -> list:
        return [peer.handle.cancel_many.remote(work) for peer, work in groups.values()]

    answers = rpc.call(
        apply, what="cancel in subscriptions", deadline_s=deadline_s, on_failure=lost_all(peers)
    )
    for answer in answers:
        for p, kept in answer.items():
            out[p] = [a and b for a, b in zip(out[p], kept, strict=True)]
    return out, sends - 1


# --- one partition, called like an actor of its own (tools, benchmarks, tests) ---------------


class _RoutedMethod:
    def __init__(self, handle: Any, route: tuple, method: str) -> None:
        self._handle, self._route, self._method = handle, route, method

    def remote(self, *args: Any) -> Any:
        return self._handle.call.remote(*self._route, self._method, *args)


class Routed:
    """One partition of a host, or of a subscription's actor, called like an actor of its
    own: ``part.stats.remote()`` is ``host.call.remote(topic, p, "stats")``; ``pid`` is
    its process's."""

    def __init__(self, handle: Any, route: tuple, name: str) -> None:
        self.handle, self.route, self.name = handle, route, name

    def __getattr__(self, method: str) -> _RoutedMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return _RoutedMethod(self.handle, self.route, method)


def host_of(topic: str, partition: int) -> str:
    """The name of the host serving the partition (started if needed)."""
    coordinator = placement.lookup(COORDINATOR)
    return rpc.get(coordinator.locate.remote(topic, partition), what="coordinator")


def topic_partition(topic: str, partition: int) -> Routed:
    """The partition's TopicPartition, on its host."""
    name = host_of(topic, partition)
    return Routed(placement.lookup(name), (topic, partition), name)


def subscription_partition(topic: str, partition: int, subscription: str) -> Routed:
    """A partition of a subscription, on the subscription's actor that serves it."""
    coordinator = placement.lookup(COORDINATOR)
    options = rpc.get(coordinator.subscription.remote(topic, subscription), what="coordinator")
    group = subscription_group(partition, int(options.get("partitions_per_actor", -1)))
    name = subscription_actor_name(topic, subscription, group)
    return Routed(placement.lookup(name), (partition,), name)
