"""One subscription on one partition: what to deliver, to whom, and when (pure: no Ray).

:class:`Subscription` is a thin owner: it wires the parts below, each in its own module
with its own concern, and drives them through two entry points its actor calls:

- :meth:`Subscription.receive` is one consumer's receive, the whole sequence: move the
  write-ahead marks (written through the injected :class:`CursorWriter` before anything
  beyond them goes out), collect due messages, flush dead letters (through the injected
  :class:`DeadLetterPublisher`), fetch payloads (staged, cached, else through the
  :class:`Fetch` the caller passes) and hand them out.
- :meth:`Subscription.step` is one step of the background work: apply what the log
  reader brought, expire ack deadlines and consumer leases, and say (a :class:`Step`)
  what I/O is due (sealed segments to load, a query of the host's unsealed index, dead
  letters to flush, a cursor write) and when to step again. The driver does that I/O and
  hands the results back.

The parts:

| part | module | concern |
|---|---|---|
| ``marks`` | :mod:`~raydelay.dispatch.marks` | cursor, log cursor, dispatch and delayed marks, their writes |
| ``consumer_table`` | :mod:`~raydelay.dispatch.consumers` | consumers, leases, what each holds, ack deadlines |
| ``redelivery`` | :mod:`~raydelay.dispatch.redelivery` | the redelivery set, counts, nack, dead letters |
| ``reading`` | :mod:`~raydelay.dispatch.reading` | the log read, the read-ahead queue, loose re-reads |
| ``unsealed`` | :mod:`~raydelay.dispatch.tail` | the host's unsealed index: due queries, rows held ahead |
| ``staging``, ``due`` | :mod:`~raydelay.dispatch.staging`, :mod:`~raydelay.dispatch.due` | due rows with payloads |
| ``buckets`` | :mod:`~raydelay.dispatch.adoption` | adopting sealed buckets, finishing them |
| ``key_pool`` | :mod:`~raydelay.dispatch.keypool` | key_shared: one key to one consumer at a time |
| ``handout`` | :mod:`~raydelay.dispatch.handout` | what a receive hands out, in delivery order |
| ``payloads`` | :mod:`~raydelay.dispatch.payloads` | payloads: staged, cached, fetched; dead letters' flush |
| ``acks`` | :mod:`~raydelay.dispatch.acks` | one ack through every part |
| ``cancels`` | :mod:`~raydelay.dispatch.cancels` | cancel markers |
| ``settled`` | :mod:`~raydelay.dispatch.settled` | delayed rows settled before they fall due |
| (stats) | :mod:`~raydelay.dispatch.counts` | the counts a subscription reports |
| ``peeks`` | :mod:`~raydelay.dispatch.peeking` | the schedule as a peek shows it |

``exclusive`` and ``failover`` ignore ``deliver_at`` and deliver in log order. Positions
are int64 keys (:func:`raydelay.positions.key_of`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import numpy as np

from raydelay.clock import Clock
from raydelay.delayed.reader import Progress, SealedReader
from raydelay.delayed.sealed import SealedMeta
from raydelay.dispatch.acks import Acks
from raydelay.dispatch.adoption import BucketAdoption
from raydelay.dispatch.cancels import Cancels
from raydelay.dispatch.consumers import ConsumerTable
from raydelay.dispatch.counts import subscription_stats
from raydelay.dispatch.cursor import Cursor, Position
from raydelay.dispatch.due import SEALED_WINDOW, DueRows, due_by
from raydelay.dispatch.handout import HandOut
from raydelay.dispatch.keypool import KeyPool
from raydelay.dispatch.marks import DELAYED_MARK_STEP_MS, DISPATCH_MARK_STEP, CursorMarks
from raydelay.dispatch.payloads import DEAD_LETTER_BATCH, Payloads
from raydelay.dispatch.peek import PeekRange
from raydelay.dispatch.peeking import Peek
from raydelay.dispatch.ports import (
    CursorWriter,
    DeadLetterPublisher,
    Delivery,
    Fetch,
    Group,
    ReadSegments,
    ReadUnsealed,
    Source,
    Step,
    TailQuery,
    Tracker,
)
from raydelay.dispatch.reading import LogReading
from raydelay.dispatch.redelivery import Redelivery
from raydelay.dispatch.settled import SettledDelayed
from raydelay.dispatch.staging import Staging
from raydelay.dispatch.tail import TAIL_IDLE_POLL_MS, TAIL_POLL_MS, UnsealedTail
from raydelay.errors import ConsumerBusy, InvalidArgument
from raydelay.log.entries import DelayedRun, LedgerObject, Rows
from raydelay.subscription_types import check_subscription_type

__all__ = [
    "DEAD_LETTER_BATCH",
    "DELAYED_MARK_STEP_MS",
    "DISPATCH_MARK_STEP",
    "SEALED_WINDOW",
    "TAIL_IDLE_POLL_MS",
    "TAIL_POLL_MS",
    "ConsumerBusy",
    "CursorWriter",
    "DeadLetterPublisher",
    "Delivery",
    "Fetch",
    "Group",
    "ReadSegments",
    "ReadUnsealed",
    "Source",
    "Step",
    "Subscription",
    "TailQuery",
    "Tracker",
]

log = logging.getLogger(__name__)


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
        ``lookahead_ms``: the due queries of the host's unsealed index ask for the rows
        due within this many ms, which wait here with their payloads and go out at their
        due instant (0: asked for only once due)."""
        spread = check_subscription_type(subscription_type).spreads
        if max_redeliveries is not None and publish_dead_letters is None:
            raise InvalidArgument("publish_dead_letters: required with max_redeliveries")
        self.name = name
        self.type = subscription_type
        self.tracker = tracker
        self._clock = clock
        keyed = subscription_type == "key_shared"
        # The sealed buckets of the partition (shared subscriptions): due rows come from
        # them with their payloads; the log is read for everything else.
        self.sealed = sealed if spread else None
        self._spread = spread  # honours deliver_at (exclusive and failover do not)
        self.lookahead_ms = lookahead_ms
        self.consumer_lease_ms = consumer_lease_ms
        self.max_fetch = max_fetch
        self.max_staged_rows = max_staged_rows
        self.counters = {
            "delivered": 0,
            "acked": 0,
            "redelivered": 0,
            "cancelled": 0,
            "dead_lettered_since_start": 0,  # (``dead_lettered`` is the cursor's, over its life)
        }
        cursor = cursor or Cursor()
        md_l, md_e = cursor.mark_delete
        self.marks = CursorMarks(
            cursor=cursor,
            dispatched_before=dispatched_before,
            read_position=(md_l, md_e + 1),
            write_cursor=write_cursor,
            persist_interval_ms=cursor_persist_interval_ms,
        )
        self.consumer_table = ConsumerTable(
            name=name,
            clock=clock,
            exclusive=subscription_type == "exclusive",
            spread=spread,
            keyed=keyed,
            ack_timeout_ms=ack_timeout_ms,
        )
        self.redelivery = Redelivery(
            consumers=self.consumer_table,
            tracker=tracker,
            cursor=cursor,
            counters=self.counters,
            max_redeliveries=max_redeliveries,
            spread=spread,
        )
        self.acks = Acks(
            name=name,
            consumers=self.consumer_table,
            redelivery=self.redelivery,
            marks=self.marks,
            counters=self.counters,
        )
        self.unsealed = UnsealedTail(lookahead_ms=lookahead_ms)
        self.settled = SettledDelayed(cursor.settled, cursor.settled_due)
        self.staging = Staging()
        self.reading = LogReading(
            name=name,
            marks=self.marks,
            tracker=tracker,
            sealed=self.sealed,
            tail=self.unsealed,
            redelivery=self.redelivery,
            settled=self.settled,
            spread=spread,
            read_ahead_entries=read_ahead_entries,
            cached_entries=cached_entries,
        )
        self.cancels = Cancels(
            marks=self.marks,
            consumers=self.consumer_table,
            redelivery=self.redelivery,
            tracker=tracker,
            counters=self.counters,
            read_position=lambda: self.reading.read_position,
            ack_keys=self.acks.ack_keys,
            settle=self._settle_cancelled,
        )
        self.reading.cancels, self.acks.reading = self.cancels, self.reading
        self.key_pool: KeyPool | None = None
        if keyed:
            self.key_pool = KeyPool(
                consumers=self.consumer_table,
                redelivery=self.redelivery,
                staging=self.staging,
                take_ready=self.reading.take_ready,
                cap=10 * read_ahead_entries,
            )
            self.consumer_table.slots_known = self.key_pool.slots_known
            self.acks.key_pool = self.key_pool
        parts = dict(
            tracker=tracker,
            sealed=self.sealed,
            tail=self.unsealed,
            staging=self.staging,
            redelivery=self.redelivery,
            marks=self.marks,
            cancels=self.cancels,
        )
        self.due = DueRows(**parts, settled=self.settled, keys=self.key_pool)  # type: ignore[arg-type]
        self.peeks = Peek(**parts, consumers=self.consumer_table)  # type: ignore[arg-type]
        self.handout = HandOut(
            consumers=self.consumer_table,
            redelivery=self.redelivery,
            reading=self.reading,
            keys=self.key_pool,
            counters=self.counters,
        )
        self.buckets = (
            BucketAdoption(
                sealed=self.sealed,
                tail=self.unsealed,
                marks=self.marks,
                cancels=self.cancels,
                reading=self.reading,
            )
            if self.sealed is not None
            else None
        )
        self.payloads = Payloads(
            name=name,
            staging=self.staging,
            objects=self.reading.objects,
            redelivery=self.redelivery,
            ack_keys=self.acks.ack_keys,
            dead_lettered=self.acks.dead_lettered,
            publish_dead_letters=publish_dead_letters,
        )
        self.stepped_ms = -1  # the latest time step() or collect_due() was given (epoch ms)
        # The most a consumer here asks to be handed ahead of due (ms): delayed rows due
        # within it go to a consumer that holds them until their instant (its client
        # does), so that the round trip back is made before the due time, not after it.
        # The driver wakes that much before a due row; a receive that asks less never
        # gets a row another one's horizon let in early (see :meth:`receive`).
        self.ahead_ms = 0
        self._ahead_of: dict[str, int] = {}  # consumer -> what its last receive asked
        # The earliest deliver_at of a row a receive left out as not due by its horizon
        # (one let in early for another consumer, handed back, or popped early by a
        # tracker that is not strict): the driver wakes for it. ``wake_needed``: it moved
        # earlier since the driver last looked (the shell wakes the driver then).
        self.withheld_ms: int | None = None
        self.wake_needed = False

    @property
    def cursor(self) -> Cursor:
        return self.marks.cursor

    # --- consumers ---------------------------------------------------------------------------

    def add_consumer(self, consumer_id: str, now_ms: int | None = None) -> None:
        self.consumer_table.add(consumer_id, now_ms)

    def touch(self, consumer_id: str, now_ms: int | None = None) -> bool:
        """The consumer was heard from: its lease starts again (False: no such consumer)."""
        return self.consumer_table.touch(consumer_id, now_ms)

    def expire_consumers(self, now_ms: int, lease_ms: int) -> list[tuple[str, int]]:
        """Remove the consumers not heard from for ``lease_ms`` (their process died, or
        lost touch): their unacked messages go back for redelivery, a failover
        subscription's next consumer becomes active, an exclusive one's slot is free.
        Returns (consumer, messages handed back) for each one removed."""
        gone = self.consumer_table.lapsed(now_ms, lease_ms)
        return [(cid, self.remove_consumer(cid)) for cid in gone]

    def consumer_leases(self, now_ms: int) -> dict[str, dict]:
        """Per consumer: messages it holds unacked and ms since it was last heard from."""
        return self.consumer_table.leases(now_ms)

    def remove_consumer(self, consumer_id: str) -> int:
        """Forget a consumer; its unacked messages go to the redelivery set."""
        if self._ahead_of.pop(consumer_id, None) is not None:
            self.ahead_ms = max(self._ahead_of.values(), default=0)
        return self.redelivery.hand_back(consumer_id)

    def consumers(self) -> list[str]:
        return self.consumer_table.ids()

    def active_consumer(self) -> str | None:
        """The consumer a FIFO subscription delivers to (the oldest one)."""
        return self.consumer_table.active()

    def can_receive(self, consumer_id: str) -> bool:
        return self.consumer_table.can_receive(consumer_id)

    # --- reading the log ---------------------------------------------------------------------

    def wants_read(self) -> bool:
        """Whether the log reader may read on (see :meth:`LogReading.wants_read`)."""
        return self.reading.wants_read()

    def offer_read(
        self,
        objects: list[LedgerObject | DelayedRun],
        ledgers: list[tuple[int, int | None]],
        tail: Position | None,
        buckets_changed: bool = False,
    ) -> None:
        """The log reader's answer, for the next :meth:`step` to apply; ``buckets_changed``:
        the host's sealed buckets changed since they were adopted."""
        if buckets_changed and self.sealed is not None:
            self.unsealed.dirty = self.unsealed.buckets_stale = True
        self.reading.offer_read(objects, ledgers, tail)

    def offer_reread(self, rows: Rows, keys: np.ndarray) -> None:
        """Rows the log returned for loose positions, for the next :meth:`step` to apply."""
        self.reading.offer_reread(rows, keys)

    def on_read(
        self,
        objects: Iterable[LedgerObject | DelayedRun],
        ledgers: Iterable[tuple[int, int | None]],
        tail: Position | None,
    ) -> int:
        """Take in ledger objects from the log (see :meth:`LogReading.on_read`)."""
        return self.reading.on_read(objects, ledgers, tail)

    def resume_after_buckets(self, ledgers: Iterable[tuple[int, int | None]]) -> int:
        """At startup, before any read: skip the part of the log the persisted buckets
        cover (see :meth:`LogReading.resume_after_buckets`). Returns how many positions
        are loose."""
        ledgers = list(ledgers)
        self.marks.learn_ledgers(ledgers)
        if self.buckets is not None:
            self.buckets.ack_gone_ledgers({i for i, _ in ledgers})
        before = self.reading.read_position
        loose = self.reading.resume_after_buckets(ledgers)
        self.cancels.read_jumped(before, self.reading.read_position)
        return loose

    def next_unread(self, max_positions: int) -> list[int]:
        """The lowest loose positions still to re-read (see resume_after_buckets)."""
        return self.reading.next_unread(max_positions)

    def on_reread(self, rows: Rows, keys: Iterable[int] | np.ndarray) -> int:
        """Take in loose positions re-read from the log (see :meth:`LogReading.on_reread`)."""
        return self.reading.on_reread(rows, keys)

    # --- the receive sequence ------------------------------------------------------------------

    async def receive(
        self, consumer_id: str, fetch: Fetch, max_messages: int, now_ms: int, ahead_ms: int = 0
    ) -> list[Delivery]:
        """One receive of up to ``max_messages`` for ``consumer_id`` at ``now_ms`` (epoch
        ms): move the write-ahead marks (the cursor is written before anything beyond
        them goes out), collect due messages, flush dead letters, fetch the payloads of
        redeliveries (``fetch`` reads what is neither staged nor cached), and hand them
        out, then read-ahead entries. Nothing goes to a FIFO subscription's standby.
        ``ahead_ms``: delayed rows of the host's index due by ``now_ms + ahead_ms`` go out
        too (the consumer's client holds them until they are due; see ``ahead_ms``)."""
        if not self.can_receive(consumer_id):
            return []
        horizon = now_ms + ahead_ms
        if self._ahead_of.get(consumer_id) != ahead_ms:
            self._ahead_of[consumer_id] = ahead_ms
            self.ahead_ms = max(self._ahead_of.values())
        if self.needs_delayed_mark(horizon) and self.due.delayed_due(horizon):
            await self.marks.move_delayed_mark(horizon)
        mark = self.wanted_mark()
        if mark is not None:
            await self.persist(force=True, mark=mark)
        self.collect_due(now_ms, max_messages, horizon)
        if self.redelivery.dead:
            await self.flush_dead_letters(fetch)
        keys = self.keys_to_fetch(max_messages, consumer_id)
        fetched = await self.fetch_payloads(fetch, keys, self.max_fetch)
        if self._spread:  # (rows let in early for another, or handed back by one, wait)
            fetched, later = due_by(fetched, horizon)
            if later is not None and (self.withheld_ms is None or later < self.withheld_ms):
                self.withheld_ms = later
                self.wake_needed = True
        return self.deliver(consumer_id, fetched, max_messages, now_ms)

    async def fetch_payloads(
        self, fetch: Fetch, keys: np.ndarray, max_reads: int | None = None
    ) -> list[Group]:
        """Payloads for positions, grouped by source (see :meth:`Payloads.fetch`)."""
        return await self.payloads.fetch(fetch, keys, max_reads)

    async def flush_dead_letters(self, fetch: Fetch) -> int:
        """Publish waiting dead letters, then ack them (see :meth:`Payloads.flush_dead_letters`)."""
        return await self.payloads.flush_dead_letters(fetch)

    async def persist(self, *, force: bool = False, mark: Position | None = None) -> bool:
        """Write the cursor (see :meth:`CursorMarks.persist`). Returns whether it wrote."""
        return await self.marks.persist(force=force, mark=mark)

    # --- the background step -------------------------------------------------------------------

    def step(self, now_ms: int) -> Step:
        """One step of the background work at ``now_ms`` (epoch ms): apply what the log
        reader brought, send expired ack deadlines and the messages of consumers whose
        lease lapsed back for redelivery, drop staged payloads no longer waiting, and say
        what I/O is due and when to step again (see :class:`Step`)."""
        self.stepped_ms = max(self.stepped_ms, now_ms)
        self.reading.apply_offers()
        self.expire(now_ms)
        expired = (
            self.expire_consumers(now_ms, self.consumer_lease_ms)
            if self.consumer_lease_ms is not None
            else []
        )
        self.prune_staged(self.max_staged_rows)
        soon = self.due.next_delayed_ms()
        persist = self.marks.write_due(now_ms, soon)
        sealed = self.sealed
        return Step(
            wake_at_ms=self._wake_at_ms(now_ms, soon),
            deliverable=self.has_deliverable(now_ms),
            wants_read=self.wants_read(),
            expired=expired,
            loads=sealed.wanted(now_ms) if sealed is not None else [],
            tail_query=self.unsealed.query(now_ms) if sealed is not None else None,
            dead_letters=self.payloads.flush_due(),
            persist=persist,
        )

    def _wake_at_ms(self, now_ms: int, next_delayed_ms: int | None = None) -> int | None:
        """The earliest time after ``now_ms`` something is due: a delivery, an ack
        deadline, a cursor write, a poll of the unsealed index, a sealed segment to load,
        a lease to lapse."""
        times = [self.next_wakeup_ms(next_delayed_ms), self.marks.next_write_ms()]
        if self.ahead_ms:  # a receive that asks ahead is woken that much before a due row
            soon = self.due.next_delayed_ms() if next_delayed_ms is None else next_delayed_ms
            if soon is not None:
                times.append(soon - self.ahead_ms)
        if self.withheld_ms is not None:
            if self.withheld_ms <= now_ms:  # (due now: the step's notice wakes the receives)
                self.withheld_ms = None
            else:
                times += [self.withheld_ms - self.ahead_ms, self.withheld_ms]
        if self.sealed is not None:
            times += [self.unsealed.refill_ms(), self.sealed.next_load_ms()]
            times.append(self.unsealed.poll_ms())
        times.append(self.consumer_table.lease_end_ms(self.consumer_lease_ms))
        later = [t for t in times if t is not None and t > now_ms]
        return min(later) if later else None

    def tail_failed(self) -> None:
        """The due query of the unsealed index failed: ask again at the next poll."""
        self.unsealed.failed()

    def take_unsealed(
        self, rows: Rows, below: int, through_ms: int, next_d: int, waiting: int
    ) -> int:
        """Take in the host's answer to a due query of its unsealed index (see
        :meth:`UnsealedTail.answer`); returns the rows taken. Adopt the buckets the answer
        says are sealed before this."""
        n = self.unsealed.answer(rows, below, through_ms, next_d, waiting)
        if n:
            self.reading.see_end(int(rows.positions.max()))
        return n

    # --- delivering ----------------------------------------------------------------------------

    def collect_due(self, now_ms: int, max_messages: int, horizon_ms: int | None = None) -> None:
        """Move due delayed positions and expired ack deadlines into the redelivery set
        (see :meth:`DueRows.collect`); rows of the host's index due by ``horizon_ms``
        (``now_ms`` when None) count as due."""
        self.stepped_ms = max(self.stepped_ms, now_ms)
        self.expire(now_ms)
        self.due.collect(now_ms if horizon_ms is None else horizon_ms, max_messages)

    def needs_delayed_mark(self, now_ms: int) -> bool:
        """Whether the delayed mark must move (be persisted) before delayed rows due up to
        ``now_ms`` may go out."""
        return self.sealed is not None and self.marks.needs_delayed_mark(now_ms)

    def staged(self, keys: np.ndarray) -> tuple[list[Group], np.ndarray]:
        """The staged rows of ``keys`` and the keys not staged (see :meth:`Staging.lookup`)."""
        return self.staging.lookup(keys)

    def prune_staged(self, max_rows: int) -> None:
        """Drop staged rows no longer waiting for delivery (see :meth:`Staging.prune`)."""
        self.staging.prune(max_rows, self.redelivery.redeliver)

    def adopt(
        self,
        meta: SealedMeta,
        done: Progress = 0,
        later: tuple[int, tuple[int, int]] | None = None,
    ) -> list[str]:
        """The host sealed a bucket: adopt it (see :meth:`BucketAdoption.adopt`)."""
        return self.buckets.adopt(meta, done, later) if self.buckets is not None else []

    def advance_buckets(self) -> list[str]:
        """Move each bucket's progress over segments whose rows are all acknowledged;
        returns the buckets this subscription is now done with."""
        return self.buckets.advance() if self.buckets is not None else []

    def keys_to_fetch(self, max_messages: int, consumer_id: str | None = None) -> np.ndarray:
        """The redelivery-set positions to hand out next (see :meth:`HandOut.keys_to_fetch`)."""
        return self.handout.keys_to_fetch(max_messages, consumer_id)

    def deliver(
        self, consumer_id: str, fetched: list[Group], max_messages: int, now_ms: int
    ) -> list[Delivery]:
        """Hand up to ``max_messages`` to ``consumer_id`` (see :meth:`HandOut.deliver`)."""
        return self.handout.deliver(consumer_id, fetched, max_messages, now_ms)

    def wanted_mark(self) -> Position | None:
        """Where the dispatch mark must move next (persist it first); None: it need not."""
        return self.reading.wanted_mark()

    def drop_missing(self, keys: Iterable[int] | np.ndarray) -> int:
        """Positions the log no longer has (deleted): nothing can deliver them; ack them."""
        return self.payloads.drop_missing(keys)

    # --- acks, nacks, timeouts -----------------------------------------------------------------

    def ack(self, consumer_id: str, keys: Iterable[int] | np.ndarray) -> int:
        """Acknowledge positions (see :meth:`Acks.ack`): any consumer may ack any message,
        as with Pulsar's ack by id (it need not hold it)."""
        return self.acks.ack(keys)

    def nack(
        self, consumer_id: str, keys: Iterable[int] | np.ndarray, delay_ms: int, now_ms: int
    ) -> int:
        """Give positions back: redeliver after ``delay_ms`` (see :meth:`Redelivery.nack`)."""
        return self.redelivery.nack(consumer_id, keys, delay_ms, now_ms)

    def redeliver_unacked(
        self, consumer_id: str, keys: np.ndarray | None = None, dry_run: bool = False
    ) -> int:
        """Pulsar's ``redeliverUnacknowledgedMessages`` (see
        :meth:`Redelivery.redeliver_unacked`)."""
        return self.redelivery.redeliver_unacked(consumer_id, keys, dry_run)

    def expire(self, now_ms: int) -> int:
        """Ack timeouts: unacked deliveries past their deadline go back for redelivery."""
        return self.redelivery.expire(now_ms)

    def dead_lettered(self, keys: Iterable[int] | np.ndarray) -> int:
        """These were published to the dead-letter topic: ack them."""
        return self.acks.dead_lettered(keys)

    # --- cancel --------------------------------------------------------------------------------

    def cancel(self, ledger_id: int, entry_id: int, marker: Position) -> bool:
        """Apply the cancel marker at ``marker`` of the position (ledger_id, entry_id) (see
        :meth:`Cancels.cancel`)."""
        return self.cancels.cancel(ledger_id, entry_id, marker)

    def _settle_cancelled(self, key: int) -> None:
        """A cancel acknowledges ``key``, read already and not in the tracker: with sealed
        buckets, unless it waits for delivery (in the redelivery set, the read-ahead queue,
        the loose positions to re-read, or held here due), the host's index or a bucket
        holds it and counts it until it falls due: it is settled (see
        :mod:`raydelay.dispatch.settled`)."""
        if self.sealed is None or key in self.redelivery.redeliver or key in self.reading.unread:
            return
        if self.reading.queued(key):
            return
        held_ms = self.unsealed.held_due_ms(key)
        if held_ms is not None and held_ms <= self.stepped_ms:
            return
        self.settled.add_one(key, held_ms)

    def learn_cancels(self, pairs: Iterable[tuple[Position, Position]]) -> int:
        """Take in the log's cancel markers from the first unacknowledged position on (at
        startup, before anything is delivered). Returns how many."""
        return self.cancels.learn(pairs, self.reading.start_position)

    async def peek(
        self,
        q: PeekRange,
        fetch: Fetch,
        read_segments: ReadSegments,
        read_unsealed: ReadUnsealed | None = None,
        unknown: Sequence[SealedMeta] = (),
    ) -> tuple[Rows, np.ndarray]:
        """The next scheduled messages not delivered yet (see :meth:`Peek.peek`)."""
        return await self.peeks.peek(q, fetch, read_segments, read_unsealed, unknown)

    # --- timers and stats ----------------------------------------------------------------------

    def has_deliverable(self, now_ms: int) -> bool:
        return (
            bool(self.redelivery.redeliver)
            or self.reading.has_ready()
            or self.due.has_due(now_ms + self.ahead_ms)
        )

    def next_wakeup_ms(self, next_delayed_ms: int | None = None) -> int | None:
        """When something may next become deliverable (epoch ms), or None
        (``next_delayed_ms``: the due rows' own, when the caller has it)."""
        if next_delayed_ms is None:
            next_delayed_ms = self.due.next_delayed_ms()
        times = [
            self.tracker.next_delivery_time(),
            next_delayed_ms,
            self.consumer_table.next_deadline_ms(),
        ]
        known = [t for t in times if t is not None]
        return min(known) if known else None

    def pending_count(self) -> int:
        return self.consumer_table.pending_count()

    def ready_count(self) -> int:
        return self.reading.ready_count

    def stats(self) -> dict:
        """The subscription's counts (see :func:`raydelay.dispatch.counts.subscription_stats`)."""
        return subscription_stats(self)
