"""Producer: batches messages into one ``append`` per partition.

- ``send_async`` checks one message, queues it and returns a ``Future`` of its
  MessageId. A background thread sends what is queued as one batch per partition the
  moment no batch is in flight; what queues meanwhile goes in the next (no timer: alone,
  a message pays one round trip and one durable write; under load the batches grow).
  At most ``max_pending_messages`` sends wait for their answer: past that,
  ``send_async`` blocks, or raises ``ProducerQueueIsFull`` with
  ``block_if_queue_full=False``, as Pulsar's client does.
- ``send`` is ``send_async(...).result()``: concurrent senders share round trips.
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
from concurrent.futures._base import FINISHED, PENDING
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raydelay.client.appends import Appends, chunks_by_partition, ids_of
from raydelay.client.message import (
    MAX_DELIVER_AT_MS,
    MessageId,
    MessageIds,
    check_key,
    check_payload,
    check_properties,
    deliver_at_of,
)
from raydelay.clock import now_ms as _now_ms
from raydelay.dispatch.keys import key_hash
from raydelay.errors import (
    InvalidArgument,
    ProducerQueueIsFull,
    StorageError,
    Unavailable,
)
from raydelay.limits import check_limit
from raydelay.log.entries import AppendBatch, Entries, encode_batch
from raydelay.positions import position_in_range
from raydelay.storage.keys import validate_name

if TYPE_CHECKING:
    from raydelay.client.links import TopicLink
    from raydelay.config import Config

log = logging.getLogger(__name__)

STICKY = 5_000  # keyless messages go to one partition in runs of at least this many


class SendFuture(Future):
    """The ``concurrent.futures.Future`` of one ``send_async``. Every send of one round (what
    the producer sends in one go) shares its round's condition, and a round is resolved at
    once, under it: a Future of its own makes a Condition per message, which was half of
    what a ``send_async`` cost. A queued send cannot be taken back: :meth:`cancel` returns
    False (cancel the message itself with ``Producer.cancel``)."""

    def __init__(self, condition: threading.Condition) -> None:
        # Future.__init__'s state, with the round's condition instead of a new one
        self._condition = condition
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Any] = []
        # a sent message's id, made when it is first asked for (most never are): its
        # round's ids and its place among them
        self._ids: MessageIds | None = None
        self._at = 0

    def cancel(self) -> bool:
        return False

    def result(self, timeout: float | None = None) -> Any:
        got = super().result(timeout)
        if got is None and self._ids is not None:
            got = self._result = self._ids[self._at]
        return got


def _resolve(
    round_: list[SendFuture],
    outcomes: Sequence[Any],
    condition: threading.Condition,
    ids: MessageIds | None = None,
) -> None:
    """Resolve a round's futures at once (``outcomes``: an exception each, or else, with
    ``ids``, the message's index among them), as ``Future.set_result`` / ``set_exception``
    would one by one: waiters woken once every future of the round is done, then the
    done-callbacks."""
    with condition:
        for fut, outcome in zip(round_, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                fut._exception = outcome
                for waiter in fut._waiters:
                    waiter.add_exception(fut)
            else:
                fut._ids, fut._at = ids, outcome
                for waiter in fut._waiters:
                    waiter.add_result(fut)
            fut._state = FINISHED
        condition.notify_all()
    for fut in round_:
        for callback in fut._done_callbacks:
            try:
                callback(fut)
            except Exception:  # (as Future does: a callback's error is logged, not raised)
                log.exception("a done-callback of %r failed", fut)


def partition_of(key: str | None, partitions: int, counter: itertools.count) -> int:
    if key is None:
        return next(counter) % partitions
    return key_hash(key) % partitions


class Producer:
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
        self._queue: list[tuple[int, bytes, str | None, dict | None, int, SendFuture]] = []
        # (send_async takes the lock itself: a Condition's own enter and exit are Python
        # calls, a fifth of what a send_async cost)
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._round = threading.Condition()  # the queued sends' (see SendFuture)
        self._pending = 0  # sends queued or in flight, their futures not resolved yet
        self._sticky_at, self._sticky_left = 0, 0  # keyless sends: partition, sends left
        self._closed = False
        self._thread: threading.Thread | None = None
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
    ) -> MessageId:
        """Send one message; returns its MessageId once it is durable.

        ``deliver_after``: seconds from now, or a ``timedelta``. ``deliver_at``: epoch ms
        (an int, numpy's too) or an aware datetime. Neither: deliver at once. A time after
        year 9999 is an InvalidArgument, raised before anything is queued."""
        return self.send_async(
            payload,
            deliver_after=deliver_after,
            deliver_at=deliver_at,
            key=key,
            properties=properties,
        ).result()

    def send_async(
        self,
        payload: bytes,
        *,
        deliver_after: float | timedelta | None = None,
        deliver_at: Any = None,
        key: str | None = None,
        properties: dict[str, str] | None = None,
    ) -> SendFuture:
        """Queue one message and return a ``concurrent.futures.Future`` of its MessageId,
        resolved once the message is durable (or with the error that kept it from being
        written: then it was not appended).

        Takes what :meth:`send` takes, checked here: bad input raises at the call and
        nothing is queued. It is sent with whatever else is queued. With
        ``max_pending_messages`` sends unresolved, it waits for room, or raises
        ``ProducerQueueIsFull`` when the producer was created with
        ``block_if_queue_full=False``. :meth:`flush` waits for every one."""
        self._check_open()
        partition, payload, key, properties, at = self.checked_one(
            payload, deliver_after, deliver_at, key, properties
        )
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
            fut = SendFuture(self._round)
            self._queue.append((partition, payload, key, properties, at, fut))
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
    ) -> MessageIds:
        """Send a batch; returns the MessageIds in input order once all are durable (a
        :class:`MessageIds` sequence, which keeps them as columns).

        ``deliver_at`` / ``deliver_after`` are one value for all messages or a sequence (a list
        or a 1-d numpy array) with one value (or None) per message. Every message is checked
        before anything is sent.

        Columns may be Arrow arrays as they come from a parquet file: payloads a binary
        array (kept as Arrow: no Python bytes per message), ``deliver_at`` epoch ms or
        aware timestamps, ``deliver_after`` seconds, keys strings."""
        return self._append(
            *self.checked_many(payloads, deliver_after, deliver_at, keys, properties)
        )

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
        arrow = isinstance(payloads, pa.Array | pa.ChunkedArray)
        if arrow:
            payloads = _arrow_payloads(payloads, self._max_bytes)
        elif isinstance(payloads, (bytes, bytearray, str)) or not isinstance(payloads, Sequence):
            raise InvalidArgument("payloads: expected a sequence of bytes (or an Arrow array)")
        n = len(payloads)
        deliver_at = _from_arrow("deliver_at", deliver_at)
        deliver_after = _from_arrow("deliver_after", deliver_after)
        if isinstance(keys, pa.Array | pa.ChunkedArray):
            keys = keys.to_pylist()
        if isinstance(deliver_at, np.ndarray):
            deliver_at = _from_numpy("deliver_at", deliver_at)
        if isinstance(deliver_after, np.ndarray):
            deliver_after = _from_numpy("deliver_after", deliver_after)
        ats = _per_message("deliver_at", deliver_at, n, scalar_ok=lambda v: not _is_seq(v))
        afters = _per_message("deliver_after", deliver_after, n, scalar_ok=lambda v: not _is_seq(v))
        ks = _per_message("keys", keys, n, scalar_ok=lambda v: False) if keys is not None else None
        props = (
            _per_message("properties", properties, n, scalar_ok=lambda v: isinstance(v, dict))
            if properties is not None
            else None
        )
        now = _now_ms()
        checked_payloads: Any = payloads if arrow else _check_payloads(payloads, self._max_bytes)
        key_list = [check_key(k, f"keys[{i}]") for i, k in enumerate(ks)] if ks else [None] * n
        prop_list = (
            [check_properties(p, f"properties[{i}]") for i, p in enumerate(props)]
            if props
            else [None] * n
        )
        if not _is_seq(deliver_at) and not _is_seq(deliver_after):  # one due time for all
            d = np.full(
                n, deliver_at_of(deliver_at, deliver_after, now, self._max_delay_ms), dtype=np.int64
            )
        else:
            column = _due_column(deliver_at, deliver_after, n, now, self._max_delay_ms)
            if column is not None:
                d = column
            else:  # mixed: None, datetimes or floats among them; one by one
                d = np.fromiter(
                    (
                        deliver_at_of(ats[i], afters[i], now, self._max_delay_ms, f"message {i}")
                        for i in range(n)
                    ),
                    dtype=np.int64,
                    count=n,
                )
        if ks is None:
            parts = self._sticky(n)
        else:
            parts = np.fromiter(
                (partition_of(k, self.partitions, self._rr) for k in key_list),
                dtype=np.int64,
                count=n,
            )
        return parts, checked_payloads, key_list, prop_list, d

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
        self, parts: np.ndarray, payloads: list[bytes], keys: list, props: list, d: np.ndarray
    ) -> MessageIds:
        """Send one batch per partition chunk in parallel; MessageIds in input order (the
        first partition's error is raised, once every partition answered)."""
        ids, failed = self._append_each(parts, payloads, keys, props, d)
        if failed:
            raise next(iter(failed.values()))
        return ids

    def _append_each(
        self, parts: np.ndarray, payloads: list[bytes], keys: list, props: list, d: np.ndarray
    ) -> tuple[MessageIds, dict[int, BaseException]]:
        """Send one batch per partition chunk in parallel. Returns the MessageIds in input
        order, and the error of each partition whose append failed (the ids of its messages
        are not valid: it appended none of them)."""
        return self.finish(self.submit(parts, payloads, keys, props, d), self.await_append)

    def submit(
        self, parts: np.ndarray, payloads: list[bytes], keys: list, props: list, d: np.ndarray
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
        out = self._link.retried(
            lambda: self._link.append(p, data), f"topic {self.topic}/{p}", partition=p
        )
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
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return  # closed, and every send resolved
                batch, self._queue = self._queue, []
                condition, self._round = self._round, threading.Condition()
            try:
                self._send_queued(batch, condition)
            finally:
                with self._cv:
                    self._pending -= len(batch)
                    self._cv.notify_all()

    def _send_queued(self, batch: list, condition: threading.Condition) -> None:
        """Append queued sends and resolve their futures (which share ``condition``): each
        message's id, or its partition's error."""
        futures = [b[5] for b in batch]
        parts = np.fromiter((b[0] for b in batch), dtype=np.int64, count=len(batch))
        try:
            ids, failed = self._append_each(
                parts,
                [b[1] for b in batch],
                [b[2] for b in batch],
                [b[3] for b in batch],
                np.fromiter((b[4] for b in batch), dtype=np.int64, count=len(batch)),
            )
        except BaseException as exc:  # noqa: BLE001 - nothing was appended: all get it
            _resolve(futures, [exc] * len(batch), condition)
            return
        outcomes: list[Any] = list(range(len(batch)))  # (each message's place in ids)
        for p, error in failed.items():
            for i in np.flatnonzero(parts == p).tolist():
                outcomes[i] = error
        _resolve(futures, outcomes, condition, ids)

    # --- cancel, flush, close ------------------------------------------------------------------

    def cancel(self, message_id: MessageId) -> bool:
        """Cancel a scheduled message. True when no subscription has had it delivered;
        False when it was delivered already (the cancel then has no effect there)."""
        return self.cancel_many([message_id])[0]

    def cancel_many(self, message_ids: Sequence[MessageId]) -> list[bool]:
        """Cancel many messages in one call per partition (and per subscription partition);
        one result per id, as :meth:`cancel` gives. Every id is checked before any is sent."""
        self._check_open()
        if isinstance(message_ids, MessageId) or not isinstance(message_ids, Sequence):
            raise InvalidArgument("message_ids: expected a sequence of MessageId")
        by_partition: dict[int, list[int]] = {}
        for i, mid in enumerate(message_ids):
            check_cancel_target(f"message_ids[{i}]", mid, self.topic, self.partitions)
            by_partition.setdefault(mid.partition, []).append(i)
        batches = {}
        with self._seq_lock:  # the markers are deduplicated like any batch of this producer
            for p, idx in by_partition.items():
                self._seq[p] += 1
                positions = [(message_ids[i].ledger_id, message_ids[i].entry_id) for i in idx]
                batches[p] = (positions, self._seq[p])
        results, resent = self._link.cancel(batches, self.name)
        self.retries += resent
        out = [False] * len(message_ids)
        for p, idx in by_partition.items():
            for i, ok in zip(idx, results[p], strict=True):
                out[i] = ok
        return out

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


def queue_full(pending: int, limit: int) -> ProducerQueueIsFull:
    """The error of a send that found ``pending`` sends unresolved, ``limit`` at most."""
    return ProducerQueueIsFull(
        f"producer: {pending} sends pending (max_pending_messages = {limit}); wait for some "
        "(flush), or create it with block_if_queue_full=True"
    )


def _check_payloads(payloads: Sequence[object], max_bytes: int) -> list[bytes]:
    if all(type(p) is bytes and len(p) <= max_bytes for p in payloads):
        return list(payloads)  # type: ignore[arg-type]
    return [check_payload(p, max_bytes, f"payloads[{i}]") for i, p in enumerate(payloads)]


def _arrow_payloads(values: pa.Array | pa.ChunkedArray, max_bytes: int) -> pa.Array:
    """An Arrow column of payloads, checked whole: binary values, none null, none over
    ``max_bytes``; kept as Arrow (no Python bytes per message)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
        raise InvalidArgument(f"payloads: expected an Arrow binary array, got {values.type}")
    sizes = pc.binary_length(values).to_numpy(zero_copy_only=False)
    if values.null_count:
        first = int(np.flatnonzero(~pc.is_valid(values).to_numpy(zero_copy_only=False))[0])
        raise InvalidArgument(f"payloads[{first}]: expected bytes, got None")
    over = np.flatnonzero(sizes > max_bytes)
    if len(over):
        i = int(over[0])
        raise InvalidArgument(
            f"payloads[{i}]: {int(sizes[i])} bytes is over topic.max_message_bytes ({max_bytes})"
        )
    return values if values.type == pa.binary() else values.cast(pa.binary())


def _from_arrow(field: str, value: Any) -> Any:
    """An Arrow column of due times as numpy (epoch ms as int64 for integers and aware
    timestamps, seconds as float64 for numbers); any other value as it is."""
    if not isinstance(value, pa.Array | pa.ChunkedArray):
        return value
    if value.null_count:
        return value.to_pylist()  # None among them: checked message by message
    t = value.type
    if pa.types.is_timestamp(t):
        if t.tz is None:
            raise InvalidArgument(f"{field}: expected aware timestamps, got {t} (no time zone)")
        raw = value.cast(pa.int64()).to_numpy(zero_copy_only=False)
        per_ms = {"s": 1, "ms": 1, "us": 1_000, "ns": 1_000_000}[t.unit]
        return raw * 1000 if t.unit == "s" else -(-raw // per_ms)  # rounded up: never early
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return value.to_numpy(zero_copy_only=False)
    raise InvalidArgument(f"{field}: expected an Arrow array of numbers or timestamps, got {t}")


def _from_numpy(field: str, value: np.ndarray) -> list:
    if value.ndim != 1:
        raise InvalidArgument(f"{field}: expected a 1-d array, got {value.ndim} dimensions")
    return value.tolist()


def _due_column(
    deliver_at: Any, deliver_after: Any, n: int, now_ms: int, max_delay_ms: int
) -> np.ndarray | None:
    """Due times (epoch ms) of a whole batch in a few numpy operations, when only one of
    ``deliver_at`` (ints) and ``deliver_after`` (numbers) is a per-message list without
    None; None when the batch needs checking message by message (which also finds and
    names the first bad message, so the error is the same)."""
    if (deliver_at is None) == (deliver_after is None):
        return None
    value = deliver_at if deliver_at is not None else deliver_after
    if not _is_seq(value) or len(value) != n or n == 0:
        return None
    if bool in set(map(type, value)):
        return None  # True is not a time; the per-message check says so
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if deliver_at is not None:
        if arr.dtype.kind not in "iu":
            return None
        if (arr < 0).any() or (arr > MAX_DELIVER_AT_MS).any():
            return None
        d = arr.astype(np.int64)
    else:
        if arr.dtype.kind not in "iuf":
            return None
        if not np.isfinite(arr).all() or (arr < 0).any():
            return None
        if (arr > (MAX_DELIVER_AT_MS - now_ms) / 1000).any():
            return None
        d = now_ms + np.round(arr.astype(np.float64) * 1000).astype(np.int64)
    if max_delay_ms and (d - now_ms > max_delay_ms).any():
        return None
    return d


def _is_seq(v: object) -> bool:
    return isinstance(v, Sequence) and not isinstance(v, (str, bytes, bytearray))


def _per_message(field: str, value: Any, n: int, *, scalar_ok) -> list:
    if value is None:
        return [None] * n
    if scalar_ok(value):
        return [value] * n
    if not _is_seq(value):
        raise InvalidArgument(f"{field}: expected one value or a sequence of {n}")
    if len(value) != n:
        raise InvalidArgument(f"{field}: has {len(value)} values for {n} payloads")
    return list(value)


def check_cancel_target(field: str, mid: Any, topic: str, partitions: int) -> None:
    """InvalidArgument, naming ``field``, unless ``mid`` is a MessageId of ``topic`` (of
    ``partitions`` partitions) at a message position: what a cancel checks of each id
    before it sends any (the console checks the same before it asks for confirmation)."""
    if not isinstance(mid, MessageId):
        raise InvalidArgument(f"{field}: expected a MessageId, got {type(mid).__name__}")
    if mid.topic != topic:
        raise InvalidArgument(f"{field}: belongs to topic {mid.topic!r}, not {topic!r}")
    if not 0 <= mid.partition < partitions:
        raise InvalidArgument(
            f"{field}: partition {mid.partition} does not exist ({topic} has {partitions})"
        )
    if not position_in_range(mid.ledger_id, mid.entry_id):
        raise InvalidArgument(f"{field}: {mid} is no message position")
