"""A producer's keyed sends: a keyed message scheduled for later is its key's while it is
pending (see ``Producer.send``'s ``on_duplicate``). The partition's host checks the key
(``raydelay.actors.partition.keyed``); this side sends the batches, applies the cancel
markers of what was replaced in every subscription, batches keyed ``send_async`` calls on
a thread of their own, and cancels by key. :class:`KeyedSends` is a part of
:class:`raydelay.Producer`, which holds the state it uses."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from raydelay.client.appends import chunks_by_partition
from raydelay.client.message import MessageIds
from raydelay.clock import now_ms as _now_ms
from raydelay.dispatch.keys import key_hash
from raydelay.errors import InvalidArgument, KeyPending, ProducerQueueIsFull
from raydelay.log.entries import AppendBatch, encode_batch

if TYPE_CHECKING:
    from raydelay.client.links import TopicLink


class KeyedSends:
    """The keyed sends of a :class:`raydelay.Producer` (see the module docstring)."""

    # the producer's state this part uses (set by Producer.__init__)
    topic: str
    name: str
    partitions: int
    retries: int
    max_pending_messages: int
    block_if_queue_full: bool
    _link: TopicLink
    _lock: threading.Lock
    _cv: threading.Condition
    _seq_lock: threading.Lock
    _seq: list[int]
    _pending: int
    _pending_limit: int
    _closed: bool
    _chunk: int
    _thread: threading.Thread | None
    _keyed_queue: list[tuple[tuple, str, Future]]
    _keyed_thread: threading.Thread | None
    _check_open: Callable[[], None]
    _answer: Callable[[int, Any, Callable[[], Any]], Any]

    def _keyed_async(self, checked: tuple, on_duplicate: str) -> Future:
        """:meth:`send_async` of a keyed scheduled message: queued for the producer's keyed
        sender (:meth:`_keyed_sender`); counted as pending until it is resolved."""
        fut: Future = Future()
        with self._lock:
            while self._pending >= self._pending_limit and not self._closed:
                if not self.block_if_queue_full or threading.current_thread() in (
                    self._thread,
                    self._keyed_thread,
                ):
                    raise queue_full(self._pending, self.max_pending_messages)
                self._cv.wait()
            self._check_open()
            self._pending += 1
            self._keyed_queue.append((checked, on_duplicate, fut))
            if self._keyed_thread is None:
                self._keyed_thread = threading.Thread(
                    target=self._keyed_sender, name=f"raydelay-keyed-{self.topic}", daemon=True
                )
                self._keyed_thread.start()
            self._cv.notify_all()
        return fut

    def _keyed_sender(self) -> None:
        """Send the queued keyed messages as they come: what queued while a call was on its
        way goes in the next (one :meth:`send_keyed` per run of one ``on_duplicate``, so
        under load the calls grow, as the flusher's do). With "error" each goes alone: one
        pending key must refuse its own send, not its neighbours'."""
        while True:
            with self._lock:
                while not self._keyed_queue:
                    if self._closed:
                        return
                    self._cv.wait()
                batch, self._keyed_queue = self._keyed_queue, []
            try:
                for run in _runs(batch):
                    self._send_keyed_run(run)
            finally:
                with self._lock:
                    self._pending -= len(batch)
                    self._cv.notify_all()

    def _send_keyed_run(self, run: list[tuple[tuple, str, Future]]) -> None:
        on_duplicate = run[0][1]
        props = [c[3] for c, _, _ in run]
        try:
            ids = self.send_keyed(
                np.array([c[0] for c, _, _ in run], dtype=np.int64),
                [c[1] for c, _, _ in run],
                [c[2] for c, _, _ in run],
                props if any(p is not None for p in props) else None,
                np.array([c[4] for c, _, _ in run], dtype=np.int64),
                on_duplicate,
            )
        except BaseException as exc:  # noqa: BLE001 - the senders' futures carry it
            for _, _, fut in run:
                fut.set_exception(exc)
            return
        for (_, _, fut), mid in zip(run, ids, strict=True):
            fut.set_result(mid)

    def send_keyed(
        self,
        parts: np.ndarray,
        payloads: Any,
        keys: list | None,
        props: list | None,
        d: np.ndarray,
        on_duplicate: str,
    ) -> MessageIds:
        """Send messages whose keys are their identities (see :meth:`send`): one
        ``append_keyed`` call per partition chunk, the partitions in parallel; then every
        subscription applies the cancel markers of the messages replaced. With
        ``on_duplicate="error"`` and several calls, every partition is asked first, so a
        pending key refuses the whole batch before anything is written."""
        by_partition = chunks_by_partition(
            parts, payloads, keys, props, d, self.partitions, self._chunk
        )
        if on_duplicate == "error" and sum(len(c) for c in by_partition.values()) > 1:
            self._refuse_pending(keys, parts, d)
        calls = []
        with self._seq_lock:
            for p, chunks in by_partition.items():
                for idx, entries in chunks:
                    self._seq[p] += 1
                    data = encode_batch(AppendBatch(self.name, self._seq[p], entries))
                    calls.append((p, idx, data, self._link.append_keyed(p, data, on_duplicate)))
        # a replace's markers go to every subscription: asked while they are written
        listed = self._link.subscriptions_ahead() if on_duplicate == "replace" else None
        ledger_col = np.zeros(len(parts), dtype=np.int64)
        entry_col = np.zeros(len(parts), dtype=np.int64)
        replaced: dict[int, tuple[list, list]] = {}
        first_error: BaseException | None = None
        for p, idx, data, ref in calls:
            try:
                reply = self._keyed_reply(p, data, ref, on_duplicate)
            except Exception as exc:  # noqa: BLE001 - every call is awaited, the first raised
                first_error = first_error or exc
                continue
            ledger_col[idx] = [lg for lg, _ in reply.positions]
            entry_col[idx] = [en for _, en in reply.positions]
            for target, marker in reply.replaced:
                work = replaced.setdefault(p, ([], []))
                work[0].append(target)
                work[1].append(marker)
        if replaced:  # (the markers are durable: a failure here leaves them to the log read)
            self._link.apply(replaced, listed)
        if first_error is not None:
            raise first_error
        return MessageIds(self.topic, parts.astype(np.int64), ledger_col, entry_col)

    def _keyed_reply(self, p: int, data: bytes, ref: Any, on_duplicate: str) -> Any:
        """The answer of one keyed append, sent again (same sequence id) while the
        partition's host restarts or the store fails retriably."""
        return self._answer(p, ref, lambda: self._link.append_keyed(p, data, on_duplicate))

    def _refuse_pending(self, keys: list | None, parts: np.ndarray, d: np.ndarray) -> None:
        """KeyPending for the first scheduled key of the batch that is pending already."""
        now = _now_ms()
        asked: dict[int, list[str]] = {}
        for i, k in enumerate(keys or []):
            if k is not None and d[i] > now:
                asked.setdefault(int(parts[i]), []).append(k)
        found = self._link.retried(
            lambda: [self._link.pending_keys(p, ks) for p, ks in asked.items()],
            f"topic {self.topic}",
        )
        for held in found:
            if held:
                k = sorted(held)[0]
                raise KeyPending(
                    f"key: {k!r} is held by a message still scheduled in topic {self.topic} "
                    "(on_duplicate='error'); nothing was written"
                )

    def cancel_keys(self, keys: Sequence[str]) -> list[bool]:
        """Cancel the messages pending under ``keys``, one call per partition (and per
        subscription actor); per key, True when a message was pending under it and no
        subscription has had it delivered."""
        self._check_open()
        if isinstance(keys, str) or not isinstance(keys, Sequence):
            raise InvalidArgument(f"keys: expected a sequence of str, got {type(keys).__name__}")
        for i, k in enumerate(keys):
            if not isinstance(k, str):
                raise InvalidArgument(f"keys[{i}]: expected a str, got {type(k).__name__}")
        self._link.guard_keys(list(keys))
        by_partition: dict[int, list[int]] = {}
        for i, k in enumerate(keys):
            by_partition.setdefault(key_hash(k) % self.partitions, []).append(i)
        with self._seq_lock:
            calls = {}
            for p in by_partition:
                self._seq[p] += 1
                calls[p] = self._seq[p]
        listed = self._link.subscriptions_ahead()  # asked while the markers are written
        answers = self._link.retried(
            lambda: [
                self._link.cancel_keys(p, [keys[i] for i in by_partition[p]], self.name, calls[p])
                for p in by_partition
            ],
            f"topic {self.topic}",
        )
        work: dict[int, tuple[list, list]] = {}
        for p, answer in zip(by_partition, answers, strict=True):
            seen = set()
            for pairs in answer:
                for target, marker in pairs:
                    if tuple(marker) not in seen:
                        seen.add(tuple(marker))
                        work.setdefault(p, ([], []))[0].append(tuple(target))
                        work[p][1].append(tuple(marker))
        kept = self._link.apply(work, listed) if work else {}
        outcome = {
            (p, tuple(t)): ok
            for p, (ts, _) in work.items()
            for t, ok in zip(ts, kept[p], strict=True)
        }
        out = [False] * len(keys)
        for p, answer in zip(by_partition, answers, strict=True):
            for i, pairs in zip(by_partition[p], answer, strict=True):
                out[i] = bool(pairs) and any(outcome[(p, tuple(t))] for t, _ in pairs)
        return out


def _runs(batch: list[tuple[tuple, str, Future]]) -> list[list[tuple[tuple, str, Future]]]:
    """Queued keyed sends cut into runs of one ``on_duplicate`` (in order); "error" sends
    each alone."""
    runs: list[list[tuple[tuple, str, Future]]] = []
    for item in batch:
        if runs and runs[-1][0][1] == item[1] and item[1] != "error":
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs


def queue_full(pending: int, limit: int) -> ProducerQueueIsFull:
    """The error of a send that found ``pending`` sends unresolved, ``limit`` at most."""
    return ProducerQueueIsFull(
        f"producer: {pending} sends pending (max_pending_messages = {limit}); wait for some "
        "(flush), or create it with block_if_queue_full=True"
    )
