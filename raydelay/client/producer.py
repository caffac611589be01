"""Producer: batches messages into one ``append`` per partition.

- ``send_async`` checks one message, queues it and returns a ``Future`` of its
  MessageId. A background thread sends what is queued as one batch per partition the
  moment no batch is in flight; what queues meanwhile goes in the next (no timer: alone,
  a message pays one round trip and one durable write; under load the batches grow).
  At most ``max_pending_messages`` sends wait for their answer: past that,
  ``send_async`` blocks, or raises ``ProducerQueueIsFull`` with
  ``block_if_queue_full=False``, as Pulsar's client does.
- ``send`` with nothing queued or on its way sends from the calling thread; else it is
  ``send_async(...).result()``: concurrent senders share round trips.
- ``send_many`` is the fast path: it checks every message first (nothing is sent
  when one is bad), then sends one batch per partition (chunked to the ledger size)
  in parallel.
- Each batch carries the producer's name and a per-partition ``sequence_id``; a
  batch re-sent after a failure is recognised by the partition and not appended
  twice. Failed sends are retried (same sequence id) when the error is retriable.
- The partition is a stable hash of the key, else round-robin in runs of STICKY messages
  (a batch of ``send_many`` spreads its keyless messages in runs; ``send`` and
  ``send_async`` keep one partition for STICKY sends, then take the next).
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from raydelay.client.appends import Appends, chunks_by_partition, ids_of
from raydelay.client.batch_input import check_batch
from raydelay.client.cancels import CancelSends
from raydelay.client.keyed import KeyedSends, queue_full
from raydelay.client.message import (
    MessageId,
    MessageIds,
    check_key,
    check_payload,
    check_properties,
    deliver_at_of,
)
from raydelay.client.rounds import Round, SendFuture
from raydelay.clock import now_ms as _now_ms
from raydelay.dispatch.keys import key_hash
from raydelay.errors import (
    InvalidArgument,
    StorageError,
    Unavailable,
)
from raydelay.limits import check_limit
from raydelay.log.entries import AppendBatch, Entries, encode_batch
from raydelay.log.keys import check_on_duplicate
from raydelay.storage.keys import validate_name

if TYPE_CHECKING:
    from raydelay.client.links import TopicLink
    from raydelay.config import Config

log = logging.getLogger(__name__)

STICKY = 5_000  # keyless messages go to one partition in runs of at least this many


def partition_of(key: str | None, partitions: int, counter: itertools.count) -> int:
    if key is None:
        return next(counter) % partitions
    return key_hash(key) % partitions


class Producer(KeyedSends, CancelSends):
    """Sends messages to one topic (``Cluster.create_producer``). ``link`` carries its
    calls to the topic's partitions (:class:`raydelay.client.links.TopicLink`); ``on_close``
    runs once when it closes. ``max_pending_messages`` (-1: no limit) and
    ``block_if_queue_full`` bound :meth:`send_async`; None takes the ``producer`` section
    of the config."""

    def __init__(
        self,
        link: TopicLink,
        topic: str,
        config: Config,
        name: str | None = None,
        on_close: Callable[[Producer], None] | None = None,
        *,
        max_pending_messages: int | None = None,
        block_if_queue_full: bool | None = None,
    ) -> None:
        if max_pending_messages is None:
            max_pending_messages = config.producer.max_pending_messages
        # (-1, no limit, becomes the largest int: the room check needs no special case)
        pending_limit = check_limit("max_pending_messages", max_pending_messages)
        if block_if_queue_full is None:
            block_if_queue_full = config.producer.block_if_queue_full
        if not isinstance(block_if_queue_full, bool):
            raise InvalidArgument(
                f"block_if_queue_full: expected True or False, got {block_if_queue_full!r}"
            )
        self.max_pending_messages = max_pending_messages
        self._pending_limit = pending_limit
        self.block_if_queue_full = block_if_queue_full
        self._link = link
        self._on_close = on_close
        self.topic = topic
        self.partitions = partitions = link.partitions
        self.name = validate_name("name", name) if name is not None else uuid.uuid4().hex
        self._seq = [0] * partitions
        # appends (of messages or cancel markers) that had to be sent again (an actor
        # restarting, the store failing)
        self.retries = 0
        if name is not None:  # a named producer continues its sequence ids where it left off
            self._seq = list(
                link.retried(
                    lambda: [link.last_sequence(p, self.name) for p in range(partitions)],
                    f"topic {topic}",
                )
            )
        self._seq_lock = threading.Lock()
        self._down_since: dict[int, float] = {}  # partitions whose appends failed: since when
        # keyless runs start at a partition of chance: producers that send a run or two
        # each (a CLI produce, a script) spread over the partitions, not all onto the first
        self._rr = itertools.count(random.randrange(partitions))
        self._queue = Round()  # the sends queued for the next go
        # (send_async takes the lock itself: a Condition's own enter and exit are Python
        # calls, a fifth of what a send_async cost)
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._pending = 0  # sends queued or in flight, their futures not resolved yet
        self._inline = 0  # sends on their way from their own thread (see send)
        self._sticky_at, self._sticky_left = 0, 0  # keyless sends: partition, sends left
        self._closed = False
        self._thread: threading.Thread | None = None
        # keyed send_async: its queue (checked send, on_duplicate, future) and its sender
        self._keyed_queue: list[tuple[tuple, str, Future]] = []
        self._keyed_thread: threading.Thread | None = None
        cfg = config
        self._max_bytes = cfg.topic.max_message_bytes
        self._max_delay_ms = cfg.delayed.max_delay_ms
        self._chunk = min(cfg.topic.max_entries_per_ledger, 10_000)

    # --- sending --------------------------------------------------------------------------

    def send(
        self,
        payload: bytes,
        *,
        deliver_after: float | timedelta | None = None,
        deliver_at: Any = None,
        key: str | None = None,
        properties: dict[str, str] | None = None,
        on_duplicate: str = "ignore",
    ) -> MessageId:
        """Send one message; returns its MessageId once it is durable.

        ``deliver_after``: seconds from now, or a ``timedelta``. ``deliver_at``: epoch ms
        (an int, numpy's too) or an aware datetime. Neither: deliver at once. A time after
        year 9999 is an InvalidArgument, raised before anything is queued.

        ``key``: the message's identity within the topic while it is scheduled (and its
        partition: one key, one partition). If a message with this key is still pending
        (sent for later, not due yet, not cancelled), ``on_duplicate`` says what happens:
        ``"ignore"`` (the default) keeps the first and returns its id; ``"replace"``
        cancels it and schedules this one; ``"error"`` raises :class:`KeyPending`;
        ``"allow"`` sends it beside the first (the key only routes and groups, as for a
        ``key_shared`` subscription's ordering). A message due at once has no pending
        life: its key only routes it.

        With nothing queued or on its way, the calling thread sends it itself; else it
        goes with the next round of queued sends (concurrent senders share round trips)."""
        self._check_open()
        checked = self.checked_one(payload, deliver_after, deliver_at, key, properties)
        check_on_duplicate(on_duplicate)
        if key is not None and on_duplicate != "allow" and checked[4] > _now_ms():  # (keyed, later)
            p, payload, key, properties, at = checked
            return self.send_keyed(
                np.array([p], dtype=np.int64),
                [payload],
                [key],
                None if properties is None else [properties],
                np.array([at], dtype=np.int64),
                on_duplicate,
            )[0]
        with self._lock:
            inline = self._pending == 0 and not self._closed
            if inline:  # (the flusher waits while it is on its way: sends keep their order)
                partition = checked[0] if checked[0] >= 0 else self._next_sticky()
                self._pending += 1
                self._inline += 1
        if not inline:
            return self._enqueue(*checked).result()
        # no hand-off to the flusher thread and back: two thread wake-ups of a lone send
        try:
            _, payload, key, properties, at = checked
            ids = self._append(
                np.array([partition], dtype=np.int64),
                [payload],
                None if key is None else [key],
                None if properties is None else [properties],
                np.array([at], dtype=np.int64),
            )
            return ids[0]
        finally:
            with self._cv:
                self._pending -= 1
                self._inline -= 1
                self._cv.notify_all()

    def send_async(
        self,
        payload: bytes,
        *,
        deliver_after: float | timedelta | None = None,
        deliver_at: Any = None,
        key: str | None = None,
        properties: dict[str, str] | None = None,
        on_duplicate: str = "ignore",
    ) -> SendFuture | Future:
        """Queue one message and return a ``concurrent.futures.Future`` of its MessageId,
        resolved once the message is durable (or with the error that kept it from being
        written: then it was not appended).

        Takes what :meth:`send` takes, checked here: bad input raises at the call and
        nothing is queued. It is sent with whatever else is queued. With
        ``max_pending_messages`` sends unresolved, it waits for room, or raises
        ``ProducerQueueIsFull`` when the producer was created with
        ``block_if_queue_full=False``. :meth:`flush` waits for every one.

        A keyed message scheduled for later (see :meth:`send`'s ``on_duplicate``) goes
        through a sending thread of its own, in order with the other keyed ones (not with
        the rest: its key is checked on the partition's host first), in batches as they
        queue up."""
        self._check_open()
        checked = self.checked_one(payload, deliver_after, deliver_at, key, properties)
        check_on_duplicate(on_duplicate)
        if key is not None and on_duplicate != "allow" and checked[4] > _now_ms():
            return self._keyed_async(checked, on_duplicate)
        return self._enqueue(*checked)

    def _enqueue(
        self, partition: int, payload: bytes, key: str | None, properties: dict | None, at: int
    ) -> SendFuture:
        """Queue one checked send for the flusher (see :meth:`send_async`)."""
        with self._lock:
            limit = self._pending_limit
            while self._pending >= limit and not self._closed:
                # (a done-callback runs on the sending thread: waiting there for room
                # would wait for itself)
                if not self.block_if_queue_full or threading.current_thread() is self._thread:
                    raise queue_full(self._pending, self.max_pending_messages)
                self._cv.wait()
            self._check_open()  # (closed while this call waited for room)
            if partition < 0:
                partition = self._next_sticky()
            fut = self._queue.add(partition, payload, key, properties, at)
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._flusher, name=f"raydelay-producer-{self.topic}", daemon=True
                )
                self._thread.start()
            if len(self._queue) == 1:
                self._cv.notify_all()  # (the flusher waits only on an empty queue)
        return fut

    def checked_one(
        self,
        payload: bytes,
        deliver_after: float | timedelta | None,
        deliver_at: Any,
        key: str | None,
        properties: dict[str, str] | None,
    ) -> tuple[int, bytes, str | None, dict[str, str] | None, int]:
        """One send's arguments checked: (its partition, -1 for a keyless one that takes
        the sticky partition when it is queued; payload, key, properties, deliver_at ms)."""
        payload = check_payload(payload, self._max_bytes)
        if key is not None:
            key = check_key(key)
        if properties is not None:
            properties = check_properties(properties)
        at = deliver_at_of(deliver_at, deliver_after, _now_ms(), self._max_delay_ms)
        return -1 if key is None else key_hash(key) % self.partitions, payload, key, properties, at

    def next_sticky(self) -> int:
        """The partition of the next keyless send (see :meth:`_next_sticky`)."""
        with self._lock:
            return self._next_sticky()

    def send_many(
        self,
        payloads: Sequence[bytes] | pa.Array | pa.ChunkedArray,
        *,
        deliver_after: Any = None,
        deliver_at: Any = None,
        keys: Sequence[str | None] | pa.Array | pa.ChunkedArray | None = None,
        properties: Sequence[dict[str, str] | None] | dict[str, str] | None = None,
        on_duplicate: str = "ignore",
    ) -> MessageIds:
        """Send a batch; returns the MessageIds in input order once all are durable (a
        :class:`MessageIds` sequence, which keeps them as columns).

        ``keys``: as :meth:`send`'s ``key``, with ``on_duplicate`` for the keyed
        messages scheduled for later (two of one key in the batch count as a duplicate
        too: "ignore" keeps the first, "replace" the last). A message ignored gets the id
        of the one pending under its key.

        ``deliver_at`` / ``deliver_after`` are one value for all messages or a sequence (a list
        or a 1-d numpy array) with one value (or None) per message. Every message is checked
        before anything is sent.

        Columns may be Arrow arrays as they come from a parquet file: payloads a binary
        array (kept as Arrow: no Python bytes per message), ``deliver_at`` epoch ms or
        aware timestamps, ``deliver_after`` seconds, keys strings."""
        check_on_duplicate(on_duplicate)
        checked = self.checked_many(payloads, deliver_after, deliver_at, keys, properties)
        parts, _, ks, _, d = checked
        if ks is not None and on_duplicate != "allow" and bool(np.any(d > _now_ms())):
            return self.send_keyed(*checked, on_duplicate)
        return self._append(*checked)

    def checked_many(
        self,
        payloads: Sequence[bytes] | pa.Array | pa.ChunkedArray,
        deliver_after: Any,
        deliver_at: Any,
        keys: Sequence[str | None] | pa.Array | pa.ChunkedArray | None,
        properties: Sequence[dict[str, str] | None] | dict[str, str] | None,
    ) -> tuple[np.ndarray, Any, list, list, np.ndarray]:
        """A batch's arguments checked, as what :meth:`submit` takes: (partitions,
        payloads, keys, properties, deliver_at ms)."""
        self._check_open()
        batch = check_batch(
            payloads, deliver_after, deliver_at, keys, properties,
            max_bytes=self._max_bytes, max_delay_ms=self._max_delay_ms,
        )  # fmt: skip
        if not batch.keyed:
            parts = self._sticky(len(batch.deliver_at))
        else:
            parts = np.fromiter(
                (partition_of(k, self.partitions, self._rr) for k in batch.keys),
                dtype=np.int64,
                count=len(batch.keys),
            )
        return parts, batch.payloads, batch.keys, batch.properties, batch.deliver_at

    def _next_sticky(self) -> int:
        """The partition of a keyless send: the same one for a run of STICKY sends, then the
        next (a lone sender keeps calling one warm partition, as Kafka's sticky
        partitioner does; measured here, 0.3-0.6 ms of a send's 3-4 ms). Under ``_cv``."""
        if self._sticky_left <= 0:
            self._sticky_at = next(self._rr) % self.partitions
            self._sticky_left = STICKY
        self._sticky_left -= 1
        return self._sticky_at

    def _sticky(self, n: int) -> np.ndarray:
        """Partitions for ``n`` keyless messages: round-robin by runs of at least STICKY
        messages, so a batch costs one append per partition it touches, not one per
        partition of the topic."""
        runs = max(1, min(self.partitions, n // STICKY))
        start = next(self._rr)
        return (start + (np.arange(n) * runs) // max(n, 1)) % self.partitions

    def _append(
        self, parts: np.ndarray, payloads: Any, keys: list | None, props: list | None, d: np.ndarray
    ) -> MessageIds:
        """Send one batch per partition chunk in parallel; MessageIds in input order (the
        first partition's error is raised, once every partition answered)."""
        ids, failed = self._append_each(parts, payloads, keys, props, d)
        if failed:
            raise next(iter(failed.values()))
        return ids

    def _append_each(
        self, parts: np.ndarray, payloads: Any, keys: list | None, props: list | None, d: np.ndarray
    ) -> tuple[MessageIds, dict[int, BaseException]]:
        """Send one batch per partition chunk in parallel. Returns the MessageIds in input
        order, and the error of each partition whose append failed (the ids of its messages
        are not valid: it appended none of them)."""
        return self.finish(self.submit(parts, payloads, keys, props, d), self.await_append)

    def submit(
        self, parts: np.ndarray, payloads: Any, keys: list | None, props: list | None, d: np.ndarray
    ) -> Appends:
        """Submit one append call per partition for the messages (``parts`` their
        partitions), and return at once; :meth:`finish` takes the answers."""
        by_partition = chunks_by_partition(
            parts, payloads, keys, props, d, self.partitions, self._chunk
        )
        # One call per partition carries its chunks in order: chunks sent as separate calls
        # could be appended out of order (a small call overtakes a big one still in transit),
        # and one key's messages must keep their order.
        with self._seq_lock:  # sequence ids in submission order, per partition
            submitted = []
            for p, chunks in by_partition.items():
                datas = []
                for _, entries in chunks:
                    self._seq[p] += 1
                    datas.append(encode_batch(AppendBatch(self.name, self._seq[p], entries)))
                ref = self._link.append(p, datas)
                submitted.append((p, [idx for idx, _ in chunks], datas, ref))
        return Appends(parts, submitted)

    def finish(
        self, appends: Appends, answer: Callable[[int, list[bytes], Any], list]
    ) -> tuple[MessageIds, dict[int, BaseException]]:
        """The MessageIds of submitted appends, and each failed partition's error
        (:func:`raydelay.client.appends.ids_of`; ``answer`` is :meth:`await_append` or
        what an asyncio caller awaited)."""
        return ids_of(self.topic, appends, answer)

    @property
    def last_sequences(self) -> list[int]:
        """Per partition, the largest sequence id this producer has used (for a named
        producer, counting the ids its earlier incarnations got appended)."""
        with self._seq_lock:
            return list(self._seq)

    def append_sequenced(self, batches: Sequence[tuple[int, int, Entries]]) -> list[list]:
        """Append batches whose sequence ids the caller derives from its input, as
        ``[(partition, sequence_id, entries)]``, all in parallel; returns each batch's
        position ranges once all are durable. A partition that holds a batch with this
        producer's name and id already does not append it again. The entries must be
        checked by the caller (``raydelay.ingest.rows`` does); the partition re-checks
        sizes. Used by bulk ingestion, whose ids come from (job, input split, chunk)."""
        self._check_open()
        by_partition: dict[int, list[int]] = {}  # partition -> indexes into batches
        for i, (p, _, _) in enumerate(batches):
            if not 0 <= p < self.partitions:
                raise InvalidArgument(f"partition: {p} does not exist (0..{self.partitions - 1})")
            by_partition.setdefault(p, []).append(i)
        submitted = []
        for p, which in by_partition.items():  # one call per partition, its batches in order
            datas = [
                encode_batch(AppendBatch(self.name, int(batches[i][1]), batches[i][2]))
                for i in which
            ]
            submitted.append((p, which, datas, self._link.append(p, datas)))
        with self._seq_lock:
            for p, seq, _ in batches:
                self._seq[p] = max(self._seq[p], int(seq))
        out: list[list] = [[] for _ in batches]
        for p, which, datas, ref in submitted:
            for i, ranges in zip(which, self.await_append(p, datas, ref), strict=True):
                out[i] = ranges
        return out

    def await_append(self, p: int, data: list[bytes], ref: Any) -> list:
        """Each batch's position ranges. While the
        partition's actor restarts or the store fails retriably, the same bytes (same sequence id) are sent again: the partition
        recognises a batch it already holds, so nothing is appended twice."""
        return self._answer(p, ref, lambda: self._link.append(p, data))

    def _answer(self, p: int, ref: Any, resend: Callable[[], Any]) -> Any:
        """The answer of an append call to partition ``p``; while its actor restarts or
        the store fails retriably, ``resend()`` (the same bytes, the same sequence id)
        until it goes through."""
        try:
            return self._link.get(ref, what=f"topic {self.topic}/{p}")
        except (Unavailable, StorageError) as exc:
            if isinstance(exc, StorageError) and not exc.retriable:
                raise
            with self._seq_lock:
                self.retries += 1
                self._down_since.setdefault(p, time.monotonic())
            log.debug("append to %s/%d failed (%s); retrying", self.topic, p, exc)

        # the partition's actor is looked up again: one that ended is re-created
        out = self._link.retried(resend, f"topic {self.topic}/{p}", partition=p)
        with self._seq_lock:  # one line per outage, whichever send saw it end first
            since = self._down_since.pop(p, None)
        if since is not None:
            log.info(
                "%s partition %d: appends go through again after %.1f s",
                self.topic, p, time.monotonic() - since,
            )  # fmt: skip
        return out

    def _flusher(self) -> None:
        """Send what is queued as soon as nothing is in flight: one batch per partition,
        then resolve each message's future. What queues while a batch is on its way goes
        in the next one, so under load batches grow and alone a message goes at once."""
        while True:
            with self._cv:
                while self._inline or not self._queue:  # (a send on its way goes first)
                    if self._closed and not self._queue:
                        return  # closed, and every queued send resolved
                    self._cv.wait()
                batch, self._queue = self._queue, Round()
            try:
                self._send_queued(batch)
            finally:
                with self._cv:
                    self._pending -= len(batch)
                    self._cv.notify_all()

    def _send_queued(self, batch: Round) -> None:
        """Append a round of queued sends and resolve it: each message's id, or its
        partition's error."""
        try:
            ids, failed = self._append_each(*batch.columns())
        except BaseException as exc:  # noqa: BLE001 - nothing was appended: all get it
            batch.resolve(error=exc)
            return
        batch.resolve(ids, failed)

    # --- flush, close -------------------------------------------------------------------------

    def flush(self) -> None:
        """Wait until every ``send_async`` made so far is resolved: durable, or failed."""
        with self._cv:
            while self._pending:
                self._cv.wait()

    @property
    def pending_messages(self) -> int:
        """Sends queued or on their way whose futures are not resolved yet."""
        return self._pending

    def close(self) -> None:
        """Stop taking sends, wait until every pending one is resolved (nothing queued is
        dropped), then close. A ``send_async`` blocked for room raises ``InvalidArgument``."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        self.flush()
        if self._on_close is not None:
            self._on_close(self)

    @property
    def link(self) -> TopicLink:
        """The calls to the topic's partitions (the asyncio producer awaits their replies)."""
        return self._link

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending_limit(self) -> int:
        """``max_pending_messages``, with -1 (no limit) as the largest int."""
        return self._pending_limit

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument("producer: it is closed")

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
