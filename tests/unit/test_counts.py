"""The counts a subscription reports (:mod:`raydelay.dispatch.counts`), on the pure
Subscription over sealed buckets with the topic's index answering as its host would:
cancelled messages leave ``delayed`` and the due histogram, dead letters are counted and
the count survives a restart, and a model checks every count under random sequences."""

from __future__ import annotations

import numpy as np

from raydelay.clock import ManualClock
from raydelay.delayed import InMemoryDelayedDeliveryTracker
from raydelay.delayed.reader import SealedReader
from raydelay.delayed.sealed import TopicIndex
from raydelay.dispatch.subscription import Subscription
from raydelay.log.entries import NO_DELAY, Entries, LedgerObject


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

    def tail(self) -> tuple[int, int]:
        return (1, self.next_entry - 1)


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
