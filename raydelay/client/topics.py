"""Topics and subscriptions of one client: creating, listing and deleting them, its
producers and consumers of them, and their numbers (stats, partition hosts, placement).
What ``Cluster.create_topic``, ``subscribe``, ``create_producer``, ``stats`` and the rest
do; their docstrings are on :class:`~raydelay.client.connection.Cluster`."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.handles import (
    SubscriptionHandles,
    TopicHandles,
    apply_markers,
    fan_out_cancel,
)
from raydelay.actors.host import HostActor
from raydelay.actors.metrics import LATENESS_BOUNDARIES_MS
from raydelay.actors.subscription import SubscriptionHost
from raydelay.client.consumer import Consumer
from raydelay.client.cursors import Cursors
from raydelay.client.message import check_number
from raydelay.client.multi import PATTERN_REFRESH_S, MultiTopicConsumer
from raydelay.client.peers import ClusterPeers, Session
from raydelay.client.producer import Producer
from raydelay.cluster import placement, rpc
from raydelay.cluster.handles import Peer
from raydelay.cluster.names import Unit, subscription_groups
from raydelay.config import Config
from raydelay.dispatch import stages
from raydelay.dispatch.counts import partition_entries
from raydelay.errors import InvalidArgument, NotFound
from raydelay.limits import check_limit
from raydelay.positions import key_of, position_of
from raydelay.storage import make_store
from raydelay.storage.keys import validate_name
from raydelay.subscription_types import check_subscription_type
from raydelay.tasks import cron
from raydelay.tasks.status import write_cancelled

_SUMMED = (
    "delayed",
    "backlog",
    "pending_ack",
    "buckets",
    "redelivery",
    "dead_letter_pending",
    "dead_lettered",
    "read_ahead",
    "delivered",
    "acked",
    "redelivered",
    "cancelled",
)


class Topics:
    """The topics-and-subscriptions side of one client."""

    def __init__(self, peers: ClusterPeers, session: Session) -> None:
        self.peers = peers
        self._session = session
        self.cursors = Cursors(peers)
        self._store: Any = None  # (made when a cancel of a scheduled call needs a record)

    @property
    def config(self) -> Config:
        """The cluster's (the coordinator's) config."""
        return self.peers.config

    def create_topic(self, topic: str, partitions: int = 1) -> None:
        """See :meth:`Cluster.create_topic`."""
        validate_name("topic", topic)
        self.peers.coord(CoordinatorActor.create_topic, topic, partitions)
        self.peers.on_partitions(topic, partitions, HostActor.tail)

    def topics(self) -> dict[str, int]:
        """See :meth:`Cluster.topics`."""
        return dict(self.peers.coord(CoordinatorActor.topics))

    def delete_topic(self, topic: str, *, force: bool = False) -> int:
        """See :meth:`Cluster.delete_topic`."""
        n = self.peers.partitions(topic)
        subs = self.peers.coord(CoordinatorActor.subscriptions, topic)
        if subs and not force:
            raise InvalidArgument(
                f"topic: {topic!r} has subscriptions ({', '.join(sorted(subs))}); "
                "delete it with force=True (CLI: --force)"
            )
        for consumer in [c for c in self._session.consumers if c.topic == topic]:
            consumer.close()
        # subscriptions first (they read from the topic's hosts): their units stop
        self._drop_units([u for s in subs for u in self.peers.units(topic, s, n)])
        hosts = {
            h
            for k, h in self.peers.coord(CoordinatorActor.assignments).items()
            if k.rsplit("/", 1)[0] == topic
        }
        drops = [h.drop_topic.remote(topic) for h in map(placement.lookup_or_none, hosts) if h]
        rpc.get(drops, what=f"hosts of {topic}")
        self.peers.forget_topic(topic)
        return int(self.peers.coord(CoordinatorActor.delete_topic, topic))

    def _check_per_actor(self, topic: str, subscription: str, per_actor: int | None) -> int:
        """The partitions_per_actor of a subscription being created or joined."""
        try:
            existing = self.peers.subscription_options(topic, subscription).get(
                "partitions_per_actor"
            )
        except NotFound:
            existing = None
        if per_actor is None:
            return existing or self.config.subscription.partitions_per_actor
        check_limit("partitions_per_actor", per_actor)
        if existing is not None and existing != per_actor:
            raise InvalidArgument(
                f"partitions_per_actor: {topic}/{subscription} exists with {existing}; it "
                f"cannot become {per_actor}"
            )
        return per_actor

    def create_producer(
        self,
        topic: str,
        name: str | None = None,
        *,
        max_pending_messages: int | None = None,
        block_if_queue_full: bool | None = None,
    ) -> Producer:
        """See :meth:`Cluster.create_producer`."""
        peers = [self.peers.topic_peer(topic, p) for p in range(self.peers.partitions(topic))]
        for peer in peers:
            peer.handle  # noqa: B018 - resolved now: a failure shows here, not at the first send

        def cancel(batches: dict, producer: str) -> tuple[dict[int, list[bool]], int]:
            return self.cancel_batches(topic, batches, producer)

        def apply(work: dict, subscriptions: Callable[[], list[str]] | None = None) -> dict:
            return self.apply_markers(topic, work, subscriptions)

        link = TopicHandles(
            topic,
            peers,
            deadline_s=self.peers.deadline_s,
            cancel=cancel,
            apply=apply,
            subscriptions_ahead=lambda: self.subscriptions_ahead(topic),
            guard_keys=lambda keys: self.guard_keys(topic, keys),
        )
        producer = Producer(
            link,
            topic,
            self.config,
            name,
            on_close=self._session.producers.remove,
            max_pending_messages=max_pending_messages,
            block_if_queue_full=block_if_queue_full,
        )
        self._session.producers.append(producer)
        return producer

    # --- subscriptions -----------------------------------------------------------------------

    def subscribe(
        self,
        topic: str | list[str] | re.Pattern,
        subscription: str,
        subscription_type: str = "shared",
        ack_timeout_s: float | None = None,
        max_redeliveries: int | None = None,
        dead_letter_topic: str | None = None,
        *,
        prefetch: bool = False,
        initial_position: str = "earliest",
        partitions_per_actor: int | None = None,
    ) -> Consumer | MultiTopicConsumer:
        """See :meth:`Cluster.subscribe`."""
        if isinstance(topic, (list, tuple, re.Pattern)):
            return self.subscribe_many(
                topic,
                subscription,
                dict(
                    subscription_type=subscription_type,
                    ack_timeout_s=ack_timeout_s,
                    max_redeliveries=max_redeliveries,
                    dead_letter_topic=dead_letter_topic,
                    prefetch=prefetch,
                    initial_position=initial_position,
                    partitions_per_actor=partitions_per_actor,
                ),
            )
        if isinstance(topic, str) and set(topic) & set("*+?[](){}|^$\\"):
            raise InvalidArgument(
                f"topic: {topic!r} is not a topic name; for a pattern pass re.compile({topic!r})"
            )
        validate_name("subscription", subscription)
        if initial_position not in ("earliest", "latest"):
            raise InvalidArgument(
                f"initial_position: must be 'earliest' or 'latest', got {initial_position!r}"
            )
        if not isinstance(prefetch, bool):
            raise InvalidArgument(f"prefetch: expected True or False, got {prefetch!r}")
        kind = check_subscription_type(subscription_type)
        if ack_timeout_s is None:
            ack_timeout_s = self.config.subscription.ack_timeout_s
        if ack_timeout_s is not None:
            ack_timeout_s = check_number("ack_timeout_s", ack_timeout_s, minimum=0.001)
        if max_redeliveries is None:
            max_redeliveries = self.config.subscription.max_redeliveries
        if max_redeliveries is not None and (
            isinstance(max_redeliveries, bool)
            or not isinstance(max_redeliveries, int)
            or max_redeliveries < 0
        ):
            raise InvalidArgument(
                f"max_redeliveries: expected an int >= 0, got {max_redeliveries!r}"
            )
        if dead_letter_topic is not None:
            validate_name("dead_letter_topic", dead_letter_topic)
        n = self.peers.partitions(topic)
        if max_redeliveries is not None:
            self.create_topic(dead_letter_topic or f"{topic}-{subscription}-DLQ", 1)
        per_actor = self._check_per_actor(topic, subscription, partitions_per_actor)
        options = {
            "type": subscription_type,
            "ack_timeout_s": ack_timeout_s,
            "max_redeliveries": max_redeliveries,
            "dead_letter_topic": dead_letter_topic,
            "partitions_per_actor": per_actor,
        }
        start = None
        if initial_position == "latest":
            tails = self.peers.on_partitions(topic, n, HostActor.tail)
            start = [None if t is None else [int(t[0]), int(t[1])] for t in tails]
        self.peers.coord(CoordinatorActor.create_subscription, topic, subscription, options, start)
        peers = [self.peers.subscription_peer(topic, p, subscription) for p in range(n)]
        for peer in peers:
            peer.handle  # noqa: B018 - resolved now: a failure shows here, not later
        link = SubscriptionHandles(peers, deadline_s=self.peers.deadline_s)
        consumer = Consumer(
            link,
            topic,
            subscription,
            lease_s=self.config.subscription.consumer_lease_s,
            # (exclusive and failover ignore deliver_at: nothing of theirs is held)
            ahead_ms=self.config.subscription.handout_ahead_ms if kind.spreads else 0,
            prefetch=prefetch,
            seek=lambda to, inclusive: self.cursors.reset(topic, subscription, n, to, inclusive),
            tails=lambda: self.peers.on_partitions(topic, n, HostActor.tail),
        )
        self._session.consumers.append(consumer)
        return consumer

    def subscribe_many(
        self,
        topics: list[str] | tuple | re.Pattern | Callable[[str], bool],
        subscription: str,
        options: dict,
        refresh_s: float = PATTERN_REFRESH_S,
    ) -> MultiTopicConsumer:
        """A consumer of ``subscription`` on a list of topics, or on those a pattern (or a
        predicate on names) matches."""
        validate_name("subscription", subscription)
        predicate: Callable[[str], object] | None
        if callable(topics) and not isinstance(topics, re.Pattern):
            predicate = topics
        elif isinstance(topics, re.Pattern):
            predicate = topics.fullmatch
        else:
            predicate = None

        def join(topic: str) -> Consumer:
            consumer = self.subscribe(topic, subscription, **options)
            assert isinstance(consumer, Consumer)  # (one topic: one Consumer)
            return consumer

        pattern = topics if isinstance(topics, re.Pattern) else None
        if predicate is not None:

            def matching() -> list[str]:
                return sorted(
                    t
                    for t in self.topics()
                    if predicate(t) and not t.endswith(f"-{subscription}-DLQ")
                )

            names = matching()
        else:
            names = list(cast("list[str] | tuple", topics))
            if not names:
                raise InvalidArgument("topic: an empty list of topics")
            for t in names:
                validate_name("topic", t)
            if len(set(names)) != len(names):
                raise InvalidArgument(f"topic: a topic is listed twice in {names!r}")
            for t in names:
                self.peers.partitions(t)  # NotFound, before any subscription is made
        consumers: dict[str, Consumer] = {}
        try:
            for t in names:
                consumers[t] = join(t)
        except BaseException:
            for c in consumers.values():
                c.close()
            raise
        return MultiTopicConsumer(
            subscription,
            consumers,
            join=join,
            topics_now=matching if predicate is not None else None,
            pattern=pattern,
            pattern_refresh_s=refresh_s,
        )

    def delete_subscription(self, topic: str, subscription: str) -> int:
        """See :meth:`Cluster.delete_subscription`."""
        n = self.peers.partitions(topic)
        self.peers.subscription_options(topic, subscription)  # NotFound
        for consumer in [
            c
            for c in self._session.consumers
            if c.topic == topic and c.subscription == subscription
        ]:
            consumer.close()
        self._drop_units(self.peers.units(topic, subscription, n))
        self.peers.forget_subscription(topic, subscription)
        return int(self.peers.coord(CoordinatorActor.delete_subscription, topic, subscription))

    def _drop_units(self, units: list[Unit]) -> None:
        """Stop serving ``units`` on the hosts they are assigned to (their subscription is
        being deleted), and wait until they have stopped."""
        assigned = self.peers.coord(CoordinatorActor.unit_assignments)
        by_host: dict[str, list[Unit]] = {}
        for u in units:
            if u.key in assigned:
                by_host.setdefault(assigned[u.key], []).append(u)
        drops = []
        for host, mine in by_host.items():
            handle = placement.lookup_or_none(host)
            if handle is not None:
                drops.append(
                    Peer(host, lambda: None, host, handle).submit(SubscriptionHost.drop, mine)
                )
        rpc.get(drops, what="subscription hosts")

    # --- cancel and stats ---------------------------------------------------------------------

    def cancel_batches(
        self, topic: str, batches: dict[int, tuple[list[tuple[int, int]], int]], producer: str
    ) -> tuple[dict[int, list[bool]], int]:
        """See :func:`raydelay.actors.handles.fan_out_cancel`."""
        self._guard_occurrences(topic, {p: batches[p][0] for p in batches})
        outcome, sends = fan_out_cancel(
            topic,
            lambda p: self.peers.topic_peer(topic, p),
            lambda p, s: self.peers.subscription_peer(topic, p, s),
            self.subscriptions_ahead(topic),  # asked now, awaited once the markers are in
            batches,
            producer,
            deadline_s=self.peers.deadline_s,
        )
        self._cancelled_calls(topic, {p: batches[p][0] for p in batches}, outcome)
        return outcome, sends

    def apply_markers(
        self,
        topic: str,
        work: dict[int, tuple[list[tuple[int, int]], list[tuple[int, int]]]],
        subscriptions: Callable[[], list[str]] | None = None,
    ) -> dict[int, list[bool]]:
        """See :func:`raydelay.actors.handles.apply_markers`; ``subscriptions``, the getter
        of a lookup started earlier (:meth:`subscriptions_ahead`)."""
        outcome = apply_markers(
            lambda p, s: self.peers.subscription_peer(topic, p, s),
            (subscriptions or self.subscriptions_ahead(topic))(),
            work,
            deadline_s=self.peers.deadline_s,
        )
        self._cancelled_calls(topic, {p: work[p][0] for p in work}, outcome)
        return outcome

    def subscriptions_ahead(self, topic: str) -> Callable[[], list[str]]:
        """Ask the coordinator for the topic's subscriptions now; the getter waits for the
        answer (asked again, retried, if that first call failed). A cancel by key asks
        while its markers are written, as a cancel by id takes its list before writing: a
        round trip less on its path."""
        coordinator = self.peers.coordinator
        first: list[Any] = []
        try:
            first.append(coordinator.submit(CoordinatorActor.subscriptions, topic))
        except Exception:  # noqa: BLE001 - the getter's retried call asks again
            pass

        def submit() -> Any:
            if first:
                return first.pop()
            return coordinator.submit(CoordinatorActor.subscriptions, topic)

        return lambda: list(coordinator.retried(submit, deadline_s=self.peers.deadline_s))

    # --- a schedule's armed occurrence is not cancelled ------------------------------------

    def _guard_occurrences(self, topic: str, targets: dict[int, list[tuple[int, int]]]) -> None:
        """On the tasks topic: InvalidArgument, before anything is written, when a target
        is the armed occurrence of a schedule that exists (its message carries the
        schedule's name as key). Cancelling it would end the schedule's chain, and nothing
        of it would run again."""
        if topic != self.config.tasks.topic:
            return
        parts = [p for p in targets if targets[p]]
        answers = self.peers.call(
            lambda: [
                self.peers.topic_peer(topic, p).submit(
                    HostActor.key_rows,
                    topic,
                    p,
                    np.array([key_of(lg, e) for lg, e in targets[p]], dtype=np.int64),
                )
                for p in parts
            ],
            "topic",
        )
        for p, rows in zip(parts, answers, strict=True):
            for position, key in zip(rows.positions, rows.keys, strict=True):
                if key is not None and self._schedule_exists(key):
                    lg, e = position_of(int(position))
                    raise InvalidArgument(
                        f"message_ids: {topic}/{p}/{lg}:{e} is the next occurrence of schedule "
                        f"{key!r}; cancelling it would stop the schedule for good. Pause the "
                        "schedule (pause_schedule, raydelay schedules pause) or delete it"
                    )

    def guard_keys(self, topic: str, keys: list[str]) -> None:
        """On the tasks topic: InvalidArgument, before anything is written, for a cancel
        by key of a schedule's name (its armed occurrence is held under it)."""
        if topic != self.config.tasks.topic:
            return
        for key in keys:
            if self._schedule_exists(key):
                raise InvalidArgument(
                    f"keys: {key!r} is the key of schedule {key!r}'s next occurrence; "
                    "cancelling it would stop the schedule for good. Pause the schedule "
                    "(pause_schedule, raydelay schedules pause) or delete it"
                )

    def _schedule_exists(self, name: str) -> bool:
        if not cron.is_name(name):
            return False
        return bool(self._tasks_store().exists(cron.schedule_key(name)))

    def _tasks_store(self) -> Any:
        if self._store is None:
            self._store = make_store(self.config)
        return self._store

    def _cancelled_calls(
        self, topic: str, targets: dict[int, list[tuple[int, int]]], outcome: dict[int, list[bool]]
    ) -> None:
        """On the tasks topic, every path of a cancel comes here: the calls it kept from
        running get their CANCELLED record (what ``task_status`` says of them), whoever
        cancelled them (the API, the CLI, the console, HTTP, a key)."""
        if topic != self.config.tasks.topic:
            return
        ids = [
            f"{topic}/{p}/{lg}:{e}"
            for p, positions in targets.items()
            for (lg, e), kept in zip(positions, outcome.get(p, []), strict=False)
            if kept
        ]
        if ids:
            write_cancelled(self._tasks_store(), ids)

    def stats(self, topic: str, subscription: str | None = None) -> dict:
        """See :meth:`Cluster.stats`."""
        n = self.peers.partitions(topic)
        if subscription is None:
            parts = self.peers.on_partitions(topic, n, HostActor.stats)
            subs = self.peers.coord(CoordinatorActor.subscriptions, topic)
            for p in parts:  # (what each partition holds: see raydelay.dispatch.counts)
                p["held"] = partition_entries(p["ledgers"], p.get("tail"))
            held = sum(p["held"] for p in parts)
            return {
                "topic": topic,
                "partitions": parts,
                "subscriptions": sorted(subs),
                "held": held,
            }
        options = self.peers.subscription_options(topic, subscription)
        self._session.flush_acks(topic)
        parts = self.peers.call(
            lambda: [
                self.peers.on_subscription(topic, p, subscription, SubscriptionHost.stats)
                for p in range(n)
            ],
            "subscription",
        )
        out: dict[str, Any] = {k: sum(int(s.get(k, 0)) for s in parts) for k in _SUMMED}
        out["mark_delete"] = [s["mark_delete"] for s in parts]
        # partitions whose delayed count is not complete yet (recovering; see counts)
        out["counting"] = [p for p, s in enumerate(parts) if s.get("counting")]
        out["type"] = options["type"]
        # per consumer: unacknowledged messages over every partition, and the oldest lease
        # age (seconds since a partition last heard from it)
        consumers: dict[str, dict] = {}
        for s in parts:
            for cid, lease in s.get("consumer_leases", {}).items():
                c = consumers.setdefault(cid, {"unacked": 0, "lease_age_s": 0.0})
                c["unacked"] += lease["unacked"]
                c["lease_age_s"] = max(c["lease_age_s"], lease["lease_age_ms"] / 1000)
        out["consumers"] = consumers
        # first deliveries of delayed messages by lateness since the actors started: counts
        # of at most each edge (ms), the last one past the last edge
        counts = [s["lateness_counts"] for s in parts if "lateness_counts" in s]
        out["lateness"] = {
            "edges_ms": list(LATENESS_BOUNDARIES_MS),
            "counts": [sum(c) for c in zip(*counts, strict=True)]
            if counts
            else [0] * (len(LATENESS_BOUNDARIES_MS) + 1),
            # the same first deliveries' lateness by stage (raydelay.dispatch.stages): the
            # subscription's three; a consumer's ``returned`` is its own (Consumer.stages)
            "stages": stages.merge(s.get("lateness_stages", {}) for s in parts),
        }
        out["partitions"] = parts
        return out

    def partition_hosts(self, topic: str) -> list[str]:
        """See :meth:`Cluster.partition_hosts`."""
        n = self.peers.partitions(topic)
        assigned = self.peers.coord(CoordinatorActor.assignments)
        return [str(assigned.get(f"{topic}/{p}", "")) for p in range(n)]

    def placement(self) -> list[dict[str, Any]]:
        """See :meth:`Cluster.placement`."""
        rows = placement.placement_table()
        serves: dict[str, list[str]] = {}
        for key, host in sorted(self.peers.coord(CoordinatorActor.assignments).items()):
            serves.setdefault(host, []).append(key)
        topics = self.peers.coord(CoordinatorActor.topics)
        for key, host in sorted(self.peers.coord(CoordinatorActor.unit_assignments).items()):
            unit = Unit.of_key(key)
            try:
                per_actor = self.peers.per_actor(unit.topic, unit.subscription)
            except NotFound:
                continue  # (deleted since the assignments were read)
            parts = subscription_groups(topics.get(unit.topic, 0), per_actor).get(unit.group, [])
            serves.setdefault(host, []).extend(
                f"{unit.topic}/{unit.subscription}/{p}" for p in parts
            )
        serving = self.peers.coordinator.actor_name  # (the one just asked)
        for r in rows:
            r["serves"] = serves.get(r["name"], [])
            r["partitions"] = len(r["serves"])
            if r["class"] == "CoordinatorActor":
                r["role"] = "serving" if r["name"] == serving else "standby"
        return rows
