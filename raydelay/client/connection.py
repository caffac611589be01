"""``raydelay.connect()`` and :class:`Cluster`, a client's connection to one raydelay
cluster (docs/client.md). Not to be confused with the ``raydelay.cluster`` package, the
Ray plumbing it stands on.

:class:`Cluster` is the facade of the client: each of its calls is done by one of its
parts, one module each, which share the client's peers and state
(:mod:`raydelay.client.peers`): topics and subscriptions (:mod:`~raydelay.client.topics`),
operations on them (:mod:`~raydelay.client.operations`), scheduled calls
(:mod:`~raydelay.client.tasks`) and its end (:mod:`~raydelay.client.lifecycle`). How it
reaches the cluster in the first place is :mod:`raydelay.client.bootstrap`."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import ray

from raydelay.client.bootstrap import attach, resolve_config
from raydelay.client.consumer import Consumer
from raydelay.client.lifecycle import Lifecycle
from raydelay.client.message import Message, seconds_of
from raydelay.client.multi import MultiTopicConsumer
from raydelay.client.operations import Operations
from raydelay.client.peers import ClusterPeers, Session
from raydelay.client.producer import Producer
from raydelay.client.reader import Reader
from raydelay.client.scheduled import ScheduledCalls
from raydelay.client.tasks import Tasks, resume_runners
from raydelay.client.topics import Topics
from raydelay.cluster.handles import Peer
from raydelay.config import ClientConfig, Config
from raydelay.errors import InvalidArgument

__all__ = ["Cluster", "connect", "resolve_config"]


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
    found = attach(config, address)
    cluster = Cluster(
        found.coordinator,
        found.config,
        client=found.client,
        started_ray=found.started_ray,
        joined_ray=found.joined_ray,
    )
    resume_runners(cluster._topics)  # scheduled calls wait in the store: their runners come back
    return cluster


class Cluster(ScheduledCalls):
    """A client of one raydelay cluster. Create producers and consumers from it."""

    config: Config  # the cluster's (the coordinator's) config

    def __init__(
        self,
        coordinator: Any,
        config: Config,
        *,
        client: ClientConfig,
        started_ray: bool,
        joined_ray: bool = False,
    ) -> None:
        session = Session(started_ray, joined_ray)
        self._compose(ClusterPeers(coordinator, config, client), session, None)

    def _compose(self, peers: ClusterPeers, session: Session, origin: Cluster | None) -> None:
        """Build this client's parts over ``peers`` and ``session`` (a view's are its
        origin's, with the view's own retry deadline)."""
        self.config = peers.config
        self._peers = peers
        self._session = session
        self._origin = origin  # set on a view made by with_retry_deadline
        self._topics = Topics(peers, session)
        self._ops = Operations(peers, session, self._topics)
        self._tasks = Tasks(self._topics, self._ops)
        self._lifecycle = Lifecycle(session)

    def with_retry_deadline(self, seconds: float | timedelta) -> Cluster:
        """A view of this client whose calls give up on an unreachable actor after
        ``seconds`` (a number or a timedelta) instead of ``client.retry_deadline_s``. It
        shares this client's connections and producers; it is closed when this client is
        shut down, and shutting the view down is refused (shut down the client)."""
        limit = seconds_of("seconds", seconds)
        if not limit > 0 or limit == float("inf"):
            raise InvalidArgument(f"seconds: must be a positive, finite duration, got {limit}")
        view = Cluster.__new__(Cluster)
        view._compose(self._peers.with_deadline(limit), self._session, self._origin or self)
        return view

    # --- topics ------------------------------------------------------------------------------

    def create_topic(self, topic: str, partitions: int = 1) -> None:
        """Create a topic with ``partitions`` partitions (idempotent for the same count)."""
        self._check_open()
        self._topics.create_topic(topic, partitions)

    def topics(self) -> dict[str, int]:
        """Every topic and its partition count."""
        self._check_open()
        return self._topics.topics()

    def delete_topic(self, topic: str, *, force: bool = False) -> int:
        """Delete a topic with its log and its subscriptions' state; returns the number of
        store objects deleted. A topic with subscriptions is deleted only with ``force``.
        Its actors are stopped first; if the store fails midway, deleting again finishes."""
        self._check_open()
        return self._topics.delete_topic(topic, force=force)

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
        return self._topics.create_producer(
            topic,
            name,
            max_pending_messages=max_pending_messages,
            block_if_queue_full=block_if_queue_full,
        )

    # --- subscriptions and their numbers -----------------------------------------------------

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
        return self._topics.subscribe(
            topic,
            subscription,
            subscription_type,
            ack_timeout_s,
            max_redeliveries,
            dead_letter_topic,
            prefetch=prefetch,
            initial_position=initial_position,
            partitions_per_actor=partitions_per_actor,
        )

    def delete_subscription(self, topic: str, subscription: str) -> int:
        """Delete a subscription: its consumers here are closed, its actors stopped, its
        cursors and marks deleted (Pulsar's unsubscribe). Returns the number of store
        objects deleted. Consumers of it elsewhere get NotFound on their next call. If the
        store fails midway, deleting again finishes."""
        self._check_open()
        return self._topics.delete_subscription(topic, subscription)

    def stats(self, topic: str, subscription: str | None = None) -> dict:
        """A subscription's numbers summed over partitions (``partitions`` has each one), or,
        without ``subscription``, the topic's partitions, subscriptions and ``held``, the
        entries its log holds. The counts are defined once, in
        :mod:`raydelay.dispatch.counts`: ``delayed`` leaves cancelled messages out and is at
        most ``backlog``; ``dead_lettered`` counts over the subscription's life;
        ``delivered``, ``acked``, ``redelivered`` and ``cancelled`` count since the actors
        started (a restart starts them again); ``consumers`` maps each consumer to
        ``unacked`` and ``lease_age_s``."""
        self._check_open()
        return self._topics.stats(topic, subscription)

    def partition_hosts(self, topic: str) -> list[str]:
        """The host actor serving each partition of ``topic`` (``host/<node>/<slot>``), in
        partition order; "" for a partition no host has taken yet."""
        self._check_open()
        return self._topics.partition_hosts(topic)

    def placement(self) -> list[dict[str, Any]]:
        """Which node holds which raydelay actor: one dict per live actor (``name``,
        ``class``, ``state``, ``node`` id, ``address``, ``head``, ``pid``, ``restarts``, and
        ``serves``: a host's partitions, ``topic/partition``, a subscription host's
        ``topic/subscription/partition``; ``partitions``: how many; a coordinator's
        ``role``: ``serving``, or ``standby`` for the one kept warm on another node), sorted
        by node then name."""
        self._check_open()
        return self._topics.placement()

    # --- operations --------------------------------------------------------------------------

    def cancel(
        self, message_ids: Any, /, key: str | None = None, *, keys: Sequence[str] | None = None
    ) -> Any:
        """Cancel messages by id (MessageIds or their strings, of any topics), in batches per
        topic. One bool per id, in order: True if it was cancelled, False if it was delivered
        (acknowledged) already or cancelled before.

        By key: ``cancel(topic, key="order-17")`` cancels the message scheduled under that
        key (see ``Producer.send``) and answers one bool: True when one was pending and no
        subscription has had it delivered. ``cancel(topic, keys=[...])``: one bool per key."""
        self._check_open()
        if key is not None or keys is not None:
            return self._ops.cancel_keys(message_ids, key, keys)
        return self._ops.cancel(message_ids)

    def due_histogram(
        self, topic: str, subscription: str, windows_s: tuple[float, ...] = (60, 3600, 86400)
    ) -> list[tuple[str, int]]:
        """Pending delayed messages of a subscription by due window, summed over partitions:
        [("<= 1m", n), ("<= 1h", n), ("<= 1d", n), ("later", n)] for the default windows
        (seconds from now, increasing). Counts of bucket segments not loaded yet are spread
        evenly over each segment's due range."""
        self._check_open()
        return self._ops.due_histogram(topic, subscription, windows_s)

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
        return self._ops.peek(topic, subscription, limit, due_after, due_before, key)

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
        return self._ops.reset_cursor(topic, subscription, to)

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
        return self._ops.create_reader(topic, start, inclusive=inclusive)

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
        return self._ops.redrive(dead_letter_topic, to_topic, limit, progress=progress)

    # --- lifecycle ---------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Close this client's producers (flushing them) and consumers. If ``connect`` started
        Ray, also persist every subscription's cursor, close every partition's open ledger
        (so a later start has nothing to fence), and stop Ray. If it joined a running Ray,
        leave it (that Ray goes on): this process no longer depends on it, so the Ray's
        later stop cannot take this process down."""
        if self._origin is not None:
            raise InvalidArgument(
                "cluster: this is a view (with_retry_deadline); shut down "
                "the client it was made from"
            )
        self._lifecycle.shutdown()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # --- for the CLI, the Pulsar layer, the ingest job and tests ------------------------------

    @property
    def _closed(self) -> bool:
        return self._session.closed

    @property
    def _started_ray(self) -> bool:
        return self._session.started_ray

    @_started_ray.setter
    def _started_ray(self, value: bool) -> None:
        self._session.started_ray = value

    @property
    def _producers(self) -> list[Producer]:
        return self._session.producers

    @property
    def _consumers(self) -> list[Consumer]:
        return self._session.consumers

    @property
    def _ray_address(self) -> str:
        """The address of the Ray cluster this client is connected to."""
        return ray.get_runtime_context().gcs_address

    def _stop_everything(self) -> int:
        """``raydelay down``: see :meth:`Lifecycle.stop_everything`."""
        return self._lifecycle.stop_everything()

    def _partitions(self, topic: str) -> int:
        return self._peers.partitions(topic)

    def _subscription_options(self, topic: str, subscription: str) -> dict:
        """A subscription's options; NotFound when it does not exist."""
        return self._peers.subscription_options(topic, subscription)

    def _subscription_peer(self, topic: str, partition: int, subscription: str) -> Peer:
        return self._peers.subscription_peer(topic, partition, subscription)

    def _subscribe_many(self, *args: Any, **kwargs: Any) -> MultiTopicConsumer:
        """See :meth:`Topics.subscribe_many`."""
        return self._topics.subscribe_many(*args, **kwargs)

    def _check_open(self) -> None:
        self._session.check_open()
