"""Pulsar's producer over raydelay's: sends queue in order, and a background thread carries
what is queued as one append call per partition, each message with its Pulsar sequence id
(a send that repeats an id the topic holds from a producer of the same name is not stored
again: Pulsar's deduplication, always on)."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import numpy as np

from raydelay.client.message import MessageId as _CoreId
from raydelay.client.message import (
    check_key,
    check_payload,
    check_properties,
    deliver_at_of,
)
from raydelay.client.producer import partition_of
from raydelay.compat.pulsar._checks import check_type, check_type_or_none
from raydelay.compat.pulsar.enums import PartitionsRoutingMode, Result
from raydelay.compat.pulsar.exceptions import AlreadyClosed, PulsarException
from raydelay.compat.pulsar.message import (
    EVENT_TIME,
    KEY_IS_ORDERING,
    NULL,
    ORDERING_KEY,
    PRODUCER,
    RESERVED,
    Message,
    MessageId,
)
from raydelay.compat.pulsar.schema import Schema
from raydelay.config import Config
from raydelay.log.entries import Entries, concat_entries
from raydelay.log.partition import StaleSequence

log = logging.getLogger(__name__)

_SEND_BATCH = 1_000  # queued sends carried by one append call at most
_BATCHES_PER_CALL = 16  # log batches per partition in one call (the log's dedup memory)


class _Send:
    __slots__ = ("partition", "seq", "auto", "entries", "future", "callback")

    def __init__(
        self, partition: int, seq: int, auto: bool, entries: Entries, callback: Any
    ) -> None:
        self.partition, self.seq, self.auto, self.entries = partition, seq, auto, entries
        self.future: Future = Future()
        self.callback = callback


def _groups(batch: list[_Send]) -> tuple[list[list[_Send]], list[_Send]]:
    """The sends of one append call as batches of the log, and the sends left for the
    next call. Consecutive sends to a partition with ids given here share one batch (its
    id is their last); a send with the caller's own id is a batch of its own. At most
    ``_BATCHES_PER_CALL`` batches go to a partition in one call: as many as the log
    remembers per producer, so that a call that must be retried one batch at a time gets
    every position back."""
    groups: list[list[_Send]] = []
    open_group: dict[int, list[_Send]] = {}  # partition -> its group of auto ids
    count: dict[int, int] = {}
    left: list[_Send] = []
    for s in batch:
        p = s.partition
        if left or (count.get(p, 0) >= _BATCHES_PER_CALL and not (s.auto and p in open_group)):
            left.append(s)  # (everything after it waits too: order per producer)
            continue
        if s.auto and p in open_group:
            open_group[p].append(s)
            continue
        group = [s]
        groups.append(group)
        count[p] = count.get(p, 0) + 1
        if s.auto:
            open_group[p] = group
        else:
            open_group.pop(p, None)
    return groups, left


class Producer:
    """Sends to one topic. Sends queue in order; a background thread carries everything
    queued as one append call per partition, each message with its sequence id."""

    def __init__(
        self,
        core: Any,
        config: Config,
        topic_name: str,
        partitions: int,
        schema_: Schema,
        initial_sequence_id: int | None,
        routing: PartitionsRoutingMode,
        router: Callable[[Message, int], int] | None,
    ) -> None:
        self._core, self._topic_name = core, topic_name
        self._config = config  # the raydelay config (message size and delay limits)
        self._partitions, self._schema = partitions, schema_
        self._routing, self._router = routing, router
        # Pulsar's ids count from 0; the log's from 1 (0: none), so the log holds id + 1
        last = max(core.last_sequences) - 1
        if initial_sequence_id is not None:
            last = max(last, initial_sequence_id)
        self._last = last  # the largest id published
        self._next = last + 1  # the next id given to a send without one
        self._single = int(np.random.default_rng().integers(partitions))
        self._rr = itertools.count(self._single)  # (a random start, as Pulsar's round robin)
        self._queue: deque[_Send] = deque()
        self._cv = threading.Condition()
        self._busy = 0
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"pulsar-producer-{topic_name}", daemon=True
        )
        self._thread.start()

    def topic(self) -> str:
        return self._topic_name

    def producer_name(self) -> str:
        return self._core.name

    def last_sequence_id(self) -> int:
        """The largest sequence id published (-1: none yet, by any producer of this name)."""
        return self._last

    def is_connected(self) -> bool:
        return not self._closed

    def send(
        self,
        content: Any,
        properties: dict | None = None,
        partition_key: str | None = None,
        ordering_key: str | None = None,
        sequence_id: int | None = None,
        replication_clusters: list | None = None,
        disable_replication: bool = False,
        event_timestamp: int | None = None,
        deliver_at: int | None = None,
        deliver_after: timedelta | None = None,
    ) -> MessageId:
        """Send one message; returns its MessageId once it is durable."""
        item = self._build(content, properties, partition_key, ordering_key, sequence_id,
                           replication_clusters, disable_replication, event_timestamp,
                           deliver_at, deliver_after, None)  # fmt: skip
        return item.future.result()

    def send_async(
        self,
        content: Any,
        callback: Callable[[Result, MessageId | None], None] | None,
        properties: dict | None = None,
        partition_key: str | None = None,
        ordering_key: str | None = None,
        sequence_id: int | None = None,
        replication_clusters: list | None = None,
        disable_replication: bool = False,
        event_timestamp: int | None = None,
        deliver_at: int | None = None,
        deliver_after: timedelta | None = None,
    ) -> None:
        """Queue one message; ``callback(result, message_id)`` runs once it is durable (or
        failed: then the id is None)."""
        if callback is not None and not callable(callback):
            raise ValueError("Argument callback is expected to be a callable")
        self._build(content, properties, partition_key, ordering_key, sequence_id,
                    replication_clusters, disable_replication, event_timestamp,
                    deliver_at, deliver_after, callback)  # fmt: skip

    def _build(
        self,
        content: Any,
        properties: Any,
        partition_key: Any,
        ordering_key: Any,
        sequence_id: Any,
        replication_clusters: Any,
        disable_replication: Any,
        event_timestamp: Any,
        deliver_at: Any,
        deliver_after: Any,
        callback: Any,
    ) -> _Send:
        if self._closed:
            raise AlreadyClosed(f"producer {self.producer_name()!r} is closed")
        data = None if content is None else self._schema.encode(content)
        check_type_or_none(dict, properties, "properties")
        check_type_or_none(str, partition_key, "partition_key")
        check_type_or_none(str, ordering_key, "ordering_key")
        check_type_or_none(int, sequence_id, "sequence_id")
        check_type_or_none(list, replication_clusters, "replication_clusters")
        check_type(bool, disable_replication, "disable_replication")
        check_type_or_none(int, event_timestamp, "event_timestamp")
        check_type_or_none(int, deliver_at, "deliver_at")
        check_type_or_none(timedelta, deliver_after, "deliver_after")
        if sequence_id is not None and sequence_id < 0:
            raise ValueError(f"sequence_id: must be >= 0, got {sequence_id}")
        props = dict(properties or {})
        bad = [k for k in props if isinstance(k, str) and k.startswith(RESERVED)]
        if bad:
            raise ValueError(f"properties: {bad[0]!r}: names starting {RESERVED!r} are reserved")
        if ordering_key:
            props[ORDERING_KEY] = ordering_key
        key = partition_key or ordering_key or None
        if key is not None and not partition_key:
            props[KEY_IS_ORDERING] = "1"
        props[PRODUCER] = self._core.name
        if event_timestamp:
            props[EVENT_TIME] = str(event_timestamp)
        if data is None:
            props[NULL] = "1"
            data = b""
        cfg = self._config
        data = check_payload(data, cfg.topic.max_message_bytes, "content")
        key = check_key(key, "partition_key")
        props = check_properties(props) or {}
        now = time.time_ns() // 1_000_000
        at = deliver_at_of(deliver_at, deliver_after, now, cfg.delayed.max_delay_ms)
        partition = self._route(data, key, props)
        entries = Entries.build([data], np.array([at], dtype=np.int64), [key], [props])
        with self._cv:
            if self._closed:  # (checked again here: a close may have come meanwhile)
                raise AlreadyClosed(f"producer {self.producer_name()!r} is closed")
            auto = sequence_id is None
            if auto:
                sequence_id = self._next
            self._next = max(self._next, sequence_id + 1)
            item = _Send(partition, sequence_id, auto, entries, callback)
            self._queue.append(item)
            self._cv.notify_all()
        return item

    def _route(self, data: bytes, key: str | None, props: dict[str, str]) -> int:
        n = self._partitions
        if self._router is not None:
            core = _Outgoing(data, key, props)
            p = int(self._router(Message(core, self._schema, self._topic_name), n))
            if not 0 <= p < n:
                raise ValueError(f"message_router: partition {p} is not in 0..{n - 1}")
            return p
        if key is None and self._routing == PartitionsRoutingMode.UseSinglePartition:
            return self._single
        return partition_of(key, n, self._rr)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                batch: list[_Send] = []
                seen: set[tuple[int, int]] = set()
                while self._queue and len(batch) < _SEND_BATCH:
                    nxt = self._queue[0]
                    if (nxt.partition, nxt.seq) in seen:
                        break  # one id twice in one call: the second waits for the next
                    seen.add((nxt.partition, nxt.seq))
                    batch.append(self._queue.popleft())
                groups, left = _groups(batch)
                self._queue.extendleft(reversed(left))
                self._busy += 1
            try:
                self._append(groups)
            finally:
                with self._cv:
                    self._busy -= 1
                    self._cv.notify_all()

    def _append(self, groups: list[list[_Send]]) -> None:
        def batch(g: list[_Send]) -> tuple[int, int, Entries]:
            entries = g[0].entries if len(g) == 1 else concat_entries([s.entries for s in g])
            return (g[0].partition, g[-1].seq + 1, entries)

        results: list[Any] = []
        try:
            ranges = self._core.append_sequenced([batch(g) for g in groups])
            for g, r in zip(groups, ranges, strict=True):
                results += self._ids_of(g, r)
        except StaleSequence:
            # an id the topic holds already but no longer knows the position of: one batch
            # at a time, to tell that one (a duplicate) from the rest
            results = []
            for g in groups:
                try:
                    results += self._ids_of(g, self._core.append_sequenced([batch(g)])[0])
                except StaleSequence:
                    results += [MessageId(s.partition, -1, -1, -1) for s in g]
                except Exception as exc:  # noqa: BLE001 - handed to the senders
                    results += [exc] * len(g)
        except Exception as exc:  # noqa: BLE001 - handed to each sender
            results = [exc] * sum(map(len, groups))
        sends = [s for g in groups for s in g]
        for s, r in zip(sends, results, strict=True):
            if isinstance(r, Exception):
                s.future.set_exception(r)
                outcome: tuple[Result, MessageId | None] = (Result.UnknownError, None)
            else:
                with self._cv:
                    self._last = max(self._last, s.seq)
                s.future.set_result(r)
                outcome = (Result.Ok, r)
            if s.callback is not None:
                try:
                    s.callback(*outcome)
                except Exception:  # noqa: BLE001 - a user's callback must not stop sends
                    log.exception("send_async callback failed")

    def _ids_of(self, group: list[_Send], ranges: list) -> list[MessageId]:
        """The ids of a batch's messages, from the position ranges the log gave it."""
        p = group[0].partition
        ids = [  # (no topic, as Pulsar's: a consumer of several topics cannot place it)
            MessageId(p, int(ledger), int(first) + i, -1)
            for ledger, first, n in ranges
            for i in range(int(n))
        ]
        if len(ids) != len(group):
            raise PulsarException(f"partition {p} gave {len(ids)} positions for {len(group)}")
        return ids

    def flush(self) -> None:
        """Wait until every message sent so far is durable (or failed)."""
        with self._cv:
            while self._queue or self._busy:
                self._cv.wait()

    def close(self) -> None:
        """Flush, then close."""
        if self._closed:
            return
        self.flush()
        self._shutdown()

    def _shutdown(self) -> None:
        with self._cv:
            self._closed = True
            dropped = list(self._queue)
            self._queue.clear()
            self._cv.notify_all()
        for s in dropped:
            s.future.set_exception(AlreadyClosed("the producer was shut down"))
            if s.callback is not None:
                s.callback(Result.AlreadyClosed, None)
        self._core.close()


class _Outgoing:
    """A message being sent, as a message router sees it."""

    def __init__(self, payload: bytes, key: str | None, props: dict[str, str]) -> None:
        self.payload, self.key, self.properties = payload, key, props
        self.publish_time_ms = 0
        self.redelivery_count = 0
        self.message_id = _CoreId("", -1, -1, -1)
