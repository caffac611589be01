"""Consumer: receives across every partition of a topic for one subscription.

``receive_batch`` and ``receive`` keep one long-poll call outstanding per partition
and, with ``prefetch``, put it back as soon as it answers (so at most one
round of replies waits here beyond what was asked for). Whatever those calls return (one
Arrow record batch each) is buffered here as it came and handed out in order of
arrival: by ``receive_batch`` as a :class:`MessageBatch` of columns, by ``receive`` as
a list of :class:`Message`. Messages in the buffer are already assigned to this
consumer (unacknowledged); closing the consumer hands them back to the subscription
for redelivery.

``ack`` and ``nack`` send one call per partition with the positions as one int64
array, whether they are given a MessageBatch, a list of messages or message ids. They
do not wait for the subscription's reply: the calls stay outstanding, and a later
``ack`` or ``nack`` confirms those that answered (any failure but an unavailable
partition is raised there). Calls from one process reach an actor in order, so a
later receive, nack or stats sees the acks; ``flush()`` and ``close()`` wait for every
one.

**Partitions are independent.** A partition whose actor fails (a restart, a lost node)
or stops answering is *down* for this consumer: ``receive`` returns what the other
partitions have, and its acks and nacks are kept and sent again in the background
(they are idempotent) once it answers, while those of the other partitions go out at
once. It is tried again with a growing backoff (0.25 s up to 2 s), its handle
re-resolved by name.

A consumer holds a lease on each subscription partition (``subscription.consumer_lease_s``):
its calls renew it, and a heartbeat thread renews it every third of the lease while the
consumer is open. A consumer whose process died stops renewing, and the subscription
removes it once the lease lapses: its unacknowledged messages go to the other consumers.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from raydelay.client.message import (
    Message,
    MessageBatch,
    MessageId,
    check_number,
    messages_from_batch,
)
from raydelay.client.reader import last_ids, only_id
from raydelay.clock import now_ms as _now_ms
from raydelay.errors import InvalidArgument, StorageError, Unavailable
from raydelay.positions import LOW, MAX_LEDGER_ID, position_in_range, position_keys
from raydelay.retries import Backoff

if TYPE_CHECKING:
    from raydelay.client.links import SubscriptionLink

log = logging.getLogger(__name__)

Nack = tuple[float, int]  # a nack on its way: (delay_s, when it was made, epoch ms)

MAX_RECEIVE = 100_000
_ACKS_IN_FLIGHT = 16  # ack calls left unconfirmed before an ack looks at the answers
_ACKS_QUEUED = 256  # ... and past this many the oldest are waited for, briefly
_SETTLE_WAIT_S = 0.5  # how long an ack waits for an old one before taking it back
_HUNG_S = 5.0  # a receive this long past its timeout: its partition is down
# the waits before a down partition is tried again: every 50 ms (jittered) for its first
# RESTART_POLL_S, the time a restarted actor takes to come back, then 0.1 s doubling up
# to 2 s (a poll is one name lookup and one call: it costs little)
RESTART_POLL = Backoff(first_s=0.05, max_s=0.05)
RESTART_POLL_S = 3.0
DOWN_BACKOFF = Backoff(first_s=0.1, max_s=2.0)
_IDLE_RETRY_S = 1.0  # the retry thread's wait while no partition is down
# How long a prefetch call stands at a partition (seconds) before it is renewed. It must
# not follow the caller's timeout: a call made with the few milliseconds a receive has
# left returns empty at once, and renewing it spins the subscription actors.
_STANDING_S = 2.0


def check_receive(max_messages: object, timeout_s: object) -> float:
    """Check a receive's arguments; returns the timeout in seconds."""
    if isinstance(max_messages, bool) or not isinstance(max_messages, int):
        raise InvalidArgument(f"max_messages: expected an int, got {type(max_messages).__name__}")
    if not 1 <= max_messages <= MAX_RECEIVE:
        raise InvalidArgument(f"max_messages: must be 1..{MAX_RECEIVE}, got {max_messages}")
    return check_number("timeout_s", timeout_s)


class Consumer:
    """One consumer of a subscription (``Cluster.subscribe``). ``link`` carries its calls
    to the subscription's partitions (:class:`raydelay.client.links.SubscriptionLink`);
    ``lease_s`` is ``subscription.consumer_lease_s``."""

    def __init__(
        self,
        link: SubscriptionLink,
        topic: str,
        subscription: str,
        *,
        lease_s: float,
        prefetch: bool = False,
        seek: Callable[[Any, bool], Any] | None = None,
        tails: Callable[[], list] | None = None,
    ) -> None:
        self._link = link
        self._seek = seek  # resets the subscription's cursor (Cluster._reset)
        self._tails = tails  # each partition's last position
        self.topic = topic
        self.subscription = subscription
        self.partitions = partitions = link.partitions
        self.consumer_id = uuid.uuid4().hex
        self.prefetch = prefetch
        self._buffer: deque[tuple[int, pa.RecordBatch]] = deque()  # (partition, rows)
        self._inflight: dict[Any, tuple[int, ...]] = {}  # receive ref -> partitions
        # the partitions by the actor serving them: one receive call (and heartbeat) each
        self._groups = [tuple(g) for g in link.heartbeat_groups()]
        self._asked: dict[Any, float] = {}  # receive ref -> when it is overdue (monotonic)
        # acks and nacks sent and not confirmed: (partition, keys, the nack or None for an ack, ref)
        self._acks: deque[tuple[int, np.ndarray, Nack | None, Any]] = deque()
        # partitions found down: when to try again, and the wait after that
        self._down: dict[int, float] = {}
        self._backoff: dict[int, Iterator[float]] = {}  # a down partition's next waits
        self._down_since: dict[int, float] = {}  # when a down partition failed first
        # acks and nacks of down partitions, to send once they answer: (keys, the nack or None)
        self._deferred: dict[int, list[tuple[np.ndarray, Nack | None]]] = {}
        self._lock = threading.Lock()  # _down, _deferred (the retry thread too)
        self._retrying = threading.Condition(self._lock)  # notified as _sending empties
        self._sending = 0  # kept calls the retry thread is sending now
        self._closed = False
        self._rewinds = 0  # redeliver_unacknowledged() calls without messages so far
        added = []
        try:
            for p in range(partitions):
                self._register(p)
                added.append(p)
        except BaseException:
            for p in added:  # nothing half-registered
                link.remove_consumer(p, self.consumer_id)
            raise
        self._stop = threading.Event()
        self._retry_now = threading.Event()  # wakes the retry thread before its next tick
        self._heartbeats = threading.Thread(
            target=self._heartbeat,
            args=(lease_s / 3,),
            name=f"raydelay-heartbeat-{self.consumer_id[:8]}",
            daemon=True,
        )
        self._heartbeats.start()
        self._retrier = threading.Thread(
            target=self._retry_deferred,
            name=f"raydelay-retry-{self.consumer_id[:8]}",
            daemon=True,
        )
        self._retrier.start()

    def _heartbeat(self, every_s: float) -> None:
        """Renew the lease at every partition until the consumer closes. A heartbeat still
        unanswered (its actor is restarting) is not sent again on top of itself."""
        sent: dict[tuple[int, ...], Any] = {}
        refused: set[int] = set()
        groups = self._groups
        while not self._stop.wait(every_s):
            try:
                for group in groups:
                    ref = sent.get(group)
                    if ref is not None:
                        if not self._link.ready([ref], 1, 0):
                            continue
                        try:
                            kept = self._link.get(ref, what=f"subscription {list(group)}")
                        except Exception:  # noqa: BLE001 - the actor is down: try again later
                            kept = [True] * len(group)
                        for p, ok in zip(group, kept, strict=True):
                            if ok:
                                refused.discard(p)
                            elif p not in refused:
                                refused.add(p)
                                log.warning(
                                    "%s/%s partition %d: this consumer lost its place (its "
                                    "lease lapsed and another consumer holds the exclusive "
                                    "subscription)",
                                    self.topic,
                                    self.subscription,
                                    p,
                                )
                    sent[group] = self._link.heartbeat(list(group), self.consumer_id)
            except Exception as exc:  # noqa: BLE001 - Ray went away (shutdown): stop quietly
                if self._stop.is_set() or not self._link.connected():
                    return
                log.warning("%s/%s: heartbeat failed: %s", self.topic, self.subscription, exc)

    def receive(self, max_messages: int = 100, timeout_s: float = 1.0) -> list[Message]:
        """Up to ``max_messages`` messages; waits up to ``timeout_s`` seconds for the first.
        Returns an empty list when none arrived in time."""
        out: list[Message] = []
        for p, rb in self._take(max_messages, timeout_s):
            out.extend(messages_from_batch(self.topic, p, rb))
        return out

    def receive_batch(self, max_messages: int = 10_000, timeout_s: float = 1.0) -> MessageBatch:
        """Up to ``max_messages`` messages as one :class:`MessageBatch` of Arrow columns (one
        record batch per partition they came from); waits up to ``timeout_s`` seconds for
        the first. The batch is empty (``len() == 0``) when none arrived in time."""
        return MessageBatch(self.topic, self._take(max_messages, timeout_s))

    def _take(self, max_messages: int, timeout_s: float) -> list[tuple[int, pa.RecordBatch]]:
        timeout_s = self._check_receive(max_messages, timeout_s)
        deadline = time.monotonic() + timeout_s
        while not self._buffer:
            remaining = deadline - time.monotonic()
            self._poll(max_messages, max(remaining, 0.0))
            if self._buffer or remaining <= 0:
                break
        return self._from_buffer(max_messages)

    def _check_receive(self, max_messages: object, timeout_s: object) -> float:
        self._check_open()
        return check_receive(max_messages, timeout_s)

    def _from_buffer(self, max_messages: int) -> list[tuple[int, pa.RecordBatch]]:
        """Up to ``max_messages`` of what the buffer holds, in order of arrival."""
        out: list[tuple[int, pa.RecordBatch]] = []
        room = max_messages
        while self._buffer and room > 0:
            p, rb = self._buffer[0]
            if rb.num_rows <= room:
                self._buffer.popleft()
                out.append((p, rb))
                room -= rb.num_rows
            else:
                out.append((p, rb.slice(0, room)))
                self._buffer[0] = (p, rb.slice(room))
                room = 0
        return out

    def _poll(self, max_messages: int, timeout_s: float) -> None:
        share, call_s, wait_s = self._plan(max_messages, timeout_s)
        self._ask(share, call_s)
        refs = list(self._inflight)
        if not refs:  # every partition is down: wait for the first retry
            retry = min(self._down.values(), default=time.monotonic()) - time.monotonic()
            time.sleep(min(max(retry, 0.01), max(timeout_s, 0.01)))
            return
        ready = self._link.ready(refs, 1, wait_s)
        if ready:  # take every other reply that is already there too
            more = self._link.ready(refs, len(refs), 0)
            ready = list(dict.fromkeys(ready + more))
        self._collect(ready)
        # With prefetch, a call stands at every partition again at once, while the caller
        # works on what arrived: a message falling due meanwhile is answered the moment it is
        # due, not when the next receive reaches the partition (as Pulsar's consumer
        # prefetches).
        if self.prefetch:
            self._ask(share, call_s)

    def _plan(self, max_messages: int, timeout_s: float) -> tuple[int, float, float]:
        """(each partition's share, how long a receive call stands, how long to wait for
        the first answer). Each partition is asked for its share, so that about
        ``max_messages`` wait here (assigned to this consumer, their ack deadlines
        running) per round of replies."""
        share = -(-max_messages // self.partitions)
        if self.prefetch:  # calls outlive this receive: wait only for this one's timeout
            return share, max(timeout_s, _STANDING_S), timeout_s
        # calls end with this receive's timeout; the margin covers the trip back
        return share, timeout_s, timeout_s + 5.0

    def _collect(self, ready: list) -> None:
        """Take in the receive calls of ``ready`` that are this consumer's (and mark the
        partitions of calls long overdue down)."""
        for ref in ready:
            parts = self._inflight.pop(ref, None)
            if parts is None:
                continue
            self._asked.pop(ref, None)  # (both maps change together)
            try:
                reply = self._link.get(ref, what=f"subscription {list(parts)}")
            except (StorageError, Unavailable) as exc:
                for p in parts:
                    self._receive_failed(p, exc)
                continue
            got, failed = reply if len(parts) > 1 else ([(parts[0], reply)], [])
            for p, rb in got:
                if rb.num_rows:
                    self._buffer.append((p, rb))
            for p in set(parts) - {p for p, _ in failed}:
                self._up(p)
            for p, err in failed:  # (after what the others brought is taken in)
                self._receive_failed(p, err)
        now = time.monotonic()
        for ref, overdue in list(self._asked.items()):
            if now > overdue:  # no answer long after its timeout: the actor hangs
                self._asked.pop(ref)  # (its reply, if one comes, is still taken)
                for p in self._inflight.get(ref, ()):
                    self._failed(p, Unavailable("no answer"))

    def _receive_failed(self, p: int, exc: BaseException) -> None:
        """A receive at ``p`` failed: down, when the actor is unavailable or the store
        failed retriably; any other error is raised."""
        if isinstance(exc, Unavailable) or (isinstance(exc, StorageError) and exc.retriable):
            self._failed(p, exc)
        else:
            raise exc

    def _ask(self, share: int, timeout_s: float) -> None:
        """A receive call outstanding at every partition that has none and is not down
        (one that is down is asked again once its backoff ran out): one call for the
        partitions of one actor."""
        busy = {p for parts in self._inflight.values() for p in parts}
        now = time.monotonic()
        for group in self._groups:
            # a down partition is looked up again by the retry thread (it may be re-created:
            # slow, and never on this thread); it is asked once that is done (retry_at 0)
            parts = tuple(p for p in group if p not in busy and not self._down.get(p, 0) > 0)
            if not parts:
                continue
            if len(parts) == 1:
                call = self._link.receive(
                    parts[0], self.consumer_id, share, timeout_s, self._rewinds
                )
            else:
                call = self._link.receive_many(
                    list(parts), self.consumer_id, share, timeout_s, self._rewinds
                )
            self._inflight[call] = parts
            self._asked[call] = now + timeout_s + _HUNG_S

    # --- partitions that are down -----------------------------------------------------------

    def _failed(self, p: int, exc: Exception) -> None:
        """Partition ``p`` failed a call: down until its backoff runs out (the retry thread
        wakes at that instant). For its first few seconds down it is tried every 50 ms:
        an actor Ray restarts is back within about a second, and its consumers find it
        then, not a doubling wait later."""
        with self._lock:
            now = time.monotonic()
            first = p not in self._down
            if first or p not in self._backoff:
                self._backoff[p] = DOWN_BACKOFF.delays_s()
                self._down_since[p] = now
            if now - self._down_since[p] < RESTART_POLL_S:
                wait_s = next(RESTART_POLL.delays_s())
            else:
                wait_s = next(self._backoff[p])
            self._down[p] = now + wait_s
        log.debug(
            "%s/%s partition %d: call failed (%s); next try in %.3f s",
            self.topic, self.subscription, p, exc, self._down[p] - time.monotonic(),
        )  # fmt: skip
        self._retry_now.set()  # (the retry thread waits for the earliest lapse)
        if first:
            log.warning(
                "%s/%s partition %d: %s; its messages wait, the other partitions go on",
                self.topic, self.subscription, p, exc,
            )  # fmt: skip

    def _up(self, p: int) -> None:
        if p in self._down:
            with self._lock:
                self._down.pop(p, None)
                self._backoff.pop(p, None)
                self._down_since.pop(p, None)
            log.info("%s/%s partition %d: answering again", self.topic, self.subscription, p)

    def _refresh(self, p: int) -> bool:
        """Re-resolve a down partition's actor by name (get-or-create); False if that
        failed too (its backoff grows)."""
        started = time.monotonic()
        try:
            self._link.reconnect(p)
        except Exception as exc:  # noqa: BLE001 - this runs on the retry thread: keep it alive
            self._failed(p, exc)
            return False
        log.info(
            "%s/%s partition %d: looked its actor up again (%.1f s)",
            self.topic, self.subscription, p, time.monotonic() - started,
        )  # fmt: skip
        with self._lock:
            self._down[p] = 0.0  # may be asked now; a success brings it up
        return True

    def _defer(self, p: int, keys: np.ndarray, nack: Nack | None) -> None:
        with self._lock:
            self._deferred.setdefault(p, []).append((keys, nack))
        self._retry_now.set()

    def _retry_deferred(self) -> None:
        """Background: look the actors of down partitions up again once their backoff ran
        out (receive asks them again after that), and send the acks and nacks kept for
        them; what fails again is kept for the next try."""
        while not self._stop.is_set():
            with self._lock:
                now = time.monotonic()
                waits = [at - now for at in self._down.values() if at > 0]
                pending = bool(self._deferred) or 0.0 in self._down.values()
            # asleep while all is well (a failure or a kept call wakes it at once)
            idle_s = DOWN_BACKOFF.first_s if pending else _IDLE_RETRY_S
            self._retry_now.wait(min(waits) if waits else idle_s)
            self._retry_now.clear()
            if self._stop.is_set():
                return
            now = time.monotonic()
            with self._lock:
                lapsed = [p for p, at in self._down.items() if 0 < at <= now]
            for p in lapsed:
                self._refresh(p)
            with self._lock:
                due = [p for p in self._deferred if self._down.get(p, 0.0) == 0.0]
            for p in due:
                with self._lock:
                    work = self._deferred.pop(p, [])
                    self._sending += 1
                try:
                    if work:
                        self._resend(p, work)
                finally:
                    with self._lock:
                        self._sending -= 1
                        self._retrying.notify_all()

    def _resend(self, p: int, work: list[tuple[np.ndarray, Nack | None]]) -> None:
        """Send kept calls of partition ``p`` (the retry thread)."""
        try:
            self._link.get(self._send(p, work), what=f"subscription {p}", timeout_s=5.0)
            self._up(p)
        except (Unavailable, StorageError) as exc:
            if self._stop.is_set() or not self._link.connected():
                return
            if isinstance(exc, StorageError) and not exc.retriable:
                self._drop_bad(p, work)
                return
            with self._lock:  # kept, and tried again later
                self._deferred[p] = work + self._deferred.get(p, [])
            self._failed(p, exc)
        except Exception:  # noqa: BLE001 - a bad call among them: sort them out
            if self._stop.is_set() or not self._link.connected():
                return
            self._drop_bad(p, work)

    def _drop_bad(self, p: int, work: list[tuple[np.ndarray, Nack | None]]) -> None:
        """Send kept calls one by one: one the partition refuses for good (an ack of no
        message) is reported and dropped; one that fails for now is kept."""
        for item in work:
            try:
                self._link.get(self._send(p, [item]), what=f"subscription {p}", timeout_s=5.0)
            except (Unavailable, StorageError) as exc:
                if isinstance(exc, StorageError) and not exc.retriable:
                    log.error("%s/%s partition %d: dropped a kept call: %s",
                              self.topic, self.subscription, p, exc)  # fmt: skip
                    continue
                with self._lock:
                    self._deferred.setdefault(p, []).append(item)
            except Exception as exc:  # noqa: BLE001 - refused for good: reported, dropped
                log.error("%s/%s partition %d: dropped a kept call: %s",
                          self.topic, self.subscription, p, exc)  # fmt: skip

    def _send(self, p: int, work: list[tuple[np.ndarray, Nack | None]]) -> list[Any]:
        """Ack and nack calls for ``work`` (acks merged into one), in their order."""
        link, cid = self._link, self.consumer_id
        refs, acks = [], []
        for keys, nack in work:
            if nack is None:
                acks.append(keys)
                continue
            if acks:
                refs.append(link.ack(p, cid, np.concatenate(acks)))
                acks = []
            refs.append(link.nack(p, cid, keys, *nack))
        if acks:
            refs.append(link.ack(p, cid, np.concatenate(acks)))
        return refs

    def _register(self, p: int) -> None:
        """Join partition ``p`` (idempotent; also after its actor restarted and forgot us)."""

        self._link.retried(
            lambda: self._link.add_consumer(p, self.consumer_id),
            f"subscription {self.subscription} partition {p}",
            partition=p,
        )

    def ack(
        self, messages: MessageBatch | Message | MessageId | Iterable[Message | MessageId]
    ) -> None:
        """Acknowledge messages: a MessageBatch, a Message or MessageId, or an iterable of
        them (one call per partition)."""
        self._check_open()
        self._submit(self._group(messages, "messages"), None)

    def _submit(self, by_partition: dict[int, np.ndarray], nack: Nack | None) -> None:
        """Send acks (``nack`` None) or nacks, one call per partition; a down
        partition's are kept for the retry thread."""
        going = {}
        for p, keys in by_partition.items():
            if p in self._down or self._deferred.get(p):  # (keeps them in order)
                self._defer(p, keys, nack)
            else:
                going[p] = keys
        for group in self._groups:  # one call per actor
            acks = [(p, going[p]) for p in group if p in going]
            if len(acks) > 1:
                ref = self._link.ack_many(acks, self.consumer_id, nack)
            elif acks and nack is None:
                ref = self._link.ack(acks[0][0], self.consumer_id, acks[0][1])
            elif acks and nack is not None:
                ref = self._link.nack(acks[0][0], self.consumer_id, acks[0][1], *nack)
            for p, keys in acks:  # (the partitions of one call share its answer)
                self._acks.append((p, keys, nack, ref))
        if len(self._acks) > _ACKS_IN_FLIGHT:
            self._reap_acks()

    def flush(self) -> None:
        """Wait until every ack and nack sent so far is applied by its subscription (those
        of a down partition too, retried until ``client.retry_deadline_s``)."""
        self._check_open()
        self._settle_acks()

    def _confirm(
        self,
        p: int,
        keys: np.ndarray,
        nack: Nack | None,
        ref: Any,
        timeout_s: float | None = None,
    ) -> None:
        """Take the answer of an ack or nack call: a partition that is down (or does not
        answer within ``timeout_s``) gets the call again later; any other failure is
        raised."""
        try:
            failed = self._link.get(ref, what=f"subscription {p}", timeout_s=timeout_s)
            if isinstance(failed, dict) and p in failed:  # (one call for several partitions)
                raise failed[p]
        except (Unavailable, StorageError) as exc:
            if isinstance(exc, StorageError) and not exc.retriable:
                raise
            self._failed(p, exc)
            self._defer(p, keys, nack)

    def _reap_acks(self) -> None:
        """Confirm the calls that answered, without waiting; past ``_ACKS_QUEUED`` still
        open, wait briefly for the oldest, and keep the calls of a partition that does not
        answer for the retry thread."""
        refs = list(dict.fromkeys(a[3] for a in self._acks))  # (one per call, as Ray wants)
        done = set(self._link.ready(refs, len(refs), 0))
        answered = [item for item in self._acks if item[3] in done]
        self._acks = deque(item for item in self._acks if item[3] not in done)
        for i, item in enumerate(answered):
            try:
                self._confirm(*item)
            except BaseException:  # raised once; the answers after it are still taken
                for later in answered[i + 1 :]:
                    self._acks.appendleft(later)
                raise
        while len(self._acks) > _ACKS_QUEUED:
            p, keys, nack, ref = self._acks.popleft()
            if p not in self._down and self._link.ready([ref], 1, _SETTLE_WAIT_S):
                self._confirm(p, keys, nack, ref)
            else:  # (sent again later: acks and nacks are idempotent)
                self._failed(p, Unavailable("no answer"))
                self._defer(p, keys, nack)

    def _settle_acks(self) -> None:
        """Confirm every ack and nack sent so far, waiting for the answers, and send the
        kept ones of down partitions (retried until ``client.retry_deadline_s``)."""
        give_up = time.monotonic() + self._link.deadline_s

        def left() -> float:
            return max(0.1, give_up - time.monotonic())

        while self._acks:
            self._confirm(*self._acks.popleft(), timeout_s=left())
        while True:
            with self._lock:  # what the retry thread is sending now comes back or goes
                self._retrying.wait_for(lambda: self._sending == 0, timeout=left())
                deferred, self._deferred = self._deferred, {}
            if not deferred:
                return
            pending = sorted(deferred.items())
            try:
                while pending:
                    p, work = pending[0]

                    def send(p: int = p, work: list = work) -> list:
                        return self._send(p, work)

                    self._link.retried(
                        send,
                        f"subscription {self.subscription} partition {p}",
                        partition=p,
                        deadline_s=left(),
                        timeout_s=left(),
                    )
                    pending.pop(0)
                    self._up(p)
            finally:
                with self._lock:  # what did not go through is kept for the retry thread
                    for p, work in pending:
                        self._deferred[p] = work + self._deferred.get(p, [])

    def nack(
        self,
        messages: MessageBatch | Message | MessageId | Iterable[Message | MessageId],
        delay_s: float = 0.0,
    ) -> None:
        """Give messages back for redelivery after ``delay_s`` seconds (0: as soon as
        possible), counted from this call: nacks made in a row come back in that order,
        however their calls are scheduled (or retried) on the way. Takes what :meth:`ack`
        takes."""
        self._check_open()
        delay_s = check_number("delay_s", delay_s)
        self._submit(self._group(messages, "messages"), (delay_s, _now_ms()))

    def redeliver_unacknowledged(
        self,
        msgs: MessageBatch | Message | MessageId | Iterable[Message | MessageId] | None = None,
    ) -> int:
        """Redeliver now messages this consumer holds unacknowledged, with
        ``redelivery_count`` raised (Pulsar's ``redeliverUnacknowledgedMessages``). Returns
        how many go back.

        - No argument: everything it holds, including what it received and has not handed
          to the caller yet. On a shared subscription they go to any consumer; on an
          exclusive or failover one delivery rewinds to the first of them and goes on in
          log order.
        - ``msgs`` (what :meth:`ack` takes): a shared subscription takes back only those;
          exclusive and failover rewind as above. A message this consumer does not hold
          (acknowledged, or held by another consumer) is an :class:`InvalidArgument`
          naming it, and then nothing goes back. Messages a restarted subscription forgot
          it had handed out are accepted: they are on their way again already."""
        self._check_open()
        if msgs is None:
            self._rewinds += 1
            n = sum(
                self._link.retried(
                    lambda: [
                        self._link.redeliver(p, self.consumer_id, None, self._rewinds)
                        for p in range(self.partitions)
                    ],
                    "subscription",
                )
            )
            # receive calls sent before answer empty, or with messages that just went back:
            # what they and the buffer hold is dropped, or it would arrive twice
            if self._inflight:
                self._link.ready(list(self._inflight), len(self._inflight), 10)
            self._inflight.clear()
            self._asked.clear()
            self._buffer.clear()
            return n
        by_partition = self._group(msgs, "msgs")
        for p, keys in by_partition.items():  # check every partition before any goes back

            def check(p: int = p, keys: np.ndarray = keys) -> list:
                return [self._link.redeliver(p, self.consumer_id, keys, 0, True)]

            try:
                self._link.retried(check, "subscription")
            except InvalidArgument as exc:
                raise InvalidArgument(f"{exc} (in {self.topic}/{p})") from None
        return sum(
            self._link.retried(
                lambda: [
                    self._link.redeliver(p, self.consumer_id, keys)
                    for p, keys in by_partition.items()
                ],
                "subscription",
            )
        )

    def seek(self, to: Any, *, inclusive: bool = False) -> None:
        """Move the subscription's cursor (Pulsar's ``Consumer.seek``), for every consumer
        of it: ``to`` is ``"earliest"``, ``"latest"``, a :class:`MessageId` (delivery goes
        on after that message on its partition, or from it with ``inclusive``, as Pulsar's
        ``start_message_id_inclusive``), or a time (epoch ms or an aware datetime: the
        first entry published at or after it, on every partition). See
        :meth:`raydelay.Cluster.reset_cursor`. The acks sent before go first; what this
        consumer holds but has not acked is given back (the reset delivers it again if it
        comes after the new position), and what it had received and not handed out is
        dropped."""
        self._check_open()
        if self._seek is None:
            raise InvalidArgument("seek: this consumer was not made by Cluster.subscribe")
        if not isinstance(inclusive, bool):
            raise InvalidArgument(f"inclusive: expected True or False, got {inclusive!r}")
        self.flush()
        self._seek(to, inclusive)
        self.redeliver_unacknowledged()  # (and drops what the buffer and calls under way hold)

    def last_message_ids(self) -> list[MessageId | None]:
        """The id of each partition's last entry (None: the partition is empty)."""
        self._check_open()
        if self._tails is None:
            raise InvalidArgument(
                "last_message_ids: this consumer was not made by Cluster.subscribe"
            )
        return last_ids(self.topic, self._tails())

    def get_last_message_id(self) -> MessageId | None:
        """The id of the topic's last entry (Pulsar's ``get_last_message_id``); a topic of
        one partition only (see :meth:`last_message_ids`)."""
        return only_id(self.topic, self.last_message_ids())

    def _group(self, messages: Any, field: str) -> dict[int, np.ndarray]:
        """partition -> int64 position keys of ``messages``."""
        if isinstance(messages, MessageBatch):
            if messages.topic != self.topic:
                raise InvalidArgument(
                    f"{field}: a batch of topic {messages.topic!r}, not {self.topic!r}"
                )
            return messages.position_keys()
        if isinstance(messages, (Message, MessageId)):
            messages = [messages]
        try:
            items = list(messages)
        except TypeError:
            raise InvalidArgument(
                f"{field}: expected a MessageBatch, a Message, a MessageId or an iterable of them"
            ) from None
        if items and all(type(m) is Message for m in items):
            ids = [m[0] for m in items]  # fast path: what receive() returned
        else:
            ids = []
            for m in items:
                mid = m.message_id if isinstance(m, Message) else m
                if not isinstance(mid, MessageId):
                    raise InvalidArgument(
                        f"{field}: expected Message or MessageId, got {type(m).__name__}"
                    )
                ids.append(mid)
        n = len(ids)
        try:
            parts, ledgers, entries = (
                np.fromiter((i[c] for i in ids), dtype=np.int64, count=n) for c in (1, 2, 3)
            )
        except (OverflowError, TypeError, ValueError):
            parts = ledgers = entries = np.full(n, -1, np.int64)  # named just below
        if any(i[0] != self.topic for i in ids) or (
            n and (parts.min() < 0 or parts.max() >= self.partitions)
        ):
            bad = next(i for i in ids if i[0] != self.topic or not 0 <= i[1] < self.partitions)
            raise InvalidArgument(f"{field}: {bad} is not a message of topic {self.topic!r}")
        if n and (
            ledgers.min() < 0
            or ledgers.max() > MAX_LEDGER_ID
            or entries.min() < 0
            or entries.max() > LOW
        ):
            bad = next(i for i in ids if not position_in_range(i[2], i[3]))
            raise InvalidArgument(f"{field}: {bad} is no message position (out of range)")
        keys = position_keys(ledgers, entries)
        return {int(p): keys[parts == p] for p in np.unique(parts)}

    def close(self) -> None:
        """Leave the subscription: unacknowledged messages (buffered ones too) are redelivered
        to the other consumers."""
        if self._closed:
            return
        try:
            self._settle_acks()  # what was acked stays acked, not redelivered
        except Exception as exc:  # noqa: BLE001 - closing: report; unconfirmed acks redeliver
            log.warning("closing consumer of %s/%s: %s", self.topic, self.subscription, exc)
        self._closed = True
        self._stop.set()
        self._retry_now.set()
        # (a heartbeat sent after the removal would add this consumer back, its lease
        # then holding the subscription until it lapsed: the heartbeats end first)
        if self._heartbeats is not threading.current_thread():
            self._heartbeats.join(timeout=_HUNG_S)
        refs = [self._link.remove_consumer(p, self.consumer_id) for p in range(self.partitions)]
        try:
            # (a partition that does not answer lets this consumer's lease lapse instead)
            answered = self._link.ready(refs, len(refs), _HUNG_S)
            self._link.get(answered, what="subscription")
            if self._inflight:  # woken by the removal; what they carry is redelivered
                self._link.ready(list(self._inflight), len(self._inflight), 10)
        except Unavailable as exc:  # its topic was deleted: nothing is left to hand back
            log.warning("closing consumer of %s/%s: %s", self.topic, self.subscription, exc)
        finally:
            self._inflight.clear()
            self._asked.clear()
            self._buffer.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument("consumer: it is closed")

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
