"""One subscription on one partition: what to deliver, to whom, and when (pure: no Ray).

The :class:`Subscription` holds all the dispatch logic; the actor around it only
moves bytes (reads the log, fetches payloads, answers consumers) and runs timers.

- **cursor**: mark-delete plus individual acks (:mod:`raydelay.dispatch.cursor`).
- **read-ahead**: entries read from the log and due now wait in a bounded queue
  with their payloads.
- **delayed messages**: a ``shared`` subscription puts not-yet-due entries into its
  tracker (position only; the payload is fetched again when due). ``exclusive``
  and ``failover`` ignore ``deliver_at`` and deliver in log order.
- **redelivery set**: positions the tracker popped, positions whose ack timed out,
  nacked positions whose delay elapsed, and the pending positions of consumers that
  left. A position stays there until a consumer has it, so none is lost.
- **delivery order**: redeliveries (which include due delayed messages), then the
  read-ahead queue.
- **dead letters**: a position due for its ``max_redeliveries + 1``-th redelivery goes
  to the dead-letter set instead; the actor publishes it and then acks it.

Positions are ints: ``ledger_id << 32 | entry_id``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from pyroaring import BitMap, BitMap64

from raydelay.clock import Clock
from raydelay.delayed.base import DelayedDeliveryTracker
from raydelay.dispatch.cursor import Cursor, Position
from raydelay.dispatch.keys import LOW, SHIFT, key_of, position_of
from raydelay.errors import InvalidArgument, RaydelayError
from raydelay.log.entries import NO_DELAY, LedgerObject

log = logging.getLogger(__name__)

SUBSCRIPTION_TYPES = ("shared", "exclusive", "failover")
DISPATCH_MARK_STEP = 10_000  # entries the dispatch mark moves ahead at a time
_MARKER_MEMORY = 100_000  # outcomes of recent cancel markers, for the caller who asks


class ConsumerBusy(RaydelayError):
    """An exclusive subscription already has a consumer."""


@dataclass(frozen=True)
class Delivery:
    """Messages handed to a consumer from one ledger object: their indexes in it, their
    position keys, and how many times each was delivered before."""

    obj: LedgerObject
    indexes: np.ndarray  # int64
    keys: np.ndarray  # int64 position keys
    counts: np.ndarray  # int64 redelivery counts

    def __len__(self) -> int:
        return len(self.keys)


class _Run:
    """Entries of one ledger object waiting in the read-ahead queue (from ``pos`` on)."""

    __slots__ = ("obj", "indexes", "keys", "pos")

    def __init__(self, obj: LedgerObject, indexes: np.ndarray, keys: np.ndarray) -> None:
        self.obj, self.indexes, self.keys, self.pos = obj, indexes, keys, 0

    def __len__(self) -> int:
        return len(self.keys) - self.pos


@dataclass
class _Consumer:
    consumer_id: str
    pending: set[int]


class Subscription:
    def __init__(
        self,
        *,
        name: str,
        subscription_type: str,
        tracker: DelayedDeliveryTracker,
        clock: Clock,
        cursor: Cursor | None = None,
        dispatched_before: Position = (-1, -1),
        ack_timeout_ms: int | None = None,
        max_redeliveries: int | None = None,
        read_ahead_entries: int = 10_000,
    ) -> None:
        if subscription_type not in SUBSCRIPTION_TYPES:
            raise InvalidArgument(
                f"subscription_type: must be one of {', '.join(SUBSCRIPTION_TYPES)}; "
                f"got {subscription_type!r}"
            )
        self.name = name
        self.type = subscription_type
        self.tracker = tracker
        self._clock = clock
        self.cursor = cursor or Cursor()
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
        self._pending: dict[int, tuple[str, int]] = {}  # key -> (consumer, deadline_ms or 0)
        self._deadlines: list[tuple[int, int, list[int]]] = []  # heap: (deadline_ms, n, keys)
        self._deadline_seq = 0
        self._counts: dict[int, int] = {}  # key -> deliveries so far, once above zero
        self._consumers: dict[str, _Consumer] = {}
        self._cancelled_ahead = BitMap64()  # cancel targets not read from the log yet
        # After a restart: positions before read_position still to be re-read one by one
        # (see resume_after_buckets), and the first unacknowledged position at the start.
        self.unread = BitMap64()
        self.start_position: Position = self.read_position
        self._marker_results: OrderedDict[int, bool] = OrderedDict()  # marker -> outcome
        self.tail: Position | None = None
        self.counters = {
            "delivered": 0,
            "acked": 0,
            "redelivered": 0,
            "cancelled": 0,
            "dead_lettered": 0,
        }

    # --- consumers -----------------------------------------------------------------------

    def add_consumer(self, consumer_id: str) -> None:
        if consumer_id in self._consumers:
            return
        if self.type == "exclusive" and self._consumers:
            raise ConsumerBusy(
                f"subscription {self.name!r} is exclusive and already has a consumer"
            )
        self._consumers[consumer_id] = _Consumer(consumer_id, set())

    def remove_consumer(self, consumer_id: str) -> int:
        """Forget a consumer; its unacked messages go to the redelivery set."""
        c = self._consumers.pop(consumer_id, None)
        if c is None:
            return 0
        keys = [k for k in c.pending if self._pending.get(k, ("",))[0] == consumer_id]
        for k in keys:
            del self._pending[k]
            self._schedule_redelivery(k)
        return len(keys)

    def consumers(self) -> list[str]:
        return list(self._consumers)

    def active_consumer(self) -> str | None:
        """The consumer a FIFO subscription delivers to (the oldest one)."""
        return next(iter(self._consumers), None)

    def can_receive(self, consumer_id: str) -> bool:
        if consumer_id not in self._consumers:
            return False
        return self.type == "shared" or consumer_id == self.active_consumer()

    # --- reading the log -------------------------------------------------------------------

    def wants_read(self) -> bool:
        return self._ready_count < self.read_ahead_entries

    def on_read(
        self,
        objects: Iterable[LedgerObject],
        ledgers: Iterable[tuple[int, int | None]],
        tail: Position | None,
    ) -> int:
        """Take in ledger objects from the log (in log order). Returns entries taken in."""
        self.cursor.learn_ledgers(ledgers)
        self.tail = tail
        taken = 0
        for obj in objects:
            first_key = key_of(obj.ledger_id, obj.first_entry)
            read_key = key_of(*self.read_position)
            start = max(0, read_key - first_key) if obj.ledger_id == self.read_position[0] else 0
            if obj.ledger_id < self.read_position[0] or start >= obj.count:
                continue
            taken += self._take_in(obj, np.arange(start, obj.count))
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
        self.cursor.learn_ledgers(ledgers)
        through = self.tracker.persisted_through()
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
            span = BitMap64()
            span.add_range(key_of(ledger_id, lo), key_of(ledger_id, size))
            acked = self.cursor.acked.get(ledger_id)
            if acked:
                entries = np.frombuffer(acked.to_array(), dtype=np.uint32).astype(np.uint64)
                span -= BitMap64((np.uint64(ledger_id) << np.uint64(SHIFT)) | entries)
            loose |= span
        if loose:
            loose -= self.tracker.tracked_among(loose)
        self.unread = loose
        self.read_position = max(resume, self.read_position)
        return len(loose)

    def next_unread(self, max_positions: int) -> list[int]:
        """The lowest loose positions still to re-read (see resume_after_buckets)."""
        return list(itertools.islice(self.unread, max_positions))

    def on_reread(self, objects: Iterable[LedgerObject], keys: Iterable[int]) -> int:
        """Take in the loose positions ``keys`` from the ledger objects holding them (a
        position the log no longer has is dropped). Returns entries taken in."""
        chunk = BitMap64(keys) & self.unread
        self.unread -= chunk
        taken = 0
        for obj in objects:
            lo = key_of(obj.ledger_id, obj.first_entry)
            span = BitMap64()
            span.add_range(lo, lo + obj.count)
            inside = chunk & span
            if not inside:
                continue
            chunk -= inside
            idx = np.fromiter(inside, dtype=np.uint64, count=len(inside)).astype(np.int64) - lo
            taken += self._take_in(obj, idx)
        if chunk:
            log.error(
                "subscription %s: %d positions are gone from the log, first %s",
                self.name,
                len(chunk),
                position_of(chunk.min()),
            )
        return taken

    def _take_in(self, obj: LedgerObject, idx: np.ndarray) -> int:
        """Entries ``idx`` (ascending indexes) of ``obj``, read from the log: apply cancel
        markers, put not-yet-due delayed messages in the tracker, queue the rest."""
        ents = obj.entries
        if ents.cancels:
            is_marker = np.isin(idx, np.fromiter(ents.cancels, dtype=np.int64))
            for i in idx[is_marker].tolist():  # markers first
                self._apply_marker(
                    key_of(obj.ledger_id, obj.first_entry + i), key_of(*ents.cancels[i])
                )
                self.cursor.ack(np.array([obj.ledger_id]), np.array([obj.first_entry + i]))
            idx = idx[~is_marker]
        entry_ids = obj.first_entry + idx
        keep = self._unseen(obj.ledger_id, entry_ids)
        for e in entry_ids[~keep]:  # cancelled before they were read: ack them now
            k = key_of(obj.ledger_id, int(e))
            if k in self._cancelled_ahead:
                self._cancelled_ahead.discard(k)
                self.cursor.ack(np.array([obj.ledger_id]), np.array([int(e)]))
        idx, entry_ids = idx[keep], entry_ids[keep]
        ds = ents.deliver_at_ms[idx]
        now_due = np.ones(len(idx), dtype=bool)
        if self.type == "shared" and len(idx):
            delayed = ds != NO_DELAY
            if delayed.any():
                tracked = self.tracker.add_messages(
                    np.full(int(delayed.sum()), obj.ledger_id, dtype=np.int64),
                    entry_ids[delayed],
                    ds[delayed],
                )
                now_due[np.flatnonzero(delayed)[tracked]] = False
        if now_due.any():
            run_keys = (np.int64(obj.ledger_id) << SHIFT) | entry_ids[now_due]
            before = key_of(*self._dispatched_before) if self._dispatched_before[1] >= 0 else -1
            for k in run_keys[run_keys < before].tolist():  # only right after a restart
                self._counts.setdefault(k, 1)  # an earlier life may have delivered it
            self._ready.append(_Run(obj, idx[now_due], run_keys))
            self._ready_count += len(run_keys)
        return len(idx)

    def _unseen(self, ledger_id: int, entry_ids: np.ndarray) -> np.ndarray:
        """Which entries are neither acknowledged nor cancelled ahead of the read."""
        keep = np.ones(len(entry_ids), dtype=bool)
        md_l, md_e = self.cursor.mark_delete
        if ledger_id < md_l:
            keep[:] = False
            return keep
        if ledger_id == md_l:
            keep &= entry_ids > md_e
        bm = self.cursor.acked.get(ledger_id)
        if (
            bm
            and len(entry_ids)
            and bm.range_cardinality(int(entry_ids[0]), int(entry_ids[-1]) + 1)
        ):
            both = BitMap(entry_ids.astype(np.uint32)) & bm
            keep &= ~np.isin(entry_ids, np.fromiter(both, dtype=np.int64, count=len(both)))
        if self._cancelled_ahead:
            keys = (np.int64(ledger_id) << SHIFT) | entry_ids
            cancelled = np.fromiter(self._cancelled_ahead, dtype=np.uint64).astype(np.int64)
            keep &= ~np.isin(keys, cancelled)
        return keep

    # --- delivering -------------------------------------------------------------------------

    def collect_due(self, now_ms: int, max_messages: int) -> None:
        """Move due delayed positions and expired ack deadlines into the redelivery set."""
        self.expire(now_ms)
        if len(self.redeliver) < max_messages and self.tracker.has_message_available():
            due = self.tracker.get_scheduled_messages(max_messages)
            self.redeliver.update([(lg << SHIFT) | e for lg, e in due])

    def keys_to_fetch(self, max_messages: int) -> list[int]:
        """The redelivery-set positions to hand out next (lowest first); the actor fetches
        their payloads, then calls :meth:`deliver`."""
        return list(itertools.islice(self.redeliver, max_messages))

    def dead_letters(self, max_messages: int) -> list[int]:
        out: list[int] = []
        for k in self.dead:
            out.append(k)
            if len(out) >= max_messages:
                break
        return out

    def deliver(
        self,
        consumer_id: str,
        fetched: list[tuple[LedgerObject, np.ndarray, np.ndarray]],
        max_messages: int,
        now_ms: int,
    ) -> list[Delivery]:
        """Hand up to ``max_messages`` to ``consumer_id``: fetched redeliveries first (groups
        of (object, indexes, position keys)), then the read-ahead queue. Returns nothing for
        a FIFO subscription's standby consumer."""
        if not self.can_receive(consumer_id):
            return []
        out: list[Delivery] = []
        room = max_messages
        for obj, idx, keys in sorted(fetched, key=lambda g: int(g[2][0]) if len(g[2]) else 0):
            if room <= 0:
                break
            # only what is still waiting: another receive, an ack or a cancel may have won
            waiting = BitMap64(keys.astype(np.uint64)) & self.redeliver
            if len(waiting) < len(keys):
                keep = np.isin(keys, np.fromiter(waiting, dtype=np.uint64).astype(np.int64))
                idx, keys = idx[keep], keys[keep]
            idx, keys = idx[:room], keys[:room]
            if len(keys):
                self.redeliver -= BitMap64(keys.astype(np.uint64))
                out.append(self._hand_out(consumer_id, obj, idx, keys, now_ms))
                room -= len(keys)
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
            keep = self._unseen(int(keys[0] >> SHIFT), keys & LOW)  # acked since (cancels)
            if not keep.all():
                idx, keys = idx[keep], keys[keep]
            if len(keys):
                out.append(self._hand_out(consumer_id, run.obj, idx, keys, now_ms))
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
        self, consumer_id: str, obj: LedgerObject, idx: np.ndarray, keys: np.ndarray, now_ms: int
    ) -> Delivery:
        deadline = now_ms + self.ack_timeout_ms if self.ack_timeout_ms else 0
        klist = keys.tolist()
        self._pending.update(dict.fromkeys(klist, (consumer_id, deadline)))
        self._consumers[consumer_id].pending.update(klist)
        if deadline:
            self._deadline_seq += 1
            heapq.heappush(self._deadlines, (deadline, self._deadline_seq, klist))
        self.counters["delivered"] += len(klist)
        if self._counts:
            counts = np.array([self._counts.get(k, 0) for k in klist], dtype=np.int64)
        else:
            counts = np.zeros(len(klist), dtype=np.int64)
        return Delivery(obj, idx, keys, counts)

    def drop_missing(self, keys: Iterable[int]) -> int:
        """Positions the log no longer has (deleted): nothing can deliver them; ack them."""
        n = 0
        for k in keys:
            if k in self.redeliver or k in self.dead:
                log.error(
                    "subscription %s: position %s is gone from the log", self.name, position_of(k)
                )
                self.redeliver.discard(k)
                self.dead.discard(k)
                self._ack_keys([k])
                n += 1
        return n

    # --- acks, nacks, timeouts ------------------------------------------------------------------

    def ack(self, consumer_id: str, keys: Iterable[int]) -> int:
        """Acknowledge positions; returns how many were newly acknowledged."""
        return self._ack_keys(keys)

    def _ack_keys(self, keys: Iterable[int]) -> int:
        ks = np.fromiter(keys, dtype=np.int64)
        if len(ks) == 0:
            return 0
        klist = ks.tolist()
        pop = self._pending.pop
        owners = {o[0] for o in (pop(k, None) for k in klist) if o is not None}
        for owner in owners:
            c = self._consumers.get(owner)
            if c is not None:
                c.pending.difference_update(klist)
        if self._counts:
            for k in klist:
                self._counts.pop(k, None)
        if self.redeliver or self.dead:
            gone = BitMap64(klist)
            self.redeliver -= gone
            self.dead -= gone
        added = self.cursor.ack(ks >> SHIFT, ks & LOW)
        self.counters["acked"] += added
        return added

    def nack(self, consumer_id: str, keys: Iterable[int], delay_ms: int, now_ms: int) -> int:
        """Give positions back: redeliver after ``delay_ms`` (milliseconds), through the tracker."""
        n = 0
        for k in keys:
            owner = self._pending.get(k)
            if owner is None or owner[0] != consumer_id:
                continue
            del self._pending[k]
            self._consumers[consumer_id].pending.discard(k)
            n += 1
            if delay_ms > 0 and not self._over_limit(k):
                self._counts[k] = self._counts.get(k, 0) + 1
                if self.tracker.add_message(*position_of(k), now_ms + delay_ms):
                    continue
                self.redeliver.add(k)
                continue
            self._schedule_redelivery(k)
        return n

    def expire(self, now_ms: int) -> int:
        """Ack timeouts: unacked deliveries past their deadline go back for redelivery."""
        n = 0
        while self._deadlines and self._deadlines[0][0] <= now_ms:
            deadline, _, keys = heapq.heappop(self._deadlines)
            for k in keys:
                owner = self._pending.get(k)
                if owner is None or owner[1] != deadline:
                    continue  # acked, nacked or delivered again since
                del self._pending[k]
                c = self._consumers.get(owner[0])
                if c is not None:
                    c.pending.discard(k)
                self._schedule_redelivery(k)
                n += 1
        return n

    def _over_limit(self, k: int) -> bool:
        return self.max_redeliveries is not None and self._counts.get(k, 0) >= self.max_redeliveries

    def _schedule_redelivery(self, k: int) -> None:
        if self._over_limit(k):
            self.dead.add(k)
            return
        self._counts[k] = self._counts.get(k, 0) + 1
        self.counters["redelivered"] += 1
        self.redeliver.add(k)

    def dead_lettered(self, keys: Iterable[int]) -> int:
        """The actor published these to the dead-letter topic: ack them."""
        keys = list(keys)
        self.counters["dead_lettered"] += len(keys)
        return self._ack_keys(keys)

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

    def _apply_cancel(self, k: int) -> bool:
        lg, e = position_of(k)
        if self.cursor.is_acked(lg, e) or k in self._pending or k in self.dead:
            return False
        if self._counts.get(k, 0) > 0:
            return False  # delivered before and waiting for a redelivery
        if (lg, e) >= self.read_position:
            self._cancelled_ahead.add(k)
            self.counters["cancelled"] += 1
            return True
        self.tracker.remove_message(lg, e)
        self._ack_keys([k])  # drops it from the redelivery set and the read-ahead queue
        self.counters["cancelled"] += 1
        return True

    # --- timers and stats -----------------------------------------------------------------------

    def has_deliverable(self) -> bool:
        return bool(self.redeliver) or bool(self._ready) or self.tracker.has_message_available()

    def next_wakeup_ms(self) -> int | None:
        """When something may next become deliverable (epoch ms), or None."""
        times = [t for t in (self.tracker.next_delivery_time(),) if t is not None]
        if self._deadlines:
            times.append(self._deadlines[0][0])
        return min(times) if times else None

    def pending_count(self) -> int:
        return len(self._pending)

    def ready_count(self) -> int:
        return self._ready_count

    def stats(self) -> dict:
        buckets = getattr(self.tracker, "immutable_bucket_count", lambda: 0)()
        return {
            "type": self.type,
            "delayed": self.tracker.number_of_delayed_messages(),
            "backlog": self.cursor.unacked_between(self.tail),
            "pending_ack": len(self._pending),
            "buckets": buckets,
            "redelivery": len(self.redeliver),
            "dead_letter_pending": len(self.dead),
            "read_ahead": self._ready_count,
            "unread": len(self.unread),
            "mark_delete": list(self.cursor.mark_delete),
            "consumers": len(self._consumers),
            **self.counters,
        }
