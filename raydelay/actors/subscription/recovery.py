"""Recovering one subscription partition from the store: its pure ``Subscription`` built
from the cursor, the log resumed where the buckets leave it, cancels learned, old objects
deleted, and what recovery cost until the first delivery (:class:`RecoveryCost`).

Everything here makes blocking calls: the constructor of a
:class:`~raydelay.actors.subscription.shell.SubscriptionShell` runs on a thread, and
:func:`drop_legacy_buckets` is run on one once the shell has started.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.host import HostActor
from raydelay.actors.registry import CoordinatorRegistry
from raydelay.actors.subscription.ref import PartitionRef
from raydelay.clock import Clock
from raydelay.cluster.handles import Peer
from raydelay.config import Config
from raydelay.delayed import InMemoryDelayedDeliveryTracker
from raydelay.delayed.reader import SealedReader
from raydelay.dispatch.cursor import Cursor, Position
from raydelay.dispatch.ports import CursorWriter, DeadLetterPublisher
from raydelay.dispatch.subscription import Subscription
from raydelay.storage import ObjectStore
from raydelay.subscription_types import spreads

log = logging.getLogger(__name__)

# Entries of decoded ledger objects kept for payload fetches.
_DECODED_ENTRIES = 200_000
# Payloads read from the host per receive: due delayed messages are scattered over the
# log, so a read costs about one ranged read each; smaller reads reach the consumer
# sooner. Payloads the decoded objects here still hold are not capped.
_FETCH_MAX = 2_000
# Sealed-bucket rows kept for delivery before they are pruned.
_STAGED_ROWS = 200_000


def seconds_to_ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(round(float(seconds) * 1000))


def make_tracker(config: Config, clock: Clock) -> InMemoryDelayedDeliveryTracker:
    """The in-memory tracker: this subscription's delayed nacks (and, with
    ``delayed.tracker = "memory"``, the delayed positions it reads from the log)."""
    d = config.delayed
    return InMemoryDelayedDeliveryTracker(
        clock=clock,
        tick_time_ms=d.tick_time_ms,
        strict=d.strict,
        fixed_delay_lookahead=d.fixed_delay_lookahead,
    )


def build_subscription(
    ref: PartitionRef,
    config: Config,
    options: dict[str, Any],
    clock: Clock,
    cursor: Cursor,
    dispatched_before: Position,
    write_cursor: CursorWriter,
    publish_dead_letters: DeadLetterPublisher,
) -> Subscription:
    """The pure subscription of one partition, from its cursor and its options; it reads
    sealed buckets when its type spreads delayed messages over consumers (shared,
    key_shared) and the partition's delayed index is bucketed."""
    reader = None
    if spreads(options["type"]) and config.delayed.tracker == "bucket":
        reader = SealedReader()
    return Subscription(
        name=ref.name,
        subscription_type=options["type"],
        tracker=make_tracker(config, clock),
        clock=clock,
        cursor=cursor,
        dispatched_before=dispatched_before,
        ack_timeout_ms=seconds_to_ms(options.get("ack_timeout_s")),
        max_redeliveries=options.get("max_redeliveries"),
        read_ahead_entries=config.subscription.read_ahead_entries,
        sealed=reader,
        write_cursor=write_cursor,
        publish_dead_letters=publish_dead_letters,
        cursor_persist_interval_ms=config.subscription.cursor_persist_interval_ms,
        consumer_lease_ms=int(config.subscription.consumer_lease_s * 1000),
        cached_entries=_DECODED_ENTRIES,
        max_fetch=_FETCH_MAX,
        max_staged_rows=_STAGED_ROWS,
        lookahead_ms=config.subscription.lookahead_ms,
    )


def resume_log(sub: Subscription, host: Peer[HostActor], ref: PartitionRef) -> int:
    """Resume the log read after what the buckets hold, learn the log's tail and the
    cancel markers ahead; returns how many loose positions are to be read again."""
    ledgers = host.call_from_thread(HostActor.ledgers, ref.topic, ref.partition)
    loose = sub.resume_after_buckets(ledgers)
    tail = host.call_from_thread(HostActor.tail, ref.topic, ref.partition)
    sub.reading.tail = None if tail is None else (int(tail[0]), int(tail[1]))
    _learn_cancels(sub, host, ref)
    return loose


def _learn_cancels(sub: Subscription, host: Peer[HostActor], ref: PartitionRef) -> None:
    """Before delivering anything, learn every cancel marker ahead of the read position:
    a cancel this subscription applied before it died stays applied."""
    pairs = host.call_from_thread(
        HostActor.cancel_markers, ref.topic, ref.partition, sub.reading.read_position
    )
    learned = sub.learn_cancels(pairs)
    if learned:
        log.info("%s: %d cancel markers ahead of the read position", sub.name, learned)


def drop_legacy_buckets(
    name: str, prefix: str, store: ObjectStore, coordinator: Peer[CoordinatorActor]
) -> int:
    """Delete the buckets this subscription indexed by itself before the topic did it
    for all (stores written before sealed buckets): the topic re-indexed every retained
    ledger when it came up, so they are not needed. Returns objects deleted."""
    registry = CoordinatorRegistry(coordinator)
    records = registry.list(prefix)
    doomed = store.list(f"{prefix}/buckets/") + store.list(f"{prefix}/tombs/")
    for key in doomed:
        store.delete(key)
    if records:
        registry.apply([("remove", prefix, k, None) for k in records])
        log.info(
            "%s: deleted %d buckets it had indexed itself (the topic indexes them now)",
            name,
            len(records),
        )
    return len(doomed)


class RecoveryCost:
    """What one recovery cost, filled in until the first delivery after it: init and
    first-receive and first-delivery seconds, loose positions re-read, where the log read
    resumed, delayed messages tracked, bytes read from the log and from the store; when it
    began (``began_at_ms``, epoch ms) and the seconds at which each step of the
    constructor ended (``steps``: its peers found, its cursor loaded, its sealed buckets
    read; the log is what follows until ``init_s``)."""

    def __init__(self, started: float) -> None:
        began = int(time.time() * 1000 - (time.monotonic() - started) * 1000)
        self._cost: dict[str, Any] = {
            "started": started,
            "began_at_ms": began,
            "steps": {},
            "log_bytes": 0,
        }

    def step(self, name: str) -> None:
        """Step ``name`` of the constructor is done."""
        self._cost["steps"][name] = round(time.monotonic() - self._cost["started"], 3)

    def recovered(self, loose: int, read_from: Position, delayed: int) -> None:
        """The constructor's part is done."""
        self._cost.update(
            init_s=round(time.monotonic() - self._cost["started"], 3),
            loose=loose,
            read_from=list(read_from),
            delayed=delayed,
        )

    @property
    def delivered(self) -> bool:
        """Whether the first delivery after recovery was made (then nothing more counts)."""
        return "first_delivery_s" in self._cost

    def count_log_bytes(self, nbytes: int) -> None:
        """Bytes read from the log, counted until the first delivery (what recovery read)."""
        if not self.delivered:
            self._cost["log_bytes"] += nbytes

    def first_receive(self) -> None:
        if "first_receive_s" not in self._cost:
            self._cost["first_receive_s"] = round(time.monotonic() - self._cost["started"], 3)

    def first_delivery(self, now_ms: int, store_bytes: int) -> None:
        if self.delivered:
            return
        r = self._cost
        r["first_delivery_s"] = round(time.monotonic() - r.pop("started"), 3)
        r["first_delivery_at_ms"] = now_ms
        r["store_bytes"] = store_bytes

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self._cost.items() if k != "started"}
