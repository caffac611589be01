"""``raydelay.connect()`` and :class:`Cluster`, a client's connection to one raydelay
cluster (DESIGN.md §5.4). Not to be confused with the ``raydelay.cluster`` package, the
Ray plumbing it stands on."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import os
import re
import socket
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import numpy as np
import ray

from raydelay.actors.coordinator import CoordinatorActor, spawn_coordinator
from raydelay.actors.handles import SubscriptionHandles, TopicHandles, fan_out_cancel
from raydelay.actors.host import HostActor, coordinator_peer, partition_peer, spawn_host
from raydelay.actors.metrics import LATENESS_BOUNDARIES_MS
from raydelay.actors.subscription import SubscriptionActor, spawn_subscription
from raydelay.client.consumer import Consumer
from raydelay.client.message import (
    Message,
    MessageId,
    check_key,
    check_number,
    messages_from_batch,
    seconds_of,
    time_ms_of,
)
from raydelay.client.multi import PATTERN_REFRESH_S, MultiTopicConsumer
from raydelay.client.producer import Producer
from raydelay.client.reader import Reader
from raydelay.client.redrive import redrive
from raydelay.cluster import handles, owner, placement, rpc
from raydelay.cluster.handles import Peer
from raydelay.cluster.local import (  # noqa: F401 - RAY_SYSTEM_CONFIG is re-exported
    RAY_SYSTEM_CONFIG,
    ray_system_config,
    running_ray_address,
)
from raydelay.cluster.names import (
    COORDINATOR,
    NAMESPACE,
    subscription_actor_name,
    subscription_group,
    subscription_groups,
)
from raydelay.cluster.nodes import check_store
from raydelay.config import ClientConfig, Config, config_from_dict, config_to_dict, load_config
from raydelay.errors import InvalidArgument, NotFound, StorageError, StoreOwned, Unavailable
from raydelay.limits import NO_LIMIT, check_limit
from raydelay.storage import make_store
from raydelay.storage.keys import validate_name
from raydelay.subscription_types import check_subscription_type, spreads

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

# How long connect() waits for another process that is starting a cluster on the same
# store to claim it, before it starts one of its own (a Ray start takes 5-30 s here).
START_TURN_WAIT_S = 120.0
# How often the waiting process looks at the store's claim meanwhile.
START_TURN_POLL_S = 0.1

_SUMMED = (
    "delayed",
    "backlog",
    "pending_ack",
    "buckets",
    "redelivery",
    "dead_letter_pending",
    "read_ahead",
    "delivered",
    "acked",
    "redelivered",
    "cancelled",
)


def connect(
    config: str | os.PathLike | Config | dict | None = None, address: str | None = None
) -> Cluster:
    """Connect to (or start) a raydelay cluster.

    - ``config``: a TOML path, a Config, a dict shaped like the TOML, or None for the
      embedded default (``configs/default.toml``: a local-dir store under
      ``./.raydelay/data``). ``RAYDELAY_*`` environment overrides apply to paths and None.
    - ``address``: None attaches to the live cluster that owns the store, else to a Ray
      running on this machine (``RAY_ADDRESS``, or the last ``ray start`` while that Ray
      lives), and starts a local one when none runs; ``"auto"`` (or an address) attaches
      to a running Ray cluster.

    Processes that call ``connect()`` without an address at the same moment on one store
    end up in one cluster: one starts Ray and claims the store, the others attach to it.
    The coordinator is created on first use and attached to afterwards; if it already
    runs with another storage config, its config wins (a warning says so)."""
    cfg = resolve_config(config)
    with contextlib.ExitStack() as turn:
        started = False
        if not ray.is_initialized():
            if address is None:
                # a store another live cluster owns: attach to that cluster, not a new Ray
                address = _owner_address(cfg) or running_ray_address()
            if address is None:
                # about to start a Ray: wait for any process starting one on this store now
                address = _take_start_turn(cfg, turn)
            if address is None:
                _start_ray(cfg)
                started = True
            else:
                _attach_ray(address)
        try:
            coordinator, running = _coordinator(cfg)
        except StoreOwned as exc:
            if not started or not exc.owner.get("address"):
                raise
            # Another process claimed the store while this one started its Ray (an S3
            # store, or a turn given up on): this Ray holds nothing yet, so it goes.
            log.info(
                "the store was claimed meanwhile by %s: attaching to it",
                owner.Claim(**exc.owner).describe(),
            )
            ray.shutdown()
            started = False
            _attach_ray(exc.owner["address"])
            coordinator, running = _coordinator(cfg)
    check_store(running.storage)  # (the cluster may have grown since it started)
    if running.storage != cfg.storage:
        # a warning only when the caller chose a config: the default just attaches
        (log.warning if config is not None else log.info)(
            "the coordinator runs with storage %s; using it instead of %s",
            running.storage,
            cfg.storage,
        )
    cluster = Cluster(coordinator, running, client=cfg.client, started_ray=started)
    from raydelay.client.tasks import resume_runners

    resume_runners(cluster)  # scheduled calls wait in the store: their runners come back
    return cluster


def _start_ray(cfg: Config) -> None:
    """Start a local Ray for this process (stopped by :meth:`Cluster.shutdown`)."""
    ray.init(
        address="local",  # a stale note of a stopped Ray must not be followed
        namespace=NAMESPACE,
        include_dashboard=False,
        logging_level=logging.WARNING,
        configure_logging=False,
        _system_config=ray_system_config(cfg),
    )


def _attach_ray(address: str) -> None:
    """Attach this process to the running Ray cluster at ``address`` (or ``"auto"``)."""
    try:
        ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING)
    except Exception as exc:  # noqa: BLE001 - Ray raises several kinds here
        if address == "auto":
            raise
        raise Unavailable(_unreachable(address, exc)) from None


def _coordinator(cfg: Config) -> tuple[Any, Config]:
    """The coordinator of the Ray this process is in (created if there is none) and the
    config it runs with. StoreOwned if a coordinator created here is refused the store."""
    coordinator = placement.lookup_or_none(COORDINATOR)
    on_failure = None
    if coordinator is None:
        check_store(cfg.storage)  # a local store on several nodes: refused, nothing created
        _refuse_if_owned(cfg)  # before a coordinator of this Ray claims the store
        coordinator = spawn_coordinator(config_to_dict(cfg), spawn_host)
        # a coordinator refused the store dies in its constructor: the store says why
        on_failure = functools.partial(_refuse_if_owned, cfg)
    running = config_from_dict(
        rpc.call(
            coordinator.config.remote,
            what="coordinator",
            deadline_s=cfg.client.retry_deadline_s,
            on_failure=on_failure,
        )
    )
    return coordinator, running


def _take_start_turn(cfg: Config, turn: contextlib.ExitStack) -> str | None:
    """Wait until no other process is starting a cluster on ``cfg``'s store; then the
    address of the cluster that one started (as soon as it has claimed the store), or
    None with the turn held in ``turn`` (released when ``connect`` returns: by then this
    process's coordinator has claimed the store). See ``raydelay.cluster.owner``."""
    store, _ = _store_claim(cfg)
    start = owner.StartTurn(store)
    give_up = time.monotonic() + START_TURN_WAIT_S
    waited = False
    while True:
        if start.try_take():
            turn.callback(start.release)
            found = _owner_address(cfg)  # the holder before this one may have claimed it
            if found is not None:
                start.release()
            return found
        found = _owner_address(cfg)
        if found is not None:
            return found
        if time.monotonic() > give_up:
            log.warning(
                "process %s has been starting a raydelay cluster on this store for %.0f s "
                "without claiming it; starting one here",
                start.holder_pid() or "?",
                START_TURN_WAIT_S,
            )
            return None
        if not waited:
            log.info(
                "process %s is starting a cluster on this store: waiting for it",
                start.holder_pid() or "?",
            )
            waited = True
        time.sleep(START_TURN_POLL_S)


def _unreachable(address: str, exc: BaseException) -> str:
    """Why ``ray.init(address)`` failed, in one line: nothing listens there, or something
    does and refused this process (Ray 2.60's token authentication, on by default)."""
    host, _, port = address.rpartition(":")
    listening = False
    if port.isdigit():
        try:
            with socket.create_connection((host or "127.0.0.1", int(port)), timeout=2):
                listening = True
        except OSError:
            pass
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if not listening:
        return f"address: no Ray cluster is running at {address!r} ({first})"
    return (
        f"address: a Ray cluster answers at {address!r} but refused this process ({first}). "
        "Ray's token authentication is on by default: give this process that cluster's "
        "token (the same ~/.ray/auth_token, or RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH), or run "
        "both with RAY_AUTH_MODE=disabled"
    )


def _store_claim(cfg: Config) -> tuple[Any, owner.Claim | None]:
    """``cfg``'s store and its owner's claim, read from here: a store that cannot work
    (no such bucket, access denied, no credentials) fails now, in one line naming the
    config keys, rather than in actors that keep restarting."""
    try:
        store = make_store(cfg)
        return store, owner.current_claim(store)
    except StorageError as exc:
        if exc.retriable:
            raise
        st = cfg.storage
        where = (
            f"storage.local.root = {st.local.root!r}"
            if st.kind == "local"
            else f"storage.s3.bucket = {st.s3.bucket!r}, storage.s3.endpoint_url = "
            f"{st.s3.endpoint_url!r}"
            if st.kind == "s3"
            else f"storage.kind = {st.kind!r}"
        )
        raise StorageError(f"storage ({where}): {exc}", retriable=False) from None


def _owner_address(cfg: Config) -> str | None:
    """The Ray address of the live cluster that owns ``cfg``'s store, or None."""
    store, claim = _store_claim(cfg)
    if claim is None or not owner.claim_is_live(store, claim):
        return None
    log.info("the store is owned by %s: attaching to it", claim.describe())
    return claim.address


def _refuse_if_owned(cfg: Config) -> None:
    """StoreOwned if a live cluster other than this Ray's owns ``cfg``'s store."""
    store, claim = _store_claim(cfg)
    mine = ray.get_runtime_context().gcs_address
    if claim is not None and claim.address != mine and owner.claim_is_live(store, claim):
        raise StoreOwned(
            f"storage: the store is owned by {claim.describe()}, not by the Ray cluster at "
            f"{mine}; connect(address={claim.address!r}) attaches to it",
            dataclasses.asdict(claim),
        )


def resolve_config(config: Any) -> Config:
    """The Config that ``connect(config)`` uses: loaded from a path (or the embedded
    default for None, with ``RAYDELAY_*`` overrides), taken as is, or built from a dict;
    a local store's root made absolute (the actors run in other directories)."""
    if config is None or isinstance(config, (str, os.PathLike)):
        cfg = load_config(config)
    elif isinstance(config, Config):
        cfg = config
    elif isinstance(config, dict):
        cfg = config_from_dict(config)
    else:
        raise InvalidArgument(
            f"config: expected a path, a Config or a dict, got {type(config).__name__}"
        )
    if cfg.storage.kind == "local":  # actors run elsewhere: pin the root
        root = str(Path(cfg.storage.local.root).expanduser().resolve())
        local = cfg.storage.local.model_copy(update={"root": root})
        cfg = cfg.model_copy(update={"storage": cfg.storage.model_copy(update={"local": local})})
    return cfg


class Cluster:
    """A client of one raydelay cluster. Create producers and consumers from it."""

    def __init__(
        self, coordinator: Any, config: Config, *, client: ClientConfig, started_ray: bool
    ) -> None:
        self._coordinator = coordinator_peer(config_to_dict(config), handle=coordinator)
        self.config = config  # the cluster's (the coordinator's) config
        self._client = client  # this client's own settings
        self._config_dict = config_to_dict(config)
        self._started_ray = started_ray
        self._producers: list[Producer] = []
        self._consumers: list[Consumer] = []
        self._peers: dict[tuple, Peer] = {}  # (topic, partition[, subscription]) -> its peer
        self._per_actors: dict[tuple[str, str], int] = {}  # partitions_per_actor of a sub
        self._tasks_side: Any = None  # raydelay.client.tasks.Tasks, made on first use
        self._closed = False
        self._origin: Cluster | None = None  # set on a view made by with_retry_deadline

    def with_retry_deadline(self, seconds: float | timedelta) -> Cluster:
        """A view of this client whose calls give up on an unreachable actor after
        ``seconds`` (a number or a timedelta) instead of ``client.retry_deadline_s``. It
        shares this client's connections and producers; it is closed when this client is
        shut down, and shutting the view down is refused (shut down the client)."""
        limit = seconds_of("seconds", seconds)
        if not limit > 0 or limit == float("inf"):
            raise InvalidArgument(f"seconds: must be a positive, finite duration, got {limit}")
        view = copy.copy(self)
        view._client = self._client.model_copy(update={"retry_deadline_s": float(limit)})
        view._origin = self._origin or self
        return view

    # --- topics -----------------------------------------------------------------------------

    def create_topic(self, topic: str, partitions: int = 1) -> None:
        """Create a topic with ``partitions`` partitions (idempotent for the same count)."""
        self._check_open()
        validate_name("topic", topic)
        self._coord(CoordinatorActor.create_topic, topic, partitions)
        self._on_partitions(topic, partitions, HostActor.tail)

    def topics(self) -> dict[str, int]:
        """Every topic and its partition count."""
        self._check_open()
        return dict(self._coord(CoordinatorActor.topics))

    def delete_topic(self, topic: str, *, force: bool = False) -> int:
        """Delete a topic with its log and its subscriptions' state; returns the number of
        store objects deleted. A topic with subscriptions is deleted only with ``force``.
        Its actors are stopped first; if the store fails midway, deleting again finishes."""
        self._check_open()
        n = self._partitions(topic)
        subs = self._coord(CoordinatorActor.subscriptions, topic)
        if subs and not force:
            raise InvalidArgument(
                f"topic: {topic!r} has subscriptions ({', '.join(sorted(subs))}); "
                "delete it with force=True (CLI: --force)"
            )
        for consumer in [c for c in self._consumers if c.topic == topic]:
            consumer.close()
        # subscriptions first (they read from the topic's hosts), and wait until they are gone
        handles.stop([name for s in subs for name in self._subscription_actors(topic, s, n)])
        hosts = {
            h
            for k, h in self._coord(CoordinatorActor.assignments).items()
            if k.rsplit("/", 1)[0] == topic
        }
        drops = [h.drop_topic.remote(topic) for h in map(placement.lookup_or_none, hosts) if h]
        rpc.get(drops, what=f"hosts of {topic}")
        for key in [k for k in self._peers if k[0] == topic]:
            del self._peers[key]
        for key in [k for k in self._per_actors if k[0] == topic]:
            del self._per_actors[key]
        return int(self._coord(CoordinatorActor.delete_topic, topic))

    def _check_per_actor(self, topic: str, subscription: str, per_actor: int | None) -> int:
        """The partitions_per_actor of a subscription being created or joined."""
        try:
            existing = self._subscription_options(topic, subscription).get("partitions_per_actor")
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

    def _per_actor(self, topic: str, subscription: str) -> int:
        """How many partitions one actor of the subscription serves (-1: all)."""
        key = (topic, subscription)
        if key not in self._per_actors:
            options = self._subscription_options(topic, subscription)
            self._per_actors[key] = options.get(
                "partitions_per_actor", self.config.subscription.partitions_per_actor
            )
        return self._per_actors[key]

    def _subscription_actors(self, topic: str, subscription: str, partitions: int) -> list[str]:
        per_actor = self._per_actor(topic, subscription)
        return [
            subscription_actor_name(topic, subscription, g)
            for g in subscription_groups(partitions, per_actor)
        ]

    def _on_partitions(
        self,
        topic: str,
        partitions: int,
        method: Callable[Concatenate[HostActor, str, int, P], Any],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> list:
        """``method(topic, p, *args)`` on every partition p of ``topic`` (retried while a host
        restarts)."""
        peers = [self._topic_peer(topic, p) for p in range(partitions)]
        return self._call(
            lambda: [
                peer.submit(method, topic, p, *args, **kwargs) for p, peer in enumerate(peers)
            ],
            f"topic {topic}",
        )

    def _partitions(self, topic: str) -> int:
        validate_name("topic", topic)
        return int(self._coord(CoordinatorActor.partitions, topic))

    def _topic_peer(self, topic: str, partition: int) -> Peer[HostActor]:
        """The partition of a topic, on its host (found through the coordinator, which
        starts the host if needed; NotFound once the topic is deleted)."""
        key = (topic, partition)
        peer = self._peers.get(key)
        if peer is None:
            peer = self._peers[key] = partition_peer(
                topic, partition, self._config_dict, self._coordinator
            )
        return peer

    def _subscription_peer(
        self, topic: str, partition: int, subscription: str
    ) -> Peer[SubscriptionActor]:
        """A partition of a subscription, on the subscription's actor; its actor is created
        if missing, only while its topic and the subscription exist (NotFound otherwise)."""
        key = (topic, partition, subscription)
        peer = self._peers.get(key)
        if peer is not None:
            return peer
        group = subscription_group(partition, self._per_actor(topic, subscription))

        def create() -> Any:
            self._subscription_options(topic, subscription)  # NotFound: deleted
            return spawn_subscription(topic, subscription, group, self._config_dict)

        peer = self._peers[key] = Peer(
            subscription_actor_name(topic, subscription, group),
            create,
            f"subscription {subscription} of {topic}/{partition}",
        )
        return peer

    def create_producer(
        self,
        topic: str,
        name: str | None = None,
        *,
        max_pending_messages: int | None = None,
        block_if_queue_full: bool | None = None,
    ) -> Producer:
        """A producer for an existing topic (NotFound otherwise).

        - ``name``: a named producer continues its sequence ids where an earlier one of that
          name left off, so a batch it re-sends after a restart is not appended twice.
        - ``max_pending_messages``: how many ``send_async`` calls may wait for their answer
          (-1: no limit); ``block_if_queue_full``: past that, ``send_async`` waits for room
          (True) or raises ``ProducerQueueIsFull`` (False). None takes the ``producer``
          section of the config (10,000 and True)."""
        self._check_open()
        peers = [self._topic_peer(topic, p) for p in range(self._partitions(topic))]
        for peer in peers:
            peer.handle  # noqa: B018 - resolved now: a failure shows here, not at the first send

        def cancel(batches: dict, producer: str) -> tuple[dict[int, list[bool]], int]:
            return self._cancel(topic, batches, producer)

        link = TopicHandles(topic, peers, deadline_s=self._client.retry_deadline_s, cancel=cancel)
        producer = Producer(
            link,
            topic,
            self.config,
            name,
            on_close=self._producers.remove,
            max_pending_messages=max_pending_messages,
            block_if_queue_full=block_if_queue_full,
        )
        self._producers.append(producer)
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
        """Create (or join) a subscription and return a consumer of it.

        - ``ack_timeout_s``: unacked messages are redelivered after this many seconds
          (None: ``subscription.ack_timeout_s`` from the config, unset by default).
        - ``max_redeliveries``: after this many redeliveries a message goes to
          ``dead_letter_topic`` (default ``<topic>-<subscription>-DLQ``) and is acked.
        - ``prefetch``: keep a receive call standing at every partition between the
          consumer's calls, so a message that falls due meanwhile is handed over at once
          (as Pulsar's consumer prefetches). A consumer that stops calling then holds up to
          one round of messages until it closes or their ack timeout passes. Off by
          default: partitions are asked only inside ``receive`` / ``receive_batch``.
        - ``initial_position``: where a *new* subscription starts: ``"earliest"`` (the oldest
          retained entry of each partition) or ``"latest"`` (after the last entry at the
          time of this call, Pulsar's default). An existing subscription keeps its cursor.
        - ``subscription_type`` ``"key_shared"``: as ``"shared"``, but all messages of one
          key go to one consumer at a time, in order.
        - ``partitions_per_actor``: how many partitions one actor (process) of the
          subscription serves; -1 (the default, ``subscription.partitions_per_actor``) is
          all of them. Set when the subscription is created; it cannot change after.

        ``topic`` may be a list of topics, or a compiled pattern (``re.compile("orders-.*")``,
        matched against whole names): then the subscription is made on each, and a
        :class:`~raydelay.client.multi.MultiTopicConsumer` receives from all of them at once
        (a pattern's consumer also subscribes topics created later, looked for once a
        second; this subscription's own dead-letter topics are left out)."""
        self._check_open()
        if isinstance(topic, (list, tuple, re.Pattern)):
            return self._subscribe_many(
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
        check_subscription_type(subscription_type)
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
        n = self._partitions(topic)
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
            tails = self._on_partitions(topic, n, HostActor.tail)
            start = [None if t is None else [int(t[0]), int(t[1])] for t in tails]
        self._coord(CoordinatorActor.create_subscription, topic, subscription, options, start)
        peers = [self._subscription_peer(topic, p, subscription) for p in range(n)]
        for peer in peers:
            peer.handle  # noqa: B018 - resolved now: a failure shows here, not later
        link = SubscriptionHandles(peers, deadline_s=self._client.retry_deadline_s)
        consumer = Consumer(
            link,
            topic,
            subscription,
            lease_s=self.config.subscription.consumer_lease_s,
            prefetch=prefetch,
            seek=lambda to, inclusive: self._reset(topic, subscription, n, to, inclusive),
            tails=lambda: self._on_partitions(topic, n, HostActor.tail),
        )
        self._consumers.append(consumer)
        return consumer

    def _subscribe_many(
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
                self._partitions(t)  # NotFound, before any subscription is made
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
        """Delete a subscription: its consumers here are closed, its actors stopped, its
        cursors and marks deleted (Pulsar's unsubscribe). Returns the number of store
        objects deleted. Consumers of it elsewhere get NotFound on their next call. If the
        store fails midway, deleting again finishes."""
        self._check_open()
        n = self._partitions(topic)
        self._subscription_options(topic, subscription)  # NotFound
        for consumer in [
            c for c in self._consumers if c.topic == topic and c.subscription == subscription
        ]:
            consumer.close()
        handles.stop(self._subscription_actors(topic, subscription, n))
        for key in [k for k in self._peers if k[0] == topic and k[2:] == (subscription,)]:
            del self._peers[key]
        self._per_actors.pop((topic, subscription), None)
        return int(self._coord(CoordinatorActor.delete_subscription, topic, subscription))

    # --- cancel and stats ---------------------------------------------------------------------

    def _cancel(
        self, topic: str, batches: dict[int, tuple[list[tuple[int, int]], int]], producer: str
    ) -> tuple[dict[int, list[bool]], int]:
        """See :func:`raydelay.actors.handles.fan_out_cancel`."""
        return fan_out_cancel(
            topic,
            lambda p: self._topic_peer(topic, p),
            lambda p, s: self._subscription_peer(topic, p, s),
            list(self._coord(CoordinatorActor.subscriptions, topic)),
            batches,
            producer,
            deadline_s=self._client.retry_deadline_s,
        )

    def stats(self, topic: str, subscription: str | None = None) -> dict:
        """A subscription's numbers summed over partitions (``partitions`` has each one), or,
        without ``subscription``, the topic's partitions and subscriptions. ``delivered``,
        ``acked``, ``redelivered`` and ``cancelled`` count since the actors started (a
        restart starts them again); ``consumers`` maps each consumer to ``unacked`` and
        ``lease_age_s``."""
        self._check_open()
        n = self._partitions(topic)
        if subscription is None:
            parts = self._on_partitions(topic, n, HostActor.stats)
            subs = self._coord(CoordinatorActor.subscriptions, topic)
            return {"topic": topic, "partitions": parts, "subscriptions": sorted(subs)}
        options = self._subscription_options(topic, subscription)
        self._flush_acks(topic)
        parts = self._call(
            lambda: [
                self._subscription_peer(topic, p, subscription).submit(SubscriptionActor.stats, p)
                for p in range(n)
            ],
            "subscription",
        )
        out: dict[str, Any] = {k: sum(int(s.get(k, 0)) for s in parts) for k in _SUMMED}
        out["mark_delete"] = [s["mark_delete"] for s in parts]
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
        }
        out["partitions"] = parts
        return out

    def partition_hosts(self, topic: str) -> list[str]:
        """The host actor serving each partition of ``topic`` (``host/<node>/<slot>``), in
        partition order; "" for a partition no host has taken yet."""
        self._check_open()
        n = self._partitions(topic)
        assigned = self._coord(CoordinatorActor.assignments)
        return [str(assigned.get(f"{topic}/{p}", "")) for p in range(n)]

    def cancel(self, message_ids: Any) -> list[bool]:
        """Cancel messages by id (MessageIds or their strings, of any topics), in batches per
        topic. One bool per id, in order: True if it was cancelled, False if it was delivered
        (acknowledged) already or cancelled before."""
        self._check_open()
        if isinstance(message_ids, (str, MessageId)) or not hasattr(message_ids, "__iter__"):
            raise InvalidArgument(
                f"message_ids: expected a list of message ids, got {type(message_ids).__name__}"
            )
        ids = [m if isinstance(m, MessageId) else MessageId.parse(m) for m in message_ids]
        by_topic: dict[str, list[int]] = {}
        for i, mid in enumerate(ids):
            by_topic.setdefault(mid.topic, []).append(i)
        outcome = [False] * len(ids)
        for topic, where in by_topic.items():
            producer = self.create_producer(topic)
            try:
                done = producer.cancel_many([ids[i] for i in where])
            finally:
                producer.close()
            for i, ok in zip(where, done, strict=True):
                outcome[i] = bool(ok)
        return outcome

    def _flush_acks(self, topic: str) -> None:
        """Wait for the acks this process's consumers of ``topic`` have sent, so that the
        numbers asked for next count them."""
        for consumer in self._consumers:
            if consumer.topic == topic and not consumer._closed:
                consumer.flush()

    def _subscription_options(self, topic: str, subscription: str) -> dict:
        """A subscription's options; NotFound when it does not exist."""
        validate_name("subscription", subscription)
        return self._coord(CoordinatorActor.subscription, topic, subscription)

    def due_histogram(
        self, topic: str, subscription: str, windows_s: tuple[float, ...] = (60, 3600, 86400)
    ) -> list[tuple[str, int]]:
        """Pending delayed messages of a subscription by due window, summed over partitions:
        [("<= 1m", n), ("<= 1h", n), ("<= 1d", n), ("later", n)] for the default windows
        (seconds from now, increasing). Counts of bucket segments not loaded yet are spread
        evenly over each segment's due range."""
        self._check_open()
        if not windows_s or any(
            isinstance(w, bool) or not isinstance(w, (int, float)) or w <= 0 for w in windows_s
        ):
            raise InvalidArgument(f"windows_s: expected positive seconds, got {windows_s!r}")
        if list(windows_s) != sorted(windows_s):
            raise InvalidArgument(f"windows_s: must increase, got {windows_s!r}")
        n = self._partitions(topic)
        self._subscription_options(topic, subscription)
        now = time.time_ns() // 1_000_000
        edges = [now + int(w * 1000) + 1 for w in windows_s]  # window i: due <= now + w
        parts = self._call(
            lambda: [
                self._subscription_peer(topic, p, subscription).submit(
                    SubscriptionActor.due_histogram, p, edges
                )
                for p in range(n)
            ],
            "subscription",
        )
        totals = [sum(col) for col in zip(*parts, strict=True)]
        labels = [f"<= {_span(w)}" for w in windows_s] + ["later"]
        return list(zip(labels, totals, strict=True))

    # --- operations ---------------------------------------------------------------------------

    def peek(
        self,
        topic: str,
        subscription: str,
        limit: int = 100,
        due_after: int | datetime | None = None,
        due_before: int | datetime | None = None,
        key: str | None = None,
    ) -> list[Message]:
        """The next scheduled messages of a subscription that no consumer has yet, in the
        order it will deliver them (deliver_at, then position), with their payloads.
        Nothing changes: no message is delivered, acknowledged or loaded for delivery.

        - ``limit``: at most this many (-1: all in the range; mind the size).
        - ``due_after`` / ``due_before``: only those due at or after / before this instant
          (epoch ms or an aware datetime).
        - ``key``: only the messages of this key.

        It looks at the sealed buckets (reading from the store only the segments that
        can hold the answer, so a backlog of 100M is paged through, not loaded), the
        partition's unsealed delayed entries, the subscription's delayed nacks, and the
        delayed messages due and waiting for a consumer (those first). Immediate messages
        are the backlog (``stats``), not the schedule, and are not shown. ``redelivery_count`` says how
        many times each was delivered before. Cancelled and acknowledged messages are not
        shown. An exclusive or failover subscription delivers in log order and ignores
        deliver_at (Pulsar's rule): nothing of it is scheduled, so it is refused."""
        self._check_open()
        lim = check_limit("limit", limit)
        lim = NO_LIMIT if lim == sys.maxsize else lim
        after = None if due_after is None else time_ms_of("due_after", due_after)
        before = None if due_before is None else time_ms_of("due_before", due_before)
        if after is not None and before is not None and before <= after:
            raise InvalidArgument(
                f"due_before: must be after due_after ({after}), got {before}: the range is empty"
            )
        check_key(key)
        n = self._partitions(topic)
        options = self._subscription_options(topic, subscription)
        if not spreads(options["type"]):
            raise InvalidArgument(
                f"subscription: {topic}/{subscription} is {options['type']}: it delivers in log "
                "order and ignores deliver_at, so nothing of it waits for a due time"
            )
        self._flush_acks(topic)
        batches = self._call(
            lambda: [
                self._subscription_peer(topic, p, subscription).submit(
                    SubscriptionActor.peek, p, lim, after, before, key
                )
                for p in range(n)
            ],
            "subscription",
        )
        found = [m for p, b in enumerate(batches) for m in messages_from_batch(topic, p, b)]
        found.sort(
            key=lambda m: (
                -1 if m.deliver_at_ms is None else m.deliver_at_ms,
                m.message_id.partition,
                m.message_id.ledger_id,
                m.message_id.entry_id,
            )
        )
        return found if lim == NO_LIMIT else found[:lim]

    def reset_cursor(self, topic: str, subscription: str, to: Any) -> dict[int, list[int]]:
        """Move a subscription's cursor (Pulsar's ``reset-cursor``); it must have no
        consumers (a consumer moves its own with :meth:`Consumer.seek`).

        ``to``: ``"earliest"`` (the oldest entry kept), ``"latest"`` (after the last entry),
        a :class:`MessageId` or its string (that message is the first delivered again, on
        its partition; the other partitions keep their cursors), or a time (epoch ms or an
        aware datetime: on every partition, the first entry published at or after it, as
        Pulsar resets by time).

        Each partition then rebuilds its state from the new mark-delete position: what
        comes after it is delivered again (a delayed message when it is due, at once if
        it is overdue), with ``redelivery_count`` raised for what had gone out before;
        cancelled messages stay cancelled. A reset reaches back only as far as the data
        kept: ledgers every subscription acknowledged, and buckets every subscription
        finished, are deleted. Returns partition -> the new mark-delete position."""
        self._check_open()
        n = self._partitions(topic)
        self._subscription_options(topic, subscription)  # NotFound
        self._flush_acks(topic)
        holders = self.stats(topic, subscription)["consumers"]
        if holders:
            raise InvalidArgument(
                f"subscription: {topic}/{subscription} has {len(holders)} consumer(s) "
                f"({', '.join(sorted(holders))}); close them first (a consumer killed holds its "
                "lease for subscription.consumer_lease_s), or call Consumer.seek on one"
            )
        return self._reset(topic, subscription, n, to)

    def create_reader(
        self, topic: str, start: Any = "earliest", *, inclusive: bool = False
    ) -> Reader:
        """A reader of every partition of ``topic``, in log order, with no subscription and
        no acknowledgements; it ignores deliver_at (Pulsar's readers).

        ``start``: ``"earliest"`` (the oldest entry kept), ``"latest"`` (what comes after
        the last entry now), a :class:`MessageId` or its string (the entry after it, or it
        with ``inclusive``; the topic's other partitions from the earliest), or a time
        (epoch ms or an aware datetime: the first entry published at or after it)."""
        self._check_open()
        if not isinstance(inclusive, bool):
            raise InvalidArgument(f"inclusive: expected True or False, got {inclusive!r}")
        n = self._partitions(topic)
        peers = [self._topic_peer(topic, p) for p in range(n)]
        starts = self._read_from(topic, n, start, inclusive, "start")
        if len(starts) < n:
            starts = {p: (-1, 0) for p in range(n)} | starts
        return Reader(
            topic,
            peers,
            starts,
            resolve=lambda to, inclusive: self._read_from(topic, n, to, inclusive, "to"),
            tails=lambda: self._on_partitions(topic, n, HostActor.tail),
        )

    def _read_from(
        self, topic: str, n: int, to: Any, inclusive: bool, field: str
    ) -> dict[int, tuple[int, int]]:
        """partition -> the first position to read for ``to`` (see create_reader): the
        entry after the mark-delete position a reset to it gives."""
        marks = self._reset_marks(topic, n, to, field, inclusive)
        return {p: (md[0], md[1] + 1) if md[0] >= 0 else (-1, 0) for p, md in marks.items()}

    def redrive(
        self,
        dead_letter_topic: str,
        to_topic: str | None = None,
        limit: int | None = None,
        *,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Send dead letters back to the topic and partition they came from (or to
        ``to_topic``), due at once, with their payload, key and properties, their
        redelivery count starting again from 0; acknowledge them in the dead-letter topic
        (SQS's redrive). Each goes back exactly once, however often a redrive is
        interrupted and run again (see :mod:`raydelay.client.redrive`). One redrive of a
        topic runs at a time; another waits for it (or for a killed one's lease to lapse).

        ``limit``: at most this many (None or -1: all); ``progress(moved)`` is called after
        each batch. Returns how many moved."""
        self._check_open()
        lim = -1 if limit is None else check_limit("limit", limit)
        lim = NO_LIMIT if lim == sys.maxsize else lim
        if to_topic is not None:
            validate_name("to_topic", to_topic)
        self._partitions(dead_letter_topic)  # NotFound
        return redrive(self, dead_letter_topic, to_topic, lim, progress)

    def _reset(
        self, topic: str, subscription: str, n: int, to: Any, inclusive: bool = True
    ) -> dict[int, list[int]]:
        marks = self._reset_marks(topic, n, to, inclusive=inclusive)
        groups: dict[str, tuple[Peer, dict[int, list[int]]]] = {}
        for p, md in marks.items():
            peer = self._subscription_peer(topic, p, subscription)
            groups.setdefault(peer.name, (peer, {}))[1][p] = md
        peers = [peer for peer, _ in groups.values()]

        def lost() -> None:
            for peer in peers:
                peer.lost()

        rpc.call(
            lambda: [peer.handle.reset.remote(work) for peer, work in groups.values()],
            what=f"resetting the cursor of {topic}/{subscription}",
            deadline_s=self._client.retry_deadline_s,
            on_failure=lost,
        )
        return marks

    def _reset_marks(
        self, topic: str, n: int, to: Any, field: str = "to", inclusive: bool = True
    ) -> dict[int, list[int]]:
        """partition -> the mark-delete position a reset ``to`` gives (see reset_cursor);
        a message id is delivered again with ``inclusive``, else what follows it."""
        if isinstance(to, str) and to in ("earliest", "latest"):
            if to == "earliest":
                return {p: [-1, -1] for p in range(n)}
            tails = self._on_partitions(topic, n, HostActor.tail)
            return {
                p: [-1, -1] if t is None else [int(t[0]), int(t[1])] for p, t in enumerate(tails)
            }
        if isinstance(to, str):
            to = MessageId.parse(to)
        if isinstance(to, MessageId):
            md = self._mark_before(topic, n, to)
            return {to.partition: md if inclusive else [md[0], md[1] + 1]}
        if isinstance(to, datetime) or (
            isinstance(to, (int, np.integer)) and not isinstance(to, bool)
        ):
            at = time_ms_of(field, to)
            found = self._on_partitions(topic, n, HostActor.position_at, at)
            tails = self._on_partitions(topic, n, HostActor.tail)
            out = {}
            for p, (pos, tail) in enumerate(zip(found, tails, strict=True)):
                if pos is not None:
                    out[p] = [int(pos[0]), int(pos[1]) - 1]
                else:  # every entry is older: after the last one
                    out[p] = [-1, -1] if tail is None else [int(tail[0]), int(tail[1])]
            return out
        raise InvalidArgument(
            f"{field}: expected 'earliest', 'latest', a MessageId (or its string), epoch "
            f"milliseconds or an aware datetime; got {type(to).__name__}"
        )

    def _mark_before(self, topic: str, n: int, mid: MessageId) -> list[int]:
        """The mark-delete position just before message ``mid``, which must be in the log."""
        if mid.topic != topic:
            raise InvalidArgument(f"message_id: {mid} is of topic {mid.topic!r}, not {topic!r}")
        if not 0 <= mid.partition < n:
            raise InvalidArgument(
                f"message_id: {topic} has partitions 0..{n - 1}, not {mid.partition}"
            )
        ledgers = self._call(
            lambda: [
                self._topic_peer(topic, mid.partition).submit(
                    HostActor.ledgers, topic, mid.partition
                )
            ],
            f"topic {topic}",
        )[0]
        sizes = dict((int(i), c) for i, c in ledgers)
        if mid.ledger_id not in sizes:
            if ledgers and mid.ledger_id < min(sizes):
                raise NotFound(f"message_id: {mid} is no longer in the log (retention deleted it)")
            raise InvalidArgument(f"message_id: {mid} is past the end of {topic}/{mid.partition}")
        count = sizes[mid.ledger_id]
        if count is None:  # the open ledger: up to its last entry
            tail = self._call(
                lambda: [
                    self._topic_peer(topic, mid.partition).submit(
                        HostActor.tail, topic, mid.partition
                    )
                ],
                f"topic {topic}",
            )[0]
            count = int(tail[1]) + 1 if tail is not None and int(tail[0]) == mid.ledger_id else 0
        if mid.entry_id >= count:
            raise InvalidArgument(f"message_id: {mid} is past the end of {topic}/{mid.partition}")
        return [mid.ledger_id, mid.entry_id - 1]

    # --- scheduled Ray calls (raydelay.tasks) ---------------------------------------------------

    @property
    def _tasks(self) -> Any:
        from raydelay.client.tasks import Tasks

        if self._tasks_side is None:
            self._tasks_side = Tasks(self)
        return self._tasks_side

    def schedule(
        self,
        fn: Any,
        *args: Any,
        deliver_after: float | timedelta | None = None,
        deliver_at: Any = None,
        kwargs: dict | None = None,
        options: dict | None = None,
        max_retries: int = 3,
        backoff: Any = 1.0,
        pickle_code: bool = False,
        pass_context: bool = False,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` as a Ray task when it falls due: ``deliver_after``
        seconds (or a timedelta) from now, or at ``deliver_at`` (epoch ms or an aware
        datetime); neither: at once. Returns its :class:`~raydelay.tasks.TaskId` once the
        call is durable.

        - ``fn``: a ``@ray.remote`` function or a plain function the runners can import
          (stored by its import path); ``pickle_code=True`` stores its code instead (for
          ``__main__``, closures, lambdas).
        - ``options``: Ray options of the task (``num_cpus``, ``num_gpus``, ``memory``,
          ``resources``, ``accelerator_type``, ``runtime_env``, ``name``).
        - ``max_retries``: retries after a failure (0: none, -1: no limit), ``backoff``
          seconds before the first (or a timedelta, or a ``(first, max)`` pair), doubling;
          then the call goes to ``<tasks.topic>-DLQ`` with its error.
        - ``pass_context=True`` passes ``raydelay_task=TaskContext`` to the call; inside
          any call, :func:`raydelay.tasks.current_task` gives the same.

        At least once: a call whose runner dies while it runs runs again, with the same
        ``TaskContext.idempotency_key``. A function that cannot be imported, arguments that
        cannot be pickled, or bad options are an InvalidArgument, and nothing is stored."""
        self._check_open()
        spec = self._tasks.spec_of(
            fn,
            options=options,
            max_retries=max_retries,
            backoff=backoff,
            pickle_code=pickle_code,
            pass_context=pass_context,
        )
        return self._tasks.schedule(
            spec, args, kwargs, deliver_after=deliver_after, deliver_at=deliver_at
        )

    def schedule_call(
        self,
        actor_name: str,
        method: str,
        *args: Any,
        deliver_after: float | timedelta | None = None,
        deliver_at: Any = None,
        kwargs: dict | None = None,
        namespace: str | None = None,
        max_retries: int = 3,
        backoff: Any = 1.0,
        pass_context: bool = False,
    ) -> Any:
        """Call ``method`` of the named actor ``actor_name`` (in Ray ``namespace``; None:
        the runner's, ``raydelay``) when it falls due; otherwise as :meth:`schedule`. The
        actor is looked up when the call runs: one that does not exist then is a failed
        try, retried."""
        self._check_open()
        from raydelay.client.tasks import actor_spec

        spec = actor_spec(
            actor_name,
            method,
            namespace=namespace,
            max_retries=max_retries,
            backoff=backoff,
            pass_context=pass_context,
        )
        return self._tasks.schedule(
            spec, args, kwargs, deliver_after=deliver_after, deliver_at=deliver_at
        )

    def schedule_many(
        self,
        fn: Any,
        args_list: Any,
        *,
        deliver_at: Any = None,
        deliver_after: Any = None,
        keys: Any = None,
        options: dict | None = None,
        max_retries: int = 3,
        backoff: Any = 1.0,
        pickle_code: bool = False,
        pass_context: bool = False,
    ) -> Any:
        """Schedule ``fn`` once per item of ``args_list`` (a tuple of positional arguments
        each; anything else is one argument), in one batch: ``deliver_at`` / ``deliver_after``
        are one value for all or one per call (a numpy array is fine). Returns their ids
        as a :class:`~raydelay.client.message.MessageIds` sequence (``str(ids[i])`` is the
        TaskId of call ``i``)."""
        self._check_open()
        spec = self._tasks.spec_of(
            fn,
            options=options,
            max_retries=max_retries,
            backoff=backoff,
            pickle_code=pickle_code,
            pass_context=pass_context,
        )
        return self._tasks.schedule_many(
            spec, args_list, deliver_at=deliver_at, deliver_after=deliver_after, keys=keys
        )

    def cancel_task(self, task_id: Any) -> bool:
        """Cancel a scheduled call: True if it will not run, False if it ran (or was
        cancelled) before."""
        self._check_open()
        return self._tasks.cancel([task_id])[0]

    def cancel_tasks(self, task_ids: Any) -> list[bool]:
        """Cancel scheduled calls (TaskIds, their strings, or what ``schedule_many``
        returned); one bool each, as :meth:`cancel_task`."""
        self._check_open()
        return self._tasks.cancel(task_ids)

    def schedule_cron(
        self,
        cron: str,
        fn: Any,
        *args: Any,
        name: str,
        timezone: str = "UTC",
        catch_up: str = "latest",
        kwargs: dict | None = None,
        options: dict | None = None,
        max_retries: int = 3,
        backoff: Any = 1.0,
        pickle_code: bool = False,
        pass_context: bool = False,
        replace: bool = False,
    ) -> dict:
        """Run ``fn(*args)`` at every occurrence of the cron expression ``cron`` (5 fields,
        or 6 with seconds last; parsed by croniter) in ``timezone``, as the recurring
        schedule ``name``. Each occurrence is one delayed call; the next is armed when one
        fires, once, so a crash, a restart or a node loss neither skips an occurrence nor
        starts it twice (a call interrupted while it runs runs again, with the same
        idempotency key ``name@occurrence``).

        ``catch_up``: what occurrences missed while the cluster was down do, once it is up
        again: ``"all"`` run, one after the other; ``"latest"`` only the most recent one
        runs; ``"none"`` none runs (an occurrence is missed when it fires more than
        ``tasks.misfire_grace_s`` late). A schedule of that name existing already is an
        InvalidArgument unless ``replace=True``. Returns the schedule as
        :meth:`list_schedules` shows it."""
        self._check_open()
        spec = self._tasks.spec_of(
            fn,
            options=options,
            max_retries=max_retries,
            backoff=backoff,
            pickle_code=pickle_code,
            pass_context=pass_context,
        )
        return self._tasks.schedule_cron(
            cron,
            spec,
            args,
            kwargs,
            name=name,
            timezone=timezone,
            catch_up=catch_up,
            replace=replace,
        )

    def list_schedules(self) -> list[dict]:
        """The recurring schedules: name, cron, timezone, catch_up, target, paused, and
        ``next_ms``, the next occurrence (None while paused)."""
        self._check_open()
        return self._tasks.list_schedules()

    def pause_schedule(self, name: str) -> dict:
        """Stop running a schedule's occurrences (they pass, and are not caught up later)."""
        self._check_open()
        return self._tasks.set_paused(name, True)

    def resume_schedule(self, name: str) -> dict:
        """Run a paused schedule's occurrences again, from the next one on."""
        self._check_open()
        return self._tasks.set_paused(name, False)

    def delete_schedule(self, name: str) -> None:
        """Delete a schedule: its next occurrence ends the chain, and nothing more runs."""
        self._check_open()
        self._tasks.delete_schedule(name)

    def task_stats(self) -> dict:
        """Scheduled calls (waiting for their time, or for a runner), running, and, since
        each runner started: succeeded, retried, dead, skipped; runners and schedules."""
        self._check_open()
        return self._tasks.stats()

    def start_runners(self, count: int = 1, max_in_flight: int | None = None) -> int:
        """Make sure ``count`` runners run (``tasks.runners`` start with the first call);
        returns how many started now."""
        self._check_open()
        return self._tasks.start_runners(count, max_in_flight)

    def stop_runners(self) -> int:
        """Stop the runners; what they held goes back to the tasks topic."""
        self._check_open()
        return self._tasks.stop_runners()

    # --- lifecycle -----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Close this client's producers (flushing them) and consumers. If ``connect`` started
        Ray, also persist every subscription's cursor, close every partition's open ledger
        (so a later start has nothing to fence), and stop Ray."""
        if self._origin is not None:
            raise InvalidArgument(
                "cluster: this is a view (with_retry_deadline); shut down "
                "the client it was made from"
            )
        if self._closed:
            return
        self._closed = True
        for producer in list(self._producers):
            producer.close()
        for consumer in list(self._consumers):
            try:
                consumer.close()
            except Exception as exc:  # noqa: BLE001 - shutting down: report and go on
                log.warning("closing a consumer failed: %s", exc)
        if self._started_ray:
            try:
                self._flush_all()
                # before Ray itself stops (an actor torn down in the middle of a call can
                # crash its process): subscriptions between calls, then the hosts they called
                handles.stop_all(graceful=True)
            finally:
                ray.shutdown()

    def _flush_all(self) -> None:
        """Persist every subscription's cursor and stop its loops, then close every
        partition's open ledger (which answers the hosts' standing long polls). Every live
        subscription actor is closed, whoever made it: one left reading would see its hosts
        stop under it."""
        from raydelay.client.tasks import stop_runner_actors

        stop_runner_actors()  # consumers themselves: they go before their subscription
        refs = []
        for name in handles.subscription_actors():
            handle = placement.lookup_or_none(name)
            if handle is not None:
                refs.append(handle.close.remote())  # persists, then stops its loops
        if refs:
            rpc.get(refs, what="subscription")
        hosts = [placement.lookup_or_none(h) for h in placement.live_hosts()]
        closes = [h.close_ledgers.remote() for h in hosts if h is not None]
        if closes:
            rpc.get(closes, what="host")

    def _stop_everything(self) -> int:
        """``raydelay down``: persist every subscription's cursor, close every partition's
        open ledger, stop every raydelay actor of this Ray for good, and disconnect.
        Returns how many actors were stopped. Ray itself keeps running."""
        self._check_open()
        for producer in list(self._producers):
            producer.close()
        for consumer in list(self._consumers):
            consumer.close()
        self._flush_all()
        stopped = handles.stop_all(graceful=False)
        self._closed = True
        ray.shutdown()
        return stopped

    @property
    def _ray_address(self) -> str:
        """The address of the Ray cluster this client is connected to."""
        return ray.get_runtime_context().gcs_address

    def placement(self) -> list[dict[str, Any]]:
        """Which node holds which raydelay actor: one dict per live actor (``name``,
        ``class``, ``state``, ``node`` id, ``address``, ``head``, ``pid``, ``restarts``, and
        ``serves``: a host's partitions, ``topic/partition``, a subscription actor's
        ``topic/subscription/partition``; ``partitions``: how many), sorted by node then
        name."""
        self._check_open()
        rows = placement.placement_table()
        serves: dict[str, list[str]] = {}
        for key, host in sorted(self._coord(CoordinatorActor.assignments).items()):
            serves.setdefault(host, []).append(key)
        for topic, n in self._coord(CoordinatorActor.topics).items():
            for sub in self._coord(CoordinatorActor.subscriptions, topic):
                for g, parts in subscription_groups(n, self._per_actor(topic, sub)).items():
                    name = subscription_actor_name(topic, sub, g)
                    serves[name] = [f"{topic}/{sub}/{p}" for p in parts]
        for r in rows:
            r["serves"] = serves.get(r["name"], [])
            r["partitions"] = len(r["serves"])
        return rows

    def _coord(
        self,
        method: Callable[Concatenate[CoordinatorActor, P], R],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """A coordinator call, retried while it restarts (or is re-created after it ended),
        for up to client.retry_deadline_s."""
        return self._coordinator.retried(
            lambda: self._coordinator.submit(method, *args, **kwargs),
            deadline_s=self._client.retry_deadline_s,
        )

    def _call(self, submit, what: str):
        """An idempotent call, retried while the actor restarts (client.retry_deadline_s)."""
        return rpc.call(submit, what=what, deadline_s=self._client.retry_deadline_s)

    def _check_open(self) -> None:
        if self._closed or (self._origin is not None and self._origin._closed):
            raise InvalidArgument("cluster: it was shut down")

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
