"""What the parts of one client share: its ways to the cluster's actors
(:class:`ClusterPeers`: the coordinator, each topic partition on its host, each
subscription partition on the host of its subscription's unit, and how long a call to them is
retried) and its own state (:class:`Session`: its producers and consumers, and whether it
is shut down). A view made by ``Cluster.with_retry_deadline`` shares both, with its own
retry deadline."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.host import HostActor, coordinator_peer, partition_peer
from raydelay.actors.subscription import SubscriptionHost, UnitPeer, unit_peer
from raydelay.client.consumer import Consumer
from raydelay.client.producer import Producer
from raydelay.cluster.handles import Peer, retried_across
from raydelay.cluster.names import Unit, subscription_group, subscription_groups
from raydelay.config import ClientConfig, Config, config_to_dict
from raydelay.errors import InvalidArgument
from raydelay.storage.keys import validate_name

P = ParamSpec("P")
R = TypeVar("R")


@dataclasses.dataclass
class Session:
    """One client's producers and consumers (closed when it shuts down), whether it is shut
    down, and whether ``connect`` started the Ray it is in (stopped then too) or joined a
    running one (left then)."""

    started_ray: bool = False
    joined_ray: bool = False
    closed: bool = False
    producers: list[Producer] = dataclasses.field(default_factory=list)
    consumers: list[Consumer] = dataclasses.field(default_factory=list)

    def check_open(self) -> None:
        if self.closed:
            raise InvalidArgument("cluster: it was shut down")

    def flush_acks(self, topic: str) -> None:
        """Wait for the acks this process's consumers of ``topic`` have sent, so that the
        numbers asked for next count them."""
        for consumer in self.consumers:
            if consumer.topic == topic and not consumer._closed:
                consumer.flush()


class ClusterPeers:
    """A client's peers of the coordinator and of the partitions it has talked to, made on
    first use and kept; every call through them is retried while its actor restarts, for
    up to ``client.retry_deadline_s``."""

    def __init__(self, coordinator: Any, config: Config, client: ClientConfig) -> None:
        self.config = config  # the cluster's (the coordinator's) config
        self.client = client  # this client's own settings
        self.config_dict = config_to_dict(config)
        self.coordinator = coordinator_peer(self.config_dict, found=coordinator)
        self._peers: dict[tuple, Peer] = {}  # (topic, partition[, subscription]) -> its peer
        self._per_actors: dict[tuple[str, str], int] = {}  # partitions_per_actor of a sub

    def with_deadline(self, deadline_s: float) -> ClusterPeers:
        """The same peers (and caches), their calls retried for ``deadline_s`` instead."""
        view = copy.copy(self)
        view.client = self.client.model_copy(update={"retry_deadline_s": float(deadline_s)})
        return view

    @property
    def deadline_s(self) -> float:
        return self.client.retry_deadline_s

    def coord(
        self,
        method: Callable[Concatenate[CoordinatorActor, P], R],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """A coordinator call, retried while it restarts (or is re-created after it ended),
        for up to client.retry_deadline_s."""
        return self.coordinator.retried(
            lambda: self.coordinator.submit(method, *args, **kwargs),
            deadline_s=self.deadline_s,
        )

    def call(self, submit: Callable[[], list], what: str) -> list:
        """An idempotent call, retried while the actor restarts (client.retry_deadline_s);
        the peers it went through are looked up again after a failed attempt."""
        return retried_across(submit, what=what, deadline_s=self.deadline_s)

    def partitions(self, topic: str) -> int:
        validate_name("topic", topic)
        return int(self.coord(CoordinatorActor.partitions, topic))

    def on_partitions(
        self,
        topic: str,
        partitions: int,
        method: Callable[Concatenate[HostActor, str, int, P], Any],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> list:
        """``method(topic, p, *args)`` on every partition p of ``topic`` (retried while a host
        restarts)."""
        peers = [self.topic_peer(topic, p) for p in range(partitions)]
        return self.call(
            lambda: [
                peer.submit(method, topic, p, *args, **kwargs) for p, peer in enumerate(peers)
            ],
            f"topic {topic}",
        )

    def on_partition(
        self,
        topic: str,
        partition: int,
        method: Callable[Concatenate[HostActor, str, int, P], Any],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> Any:
        """``method(topic, partition, *args)`` on one partition of ``topic`` (retried while
        its host restarts)."""
        return self.call(
            lambda: [
                self.topic_peer(topic, partition).submit(method, topic, partition, *args, **kwargs)
            ],
            f"topic {topic}",
        )[0]

    def subscription_options(self, topic: str, subscription: str) -> dict:
        """A subscription's options; NotFound when it does not exist."""
        validate_name("subscription", subscription)
        return self.coord(CoordinatorActor.subscription, topic, subscription)

    def per_actor(self, topic: str, subscription: str) -> int:
        """How many partitions one actor of the subscription serves (-1: all)."""
        key = (topic, subscription)
        if key not in self._per_actors:
            options = self.subscription_options(topic, subscription)
            self._per_actors[key] = options.get(
                "partitions_per_actor", self.config.subscription.partitions_per_actor
            )
        return self._per_actors[key]

    def units(self, topic: str, subscription: str, partitions: int) -> list[Unit]:
        """The units of a subscription (one per partition group)."""
        per_actor = self.per_actor(topic, subscription)
        return [Unit(topic, subscription, g) for g in subscription_groups(partitions, per_actor)]

    def topic_peer(self, topic: str, partition: int) -> Peer[HostActor]:
        """The partition of a topic, on its host (found through the coordinator, which
        starts the host if needed; NotFound once the topic is deleted)."""
        key = (topic, partition)
        peer = self._peers.get(key)
        if peer is None:
            peer = self._peers[key] = partition_peer(
                topic, partition, self.config_dict, self.coordinator
            )
        return peer

    def subscription_peer(self, topic: str, partition: int, subscription: str) -> UnitPeer:
        """A partition of a subscription: its unit, on the subscription host serving it
        (found through the coordinator, which assigns the unit and starts the host if
        needed; NotFound once the subscription is deleted). Partitions of one unit share
        one peer."""
        unit = Unit(
            topic, subscription, subscription_group(partition, self.per_actor(topic, subscription))
        )
        key = (topic, unit.key, subscription)
        peer = self._peers.get(key)
        if not isinstance(peer, UnitPeer):
            peer = self._peers[key] = unit_peer(unit, self.config_dict, self.coordinator)
        return peer

    def on_subscription(
        self,
        topic: str,
        partition: int,
        subscription: str,
        method: Callable[Concatenate[SubscriptionHost, Unit, int, P], Any],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> Any:
        """Submit ``method(unit, partition, *args)`` on the host of the unit serving a
        partition of a subscription; an ObjectRef."""
        peer = self.subscription_peer(topic, partition, subscription)
        return peer.submit(method, peer.unit, partition, *args, **kwargs)

    def forget_topic(self, topic: str) -> None:
        """Drop the peers and options kept of a deleted topic."""
        for key in [k for k in self._peers if k[0] == topic]:
            del self._peers[key]
        for key in [k for k in self._per_actors if k[0] == topic]:
            del self._per_actors[key]

    def forget_subscription(self, topic: str, subscription: str) -> None:
        """Drop the peers and options kept of a deleted subscription."""
        for key in [k for k in self._peers if k[0] == topic and k[2:] == (subscription,)]:
            del self._peers[key]
        self._per_actors.pop((topic, subscription), None)
