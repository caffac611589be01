"""A produce / cancel / consume workload with a ledger of what must and must not arrive.

The ledger keeps the records (tests/cluster/harness.py reads them too); what they add up
to (lost, early, cancelled-delivered, duplicates) is raydelay.accounting's."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from raydelay import Cluster, MessageId
from raydelay.accounting import Delivery, account, lost
from raydelay.clock import now_ms
from tests.integration.helpers import send_markers


@dataclass
class Ledger:
    sent: dict[MessageId, int | None] = field(default_factory=dict)  # id -> deliver_at
    cancelled: set[MessageId] = field(default_factory=set)  # cancel() said True
    # id -> (cancel called, cancel answered) in epoch ms, for the cancels that said True
    cancel_times: dict[MessageId, tuple[int, int]] = field(default_factory=dict)
    # every cancel tried: after a restart a retried cancel may say False for a cancel that
    # did take effect, so only these may be missing without counting as lost
    cancel_attempts: set[MessageId] = field(default_factory=set)
    # subscription -> (id, deliver_at, received at, redelivery_count) per delivery
    received: dict[str, list[tuple[MessageId, int, int, int]]] = field(default_factory=dict)
    producer_retries: int = 0
    # id -> deliver_at of the markers sent once everything arrived (not counted in ``sent``)
    markers: dict[MessageId, int | None] = field(default_factory=dict)
    # keyed rounds: the messages replaced (their replace answered: counted as cancelled), and
    # the second sends of a pending key ("ignore") that did not answer the first one's id
    replaced: set[MessageId] = field(default_factory=set)
    cancelled_by_key: int = 0
    ignored: int = 0
    ignored_wrong: list[tuple[MessageId, MessageId]] = field(default_factory=list)

    def record(self, name: str, msgs, t: int) -> None:
        self.received[name].extend(
            (m.message_id, m.deliver_at_ms, t, m.redelivery_count) for m in msgs
        )

    def ids(self, name: str) -> set[MessageId]:
        return {r[0] for r in self.received[name]}

    def all_received(self) -> bool:
        sent = self.sent | self.markers
        excused = self.cancel_attempts
        return not any(
            lost(sent, self.ids(name), cancelled=self.cancelled, excused=excused)
            for name in self.received
        )

    def result(self, name: str):
        """The accounting of subscription ``name``: a message whose cancel was tried may be
        missing (after a restart a retried cancel may say False for one that took effect)."""
        deliveries = [Delivery(m, t, count) for m, _, t, count in self.received[name]]
        return account(
            self.sent | self.markers,
            deliveries,
            cancelled=self.cancelled,
            excused=self.cancel_attempts,
        )

    def check(self) -> dict:
        """Lost, early, cancelled-but-delivered and duplicates (with those that came back
        without a raised ``redelivery_count``, and those at a count of 0), per
        subscription."""
        report = {}
        for name in self.received:
            counts = self.result(name).counts()
            report[name] = {
                k: counts[k]
                for k in (
                    "lost",
                    "early",
                    "cancelled_delivered",
                    "duplicates",
                    "unmarked_duplicates",
                    "silent_duplicates",
                    "received",
                )
            }
        return report

    def cancelled_delivered(self, name: str) -> list[dict]:
        """Each delivery to ``name`` of a message whose cancel said True: the message, when
        it was due, when its cancel was called and answered, when it was received and at
        what redelivery count (epoch ms), to find the path that let it through."""
        out = []
        for mid, at, t, count in self.received[name]:
            if mid in self.cancelled:
                called, answered = self.cancel_times.get(mid, (None, None))
                out.append(
                    {
                        "id": str(mid),
                        "deliver_at": at,
                        "cancel_called": called,
                        "cancel_answered": answered,
                        "received": t,
                        "redelivery_count": count,
                    }
                )
        return out


def run_workload(
    cluster: Cluster,
    topic: str,
    subs: list[str],
    *,
    messages: int,
    seconds: float,
    seed: int,
    cancel_share: float = 0.1,
    chaos=None,
    keyed: bool = False,
) -> Ledger:
    """Send ``messages`` over ``seconds`` (delays 0.5-4 s, some immediate), cancel a share of
    them before they are due, consume everything with one consumer per subscription, while
    ``chaos(stop_event)`` runs in another thread. Returns the ledger.

    ``keyed``: every delayed message has a key of its own; the cancels go by key, as many
    more are replaced by key (a new payload and time: the old one counts as cancelled once
    the replace answered), and as many are sent a second time, which must answer the
    first one's id ("ignore")."""
    rng = random.Random(seed)
    ledger = Ledger(received={s: [] for s in subs})
    consumers = {s: cluster.subscribe(topic, s) for s in subs}
    producer = cluster.create_producer(topic)
    stop = threading.Event()
    produced = threading.Event()

    def consume(name: str) -> None:
        consumer = consumers[name]
        while not stop.is_set():
            msgs = consumer.receive(max_messages=1_000, timeout_s=0.5)
            t = now_ms()
            ledger.record(name, msgs, t)
            if msgs:
                consumer.ack(msgs)

    threads = [threading.Thread(target=consume, args=(s,), daemon=True) for s in subs]
    chaos_thread = threading.Thread(target=chaos, args=(produced,), daemon=True) if chaos else None
    for t in threads:
        t.start()
    if chaos_thread:
        chaos_thread.start()
    try:
        batch = 500
        rounds = max(1, messages // batch)
        for r in range(rounds):
            base = now_ms()
            ats = [
                None if rng.random() < 0.2 else base + rng.randint(500, 4_000) for _ in range(batch)
            ]
            keys = [None if at is None else f"{seed}-{r}-{i}" for i, at in enumerate(ats)]
            mids = producer.send_many(
                [b"%d" % (r * batch + i) for i in range(batch)],
                deliver_at=ats,
                keys=keys if keyed else None,
            )
            ledger.sent.update(zip(mids, ats, strict=True))
            # cancel some of the ones due at least 2 s from now (well before they are due): in
            # one call a round (cancel_many), but one call per message every 25th round
            late = now_ms() + 2_000
            doomed = [
                mid
                for mid, at in zip(mids, ats, strict=True)
                if at is not None and at > late and rng.random() < cancel_share
            ]
            ledger.cancel_attempts.update(doomed)
            called = now_ms()
            if keyed:
                key_of = dict(zip(mids, keys, strict=True))
                honoured = producer.cancel_keys([key_of[m] for m in doomed]) if doomed else []
                ledger.cancelled_by_key += sum(honoured)
            elif r % 25 == 0:
                honoured = [producer.cancel(mid) for mid in doomed]
            else:
                honoured = producer.cancel_many(doomed) if doomed else []
            answered = now_ms()
            kept = [m for m, ok in zip(doomed, honoured, strict=True) if ok]
            ledger.cancelled.update(kept)
            ledger.cancel_times.update((m, (called, answered)) for m in kept)
            if keyed:
                ahead = cluster.config.subscription.handout_ahead_ms
                _replace_and_repeat(
                    producer, ledger, rng, mids, keys, ats, set(doomed), late, ahead
                )
            time.sleep(max(0.0, seconds / rounds - (now_ms() - base) / 1000))
        produced.set()
        ledger.producer_retries = producer.retries
        if chaos_thread:
            chaos_thread.join()
        wait_for(ledger, timeout_s=90)
        # then markers on every partition, read after everything and due after everything: a
        # duplicate or a cancelled message, from the log or the delayed index, comes before them
        last_due = max((at for at in ledger.sent.values() if at is not None), default=0)
        ledger.markers = send_markers(producer, [None, max(last_due, now_ms()) + 300])
        if not wait_for(ledger, timeout_s=60):
            raise AssertionError(f"not everything arrived, markers included: {ledger.check()}")
    finally:  # a failure stops the chaos and the consumers too: nothing leaks into the next test
        produced.set()
        stop.set()
        if chaos_thread:
            chaos_thread.join(timeout=30)
        for t in threads:
            t.join(timeout=10)
    return ledger


def _replace_and_repeat(
    producer, ledger: Ledger, rng, mids, keys, ats, doomed, late, ahead_ms: int
) -> None:
    """A keyed round's replaces and repeated sends, each of messages due later than
    ``late`` and not cancelled: a share replaced (the old ones count as cancelled once the
    replace answered), a share sent again (which must answer the pending one's id). A key
    is pending until ``ahead_ms`` (subscription.handout_ahead_ms) before its time."""
    live = [
        (m, k, at)
        for m, k, at in zip(mids, keys, ats, strict=True)
        if at is not None and at > late and m not in doomed
    ]
    picked = [x for x in live if rng.random() < 0.2]
    replace, repeat = picked[::2], picked[1::2]
    if replace:
        base = now_ms()
        new_ats = [base + rng.randint(500, 4_000) for _ in replace]
        old = [m for m, _, _ in replace]
        ledger.cancel_attempts.update(old)
        called = now_ms()
        new = producer.send_many(
            [b"replaces " + str(m).encode() for m in old],
            deliver_at=new_ats,
            keys=[k for _, k, _ in replace],
            on_duplicate="replace",
        )
        answered = now_ms()
        ledger.sent.update(zip(new, new_ats, strict=True))
        # a replace that answered before the old one was due (less the hand-out ahead) kept
        # it from delivery; one held up past that by a kill may come too late
        kept = [m for m, _, at in replace if answered < at - ahead_ms]
        ledger.cancelled.update(kept)
        ledger.replaced.update(kept)
        ledger.cancel_times.update((m, (called, answered)) for m in kept)
    if repeat:
        at = now_ms() + 3_000
        again = producer.send_many(
            [b"again"] * len(repeat), deliver_at=[at] * len(repeat), keys=[k for _, k, _ in repeat]
        )
        answered = now_ms()
        ledger.ignored += len(repeat)
        for (first, _, first_at), got in zip(repeat, again, strict=True):
            if got != first:  # a second message: it must arrive too
                ledger.sent[got] = at
                if answered < first_at - ahead_ms:  # (the first was pending: it should have won)
                    ledger.ignored_wrong.append((first, got))


def wait_for(ledger: Ledger, timeout_s: float) -> bool:
    """Wait until every subscription received everything it must; False after
    ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not ledger.all_received():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True
