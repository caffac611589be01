"""The counts a subscription reports (:mod:`raydelay.dispatch.counts`), on the pure
Subscription over sealed buckets with the topic's index answering as its host would:
cancelled messages leave ``delayed`` and the due histogram, dead letters are counted and
the count survives a restart, and a model checks every count under random sequences."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import hypothesis.strategies as st
import numpy as np
from hypothesis import HealthCheck, given, settings

from raydelay.clock import ManualClock
from raydelay.delayed import InMemoryDelayedDeliveryTracker
from raydelay.delayed.reader import SealedReader
from raydelay.delayed.sealed import TopicIndex
from raydelay.dispatch import counts
from raydelay.dispatch.counts import delayed_count
from raydelay.dispatch.cursor import Cursor
from raydelay.dispatch.subscription import Subscription
from raydelay.log.entries import NO_DELAY, DelayedRun, Entries, LedgerObject, Rows
from raydelay.positions import key_of, position_of


class Host:
    """The topic's side as a subscription sees it: the log's objects and the unsealed
    index, answering due queries as the host does."""

    def __init__(self) -> None:
        self.index = TopicIndex(min_index_count=1_000_000)  # (nothing is sealed here)
        self.objects: list[LedgerObject] = []
        self.next_entry = 0

    def append(self, deliver_at: list[int], publish_ms: int) -> LedgerObject:
        n = len(deliver_at)
        entries = Entries.build(
            [b"m%d" % (self.next_entry + i) for i in range(n)],
            np.asarray(deliver_at, dtype=np.int64),
        )
        obj = LedgerObject(1, self.next_entry, publish_ms, entries, {})
        self.next_entry += n
        self.objects.append(obj)
        self.index.add(obj)
        return obj

    def append_marker(self, target: tuple[int, int], publish_ms: int) -> LedgerObject:
        """A cancel marker of ``target``, as the host appends it."""
        entries = Entries.build([b""], np.asarray([NO_DELAY]), cancels={0: target})
        obj = LedgerObject(1, self.next_entry, publish_ms, entries, {})
        self.next_entry += 1
        self.objects.append(obj)
        self.index.add(obj)
        return obj

    def tail(self) -> tuple[int, int]:
        return (1, self.next_entry - 1)

    def rows(self, keys: np.ndarray) -> Rows:
        """The log's rows at ``keys``, as its point read returns them."""
        parts = []
        for o in self.objects:
            ks = key_of(1, o.first_entry) + np.arange(o.count, dtype=np.int64)
            idx = np.flatnonzero(np.isin(ks, keys))
            if len(idx):
                parts.append(Rows(ks[idx], o.publish_times(idx), o.entries.take(idx)))
        return Rows.concat(parts)

    async def fetch(self, keys: np.ndarray) -> Rows:
        return self.rows(keys)


def writing_subscription(clock: ManualClock) -> tuple[Subscription, list[bytes]]:
    """A sealed subscription and the cursor versions it writes."""
    writes: list[bytes] = []

    async def write(data: bytes) -> None:
        writes.append(data)

    return sealed_subscription(clock, write_cursor=write), writes


def sealed_subscription(clock: ManualClock, **kw) -> Subscription:
    tracker = InMemoryDelayedDeliveryTracker(clock=clock, tick_time_ms=1, strict=True)
    sub = Subscription(
        name="t/0/s",
        subscription_type="shared",
        tracker=tracker,
        clock=clock,
        sealed=SealedReader(),
        **kw,
    )
    sub.add_consumer("c")
    return sub


def step(sub: Subscription, host: Host, now: int) -> None:
    """One background step at ``now``, its due query answered from the host's index."""
    query = sub.step(now).tail_query
    if query is not None:
        rows, below, next_d, waiting = host.index.due(query.below, query.through_ms, query.now_ms)
        sub.take_unsealed(rows, below, query.now_ms, next_d, waiting)


def test_cancelled_delayed_messages_leave_delayed_and_stay_within_the_backlog():
    # Given a shared subscription that read two delayed messages and one due now
    clock = ManualClock(1_000)
    host = Host()
    sub = sealed_subscription(clock)
    obj = host.append([60_000, 90_000, NO_DELAY], publish_ms=1_000)
    sub.offer_read([obj], [(1, None)], host.tail())
    step(sub, host, 1_000)
    assert (sub.stats()["delayed"], sub.stats()["backlog"]) == (2, 3)
    # When both delayed ones are cancelled (the markers' own entries acked)
    assert sub.cancel(1, 0, marker=(1, 3)) and sub.cancel(1, 1, marker=(1, 4))
    step(sub, host, 2_000)
    # Then they are neither delayed nor in the backlog
    s = sub.stats()
    assert (s["delayed"], s["backlog"]) == (0, 1)


def test_cancelled_delayed_messages_leave_the_due_histogram():
    # Given three delayed messages, one of them in an object of delayed entries only
    clock = ManualClock(1_000)
    host = Host()
    sub = sealed_subscription(clock)
    run = host.append([61_000, 62_000], publish_ms=1_000)
    sub.offer_read([DelayedRun(1, 0, 2, 61_000)], [(1, None)], host.tail())
    mixed = host.append([NO_DELAY, 3_601_000], publish_ms=1_000)
    sub.offer_read([mixed], [(1, None)], host.tail())
    step(sub, host, 1_000)
    edges = np.asarray([61_500, 3_600_000], dtype=np.int64)
    assert histogram(sub, host, edges, 1_000) == [1, 1, 1]
    # When one of the run and the one due in an hour are cancelled
    assert sub.cancel(1, 1, marker=(1, 4)) and sub.cancel(1, 3, marker=(1, 5))
    # Then neither is charted (the run's deliver_at is read from the log, as the actor does)
    assert histogram(sub, host, edges, 1_000) == [1, 0, 0]
    assert sub.stats()["delayed"] == 1 and len(run.entries) == 2


def test_a_restarted_subscription_still_leaves_out_what_was_cancelled():
    # Given a delayed message cancelled, and the immediate one after it acknowledged: the
    # cursor's mark-delete passes both (and the marker)
    clock, host = ManualClock(1_000), Host()
    sub, writes = writing_subscription(clock)
    obj = host.append([60_000, NO_DELAY], publish_ms=1_000)
    sub.offer_read([obj], [(1, None)], host.tail())
    step(sub, host, 1_000)
    assert sub.cancel(1, 0, marker=(1, 2))
    marker = host.append_marker((1, 0), publish_ms=1_000)
    sub.offer_read([marker], [(1, None)], host.tail())
    step(sub, host, 1_000)
    sub.ack("c", receive(sub, host, 1_000))
    assert sub.cursor.mark_delete == (1, 2) and sub.stats()["delayed"] == 0
    asyncio.run(sub.persist(force=True))
    # When it restarts from its cursor: nothing is left to read, but the host's index still
    # holds the cancelled row until its time
    cursor, _ = Cursor.decode(writes[-1])
    again = sealed_subscription(clock, cursor=cursor)
    again.offer_read([], [(1, None)], host.tail())
    # (until the host answers its first query, its delayed count is not complete: it says so)
    assert again.stats()["counting"] is True
    step(again, host, 1_000)
    assert again.stats()["counting"] is False
    assert again.unsealed.waiting == 1
    # Then it is not counted (not even before the backlog caps it), nor charted
    assert again.stats()["delayed"] == delayed_count(again) == 0
    edges = np.asarray([30_000, 120_000], dtype=np.int64)
    assert histogram(again, host, edges, 1_000) == [0, 0, 0]
    # and once it falls due and is popped, the bitmap lets go of it
    clock.set(60_000)
    step(again, host, 60_000)
    again.collect_due(60_000, 100)
    assert len(again.settled) == 0 and receive(again, host, 60_000) == []


def test_a_restart_after_retention_deleted_a_cancelled_rows_ledger_still_leaves_it_out():
    # Given two delayed rows read as a run of delayed rows only (no deliver_at per row read),
    # one of them cancelled ahead of its time, and the cursor written as the actor writes it
    # (the settled rows' deliver_at read from the log first)
    clock, host = ManualClock(1_000), Host()
    sub, writes = writing_subscription(clock)
    host.append([61_000, 62_000], publish_ms=1_000)
    sub.offer_read([DelayedRun(1, 0, 2, 61_000)], [(1, None)], host.tail())
    step(sub, host, 1_000)
    assert sub.cancel(1, 0, marker=(1, 2))
    host.append_marker((1, 0), publish_ms=1_000)
    assert len(sub.settled.unknown_due()) == 1
    assert asyncio.run(sub.settled.learn_unknown(host.fetch)) is True
    assert len(sub.settled.unknown_due()) == 0
    assert asyncio.run(sub.settled.learn_unknown(host.fetch)) is False  # (asked once only)
    asyncio.run(sub.persist(force=True))
    # When retention deletes the ledger (the host's index still holds both rows till they
    # fall due) and the subscription restarts from its cursor
    host.objects.clear()
    cursor, _ = Cursor.decode(writes[-1])
    assert cursor.settled_due == {key_of(1, 0): 61_000}
    again = sealed_subscription(clock, cursor=cursor)
    again.offer_read([], [(1, None)], host.tail())
    step(again, host, 1_000)
    # Then the due histogram counts the one left, not the cancelled one
    edges = np.asarray([61_500, 3_600_000], dtype=np.int64)
    assert histogram(again, host, edges, 1_000) == [0, 1, 0]
    assert again.stats()["delayed"] == 1


def test_a_log_emptied_by_retention_still_counts_the_delayed_rows_in_the_backlog():
    # Given a delayed row read as a stand-in, whose ledger retention then deleted: the log
    # holds nothing (no tail), the host's index holds the row until it falls due
    clock, host = ManualClock(1_000), Host()
    sub, writes = writing_subscription(clock)
    host.append([61_000], publish_ms=1_000)
    sub.offer_read([DelayedRun(1, 0, 1, 61_000)], [(1, None)], host.tail())
    step(sub, host, 1_000)
    asyncio.run(sub.persist(force=True))
    host.objects.clear()
    cursor, _ = Cursor.decode(writes[-1])
    again = sealed_subscription(clock, cursor=cursor)
    again.offer_read([], [], None)
    step(again, host, 1_000)
    # Then the pending row is in the backlog as well as delayed (delayed <= backlog)
    s = again.stats()
    assert (s["delayed"], s["backlog"]) == (1, 1)


def test_the_settled_rows_deliver_at_round_trips_with_the_cursor_gone_ones_included():
    cursor = Cursor()
    cursor.settled.update([key_of(1, 0), key_of(1, 1), key_of(2, 5)])
    cursor.settled_due = {key_of(1, 0): 61_000, key_of(1, 1): None}
    back, _ = Cursor.decode(cursor.encode((1, 1)))
    assert back.settled_due == {key_of(1, 0): 61_000, key_of(1, 1): None}
    assert set(back.settled) == set(cursor.settled)


def histogram(sub: Subscription, host: Host, edges: np.ndarray, now: int) -> list[int]:
    """The due histogram as the actor makes it (Peeks.due_histogram)."""
    asyncio.run(sub.settled.learn_unknown(host.fetch, limit=len(sub.settled)))
    return counts.due_histogram(sub, edges, host.index.waiting_histogram(edges, now).tolist())


def test_the_dead_letter_count_survives_a_restart_with_the_cursor():
    clock = ManualClock(1_000)
    host = Host()
    published = []

    async def publish(keys, entries) -> None:
        published.extend(keys.tolist())

    writes: list[bytes] = []

    async def write(data: bytes) -> None:
        writes.append(data)

    sub = sealed_subscription(
        clock, max_redeliveries=0, publish_dead_letters=publish, write_cursor=write
    )
    obj = host.append([NO_DELAY, NO_DELAY], publish_ms=1_000)
    sub.offer_read([obj], [(1, None)], host.tail())
    step(sub, host, 1_000)
    got = receive(sub, host, 1_000)
    sub.nack("c", got, 0, 1_000)
    assert receive(sub, host, 1_000) == []  # (the receive flushed them to the DLQ)
    assert sorted(published) == sorted(got) and sub.stats()["dead_lettered"] == 2
    asyncio.run(sub.persist(force=True))
    cursor, _ = Cursor.decode(writes[-1])
    again = sealed_subscription(clock, cursor=cursor)
    assert again.stats()["dead_lettered"] == 2


def receive(sub: Subscription, host: Host, now: int, n: int = 100) -> list[int]:
    out = asyncio.run(sub.receive("c", host.fetch, n, now))
    return [int(k) for dv in out for k in dv.keys]


# --- the model ----------------------------------------------------------------------------------

MAX_REDELIVERIES = 1


@dataclass
class Message:
    due_ms: int  # when it may go out (again)
    state: str = "pending"  # pending, in_flight, acked, cancelled, dead_pending, dead
    nacks: int = 0


@dataclass
class Model:
    """What the counts must be: every message sent, and what became of it."""

    now: int
    messages: dict[int, Message] = field(default_factory=dict)
    markers: int = 0

    def of(self, state: str) -> list[int]:
        return sorted(k for k, m in self.messages.items() if m.state == state)

    def delayed(self) -> list[int]:
        return sorted(
            m.due_ms for m in self.messages.values() if m.state == "pending" and m.due_ms > self.now
        )

    def expected(self) -> dict:
        unacked = [m for m in self.messages.values() if m.state in ("pending", "in_flight")]
        return {
            "delayed": len(self.delayed()),
            "backlog": len(unacked) + len(self.of("dead_pending")),
            "pending_ack": len(self.of("in_flight")),
            "dead_lettered": len(self.of("dead")),
            "cancelled": len(self.of("cancelled")),
        }


class Run:
    """The subscription, its host and the model, driven one operation at a time."""

    def __init__(self, lookahead_ms: int = 0) -> None:
        self.clock = ManualClock(1_000)
        self.host = Host()
        self.model = Model(now=1_000)
        self.unread: list[LedgerObject] = []  # appended, not read by the subscription yet

        async def publish(keys, entries) -> None:
            for k in keys.tolist():
                assert self.model.messages[k].state == "dead_pending"
                self.model.messages[k].state = "dead"

        self.sub = sealed_subscription(
            self.clock,
            max_redeliveries=MAX_REDELIVERIES,
            publish_dead_letters=publish,
            lookahead_ms=lookahead_ms,
        )

    @property
    def now(self) -> int:
        return self.clock.now_ms()

    def read(self, obj: LedgerObject | None, now: bool = True) -> None:
        """``obj`` was appended; with ``now``, the subscription reads everything appended
        so far, as a shared one does (an object of delayed entries only comes as its
        stand-in), else it lags behind (a cancel then comes ahead of its read)."""
        if obj is not None:
            self.unread.append(obj)
        if not now:
            return
        while self.unread:
            obj = self.unread.pop(0)
            d = obj.entries.deliver_at_ms
            tail = (1, obj.first_entry + obj.count - 1)
            if len(d) and (d > obj.publish_time_ms).all():
                part = DelayedRun(obj.ledger_id, obj.first_entry, obj.count, int(d.min()))
                self.sub.offer_read([part], [(1, None)], tail)
            else:
                self.sub.offer_read([obj], [(1, None)], tail)
            step(self.sub, self.host, self.now)

    def send(self, delays_ms: list[int], read_now: bool = True) -> None:
        d = [NO_DELAY if x == 0 else self.now + x for x in delays_ms]
        obj = self.host.append(d, publish_ms=self.now)
        for i, x in enumerate(delays_ms):
            key = key_of(1, obj.first_entry + i)
            self.model.messages[key] = Message(due_ms=self.now + x)
        self.read(obj, read_now)

    def cancel(self, pick: int, read_now: bool = True) -> None:
        keys = sorted(self.model.messages)
        if not keys:
            return
        key = keys[pick % len(keys)]
        m = self.model.messages[key]
        marker = self.host.append_marker(position_of(key), publish_ms=self.now)
        expected = m.state == "pending" and m.nacks == 0
        assert self.sub.cancel(*position_of(key), marker=(1, marker.first_entry)) is expected
        if expected:
            m.state = "cancelled"
        self.read(marker, read_now)  # the log read applies it again: the same outcome

    def receive(self, n: int) -> None:
        got = receive(self.sub, self.host, self.now, n)
        for k in got:
            m = self.model.messages[k]
            assert m.state == "pending" and m.due_ms <= self.now, (k, m)
            m.state = "in_flight"

    def ack(self, pick: int) -> None:
        held = self.model.of("in_flight")
        if held:
            key = held[pick % len(held)]
            self.sub.ack("c", [key])
            self.model.messages[key].state = "acked"

    def nack(self, pick: int, delay_ms: int) -> None:
        held = self.model.of("in_flight")
        if not held:
            return
        key = held[pick % len(held)]
        self.sub.nack("c", [key], delay_ms, self.now)
        m = self.model.messages[key]
        if m.nacks >= MAX_REDELIVERIES:
            m.state = "dead_pending"
        else:
            m.nacks += 1
            m.state, m.due_ms = "pending", self.now + delay_ms

    def catch_up(self) -> None:
        self.read(None)

    def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        self.model.now = self.now

    def check(self) -> None:
        """After the background work a step and a receive's collection would do now, every
        count is the model's, and delayed <= backlog; so is the due histogram. While the
        subscription lags behind the log, only delayed <= backlog (the model does not
        lag)."""
        if self.unread:
            s = self.sub.stats()
            assert s["delayed"] <= s["backlog"]
            return
        step(self.sub, self.host, self.now)
        self.sub.collect_due(self.now, 1_000_000)
        s = self.sub.stats()
        assert {k: s[k] for k in self.model.expected()} == self.model.expected()
        assert s["delayed"] <= s["backlog"] - s["pending_ack"]  # (none held is delayed)
        assert delayed_count(self.sub) == s["delayed"]  # (not held down by the backlog)
        # "acked" counts cancels and dead letters (and the cancel markers' own entries)
        settled = ("acked", "cancelled", "dead")
        assert s["acked"] >= sum(len(self.model.of(state)) for state in settled)
        edges = np.asarray([self.now + 100, self.now + 1_000, self.now + 10_000], np.int64)
        want = np.bincount(
            np.searchsorted(edges, self.model.delayed(), side="right"), minlength=4
        ).tolist()
        assert histogram(self.sub, self.host, edges, self.now) == want


OPERATIONS = st.one_of(
    st.tuples(
        st.just("send"),
        st.lists(st.sampled_from([0, 0, 1, 50, 700, 5_000]), min_size=1, max_size=3),
        st.booleans(),
    ),
    st.tuples(st.just("cancel"), st.integers(0, 1_000), st.booleans()),
    st.tuples(st.just("catch_up")),
    st.tuples(st.just("receive"), st.integers(1, 4)),
    st.tuples(st.just("ack"), st.integers(0, 1_000)),
    st.tuples(st.just("nack"), st.integers(0, 1_000), st.sampled_from([0, 0, 300])),
    st.tuples(st.just("advance"), st.sampled_from([1, 49, 300, 1_000, 6_000])),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPERATIONS, min_size=1, max_size=40), st.sampled_from([0, 500]))
def test_every_count_is_the_models_under_random_sends_cancels_acks_nacks_and_dead_letters(
    ops, lookahead_ms
):
    # (with a lookahead, rows due within it wait here with their payloads: held)
    run = Run(lookahead_ms)
    for op, *args in ops:
        getattr(run, op)(*args)
        run.check()
    run.catch_up()
    run.check()
