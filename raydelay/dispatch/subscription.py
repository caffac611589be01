"""One subscription on one partition: what to deliver, to whom, and when (pure: no Ray).

The :class:`Subscription` holds all the dispatch logic; the actor around it only
moves bytes and drives two entry points:

- :meth:`Subscription.receive` is one consumer's receive, the whole sequence: move the
  write-ahead marks (written through the injected :class:`CursorWriter` before anything
  beyond them goes out), collect due messages, flush dead letters (through the injected
  :class:`DeadLetterPublisher`), fetch payloads (cached, staged, else through the
  :class:`Fetch` the caller passes) and hand them out.
- :meth:`Subscription.step` is one step of the background work: apply what the log
  reader brought (:meth:`offer_read`, :meth:`offer_reread`), expire ack deadlines and
  consumer leases, and say (a :class:`Step`) what I/O is due (sealed segments to load,
  a query of the topic's unsealed index, dead letters to flush, a cursor write) and
  when to step again. The driver does that I/O and hands the results back.

- **cursor**: mark-delete plus individual acks (:mod:`raydelay.dispatch.cursor`).
- **read-ahead**: entries read from the log and due now wait in a bounded queue
  with their payloads.
- **delayed messages**: with sealed buckets (:attr:`sealed`), a ``shared``
  subscription leaves entries not due when committed to the topic's index: it takes the
  due ones, with their payloads, from the topic's unsealed index (:meth:`take_unsealed`)
  and from the sealed buckets (:meth:`adopt`, :meth:`collect_due`). Without them, it puts
  them into its tracker (position only; the payload is fetched again when due).
  ``exclusive`` and ``failover`` ignore ``deliver_at`` and deliver in log order.
- **key_shared**: as shared, but one key's messages go to one consumer at a time, in
  order (:mod:`raydelay.dispatch.keyshared`). Every deliverable row waits in the
  redelivery set (with its payload staged) until its key's consumer asks.
- **redelivery set**: positions the tracker popped, positions whose ack timed out,
  nacked positions whose delay elapsed, and the pending positions of consumers that
  left. A position stays there until a consumer has it, so none is lost.
- **in flight**: what each consumer holds unacknowledged is one 64-bit roaring bitmap
  per consumer (the one record of who holds what); ack deadlines are bitmaps of the
  positions handed out together, in deadline order. Hand-out, ack, nack and expiry
  are bitmap and numpy operations over whole batches, never a loop per message.
- **delivery order**: redeliveries (which include due delayed messages), then the
  read-ahead queue.
- **dead letters**: a position due for its ``max_redeliveries + 1``-th redelivery goes
  to the dead-letter set instead; the actor publishes it and then acks it.

Positions are int64 keys (:func:`raydelay.delayed.index.key_of`).
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import itertools
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Protocol, cast

import numpy as np
import pyarrow as pa
from pyroaring import BitMap64

from raydelay.clock import Clock
from raydelay.delayed.base import DelayedDeliveryTracker
from raydelay.delayed.index import bitmap64_of, bitmap64_values
from raydelay.delayed.reader import Progress, SealedReader, SegmentLoad
from raydelay.delayed.sealed import SealedMeta
from raydelay.dispatch.cursor import Cursor, Position
from raydelay.dispatch.keyshared import SLOTS, Ring, slots_of
from raydelay.dispatch.objects import ObjectCache
from raydelay.dispatch.peek import NO_LIMIT, PeekRange, SegmentRef, first_rows, with_deliver_at
from raydelay.errors import ConsumerBusy, InvalidArgument
from raydelay.log.entries import (
    NO_CANCEL,
    NO_DELAY,
    DelayedRun,
    Entries,
    LedgerObject,
    Rows,
    concat_entries,
    is_run,
)
from raydelay.positions import (
    KEY_DTYPE,
    SHIFT,
    key_of,
    position_of,
    split_keys,
)
from raydelay.subscription_types import check_subscription_type

log = logging.getLogger(__name__)

# a backlog of due sealed-bucket rows is taken this many at a time (see collect_due)
SEALED_WINDOW = 50_000
DISPATCH_MARK_STEP = 10_000  # entries the dispatch mark moves ahead at a time
DELAYED_MARK_STEP_MS = 5_000  # how far ahead the persisted delayed mark moves
# How soon the topic's unsealed index is asked after new delayed rows were read (for the
# counts and new buckets; a due row is asked for at its deliver_at, whatever this is).
TAIL_POLL_MS = 1_000
# ... unless nothing read there falls due within a lookahead and no bucket was sealed since
# the last answer: the counts are kept from the reads meanwhile, and a row coming due is
# asked for at its time anyway. A steady stream of messages due later then costs each
# subscription a log read a second, not a read and a query.
TAIL_IDLE_POLL_MS = 10_000
DEAD_LETTER_BATCH = 1_000  # dead letters published per flush
_MARKER_MEMORY = 100_000  # outcomes of recent cancel markers, for the caller who asks
_KEY_SLOT_CACHE = 1_000_000  # key_shared: message keys whose hash slot is kept
PEEK_READS = 8  # sealed segments a peek reads at once
PEEK_PAGE = 50_000  # rows a peek asks of the host's unsealed index at a time, without a limit


class Source(Protocol):
    """Where delivered rows come from: a ledger object read in order, or rows read at
    scattered positions (:class:`~raydelay.log.entries.Rows`)."""

    @property
    def entries(self) -> Entries: ...

    def publish_times(self, idx: np.ndarray) -> np.ndarray: ...


Group = tuple[Source, np.ndarray, np.ndarray]  # (source, row indexes in it, position keys)


class Tracker(DelayedDeliveryTracker, Protocol):
    """The delayed tracker as a subscription uses it: the fixed tracker API plus the
    column and recovery methods both trackers have."""

    def get_scheduled_keys(self, max_messages: int) -> np.ndarray: ...

    def persisted_through(self) -> int: ...

    def tracked_among(self, keys: BitMap64) -> BitMap64: ...

    def due_histogram(self, edges: np.ndarray) -> list[int]: ...


class Fetch(Protocol):
    """Reads the log at scattered positions (the topic actor's point read): the rows of
    ``keys`` it still has, sorted by position."""

    async def __call__(self, keys: np.ndarray) -> Rows: ...


class ReadSegments(Protocol):
    """Reads sealed segments not loaded (a peek): the rows of each, in their order."""

    async def __call__(self, refs: list[SegmentRef]) -> list[Rows]: ...


class ReadUnsealed(Protocol):
    """Asks the partition's host for the rows of its unsealed index a subscription has not
    taken (every row below position key ``below`` due at or before ``through`` it took),
    within ``q``'s range and key, in (deliver_at, position) order, after the row
    ``start`` = (deliver_at, position key) (None: from the first), at most ``page``."""

    async def __call__(
        self, below: int, through: int, q: PeekRange, start: tuple[int, int] | None, page: int
    ) -> Rows: ...


class CursorWriter(Protocol):
    """Writes one cursor snapshot (:meth:`Cursor.encode` bytes) durably; returns once it is."""

    async def __call__(self, data: bytes) -> None: ...


class DeadLetterPublisher(Protocol):
    """Publishes messages to the dead-letter topic: their position keys and their rows
    (payload, key, properties) as read from the log; returns once they are durable."""

    async def __call__(self, keys: np.ndarray, entries: Entries) -> None: ...


@dataclass(frozen=True)
class TailQuery:
    """A due query of the topic's unsealed index: rows below position key ``below`` due
    at or before ``through_ms`` were taken already; everything due by ``now_ms`` is wanted.
    Answer it with :meth:`Subscription.take_unsealed` (or :meth:`Subscription.tail_failed`)."""

    below: int
    through_ms: int
    now_ms: int


@dataclass(frozen=True)
class Step:
    """What one :meth:`Subscription.step` leaves to its driver."""

    wake_at_ms: int | None  # step again by then (epoch ms); None: when something changes
    deliverable: bool  # something can be delivered: wake the waiting receive calls
    wants_read: bool  # the read-ahead has room: let the log reader read on
    expired: list[tuple[str, int]] = field(default_factory=list)  # (consumer, handed back)
    loads: list[SegmentLoad] = field(default_factory=list)  # then install() / load_failed()
    tail_query: TailQuery | None = None  # ask the topic's unsealed index
    dead_letters: bool = False  # dead letters wait: call flush_dead_letters()
    persist: bool = False  # the cursor is due to be written: call persist()


@dataclass(frozen=True)
class Delivery:
    """Messages handed to a consumer from one source: their row indexes in it, their
    position keys, and how many times each was delivered before."""

    source: Source
    indexes: np.ndarray  # int64
    keys: np.ndarray  # int64 position keys
    counts: np.ndarray  # int64 redelivery counts

    def __len__(self) -> int:
        return len(self.keys)


class _Run:
    """Entries of one source waiting in the read-ahead queue (from ``pos`` on)."""

    __slots__ = ("source", "indexes", "keys", "pos")

    def __init__(self, source: Source, indexes: np.ndarray, keys: np.ndarray) -> None:
        self.source, self.indexes, self.keys, self.pos = source, indexes, keys, 0

    def __len__(self) -> int:
        return len(self.keys) - self.pos


class _Early:
    """Rows the topic's unsealed index answered before they fall due (the lookahead), held
    with their payloads: ``order`` sorts them by deliver_at (``d``); from ``pos`` on they
    are still held."""

    __slots__ = ("rows", "order", "d", "pos")

    def __init__(self, rows: Rows) -> None:
        d = rows.entries.deliver_at_ms
        self.order = np.argsort(d, kind="stable")
        self.rows, self.d, self.pos = rows, d[self.order], 0

    def __len__(self) -> int:
        return len(self.d) - self.pos


@dataclass
class _Consumer:
    consumer_id: str
    pending: BitMap64  # positions handed to it and not yet acked, nacked or expired
    seen_ms: int = 0  # its last call or heartbeat (its lease runs from there)
    held: np.ndarray | None = None  # key_shared: per hash slot, how many of pending


def _keys_of(keys: Iterable[int] | np.ndarray) -> np.ndarray:
    if isinstance(keys, np.ndarray):
        return keys.astype(KEY_DTYPE, copy=False)
    return np.fromiter(keys, dtype=KEY_DTYPE)


class Subscription:
    def __init__(
        self,
        *,
        name: str,
        subscription_type: str,
        tracker: Tracker,
        clock: Clock,
        cursor: Cursor | None = None,
        dispatched_before: Position = (-1, -1),
        ack_timeout_ms: int | None = None,
        max_redeliveries: int | None = None,
        read_ahead_entries: int = 10_000,
        sealed: SealedReader | None = None,
        write_cursor: CursorWriter | None = None,
        publish_dead_letters: DeadLetterPublisher | None = None,
        cursor_persist_interval_ms: int = 1_000,
        consumer_lease_ms: int | None = None,
        cached_entries: int = 200_000,
        max_fetch: int = 2_000,
        max_staged_rows: int = 200_000,
        lookahead_ms: int = 0,
    ) -> None:
        """``write_cursor``: where cursor snapshots go (None: the cursor lives in memory
        only). ``publish_dead_letters``: required with ``max_redeliveries``.
        ``consumer_lease_ms``: a consumer not heard from for that long is removed (None:
        never). ``cached_entries``: entries of ledger objects read from the log kept to
        find payloads in. ``max_fetch``: payloads read through the fetch per receive (due
        delayed messages are scattered: smaller reads reach the consumer sooner).
        ``max_staged_rows``: payloads of due sealed-bucket rows kept for delivery.
        ``lookahead_ms``: the due queries of the topic's unsealed index ask for the rows
        due within this many ms, which wait here with their payloads and go out at their
        due instant (0: asked for only once due)."""
        self.spreads = check_subscription_type(subscription_type).spreads
        if max_redeliveries is not None and publish_dead_letters is None:
            raise InvalidArgument("publish_dead_letters: required with max_redeliveries")
        self.name = name
        self.type = subscription_type
        self.tracker = tracker
        self._clock = clock
        self.cursor = cursor or Cursor()
        # The sealed buckets of the partition (shared subscriptions): due rows come from
        # them with their payloads; the log is read for everything else.
        self.sealed = sealed if self.spreads else None
        # The log as this subscription still needs it: acknowledged or held by a sealed
        # bucket. Its mark-delete is how far the partition's ledgers may be deleted.
        self.log_cursor = self.cursor.copy()
        self._staged: deque[Group] = deque()
        self._staged_bitmaps: dict[int, BitMap64] = {}  # id(keys of a staged group) -> bitmap
        self._staged_rows = 0
        # The delayed rows of the ledgers not sealed yet are the topic's too (shared, with
        # sealed buckets): the subscription takes the due ones from it, and has taken every
        # row below tail_taken[0] due at or before tail_taken[1]. tail_next: the earliest
        # deliver_at still to come there (None: unknown); tail_dirty: delayed rows were
        # read from the log since the last query.
        self.tail_taken: tuple[int, int] = (0, -1)
        self.tail_next: int | None = None
        self.tail_dirty = True
        self.tail_waiting = 0
        # Delayed rows read from the log that the last due query's answer did not cover
        # (at or past its taken_below, in ledgers not adopted as sealed): (first position
        # key, the key after the last, rows), in log order, and their sum. They count as
        # delayed at once: the next answer's ``waiting`` takes them over.
        self._tail_unasked: deque[tuple[int, int, int]] = deque()
        self._tail_unasked_rows = 0
        self._buckets_stale = False  # the topic's bucket list changed since the last query
        # Rows taken from the topic's unsealed index before they fall due: released into
        # the redelivery set at their deliver_at (see collect_due), never before.
        self.lookahead_ms = lookahead_ms
        self._early: deque[_Early] = deque()
        self._stepped_ms = -1  # the latest time step() or collect_due() was given (epoch ms)
        # the earliest deliver_at read from the log since the last due query was asked:
        # its answer may not cover those rows, so it must not hide them (tail_next)
        self._tail_seen: int | None = None
        # Delayed rows due at or before it may have been delivered by an earlier life.
        self.delayed_before = self.cursor.delayed_mark
        md_l, md_e = self.cursor.mark_delete
        self.read_position: Position = (md_l, md_e + 1)
        # Entries before this were read by an earlier life and may have been delivered.
        self._dispatched_before = dispatched_before
        # New entries are delivered only below this mark, which is persisted (with the
        # cursor) before it moves: a restarted subscription knows which of the entries it
        # re-reads may have gone out already, and raises their redelivery_count.
        self.dispatch_mark: Position = max(dispatched_before, self.read_position)
        self.ack_timeout_ms = ack_timeout_ms
        self.max_redeliveries = max_redeliveries
        self.read_ahead_entries = read_ahead_entries
        self._ready: deque[_Run] = deque()
        self._ready_count = 0
        self.redeliver = BitMap64()
        self.dead = BitMap64()
        # ack deadlines: [deadline_ms, positions handed out with it], ascending; a position
        # is in at most one (it leaves when it stops being in flight other than by an ack)
        self._deadlines: list[list] = []
        self._counts: dict[int, int] = {}  # key -> deliveries so far, once above zero
        self._counted = BitMap64()  # the keys of _counts, for batch lookups
        self._consumers: dict[str, _Consumer] = {}
        # key_shared: the hash slot of each position waiting or in flight, and the slot
        # owners of the consumers (None: to compute again, after a consumer came or went)
        self._slot: dict[int, int] = {}
        self._key_slots: dict[str, int] = {}  # message key -> slot, for keys seen lately
        self._ring: Ring | None = None
        # ... and the redelivery set as sorted columns (keys, their slots, -1: not known
        # yet), kept in step with it (_pool_index); at most _pool_cap rows wait there, so
        # that a consumer that stops asking holds up only its own keys until then
        self._pool_keys = np.zeros(0, dtype=np.int64)
        self._pool_slots = np.zeros(0, dtype=np.int64)
        self._indexed = BitMap64()
        self._pool_cap = 10 * read_ahead_entries
        self._cancelled_ahead = BitMap64()  # cancel targets not read from the log yet
        # After a restart: positions before read_position still to be re-read one by one
        # (see resume_after_buckets), and the first unacknowledged position at the start.
        self.unread = BitMap64()
        self.start_position: Position = self.read_position
        self._marker_results: OrderedDict[int, bool] = OrderedDict()  # marker -> outcome
        self.tail: Position | None = None
        # the last position known to exist (the log's tail at the last read, or a row the
        # topic's index answered): acks past it name no message (None: nothing read yet)
        self._end_key: int | None = None
        self.counters = {
            "delivered": 0,
            "acked": 0,
            "redelivered": 0,
            "cancelled": 0,
            "dead_lettered": 0,
        }
        self._write_cursor = write_cursor
        self._publish_dead_letters = publish_dead_letters
        self.cursor_persist_interval_ms = cursor_persist_interval_ms
        self.consumer_lease_ms = consumer_lease_ms
        self.max_fetch = max_fetch
        self.max_staged_rows = max_staged_rows
        # decoded ledger objects read from the log: payloads found without another read
        self.objects = ObjectCache(cached_entries)
        # what the log reader brought and the next step applies, in order
        self._inbox: deque[Callable[[], int]] = deque()
        # what was last written: (mark-delete, individual acks, dispatch mark)
        self._persisted: tuple[Position, int, Position, int] | None = None
        # the delayed mark the store holds: delayed rows due after it wait for a write
        self._delayed_durable = self.cursor.delayed_mark
        self._persist_lock = asyncio.Lock()  # one cursor write at a time, in order
        self._persist_due_ms: int | None = None  # the next periodic write (None: at once)
        self._dead_letter_lock = asyncio.Lock()  # one flush at a time: none is published twice
        self._tail_asked_ms: int | None = None  # the last due query of the unsealed index
        self._tail_in_flight = False

    # --- consumers -----------------------------------------------------------------------

    def add_consumer(self, consumer_id: str, now_ms: int | None = None) -> None:
        if consumer_id in self._consumers:
            self.touch(consumer_id, now_ms)
            return
        if self.type == "exclusive" and self._consumers:
            raise ConsumerBusy(
                f"subscription {self.name!r} is exclusive and already has a consumer"
            )
        seen = self._clock.now_ms() if now_ms is None else now_ms
        held = np.zeros(SLOTS, dtype=np.int32) if self.type == "key_shared" else None
        self._consumers[consumer_id] = _Consumer(consumer_id, BitMap64(), seen, held)
        self._ring = None

    def touch(self, consumer_id: str, now_ms: int | None = None) -> bool:
        """The consumer called or sent a heartbeat: its lease starts again. False if it is
        not a consumer here (never added, or removed)."""
        c = self._consumers.get(consumer_id)
        if c is None:
            return False
        c.seen_ms = max(c.seen_ms, self._clock.now_ms() if now_ms is None else now_ms)
        return True

    def expire_consumers(self, now_ms: int, lease_ms: int) -> list[tuple[str, int]]:
        """Remove the consumers not heard from for ``lease_ms`` (their process died, or
        lost touch): their unacked messages go back for redelivery, a failover
        subscription's next consumer becomes active, an exclusive one's slot is free.
        Returns (consumer, messages handed back) for each one removed."""
        gone = [c.consumer_id for c in self._consumers.values() if now_ms - c.seen_ms > lease_ms]
        return [(cid, self.remove_consumer(cid)) for cid in gone]

    def consumer_leases(self, now_ms: int) -> dict[str, dict]:
        """Per consumer: messages it holds unacked and ms since it was last heard from."""
        return {
            cid: {"unacked": len(c.pending), "lease_age_ms": max(0, now_ms - c.seen_ms)}
            for cid, c in self._consumers.items()
        }

    def remove_consumer(self, consumer_id: str) -> int:
        """Forget a consumer; its unacked messages go to the redelivery set."""
        c = self._consumers.pop(consumer_id, None)
        self._ring = None
        if c is None or not c.pending:
            return 0
        self._forget_deadlines(c.pending)
        self._schedule_redelivery(c.pending)
        return len(c.pending)

    def consumers(self) -> list[str]:
        return list(self._consumers)

    def active_consumer(self) -> str | None:
        """The consumer a FIFO subscription delivers to (the oldest one)."""
        return next(iter(self._consumers), None)

    def can_receive(self, consumer_id: str) -> bool:
        if consumer_id not in self._consumers:
            return False
        return self.spreads or consumer_id == self.active_consumer()

    # --- reading the log -------------------------------------------------------------------

    def wants_read(self) -> bool:
        """Whether the log reader may read on: the read-ahead has room and what it read
        last was applied (the next read starts where that one ended)."""
        return not self._inbox and self._ready_count < self.read_ahead_entries

    def offer_read(
        self,
        objects: list[LedgerObject | DelayedRun],
        ledgers: list[tuple[int, int | None]],
        tail: Position | None,
        buckets_changed: bool = False,
    ) -> None:
        """The log reader's answer (see :meth:`on_read`), for the next :meth:`step` to
        apply. ``buckets_changed``: the topic's set of sealed buckets changed since they
        were adopted (the next due query of its unsealed index adopts them)."""
        if buckets_changed and self.sealed is not None:
            self.tail_dirty = self._buckets_stale = True
        self._inbox.append(functools.partial(self.on_read, objects, ledgers, tail))

    def offer_reread(self, rows: Rows, keys: np.ndarray) -> None:
        """Rows the log returned for loose positions (see :meth:`on_reread`), for the next
        :meth:`step` to apply."""
        self._inbox.append(functools.partial(self.on_reread, rows, keys))

    def on_read(
        self,
        objects: Iterable[LedgerObject | DelayedRun],
        ledgers: Iterable[tuple[int, int | None]],
        tail: Position | None,
    ) -> int:
        """Take in ledger objects from the log (in log order); a :class:`DelayedRun` stands
        for an object of delayed entries only, which the topic's index delivers. The
        objects are kept (bounded) to find payloads in; with sealed buckets only those
        with an immediate entry (delayed rows come with theirs from the topic's index).
        Returns entries taken in."""
        self._learn_ledgers(ledgers)
        self.tail = tail
        if tail is not None:
            self._see_end(key_of(*tail))
        taken = 0
        for obj in objects:
            first_key = key_of(obj.ledger_id, obj.first_entry)
            read_key = key_of(*self.read_position)
            start = max(0, read_key - first_key) if obj.ledger_id == self.read_position[0] else 0
            if obj.ledger_id < self.read_position[0] or start >= obj.count:
                continue
            if isinstance(obj, DelayedRun):
                self._tail_read(
                    obj.min_deliver_at_ms,
                    first_key + start,
                    first_key + obj.count,
                    obj.count - start,
                )
                if self._cancelled_ahead:  # cancelled before the read passed them: ack them
                    span = BitMap64()
                    span.add_range(first_key + start, first_key + obj.count)
                    done = span & self._cancelled_ahead
                    if done:
                        self._cancelled_ahead -= done
                        self._ack_cursor(bitmap64_values(done))
            else:
                if self.sealed is None or (obj.entries.deliver_at_ms <= obj.publish_time_ms).any():
                    self.objects.add(obj)
                idx = np.arange(start, obj.count, dtype=np.int64)
                taken += self._take_in(obj, idx, first_key + idx, read=True)
            last = obj.first_entry + obj.count
            self.read_position = (obj.ledger_id, last)
            size = self.cursor.ledger_size(obj.ledger_id)
            if size is not None and last >= size:
                nxt = next((i for i, _ in self.cursor.known_ledgers() if i > obj.ledger_id), None)
                if nxt is not None:
                    self.read_position = (nxt, 0)
        return taken

    def resume_after_buckets(self, ledgers: Iterable[tuple[int, int | None]]) -> int:
        """At startup, before any read: skip the part of the log the tracker's persisted
        buckets cover, so recovery costs the log tail, not the backlog.

        Every entry of a ledger up to ``tracker.persisted_through()`` is acknowledged, in
        a bucket (the tracker brings it back when due), or *loose*: immediate, due when
        it was read, delivered and unacknowledged, nacked. The loose ones are the
        ledger's range minus the acknowledged and the tracked positions; they go to
        :attr:`unread` (re-read one by one through :meth:`on_reread`) and the sequential
        read starts after that ledger. ``ledgers`` is the log's (id, size or None while
        open) list. Returns how many positions are loose."""
        ledgers = list(ledgers)
        self._learn_ledgers(ledgers)
        self._ack_gone_ledgers({i for i, _ in ledgers})
        through = self.tracker.persisted_through()
        if self.sealed is not None:
            through = max(through, self.sealed.sealed_through)
        start_l, start_e = self.read_position
        if through < start_l:
            return 0
        loose = BitMap64()
        resume: Position = (through + 1, 0)
        for ledger_id, size in ledgers:
            if ledger_id < start_l or ledger_id > through:
                continue
            if size is None:  # still open (cannot be, once a later ledger exists): read it
                resume = (ledger_id, start_e if ledger_id == start_l else 0)
                break
            lo = start_e if ledger_id == start_l else 0
            if size <= lo:
                continue
            loose.add_range(key_of(ledger_id, lo), key_of(ledger_id, size))
        if loose:
            loose -= self.cursor.acked_keys
            loose -= self.tracker.tracked_among(loose)
            if self.sealed is not None:
                loose -= self.sealed.covered & loose
        self.unread = loose
        self.read_position = max(resume, self.read_position)
        return len(loose)

    def next_unread(self, max_positions: int) -> list[int]:
        """The lowest loose positions still to re-read (see resume_after_buckets)."""
        return list(itertools.islice(self.unread, max_positions))

    def on_reread(self, rows: Rows, keys: Iterable[int] | np.ndarray) -> int:
        """Take in the loose positions ``keys`` from the rows the log returned for them (a
        position the log no longer has is dropped). Returns entries taken in."""
        chunk = bitmap64_of(_keys_of(keys)) & self.unread
        self.unread -= chunk
        wanted = bitmap64_values(chunk)
        idx = np.flatnonzero(np.isin(rows.positions, wanted))
        taken = self._take_in(rows, idx, rows.positions[idx]) if len(idx) else 0
        gone = np.setdiff1d(wanted, rows.positions)
        if len(gone):
            log.error(
                "subscription %s: %d positions are gone from the log, first %s",
                self.name,
                len(gone),
                position_of(int(gone[0])),
            )
        return taken

    def _take_in(
        self, source: Source, idx: np.ndarray, keys: np.ndarray, read: bool = False
    ) -> int:
        """Rows ``idx`` of ``source`` at positions ``keys`` (both ascending), from the log:
        apply cancel markers, put not-yet-due delayed messages in the tracker, queue the
        rest. ``read``: by the sequential read (not a re-read of loose positions)."""
        ents = source.entries
        targets = ents.cancel_targets[idx]
        is_marker = targets != NO_CANCEL
        if is_marker.any():
            for marker, target in zip(keys[is_marker].tolist(), targets[is_marker].tolist()):
                self._apply_marker(marker, target)  # markers first
            self._ack_cursor(keys[is_marker])
            idx, keys = idx[~is_marker], keys[~is_marker]
        keep = self._unseen(keys)
        if not keep.all() and self._cancelled_ahead:
            # cancelled before they were read: ack them now
            ahead = bitmap64_of(keys[~keep]) & self._cancelled_ahead
            if ahead:
                self._cancelled_ahead -= ahead
                done = bitmap64_values(ahead)
                self._ack_cursor(done)
        idx, keys = idx[keep], keys[keep]
        ds = ents.deliver_at_ms[idx]
        if self.sealed is not None and len(idx):
            # not due when committed: the topic indexed it (its unsealed index or a bucket)
            later = ds > source.publish_times(idx)
            if later.any():
                soonest = int(ds[later].min())
                if read:  # (one object: in the index whole, or not yet)
                    span = keys[later]
                    self._tail_read(soonest, int(span[0]), int(span[-1]) + 1, len(span))
                else:
                    self._tail_read(soonest)
                idx, keys, ds = idx[~later], keys[~later], ds[~later]
        now_due = np.ones(len(idx), dtype=bool)
        if self.spreads and len(idx):
            delayed = ds != NO_DELAY
            if delayed.any():
                tracked = self.tracker.add_messages(*split_keys(keys[delayed]), ds[delayed])
                now_due[np.flatnonzero(delayed)[tracked]] = False
        if now_due.any():
            run_keys = keys[now_due]
            before = key_of(*self._dispatched_before) if self._dispatched_before[1] >= 0 else -1
            if run_keys[0] < before:  # only right after a restart
                self._bump_counts(run_keys[run_keys < before], floor=1)
            self._ready.append(_Run(source, idx[now_due], run_keys))
            self._ready_count += len(run_keys)
        return len(idx)

    def _tail_read(
        self, soonest: int, first_key: int = -1, end_key: int = -1, count: int = 0
    ) -> None:
        """Delayed rows the topic indexed were read from the log, the soonest due at
        ``soonest`` (epoch ms): the unsealed index holds something to ask for. ``count``
        of them lie from position key ``first_key`` to before ``end_key``, read in
        sequence (counted as delayed until a due query's answer covers them)."""
        if count > 0:
            self._tail_unasked.append((first_key, end_key, count))
            self._tail_unasked_rows += count
        self.tail_next = soonest if self.tail_next is None else min(self.tail_next, soonest)
        self._tail_seen = soonest if self._tail_seen is None else min(self._tail_seen, soonest)
        self.tail_dirty = True

    def _unseen(self, keys: np.ndarray, bm: BitMap64 | None = None) -> np.ndarray:
        """Which positions are neither acknowledged nor cancelled ahead of the read (``bm``:
        the bitmap of ``keys``, when the caller has it)."""
        keep = np.ones(len(keys), dtype=bool)
        if not len(keys):
            return keep
        keep &= keys > self.cursor.floor_key()
        acked, ahead = self.cursor.acked_keys, self._cancelled_ahead
        if acked or ahead:
            bm = bitmap64_of(keys) if bm is None else bm
            hit = (bm & acked) | (bm & ahead)
            if hit:
                keep &= ~np.isin(keys, bitmap64_values(hit))
        return keep

    # --- the receive sequence ----------------------------------------------------------------

    async def receive(
        self, consumer_id: str, fetch: Fetch, max_messages: int, now_ms: int
    ) -> list[Delivery]:
        """One receive of up to ``max_messages`` for ``consumer_id`` at ``now_ms`` (epoch
        ms): move the write-ahead marks (the cursor is written before anything beyond
        them goes out), collect due messages, flush dead letters, fetch the payloads of
        redeliveries (``fetch`` reads what is neither staged nor cached), and hand them
        out, then read-ahead entries. Nothing goes to a FIFO subscription's standby."""
        if not self.can_receive(consumer_id):
            return []
        if self.needs_delayed_mark(now_ms) and self._delayed_due(now_ms):
            # delayed rows due by then may go out: a restart must know they may have (the
            # step moves the mark ahead in the background, so this write is rare)
            self.cursor.delayed_mark = max(self.cursor.delayed_mark, now_ms + DELAYED_MARK_STEP_MS)
            await self.persist(force=True)
        mark = self.wanted_mark()
        if mark is not None:
            await self.persist(force=True, mark=mark)
        self.collect_due(now_ms, max_messages)
        if self.dead:
            await self.flush_dead_letters(fetch)
        keys = self.keys_to_fetch(max_messages, consumer_id)
        fetched = await self.fetch_payloads(fetch, keys, self.max_fetch)
        return self.deliver(consumer_id, fetched, max_messages, now_ms)

    async def fetch_payloads(
        self, fetch: Fetch, keys: np.ndarray, max_reads: int | None = None
    ) -> list[Group]:
        """Payloads for positions, grouped by source: the staged rows, the cached objects,
        else rows read through ``fetch`` (positions the log no longer has are acked:
        nothing can deliver them). With ``max_reads``, at most that many (the lowest) are
        read through ``fetch``; the others are left out of the result."""
        if not len(keys):
            return []
        groups, need = self.staged(np.asarray(keys, dtype=KEY_DTYPE))
        if len(need):
            cached, need = self.objects.lookup(need)
            groups.extend(cached)
        if max_reads is not None and len(need) > max_reads:
            need = np.sort(need)[:max_reads]
        if len(need):
            rows = await fetch(need)
            found = np.isin(need, rows.positions)
            if found.any():
                got = need[found]
                groups.append((rows, np.searchsorted(rows.positions, got), got))
            if not found.all():
                self.drop_missing(need[~found])
        return groups

    async def flush_dead_letters(self, fetch: Fetch) -> int:
        """Publish waiting dead letters (up to :data:`DEAD_LETTER_BATCH`, payloads read
        through ``fetch``), then ack them; returns how many. One flush at a time: a second
        one while the first awaits its publish returns 0 (the first takes what waits)."""
        publish = self._publish_dead_letters
        if not self.dead or publish is None or self._dead_letter_lock.locked():
            return 0
        async with self._dead_letter_lock:
            groups = await self.fetch_payloads(fetch, _first(self.dead, DEAD_LETTER_BATCH))
            if not groups:
                return 0
            entries = concat_entries([src.entries.take(idx) for src, idx, _ in groups])
            keys = np.concatenate([ks for _, _, ks in groups])
            await publish(keys, entries)
            self.dead_lettered(keys)
            log.info("subscription %s: %d messages dead-lettered", self.name, len(keys))
            return len(keys)

    async def persist(self, *, force: bool = False, mark: Position | None = None) -> bool:
        """Write the cursor with the dispatch mark when it changed since the last write (or
        with ``force``); with ``mark``, write it with that mark and then move the dispatch
        mark there (write ahead, then apply). Returns whether it wrote."""
        async with self._persist_lock:
            if mark is not None and mark <= self.dispatch_mark:
                return False  # another call moved it meanwhile
            target = mark or self.dispatch_mark
            delayed_mark = self.cursor.delayed_mark
            state = (
                self.cursor.mark_delete,
                self.cursor.individually_acked(),
                target,
                delayed_mark,
            )
            wrote = False
            if state != self._persisted or force:
                if self._write_cursor is not None:
                    await self._write_cursor(self.cursor.encode(target))
                    wrote = True
                self._persisted = state
            self._delayed_durable = max(self._delayed_durable, delayed_mark)
            if mark is not None:
                self.dispatch_mark = mark
            return wrote

    # --- the background step ---------------------------------------------------------------

    def step(self, now_ms: int) -> Step:
        """One step of the background work at ``now_ms`` (epoch ms): apply what the log
        reader brought, send expired ack deadlines and the messages of consumers whose
        lease lapsed back for redelivery, drop staged payloads no longer waiting, and say
        what I/O is due and when to step again (see :class:`Step`)."""
        self._stepped_ms = max(self._stepped_ms, now_ms)
        while self._inbox:
            self._inbox.popleft()()
        self.expire(now_ms)
        expired = (
            self.expire_consumers(now_ms, self.consumer_lease_ms)
            if self.consumer_lease_ms is not None
            else []
        )
        self.prune_staged(self.max_staged_rows)
        persist = False
        if not self._persist_lock.locked() and (
            self._persist_due_ms is None or now_ms >= self._persist_due_ms
        ):
            persist = True
            self._persist_due_ms = now_ms + self.cursor_persist_interval_ms
        soon = self._next_delayed_ms()
        if (
            soon is not None
            and not self._persist_lock.locked()
            and soon <= now_ms + DELAYED_MARK_STEP_MS // 2
            and max(now_ms, soon) + DELAYED_MARK_STEP_MS // 2 > self.cursor.delayed_mark
        ):
            # delayed rows fall due soon: move the delayed mark ahead now, in the background,
            # before receive would have to (a write on the delivery path, at their instant)
            self.cursor.delayed_mark = max(now_ms, soon) + DELAYED_MARK_STEP_MS
            persist = True
        return Step(
            wake_at_ms=self._wake_at_ms(now_ms, soon),
            deliverable=self.has_deliverable(now_ms),
            wants_read=self.wants_read(),
            expired=expired,
            loads=self.sealed.wanted(now_ms) if self.sealed is not None else [],
            tail_query=self._tail_query(now_ms),
            dead_letters=bool(self.dead) and not self._dead_letter_lock.locked(),
            persist=persist,
        )

    def _wake_at_ms(self, now_ms: int, next_delayed_ms: int | None = None) -> int | None:
        """The earliest time after ``now_ms`` something is due: a delivery, an ack
        deadline, a cursor write, a poll of the unsealed index, a sealed segment to load,
        a lease to lapse."""
        times = [
            self.next_wakeup_ms(next_delayed_ms),
            self._persist_due_ms,
            self._tail_refill_ms(),
        ]
        if self.sealed is not None:
            times.append(self.sealed.next_load_ms())
        if self.tail_dirty and self.sealed is not None and self._tail_asked_ms is not None:
            stale = self._buckets_stale or self._tail_refill_ms() is None
            times.append(self._tail_asked_ms + (TAIL_POLL_MS if stale else TAIL_IDLE_POLL_MS))
        if self.consumer_lease_ms is not None and self._consumers:
            seen = min(c.seen_ms for c in self._consumers.values())
            times.append(seen + self.consumer_lease_ms + 1)
        later = [t for t in times if t is not None and t > now_ms]
        return min(later) if later else None

    def _tail_refill_ms(self) -> int | None:
        """When to ask the topic's unsealed index next (epoch ms): half a lookahead before
        the earliest deliver_at there, so that each query brings about half a lookahead of
        rows, before they fall due."""
        if self.sealed is None or self.tail_next is None:
            return None
        return self.tail_next - self.lookahead_ms // 2

    def _tail_query(self, now_ms: int) -> TailQuery | None:
        """The due query of the topic's unsealed index to send now, if one is due: half a
        lookahead before the earliest deliver_at there, or a while after delayed rows were
        read. It asks for every row due within the lookahead."""
        if self.sealed is None or self._tail_in_flight:
            return None
        refill = self._tail_refill_ms()
        due = refill is not None and refill <= now_ms
        since = None if self._tail_asked_ms is None else now_ms - self._tail_asked_ms
        poll_ms = TAIL_POLL_MS if self._buckets_stale or refill is None else TAIL_IDLE_POLL_MS
        polled = since is None or since >= poll_ms
        if not due and not (self.tail_dirty and polled):
            return None
        self.tail_dirty = self._buckets_stale = False
        self._tail_seen = None
        self._tail_asked_ms = now_ms
        self._tail_in_flight = True
        below, through = self.tail_taken
        return TailQuery(below, through, now_ms + self.lookahead_ms)

    def tail_failed(self) -> None:
        """The due query of the unsealed index failed: ask again at the next poll."""
        self._tail_in_flight = False
        self.tail_dirty = True

    # --- delivering -------------------------------------------------------------------------

    def collect_due(self, now_ms: int, max_messages: int) -> None:
        """Move due delayed positions and expired ack deadlines into the redelivery set.
        Due rows of sealed buckets come with their payloads: they are staged here for
        :meth:`staged` to find."""
        self._stepped_ms = max(self._stepped_ms, now_ms)
        self.expire(now_ms)
        # (key_shared: the redelivery set also holds rows waiting for other consumers)
        room = (
            min(max_messages, self._pool_cap - len(self.redeliver))
            if self.type == "key_shared"
            else max_messages - len(self.redeliver)
        )
        if self._early and room > 0:
            room -= self._release_early(now_ms, room)
        if self.sealed is not None and room > 0:
            # a backlog of due sealed rows is taken a window of SEALED_WINDOW rows at a time,
            # staged for the receives that follow: a take costs about the same for 10k rows
            # as for 50k. A window is whole loaded groups, the one due first first (not the
            # earliest rows over all of them: a merged bucket's groups overlap in time, and
            # a few rows off every one of them would leave hundreds of loaded heads behind,
            # each a slice per take). The next window is taken once this one went out (a
            # receive's top-up takes no more than it hands out).
            want = room
            if not self.redeliver and self.type != "key_shared":
                want = max(room, SEALED_WINDOW)
            groups = self.sealed.take_due(now_ms, want, earliest_first=False)
            if len(groups) > 1:  # one staged block: a receive looks up one, not many
                groups = [_coalesce(groups)]
            for rows, idx, keys in groups:
                room -= self._stage(rows, idx, keys)
        if room > 0 and self.tracker.has_message_available():
            due = np.asarray(self.tracker.get_scheduled_keys(room), dtype=KEY_DTYPE)
            if len(due):  # (one nacked with a delay may have been acked since)
                due = due[self._unseen(due)]
                self.redeliver |= bitmap64_of(due)

    def _stage(self, rows: Rows, idx: np.ndarray, keys: np.ndarray) -> int:
        """Due delayed rows taken from the topic's index: into the redelivery set, with
        their payloads kept for :meth:`staged`. Rows acknowledged (or cancelled) are left
        out; rows an earlier life may have delivered get their redelivery_count raised."""
        order = np.argsort(keys)  # (a bitmap builds three times faster from sorted keys)
        idx, keys = idx[order], keys[order]
        bm = bitmap64_of(keys)
        keep = self._unseen(keys, bm)
        if not keep.all():
            idx, keys = idx[keep], keys[keep]
            bm = bitmap64_of(keys)
        if not len(keys):
            return 0
        if self.delayed_before >= 0:
            old = rows.entries.deliver_at_ms[idx] <= self.delayed_before
            if old.any():
                self._bump_counts(keys[old], floor=1)
        self.redeliver |= bm
        if self.type == "key_shared":
            self._learn_slots(rows, idx, keys)
        self._staged.append((rows, idx, keys))
        self._staged_bitmaps[id(keys)] = bm
        self._staged_rows += len(keys)
        return len(keys)

    def _release_early(self, now_ms: int, room: int) -> int:
        """Stage up to ``room`` held rows due at ``now_ms`` (deliver_at <= now: never
        early); returns how many were staged."""
        staged = 0
        for early in list(self._early):
            if room <= 0:
                break
            n = min(int(np.searchsorted(early.d, now_ms, "right")) - early.pos, room)
            if n <= 0:
                continue
            idx = early.order[early.pos : early.pos + n]
            early.pos += n
            room -= n
            staged += self._stage(early.rows, idx, early.rows.positions[idx])
            if not len(early):
                self._early.remove(early)
        return staged

    def _early_due(self, now_ms: int) -> bool:
        return any(int(e.d[e.pos]) <= now_ms for e in self._early)

    def _delayed_due(self, now_ms: int) -> bool:
        """Whether a row of the topic's index (held here or in a loaded segment) is due at
        ``now_ms``: what :meth:`collect_due` would stage, which the delayed mark covers."""
        return self._early_due(now_ms) or (self.sealed is not None and self.sealed.has_due(now_ms))

    def _next_delayed_ms(self) -> int | None:
        """The earliest deliver_at of a row of the topic's index not handed out yet (epoch
        ms), as far as this subscription knows; None without sealed buckets or rows."""
        if self.sealed is None:
            return None
        times = [t for t in (self.sealed.next_time(), self.tail_next) if t is not None]
        times += [int(e.d[e.pos]) for e in self._early]
        return min(times) if times else None

    def take_unsealed(
        self, rows: Rows, below: int, through_ms: int, next_d: int, waiting: int
    ) -> int:
        """Take in the topic's answer to a due query of its unsealed index (see
        ``TopicIndex.due``), asked with :attr:`tail_taken` for the rows due by
        ``through_ms`` (the query's ``now_ms``); returns the rows taken. They wait here
        until they are due (:meth:`collect_due`). Adopt the buckets the answer says are
        sealed before this."""
        self._tail_in_flight = False
        self.tail_taken = (
            max(self.tail_taken[0], int(below)),
            max(self.tail_taken[1], int(through_ms)),
        )
        nxt = [t for t in (None if next_d < 0 else int(next_d), self._tail_seen) if t is not None]
        self.tail_next = min(nxt) if nxt else None
        self._tail_seen = None
        self.tail_waiting = int(waiting)
        self._forget_unasked(below=self.tail_taken[0])
        if not len(rows):
            return 0
        self._see_end(int(rows.positions.max()))
        self._early.append(_Early(rows))
        return len(rows)

    def _forget_unasked(self, below: int = -1, through_ledger: int = -1) -> None:
        """Stop counting the delayed rows read that another count holds now: those below
        position key ``below`` (a due answer's ``waiting`` covers them) or in a ledger up
        to ``through_ledger`` (an adopted bucket holds them). A stand-in for consecutive
        objects may straddle ``below``: its rows from there on stay counted."""
        q = self._tail_unasked
        while q:
            first, end, count = q[0]
            whole = end - first == count  # (entries one after another, not one object's)
            if first >> SHIFT <= through_ledger or end <= below or (first < below and not whole):
                q.popleft()
                self._tail_unasked_rows -= count
            elif first < below:
                q[0] = (below, end, end - below)
                self._tail_unasked_rows -= below - first
                break
            else:
                break

    def _see_end(self, key: int) -> None:
        self._end_key = key if self._end_key is None else max(self._end_key, key)

    def needs_delayed_mark(self, now_ms: int) -> bool:
        """Whether the delayed mark must move (be persisted) before delayed rows due up to
        ``now_ms`` may go out."""
        return self.sealed is not None and now_ms > self._delayed_durable

    def staged(self, keys: np.ndarray) -> tuple[list[Group], np.ndarray]:
        """The staged sealed-bucket rows of ``keys``, as (rows, indexes, keys) groups, and
        the keys not staged (to be read from the topic)."""
        groups = []
        need = np.asarray(keys, dtype=np.int64)
        for rows, idx, ks in self._staged:
            if not len(need):
                break
            at = np.minimum(np.searchsorted(ks, need), len(ks) - 1)
            hit = ks[at] == need
            if hit.any():
                groups.append((rows, idx[at[hit]], need[hit]))
                need = need[~hit]
        return groups, need

    def prune_staged(self, max_rows: int) -> None:
        """Drop staged rows no longer waiting for delivery (and the oldest beyond
        ``max_rows``: those are read from the topic if they are wanted again)."""
        kept: deque[Group] = deque()
        bitmaps: dict[int, BitMap64] = {}  # (each group's keys, built once: steps are often)
        self._staged_rows = 0
        for group in self._staged:
            bm = self._staged_bitmaps.get(id(group[2]))
            if bm is None:
                bm = bitmap64_of(group[2])
            if bm.intersect(self.redeliver):
                kept.append(group)
                bitmaps[id(group[2])] = bm
                self._staged_rows += len(group[2])
        while self._staged_rows > max_rows and len(kept) > 1:
            dropped = kept.popleft()[2]
            bitmaps.pop(id(dropped), None)
            self._staged_rows -= len(dropped)
        self._staged, self._staged_bitmaps = kept, bitmaps

    # --- sealed buckets -----------------------------------------------------------------------

    def adopt(
        self,
        meta: SealedMeta,
        done: Progress = 0,
        later: tuple[int, tuple[int, int]] | None = None,
    ) -> list[str]:
        """The topic sealed a bucket: read its rows from it, but for the ones already taken
        from the topic's unsealed index (:attr:`tail_taken`). Call it before taking in a
        due query's answer that reports the bucket sealed. ``later`` = (ledger, taken
        after): its runs past that ledger were sealed after that answer was made, which took
        their due rows as ``taken after`` says. A merged bucket takes over the buckets held
        whose runs it owns, where they stood; returns their keys."""
        if self.sealed is None or meta.key in self.sealed.buckets:
            return []
        held = self.sealed.held_runs(meta)
        fresh = [r.ledgers for r in meta.runs if r.key not in held]
        if fresh:
            # what the cursor and the cancels must learn of the ledgers new here (of a
            # merged bucket, only its runs not held yet: the others were learnt)
            def new_here(key: int) -> bool:
                lg = key >> SHIFT
                return any(lo <= lg <= hi for lo, hi in fresh)

            self._learn_ledgers([x for x in meta.ledgers if any(a <= x[0] <= b for a, b in fresh)])
            for marker, target in meta.markers:  # before any of its rows can go out
                if new_here(marker):
                    self._apply_marker(marker, target)
        replaced = self.sealed.adopt(meta, done=done, taken=self.tail_taken, later=later)
        if meta.runs:  # (its rows count among the sealed ones now)
            end_ledger = max(r.ledgers[1] for r in meta.runs)
            self._forget_unasked(through_ledger=end_ledger)
        if fresh:
            positions = meta.positions()
            if held:
                keep = BitMap64()
                for lo, hi in fresh:
                    keep.add_range(lo << SHIFT, (hi + 1) << SHIFT)
                positions = positions & keep
            self.log_cursor.ack_keys(positions)
        if meta.keys:  # its rows exist: an ack of one is not past the end of the log
            self._see_end(int(meta.keys.max()))
        return replaced

    def _ack_gone_ledgers(self, present: set[int]) -> None:
        """Entries of a bucket's ledgers that are gone from the log and not in the bucket
        can never be read again (every subscription then had them acknowledged): a
        subscription made after their deletion acknowledges them too."""
        if self.sealed is None:
            return
        for b in self.sealed.buckets.values():
            for ledger_id, size in b.meta.ledgers:
                if ledger_id in present or ledger_id < self.cursor.mark_delete[0] or not size:
                    continue
                gone = BitMap64()
                gone.add_range(key_of(ledger_id, 0), key_of(ledger_id, size))
                gone -= b.meta.positions()
                if gone:
                    self._ack_cursor(bitmap64_values(gone))

    def advance_buckets(self) -> list[str]:
        """Move each bucket's progress over segments whose rows are all acknowledged;
        returns the buckets this subscription is now done with."""
        if self.sealed is None:
            return []
        self.sealed.trim_covered(key_of(*self.read_position))
        return self.sealed.advance(self._all_acked)

    def _all_acked(self, keys: np.ndarray) -> bool:
        """Whether every position of ``keys`` is acknowledged (or cancelled ahead of the
        read): below mark-delete, or in the individual acks. Asked per sealed run at every
        progress report, so it answers without building more than one bitmap."""
        floor = self.cursor.floor_key()
        above = keys[keys > floor]
        if not len(above):
            return True
        rest = bitmap64_of(np.sort(above)) - self.cursor.acked_keys
        if rest and self._cancelled_ahead:
            rest -= self._cancelled_ahead
        return not rest

    def keys_to_fetch(self, max_messages: int, consumer_id: str | None = None) -> np.ndarray:
        """The redelivery-set positions to hand out next (lowest first); the actor fetches
        their payloads, then calls :meth:`deliver` with them. A key_shared subscription
        first moves read-ahead rows into the redelivery set, then picks the positions of
        ``consumer_id``'s keys (and positions whose key it does not know yet)."""
        if self.type != "key_shared" or consumer_id is None:
            return _first(self.redeliver, max_messages)
        self._pool_ready(max(self.read_ahead_entries, max_messages))
        while True:
            keys, slots = self._pool_index()
            ok = slots < 0
            known = ~ok
            ok[known] = self._eligible(consumer_id, slots[known])
            if int(ok.sum()) >= max_messages:
                break
            # too few for this consumer in what waits (the rest wait for others): read on,
            # as far as the dispatch mark and the pool's cap let
            budget = min(self._pool_cap, len(self.redeliver) + self.read_ahead_entries)
            if not self._pool_ready(budget):
                break
        return keys[ok][:max_messages]

    def _pool_index(self) -> tuple[np.ndarray, np.ndarray]:
        """The redelivery set's keys (ascending) and their hash slots (-1: not known)."""
        gone = self._indexed - self.redeliver
        if gone:
            keep = ~np.isin(self._pool_keys, bitmap64_values(gone))
            self._pool_keys, self._pool_slots = self._pool_keys[keep], self._pool_slots[keep]
            self._indexed -= gone
        new = self.redeliver - self._indexed
        if new:
            keys = bitmap64_values(new)
            keys = np.concatenate([self._pool_keys, keys])
            slots = np.concatenate([self._pool_slots, self._slots_known(bitmap64_values(new))])
            order = np.argsort(keys, kind="stable")
            self._pool_keys, self._pool_slots = keys[order], slots[order]
            self._indexed |= new
        unknown = self._pool_slots < 0
        if unknown.any():  # learned since they came in
            self._pool_slots[unknown] = self._slots_known(self._pool_keys[unknown])
        return self._pool_keys, self._pool_slots

    # --- key_shared ---------------------------------------------------------------------------

    def _pool_ready(self, budget: int) -> int:
        """key_shared: move read-ahead rows (below the dispatch mark) into the redelivery
        set, their payloads staged and their slots noted, until it holds ``budget``.
        Returns how many moved."""
        room = budget - len(self.redeliver)
        if room <= 0:
            return 0
        moved = 0
        for source, idx, keys in self._take_ready(room):
            self._learn_slots(source, idx, keys)
            self.redeliver |= bitmap64_of(keys)
            self._staged.append((source, idx, keys))
            self._staged_rows += len(keys)
            moved += len(keys)
        return moved

    def _learn_slots(self, source: Source, idx: np.ndarray, keys: np.ndarray) -> np.ndarray:
        col = source.entries.batch.column(2)
        if is_run(idx):  # no copy
            col = col.slice(int(idx[0]), len(idx))
        else:
            col = col.take(pa.array(idx, type=pa.int64()))
        if len(self._key_slots) > _KEY_SLOT_CACHE:
            self._key_slots.clear()
        slots = slots_of(col, self._key_slots)
        self._slot.update(zip(keys.tolist(), slots.tolist()))
        return slots

    def _slots_known(self, keys: np.ndarray) -> np.ndarray:
        """The hash slot of each position, -1 where not known yet."""
        ks = keys.tolist()
        if len(ks) > 1:
            try:  # every one known (the usual case): one C-level lookup
                return np.array(itemgetter(*ks)(self._slot), dtype=np.int64)
            except KeyError:
                pass
        get = self._slot.get
        return np.fromiter((get(k, -1) for k in ks), dtype=np.int64, count=len(ks))

    def _eligible(self, consumer_id: str, slots: np.ndarray) -> np.ndarray:
        """Which of ``slots`` ``consumer_id`` may take messages of now: it owns them, and no
        other consumer holds messages of them unacknowledged."""
        if self._ring is None:
            self._ring = Ring(list(self._consumers))
        ok = self._ring.owned(consumer_id, slots)
        others = [
            c.held
            for cid, c in self._consumers.items()
            if cid != consumer_id and c.pending and c.held is not None
        ]
        if others and ok.any():
            blocked = np.zeros(SLOTS, dtype=bool)
            for held in others:
                blocked |= held > 0
            ok &= ~blocked[slots]
        return ok

    def _take_back(self, c: _Consumer, bm: BitMap64) -> BitMap64:
        """Remove ``bm`` from what ``c`` holds; returns what it held of it."""
        hit = c.pending & bm
        if hit:
            c.pending -= hit
            if c.held is not None:
                slots = self._slots_known(bitmap64_values(hit))
                np.subtract.at(c.held, slots[slots >= 0], 1)
        return hit

    def _still_waiting(self, idx: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The fetched rows still in the redelivery set (another receive, an ack or a
        cancel may have taken some while they were fetched)."""
        waiting = bitmap64_of(keys) & self.redeliver
        if len(waiting) < len(keys):
            keep = np.isin(keys, bitmap64_values(waiting))
            idx, keys = idx[keep], keys[keep]
        return idx, keys

    def _deliver_keyed(
        self,
        consumer_id: str,
        fetched: list[Group],
        room: int,
        now_ms: int,
    ) -> list[Delivery]:
        """key_shared: hand out the fetched rows of ``consumer_id``'s keys, lowest position
        first. A key with a lower position waiting that was not fetched waits (its order
        first); rows left for other consumers stay staged."""
        parts = []
        for g, (source, idx, keys) in enumerate(fetched):
            idx, keys = self._still_waiting(idx, keys)
            if not len(keys):
                continue
            slots = self._slots_known(keys)
            if (slots < 0).any():
                slots = self._learn_slots(source, idx, keys)
            parts.append((np.full(len(keys), g), idx, keys, slots))
        if not parts:
            return []
        group, idx, keys, slots = (np.concatenate(c) for c in zip(*parts))
        order = np.argsort(keys, kind="stable")
        group, idx, keys, slots = group[order], idx[order], keys[order], slots[order]
        ok = self._eligible(consumer_id, slots)
        # a key goes out only ahead of its positions still waiting that were not fetched
        # (cut by the fetch, or back in the redelivery set while it was fetched)
        pool_keys, pool_slots = self._pool_index()
        behind = ~np.isin(pool_keys, keys)
        if behind.any():
            b_keys, b_slots = pool_keys[behind], pool_slots[behind]
            unknown = b_slots < 0
            if unknown.any():  # its key could be any: nothing after it may go
                ok &= keys < int(b_keys[unknown].min())
            if not unknown.all():
                first = np.full(SLOTS, np.iinfo(np.int64).max, dtype=np.int64)
                np.minimum.at(first, b_slots[~unknown], b_keys[~unknown])
                ok &= keys < first[slots]
        chosen = np.flatnonzero(ok)[:room]
        # left for others: keep their rows staged, so that their consumer need not read them
        left = np.flatnonzero(~ok)
        if len(left):
            _, need = self.staged(keys[left])
            if len(need):
                for g in np.unique(group[left]).tolist():
                    sel = left[(group[left] == g) & np.isin(keys[left], need)]
                    if len(sel):
                        self._staged.append((fetched[g][0], idx[sel], keys[sel]))
                        self._staged_rows += len(sel)
        if not len(chosen):
            return []
        self.redeliver -= bitmap64_of(keys[chosen])
        out = []
        # runs of one source in position order: one Delivery each, so that order holds
        cuts = np.flatnonzero(np.diff(group[chosen])) + 1
        for run in np.split(chosen, cuts):
            source = fetched[int(group[run[0]])][0]
            out.append(self._hand_out(consumer_id, source, idx[run], keys[run], now_ms))
        return out

    def deliver(
        self,
        consumer_id: str,
        fetched: list[Group],
        max_messages: int,
        now_ms: int,
    ) -> list[Delivery]:
        """Hand up to ``max_messages`` to ``consumer_id``: fetched redeliveries first (groups
        of (source, row indexes, position keys)), then the read-ahead queue. Returns
        nothing for a FIFO subscription's standby consumer."""
        if not self.can_receive(consumer_id):
            return []
        if self.type == "key_shared":
            return self._deliver_keyed(consumer_id, fetched, max_messages, now_ms)
        out: list[Delivery] = []
        room = max_messages
        for source, idx, keys in sorted(fetched, key=lambda g: int(g[2][0]) if len(g[2]) else 0):
            if room <= 0:
                break
            # only what is still waiting: another receive, an ack or a cancel may have won
            idx, keys = self._still_waiting(idx, keys)
            idx, keys = idx[:room], keys[:room]
            if len(keys):
                self.redeliver -= bitmap64_of(keys)
                out.append(self._hand_out(consumer_id, source, idx, keys, now_ms))
                room -= len(keys)
        for source, idx, keys in self._take_ready(room):
            out.append(self._hand_out(consumer_id, source, idx, keys, now_ms))
        return out

    def _take_ready(self, room: int) -> list[Group]:
        """Up to ``room`` rows off the read-ahead queue, below the dispatch mark, left out
        the ones acknowledged since they were read (cancels)."""
        out = []
        mark = key_of(*self.dispatch_mark)
        while self._ready and room > 0:
            run = self._ready[0]
            below = int(np.searchsorted(run.keys, mark)) if run.keys[-1] >= mark else len(run.keys)
            end = min(below, run.pos + room)
            if end <= run.pos:
                break  # past the dispatch mark: wanted_mark() says where to move it
            idx, keys = run.indexes[run.pos : end], run.keys[run.pos : end]
            self._ready_count -= end - run.pos
            run.pos = end
            if run.pos >= len(run.keys):
                self._ready.popleft()
            keep = self._unseen(keys)
            if not keep.all():
                idx, keys = idx[keep], keys[keep]
            if len(keys):
                out.append((run.source, idx, keys))
                room -= len(keys)
        return out

    def wanted_mark(self) -> Position | None:
        """Where the dispatch mark must move before the read-ahead queue can go on (None:
        it need not move). The actor persists it first, then sets ``dispatch_mark``."""
        if not self._ready:
            return None
        run = self._ready[0]
        head = int(run.keys[run.pos])
        if head < key_of(*self.dispatch_mark):
            return None
        ledger_id, entry_id = position_of(head)
        return (ledger_id, entry_id + DISPATCH_MARK_STEP)

    def _hand_out(
        self, consumer_id: str, source: Source, idx: np.ndarray, keys: np.ndarray, now_ms: int
    ) -> Delivery:
        bm = bitmap64_of(keys)
        c = self._consumers[consumer_id]
        c.pending |= bm
        if c.held is not None:
            slots = self._slots_known(keys)
            np.add.at(c.held, slots[slots >= 0], 1)
        if self.ack_timeout_ms:
            deadline = now_ms + self.ack_timeout_ms
            if self._deadlines and self._deadlines[-1][0] == deadline:
                self._deadlines[-1][1] |= bm
            elif not self._deadlines or self._deadlines[-1][0] < deadline:
                self._deadlines.append([deadline, bm])
            else:  # the clock stepped back: keep the list in deadline order
                bisect.insort(self._deadlines, [deadline, bm], key=lambda x: x[0])
        self.counters["delivered"] += len(keys)
        return Delivery(source, idx, keys, self._counts_of(keys, bm))

    def _counts_of(self, keys: np.ndarray, bm: BitMap64 | None = None) -> np.ndarray:
        """How many times each position was delivered before (0 for most)."""
        counts = np.zeros(len(keys), dtype=np.int64)
        if self._counted:
            hit = (bm if bm is not None else bitmap64_of(keys)) & self._counted
            if hit:
                where = np.flatnonzero(np.isin(keys, bitmap64_values(hit)))
                counts[where] = [self._counts[k] for k in keys[where].tolist()]
        return counts

    def _bump_counts(self, keys: np.ndarray, floor: int | None = None) -> np.ndarray:
        """Raise the delivery counts of ``keys`` by one (or, with ``floor``, to at least
        that); returns the new counts."""
        new = self._counts_of(keys)
        new = np.maximum(new, floor) if floor is not None else new + 1
        self._counts.update(zip(keys.tolist(), new.tolist()))
        self._counted |= bitmap64_of(keys)
        return new

    def drop_missing(self, keys: Iterable[int] | np.ndarray) -> int:
        """Positions the log no longer has (deleted): nothing can deliver them; ack them."""
        bm = bitmap64_of(_keys_of(keys))
        gone = (bm & self.redeliver) | (bm & self.dead)
        if not gone:
            return 0
        log.error(
            "subscription %s: %d positions are gone from the log, first %s",
            self.name,
            len(gone),
            position_of(gone.min()),
        )
        self._ack_keys(bitmap64_values(gone))
        return len(gone)

    # --- acks, nacks, timeouts ------------------------------------------------------------------

    def ack(self, consumer_id: str, keys: Iterable[int] | np.ndarray) -> int:
        """Acknowledge positions (int64 keys); returns how many were newly acknowledged. Any
        consumer may ack any message, as with Pulsar's ack by id (it need not hold it). A
        position past the end of the log is an InvalidArgument, and nothing is acked."""
        ks = _keys_of(keys)
        if self._end_key is not None and len(ks) and int(ks.max()) > self._end_key:
            bad = ks[ks > self._end_key][:3]
            shown = ", ".join("{}:{}".format(*position_of(int(k))) for k in bad)
            last = "{}:{}".format(*position_of(self._end_key))
            raise InvalidArgument(
                f"messages: {shown} past the end of {self.name} (its last entry is {last}): "
                "no such message"
            )
        return self._ack_keys(ks)

    def _ack_keys(self, ks: np.ndarray) -> int:
        if len(ks) == 0:
            return 0
        bm = bitmap64_of(ks)
        for c in self._consumers.values():
            if c.pending:
                self._take_back(c, bm)
        if self._counted:
            done = self._counted & bm
            if done:
                for k in done:
                    del self._counts[k]
                self._counted -= done
        if self.redeliver:
            self.redeliver -= bm
        if self._slot:
            for k in ks.tolist():
                self._slot.pop(k, None)
        if self.dead:
            self.dead -= bm
        added = self._ack_cursor(ks, bm)
        self.counters["acked"] += added
        return added

    def nack(
        self, consumer_id: str, keys: Iterable[int] | np.ndarray, delay_ms: int, now_ms: int
    ) -> int:
        """Give positions back: redeliver after ``delay_ms`` (milliseconds), through the tracker.
        Only positions ``consumer_id`` holds are taken back."""
        c = self._consumers.get(consumer_id)
        if c is None:
            return 0
        held = self._take_back(c, bitmap64_of(_keys_of(keys)))
        if not held:
            return 0
        self._forget_deadlines(held)
        if delay_ms <= 0:
            self._schedule_redelivery(held)
            return len(held)
        later = self._to_dead_letters(bitmap64_values(held))
        if len(later):
            self._bump_counts(later)
            tracked = self.tracker.add_messages(
                *split_keys(later), np.full(len(later), now_ms + delay_ms, np.int64)
            )
            if not tracked.all():
                self.redeliver |= bitmap64_of(later[~tracked])
        return len(held)

    def redeliver_unacked(
        self, consumer_id: str, keys: np.ndarray | None = None, dry_run: bool = False
    ) -> int:
        """Pulsar's ``redeliverUnacknowledgedMessages``: hand messages ``consumer_id`` holds
        unacked back for redelivery now, ``redelivery_count`` raised. ``keys`` None: all it
        holds. A shared subscription takes back only ``keys``; exclusive and failover rewind:
        everything the consumer holds goes out again first, in log order. A key held by
        another consumer or acknowledged already is an :class:`InvalidArgument` naming it,
        and nothing is handed back; a key unacknowledged and held by no consumer (a
        restarted subscription forgot who had it) is on its way again already. ``dry_run``:
        only check, and count what would go back."""
        c = self._consumers.get(consumer_id)
        held = c.pending if c is not None else BitMap64()
        if keys is not None:
            wanted = bitmap64_of(_keys_of(keys))
            others = wanted - held
            bad = [
                (int(k), why)
                for k in bitmap64_values(others)
                if (why := self._not_redeliverable(int(k), consumer_id)) is not None
            ]
            if bad:
                shown = ", ".join(
                    f"{position_of(k)[0]}:{position_of(k)[1]} ({why})" for k, why in bad[:5]
                )
                more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
                raise InvalidArgument(
                    f"msgs: not held unacknowledged by this consumer: {shown}{more}"
                )
            if self.spreads:
                held = wanted & held
        if c is None or not held or dry_run:
            return len(held) if c is not None else 0
        held = self._take_back(c, BitMap64(held))
        self._forget_deadlines(held)
        self._schedule_redelivery(held)
        return len(held)

    def _not_redeliverable(self, key: int, consumer_id: str) -> str | None:
        """Why ``key`` cannot be redelivered on behalf of ``consumer_id`` (None: it can)."""
        ledger_id, entry_id = position_of(key)
        if self.cursor.is_acked(ledger_id, entry_id):
            return "acknowledged"
        for cid, other in self._consumers.items():
            if cid != consumer_id and key in other.pending:
                return "held by another consumer"
        return None

    def expire(self, now_ms: int) -> int:
        """Ack timeouts: unacked deliveries past their deadline go back for redelivery."""
        n = 0
        while self._deadlines and self._deadlines[0][0] <= now_ms:
            _, bm = self._deadlines.pop(0)
            for c in self._consumers.values():
                hit = self._take_back(c, bm)
                if hit:
                    self._schedule_redelivery(hit)
                    n += len(hit)
        return n

    def _forget_deadlines(self, bm: BitMap64) -> None:
        """``bm`` is no longer in flight (nacked, consumer gone): drop it from the deadlines,
        so that an expiry cannot take back a later delivery of the same positions."""
        for entry in self._deadlines:
            entry[1] -= bm
        self._deadlines = [e for e in self._deadlines if e[1]]

    def _to_dead_letters(self, keys: np.ndarray) -> np.ndarray:
        """Move the positions that used up ``max_redeliveries`` to the dead-letter set;
        returns the others."""
        if self.max_redeliveries is None:
            return keys
        over = self._counts_of(keys) >= self.max_redeliveries
        if over.any():
            self.dead |= bitmap64_of(keys[over])
        return keys[~over]

    def _schedule_redelivery(self, bm: BitMap64) -> None:
        ks = self._to_dead_letters(bitmap64_values(bm))
        if len(ks):
            self._bump_counts(ks)
            self.counters["redelivered"] += len(ks)
            self.redeliver |= bitmap64_of(ks)

    def dead_lettered(self, keys: Iterable[int] | np.ndarray) -> int:
        """These were published to the dead-letter topic: ack them."""
        ks = _keys_of(keys)
        self.counters["dead_lettered"] += len(ks)
        return self._ack_keys(ks)

    # --- cancel -----------------------------------------------------------------------------

    def cancel(self, ledger_id: int, entry_id: int, marker: Position) -> bool:
        """Apply the cancel marker at ``marker`` of the position (ledger_id, entry_id). True if
        it kept the message from being delivered; False if it was delivered (or acknowledged)
        already. Whether the marker is applied here first or read from the log first, it
        takes effect once and both report the same outcome."""
        return self._apply_marker(key_of(*marker), key_of(ledger_id, entry_id))

    def learn_cancels(self, pairs: Iterable[tuple[Position, Position]]) -> int:
        """Take in the log's cancel markers from the first unacknowledged position on (at
        startup, before anything is delivered): their targets will never be delivered.
        Returns how many."""
        n = 0
        for marker, target in pairs:
            if tuple(marker) >= self.start_position:
                self._apply_marker(key_of(*marker), key_of(*target))
                n += 1
        return n

    def _apply_marker(self, marker_key: int, target_key: int) -> bool:
        known = self._marker_results.get(marker_key)
        if known is not None:
            return known
        result = self._apply_cancel(target_key)
        self._marker_results[marker_key] = result
        while len(self._marker_results) > _MARKER_MEMORY:
            self._marker_results.popitem(last=False)
        return result

    def _in_flight(self, k: int) -> bool:
        return any(k in c.pending for c in self._consumers.values())

    def _apply_cancel(self, k: int) -> bool:
        lg, e = position_of(k)
        if self.cursor.is_acked(lg, e) or self._in_flight(k) or k in self.dead:
            return False
        if self._counts.get(k, 0) > 0:
            return False  # delivered before and waiting for a redelivery
        if (lg, e) >= self.read_position:
            if k in self._cancelled_ahead:
                return False  # a second cancel, as for one already applied: counted once
            self._cancelled_ahead.add(k)
            self.counters["cancelled"] += 1
            return True
        self.counters["cancelled"] += 1
        self.tracker.remove_message(lg, e)
        self._ack_keys(np.array([k], dtype=np.int64))  # out of the redelivery set, read-ahead
        return True

    # --- peek --------------------------------------------------------------------------------

    async def peek(
        self,
        q: PeekRange,
        fetch: Fetch,
        read_segments: ReadSegments,
        read_unsealed: ReadUnsealed | None = None,
        unknown: Sequence[SealedMeta] = (),
    ) -> tuple[Rows, np.ndarray]:
        """The next scheduled messages not delivered yet, in delivery order (see
        :mod:`raydelay.dispatch.peek`), and how many times each was delivered before.
        Nothing changes. ``fetch`` reads payloads of positions from the log;
        ``read_segments`` reads sealed segments not loaded; ``read_unsealed`` asks the
        host's unsealed index (None: not asked). ``unknown``: buckets the host lists that
        are not adopted here yet (their rows are in neither place the subscription looks)."""
        waiting = getattr(self.tracker, "waiting", None)
        if waiting is None:
            raise InvalidArgument(f"peek: the tracker {type(self.tracker).__name__} cannot list")
        # what is held here, taken at one moment (nothing awaits before the last line)
        held: list[Rows] = [e.rows.take(e.order[e.pos :]) for e in self._early if len(e)]
        refs: list[SegmentRef] = []
        if self.sealed is not None:
            loaded, raw = self.sealed.peek_parts(unknown, self.tail_taken)
            held += loaded
            refs = sorted(SegmentRef(*r) for r in raw if q.admits_span(r[0], r[1]))
        ready = self.redeliver - self.dead
        cap = len(ready) if q.limit == NO_LIMIT else min(len(ready), max(q.limit, 1_000))
        groups, need = self.staged(_first(ready, cap))
        held += [cast(Rows, rows).take(idx) for rows, idx, _ in groups]  # (staged: Rows)
        nacked, nacked_d = waiting(q.due_after, q.due_before, q.limit)
        taken = self.tail_taken
        # held by a consumer or waiting for the dead-letter topic: not shown
        taken_out = BitMap64(self.dead)
        for c in self._consumers.values():
            taken_out |= c.pending
        found = self._peek_select(held, q, taken_out)
        # then the reads: positions without payloads, the host's index, sealed segments
        if len(need) or len(nacked):
            rows = await fetch(np.unique(np.concatenate([need, nacked])))
            parts = [found, rows.take(np.flatnonzero(np.isin(rows.positions, need)))]
            hit = np.isin(nacked, rows.positions)
            if hit.any():  # (a nacked one goes out at its nack's time, not its deliver_at)
                at = np.searchsorted(rows.positions, nacked[hit])
                parts.append(with_deliver_at(rows.take(at), nacked_d[hit]))
            found = self._peek_select(parts, q, taken_out)
        if read_unsealed is not None and self.sealed is not None:
            found = await self._peek_unsealed(found, q, read_unsealed, taken, taken_out)
        i, every = 0, []  # (without a limit, every row read is kept and sorted once)
        while i < len(refs):
            bar = q.bar(found)
            batch: list[SegmentRef] = []
            while (
                i < len(refs) and len(batch) < PEEK_READS and (bar is None or refs[i].min_d <= bar)
            ):
                batch.append(refs[i])
                i += 1
            if not batch:
                break  # (every segment left starts after the answer's last row)
            got = await read_segments(batch)
            parts = [
                self._peek_filter(rows.take(np.flatnonzero(ref.untaken(rows))), q, taken_out)
                for ref, rows in zip(batch, got, strict=True)
            ]
            if q.limit == NO_LIMIT:
                every += parts
            else:
                found = first_rows([found, *parts], q.limit)
        if every:
            found = first_rows([found, *every], q.limit)
        return found, self._counts_of(found.positions)

    async def _peek_unsealed(
        self,
        found: Rows,
        q: PeekRange,
        read_unsealed: ReadUnsealed,
        taken: tuple[int, int],
        taken_out: BitMap64,
    ) -> Rows:
        """``found`` with the host's unsealed rows, asked a page at a time until the answer
        is full and the pages pass its last row (rows acknowledged here are left out after
        the host answered, so one page may not be enough)."""
        page = PEEK_PAGE if q.limit == NO_LIMIT else max(q.limit, 1_000)
        start: tuple[int, int] | None = None
        while True:
            rows = await read_unsealed(taken[0], taken[1], q, start, page)
            found = self._peek_select([found, rows], q, taken_out)
            if len(rows) < page:
                return found
            last = (int(rows.entries.deliver_at_ms[-1]), int(rows.positions[-1]))
            bar = q.bar(found)
            if bar is not None and last[0] > bar:
                return found
            start = last

    def _peek_select(self, parts: list[Rows], q: PeekRange, taken_out: BitMap64) -> Rows:
        """The rows of ``parts`` a peek shows (see :meth:`_peek_filter`), sorted, at most
        its limit."""
        return first_rows([self._peek_filter(rows, q, taken_out) for rows in parts], q.limit)

    def _peek_filter(self, rows: Rows, q: PeekRange, taken_out: BitMap64) -> Rows:
        """The rows a peek shows: scheduled (with a deliver_at), in ``q``'s range, neither
        acknowledged nor cancelled, and not in ``taken_out`` (held by a consumer, or
        waiting for the dead-letter topic)."""
        if not len(rows):
            return rows
        # (an immediate message waiting for a consumer is backlog, not schedule; one nacked
        # with a delay comes here with the nack's time)
        keep = q.mask(rows) & (rows.entries.deliver_at_ms >= 0)
        if keep.any():
            keep &= self._unseen(rows.positions)
        if keep.any() and taken_out:
            hit = taken_out & bitmap64_of(np.sort(rows.positions))
            if hit:
                keep &= ~np.isin(rows.positions, bitmap64_values(hit))
        return rows if keep.all() else rows.take(np.flatnonzero(keep))

    # --- timers and stats -----------------------------------------------------------------------

    def has_deliverable(self, now_ms: int) -> bool:
        return (
            bool(self.redeliver)
            or bool(self._ready)
            or self.tracker.has_message_available()
            or (self.sealed is not None and self.sealed.has_due(now_ms))
            or (bool(self._early) and self._early_due(now_ms))
        )

    def next_wakeup_ms(self, next_delayed_ms: int | None = None) -> int | None:
        """When something may next become deliverable (epoch ms), or None
        (``next_delayed_ms``: :meth:`_next_delayed_ms`, when the caller has it)."""
        if next_delayed_ms is None:
            next_delayed_ms = self._next_delayed_ms()
        times = [t for t in (self.tracker.next_delivery_time(), next_delayed_ms) if t is not None]
        if self._deadlines:
            times.append(self._deadlines[0][0])
        return min(times) if times else None

    def pending_count(self) -> int:
        return sum(len(c.pending) for c in self._consumers.values())

    def ready_count(self) -> int:
        return self._ready_count

    def stats(self) -> dict:
        buckets = getattr(self.tracker, "immutable_bucket_count", lambda: 0)()
        delayed = self.tracker.number_of_delayed_messages()
        if self.sealed is not None:
            buckets += len(self.sealed.buckets)
            delayed += self.sealed.remaining() + self.tail_waiting + self._tail_unasked_rows
            # (rows held here that are due already wait for delivery: not delayed)
            now = self._stepped_ms
            delayed += sum(len(e.d) - int(np.searchsorted(e.d, now, "right")) for e in self._early)
        return {
            "type": self.type,
            "delayed": delayed,
            "backlog": self.cursor.unacked_between(self.tail),
            "pending_ack": self.pending_count(),
            "buckets": buckets,
            "loaded_indexes": self.tracker.number_of_delayed_messages()
            + (self.sealed.loaded_rows() if self.sealed is not None else 0),
            "redelivery": len(self.redeliver),
            "dead_letter_pending": len(self.dead),
            "read_ahead": self._ready_count,
            "unread": len(self.unread),
            "mark_delete": list(self.cursor.mark_delete),
            "log_mark": list(self.log_cursor.mark_delete),
            "read_position": list(self.read_position),
            "tail": None if self.tail is None else list(self.tail),
            "consumers": len(self._consumers),
            **self.counters,
        }

    # --- the cursor ---------------------------------------------------------------------------

    def _ack_cursor(self, keys: np.ndarray, bm: BitMap64 | None = None) -> int:
        """Acknowledge ``keys`` (``bm``: their bitmap, when the caller has it) in the cursor
        and the log's cursor; returns how many the cursor had not acknowledged."""
        if bm is None:
            bm = bitmap64_of(np.sort(keys))
        self.log_cursor.ack_keys(bm)
        return self.cursor.ack_keys(bm)

    def _learn_ledgers(self, ledgers: Iterable[tuple[int, int | None]]) -> None:
        known = list(ledgers)
        self.cursor.learn_ledgers(known)
        self.log_cursor.learn_ledgers(known)


def _coalesce(
    groups: list[tuple[Rows, np.ndarray, np.ndarray]],
) -> tuple[Rows, np.ndarray, np.ndarray]:
    """Groups of rows (rows, indexes, keys) as one: their rows copied once, in order (a
    group of consecutive indexes, as the sealed reader hands out, is sliced, not taken)."""
    rows = Rows.join([r.at(idx) for r, idx, _ in groups])
    keys = np.concatenate([k for _, _, k in groups])
    return rows, np.arange(len(keys), dtype=np.int64), keys


def _first(bm: BitMap64, n: int) -> np.ndarray:
    """The ``n`` lowest keys of ``bm``."""
    if len(bm) <= n:
        return bitmap64_values(bm)
    return np.fromiter(itertools.islice(bm, n), dtype=KEY_DTYPE, count=n)
