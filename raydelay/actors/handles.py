"""The client side of the calls to partitions (on their hosts and subscription hosts), typed by the actors' own methods.

- :class:`TopicHandles` and :class:`SubscriptionHandles`: what a Producer and a Consumer
  call (``raydelay.client.links``' protocols), one :class:`~raydelay.cluster.handles.Peer`
  per partition.
- :func:`fan_out_cancel`: a cancel, from the markers in the log to every subscription
  (:func:`apply_markers`, its second half, also applies the markers of keyed sends).
- :class:`HostPartition` and :class:`SubscriptionPartition`: one partition, called
  directly (tools, benchmarks and tests): ``part.submit(HostActor.stats)``.

Every call names the actor method it runs (``HostActor.append``,
``SubscriptionHost.ack``...), so mypy checks its arguments and its reply against that
method; nothing goes by a method name. A subscription host's calls name the unit first
(``UnitPeer.unit``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.host import HostActor
from raydelay.actors.standby import find_coordinator
from raydelay.actors.subscription import SubscriptionHost, UnitPeer
from raydelay.cluster import placement, rpc
from raydelay.cluster.handles import PartitionPeers, Peer, refresh_all
from raydelay.cluster.names import COORDINATOR, Unit, host_node_prefix, subscription_group

P = ParamSpec("P")
ActorT = TypeVar("ActorT")


class TopicHandles(PartitionPeers[HostActor]):
    """A topic's partitions on their hosts, as a producer calls them (``links.TopicLink``)."""

    def __init__(
        self,
        topic: str,
        peers: list[Peer[HostActor]],
        *,
        deadline_s: float,
        cancel: Callable,
        apply: Callable,
        subscriptions_ahead: Callable[[], Callable[[], list[str]]],
        guard_keys: Callable[[list[str]], None] = lambda keys: None,
    ) -> None:
        super().__init__(peers, deadline_s=deadline_s)
        self.topic = topic
        self.cancel = cancel  # markers through the topic, outcomes from every subscription
        self.apply = apply  # markers in the log already: outcomes from every subscription
        self.subscriptions_ahead = subscriptions_ahead  # the lookup started, its getter
        self.guard_keys = guard_keys  # raises for keys a cancel must not take

    def append(self, partition: int, batches: list[bytes]) -> Any:
        return self._peers[partition].submit(HostActor.append, self.topic, partition, batches)

    def append_keyed(self, partition: int, batch: bytes, on_duplicate: str) -> Any:
        peer = self._peers[partition]
        return peer.submit(HostActor.append_keyed, self.topic, partition, batch, on_duplicate)

    def cancel_keys(self, partition: int, keys: list[str], producer: str, sequence_id: int) -> Any:
        peer = self._peers[partition]
        return peer.submit(
            HostActor.cancel_keys, self.topic, partition, keys, producer, sequence_id
        )

    def pending_keys(self, partition: int, keys: list[str]) -> Any:
        return self._peers[partition].submit(HostActor.pending_keys, self.topic, partition, keys)

    def last_sequence(self, partition: int, producer: str) -> Any:
        peer = self._peers[partition]
        return peer.submit(HostActor.last_sequence, self.topic, partition, producer)

    def check_cancel(self, targets: dict[int, list[tuple[int, int]]]) -> None:
        check_cancel_targets(self.topic, self._peers.__getitem__, targets, self.deadline_s)


class SubscriptionHandles(PartitionPeers[SubscriptionHost]):
    """A subscription's partitions on the hosts of its units, as a consumer calls them
    (``links.SubscriptionLink``). A call for several partitions goes to the unit of the
    first (they share it: a group of :meth:`heartbeat_groups`)."""

    _peers: Sequence[UnitPeer]

    def receive(self, partition: int, consumer: str, max_messages: int, timeout_s: float,
                rewinds: int) -> Any:  # fmt: skip
        return self._on(
            partition,
            SubscriptionHost.receive,
            partition,
            consumer,
            max_messages,
            timeout_s,
            rewinds,
        )

    def receive_many(self, partitions: list[int], consumer: str, max_messages: int,
                     timeout_s: float, rewinds: int, packed: bool = False,
                     ahead_ms: int = 0) -> Any:  # fmt: skip
        return self._on(
            partitions[0],
            SubscriptionHost.receive_many,
            consumer,
            list(partitions),
            max_messages,
            timeout_s,
            rewinds,
            packed,
            ahead_ms,
        )

    def ack(self, partition: int, consumer: str, keys: Any) -> Any:
        return self._on(partition, SubscriptionHost.ack, partition, consumer, keys)

    def ack_many(self, acks: list[tuple[int, Any]], consumer: str, nack: Any = None) -> Any:
        return self._on(acks[0][0], SubscriptionHost.ack_many, consumer, acks, nack)

    def nack(
        self, partition: int, consumer: str, keys: Any, delay_s: float, nacked_at_ms: int
    ) -> Any:
        return self._on(
            partition, SubscriptionHost.nack, partition, consumer, keys, delay_s, nacked_at_ms
        )

    def heartbeat_groups(self) -> list[list[int]]:
        groups: dict[str, list[int]] = {}
        for p, peer in enumerate(self._peers):
            groups.setdefault(peer.name, []).append(p)
        return list(groups.values())

    def actor_of(self, partition: int) -> str:
        return self._peers[partition].name

    def node_of(self, partition: int) -> str | None:
        host = self._peers[partition].host  # (its name says its node)
        return None if host is None else host_node_prefix(host)

    def heartbeat(self, partitions: list[int], consumer: str) -> Any:
        return self._on(partitions[0], SubscriptionHost.heartbeat_many, consumer, list(partitions))

    def add_consumer(self, partition: int, consumer: str) -> Any:
        return self._on(partition, SubscriptionHost.add_consumer, partition, consumer)

    def remove_consumer(self, partition: int, consumer: str) -> Any:
        return self._on(partition, SubscriptionHost.remove_consumer, partition, consumer)

    def redeliver(self, partition: int, consumer: str, keys: Any, rewinds: int = 0,
                  check_only: bool = False) -> Any:  # fmt: skip
        return self._on(
            partition, SubscriptionHost.redeliver, partition, consumer, keys, rewinds, check_only
        )

    def _on(
        self,
        partition: int,
        method: Callable[Concatenate[SubscriptionHost, Unit, P], Any],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> Any:
        """Submit a call of the unit serving ``partition`` (the unit goes first)."""
        peer = self._peers[partition]
        return peer.submit(method, peer.unit, *args, **kwargs)


def check_cancel_targets(
    topic: str,
    topic_peer: Callable[[int], Peer[HostActor]],
    targets: dict[int, list[tuple[int, int]]],
    deadline_s: float,
) -> None:
    """NotFound for the first target that a cancel would refuse, asked of every partition
    at once, before anything is written: a cancel of several partitions (or topics) is
    then all or nothing (a target that passed stays good, see ``Appender.check_targets``)."""
    parts = list(targets)
    rpc.call(
        lambda: [topic_peer(p).submit(HostActor.check_cancel, topic, p, targets[p]) for p in parts],
        what="cancel targets",
        deadline_s=deadline_s,
        on_failure=lost_all([topic_peer(p) for p in parts]),
    )


def lost_all(peers: list[Peer]) -> Callable[[], None]:
    """What a retried call of ``peers`` does after a failure: :func:`refresh_all`."""
    return functools.partial(refresh_all, peers)


def fan_out_cancel(
    topic: str,
    topic_peer: Callable[[int], Peer[HostActor]],
    subscription_peer: Callable[[int, str], UnitPeer],
    subscriptions: Callable[[], list[str]],
    batches: dict[int, tuple[list[tuple[int, int]], int]],
    producer: str,
    *,
    deadline_s: float,
) -> tuple[dict[int, list[bool]], int]:
    """A cancel, end to end: for each partition p of ``topic``, ``batches[p]`` = (target
    positions, sequence id). First the durable cancel markers, one call per partition
    (deduplicated by producer and sequence id, so a retry gets the same markers); then every
    subscription applies them at once, one call per subscription actor for all its
    partitions (``cancel_many``). A target counts as cancelled (True) when no subscription
    had it delivered. Also returns how many times the markers were sent again (a host
    restarting, the store failing). Retried, with handles looked up again, for
    ``deadline_s``. ``subscriptions()`` waits for the topic's subscriptions, a lookup the
    caller started before the markers (so that its trip overlaps theirs)."""
    parts = list(batches)
    sends = 0
    if len(parts) > 1:  # (one partition's host checks its targets before it writes)
        check_cancel_targets(
            topic, topic_peer, {p: batches[p][0] for p in parts}, deadline_s=deadline_s
        )

    def send_markers() -> list:
        nonlocal sends
        sends += 1
        return [
            topic_peer(p).submit(HostActor.cancel, topic, p, batches[p][0], producer, batches[p][1])
            for p in parts
        ]

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
    work = {p: (batches[p][0], markers[p]) for p in parts}
    return apply_markers(subscription_peer, subscriptions(), work, deadline_s=deadline_s), sends - 1


def apply_markers(
    subscription_peer: Callable[[int, str], UnitPeer],
    subscriptions: list[str],
    work: dict[int, tuple[list[tuple[int, int]], list[tuple[int, int]]]],
    *,
    deadline_s: float,
) -> dict[int, list[bool]]:
    """Have every subscription apply cancel markers already in the log: ``work[p]`` =
    (targets, markers) of partition p. One call per subscription actor for all its
    partitions (``cancel_many``); per partition, whether each target was kept from
    delivery in every subscription. Retried, with handles looked up again."""
    parts = [p for p in work if work[p][0]]
    out = {p: [True] * len(work[p][0]) for p in work}
    # one call per unit of each subscription: its partitions' targets and markers together
    groups: dict[str, tuple[UnitPeer, dict[int, tuple[list, list]]]] = {}
    peers: list[Peer] = []
    for sub in subscriptions:
        for p in parts:
            peer = subscription_peer(p, sub)
            peers.append(peer)
            groups.setdefault(peer.name, (peer, {}))[1][p] = work[p]
    if not groups:
        return out

    def apply() -> list:
        return [
            peer.submit(SubscriptionHost.cancel_many, peer.unit, w) for peer, w in groups.values()
        ]

    answers = rpc.call(
        apply, what="cancel in subscriptions", deadline_s=deadline_s, on_failure=lost_all(peers)
    )
    for answer in answers:
        for p, kept in answer.items():
            out[p] = [a and b for a, b in zip(out[p], kept, strict=True)]
    return out


# --- one partition, called directly (tools, benchmarks, tests) --------------------------------


class _OnePartition(Generic[ActorT]):
    """One partition on the actor that holds it (``handle``, named ``name``)."""

    def __init__(self, handle: Any, name: str) -> None:
        self.handle, self.name = handle, name

    def pid(self) -> Any:
        """The ObjectRef of its process's id."""
        return self.handle.pid.remote()

    def actor(
        self, method: Callable[Concatenate[ActorT, P], Any], /, *args: P.args, **kwargs: P.kwargs
    ) -> Any:
        """Submit a call of the whole actor (not of this partition); an ObjectRef."""
        return getattr(self.handle, method.__name__).remote(*args, **kwargs)


class HostPartition(_OnePartition[HostActor]):
    """A partition of a topic on its host: ``part.submit(HostActor.stats)`` is
    ``host.stats.remote(topic, partition)``."""

    def __init__(self, handle: Any, topic: str, partition: int, name: str) -> None:
        super().__init__(handle, name)
        self.topic, self.partition = topic, partition

    def submit(
        self,
        method: Callable[Concatenate[HostActor, str, int, P], Any],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> Any:
        """Submit a call of the partition (the topic and partition go first); an ObjectRef."""
        return self.actor(method, self.topic, self.partition, *args, **kwargs)


class SubscriptionPartition(_OnePartition[SubscriptionHost]):
    """A partition of a subscription on the host serving its unit:
    ``part.submit(SubscriptionHost.stats)`` is ``host.stats.remote(unit, partition)``."""

    def __init__(self, handle: Any, unit: Unit, partition: int, name: str) -> None:
        super().__init__(handle, name)
        self.unit, self.partition = unit, partition

    def submit(
        self,
        method: Callable[Concatenate[SubscriptionHost, Unit, int, P], Any],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> Any:
        """Submit a call of the partition (the unit and partition go first); an ObjectRef."""
        return self.actor(method, self.unit, self.partition, *args, **kwargs)


def coordinator_handle() -> Peer[CoordinatorActor]:
    """The coordinator that serves (looked up, never created here; ValueError when none
    runs)."""
    found = find_coordinator()
    if found is None:
        raise ValueError("no raydelay coordinator runs")
    return Peer(
        COORDINATOR, lambda: found.handle, "coordinator", found.handle, actor_name=found.name
    )


def host_of(topic: str, partition: int) -> str:
    """The name of the host serving the partition (started if needed)."""
    return rpc.get(
        coordinator_handle().submit(CoordinatorActor.locate, topic, partition), what="coordinator"
    )


def topic_partition(topic: str, partition: int) -> HostPartition:
    """A handle to the partition on its host (its HostedPartition there)."""
    name = host_of(topic, partition)
    return HostPartition(placement.lookup(name), topic, partition, name)


def unit_host_of(topic: str, subscription: str, group: int = 0) -> str:
    """The name of the subscription host serving unit ``group`` of a subscription (the
    unit assigned, and its host started, if needed)."""
    return rpc.get(
        coordinator_handle().submit(CoordinatorActor.locate_unit, topic, subscription, group),
        what="coordinator",
    )


def subscription_partition(topic: str, partition: int, subscription: str) -> SubscriptionPartition:
    """A partition of a subscription, on the subscription host serving its unit."""
    options = rpc.get(
        coordinator_handle().submit(CoordinatorActor.subscription, topic, subscription),
        what="coordinator",
    )
    group = subscription_group(partition, int(options.get("partitions_per_actor", -1)))
    unit = Unit(topic, subscription, group)
    name = unit_host_of(*unit)
    return SubscriptionPartition(placement.lookup(name), unit, partition, name)
