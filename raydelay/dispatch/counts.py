"""What one subscription, and one topic, reports of itself: the counts behind ``stats``
(pure: no Ray).

One definition, read from the subscription's parts, so that the actor's stats, the CLI,
the console, the metrics and the dashboard cannot each count in their own way:

- ``backlog``: entries up to the log's tail (as of the subscription's last read) not
  acknowledged; with no tail (a log retention emptied while delayed rows wait in the
  sealed buckets), the delayed ones. A cancelled message is acknowledged once its cancel is durable (its
  marker in the log), so it leaves the backlog then.
- ``delayed``: messages of the backlog not due yet: in the tracker (nacked with a delay,
  or every delayed message without sealed buckets), or, with sealed buckets, in the host's
  unsealed index, in a sealed bucket, or held here ahead of their instant; less the rows
  settled before they fell due (:mod:`raydelay.dispatch.settled`: cancelled). Never more
  than ``backlog`` once the log's tail is known: the host's index may already hold rows committed after this
  subscription's last read of the log's tail; they count once the read reaches them.
- ``counting``: True while ``delayed`` is not complete yet: the host has not answered the
  subscription's first query of its unsealed index (a partition recovering after a
  restart). ``delayed`` then counts only what is known, and so do the due histograms.
- ``dead_lettered``: messages published to the dead-letter topic, over the subscription's
  whole life (persisted with the cursor: a restart does not reset it).
- ``delivered``, ``acked``, ``redelivered``, ``cancelled``, ``dead_lettered_since_start``:
  since the actor started.

A topic's own counts (:func:`topic_counts`) are what it holds, not a sum over its
subscriptions: ``entries``, the entries of its log that retention has not deleted
(messages and cancel markers; a dead-letter topic's are its dead letters), and
``delayed``, the most any of its subscriptions has waiting.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # (the owner calls this with itself; no import at run time)
    from raydelay.dispatch.subscription import Subscription


def delayed_count(sub: Subscription) -> int:
    """Messages of ``sub`` not due yet, cancelled ones left out (see the module
    docstring); not capped by the backlog."""
    delayed = sub.tracker.number_of_delayed_messages()
    sealed = sub.sealed
    if sealed is None:
        return delayed
    unsealed, settled = sub.unsealed, sub.settled
    held, settled_held = unsealed.held_counts(sub.stepped_ms, settled.among)
    # every settled row not held here is counted once by the buckets or the host's index
    stored = sealed.remaining() + unsealed.waiting + unsealed.unasked_rows
    return delayed + max(0, stored - (len(settled) - settled_held)) + held


def subscription_stats(sub: Subscription) -> dict:
    """The counts of ``sub`` on its partition (see the module docstring), what consumers
    hold, what waits for redelivery or the dead-letter topic, the marks, and the delivery
    counters."""
    tracker, sealed = sub.tracker, sub.sealed
    buckets = getattr(tracker, "immutable_bucket_count", lambda: 0)()
    if sealed is not None:
        buckets += len(sealed.buckets)
    cursor, reading = sub.cursor, sub.reading
    delayed = delayed_count(sub)
    if reading.tail is None:
        # a log with nothing in it (none written yet, or retention deleted every ledger
        # while its delayed rows wait in the sealed buckets): those rows are the backlog
        backlog = delayed
    else:
        backlog = cursor.unacked_between(reading.tail)
        delayed = min(delayed, backlog)
    return {
        "type": sub.type,
        "delayed": delayed,
        "counting": sealed is not None and not sub.unsealed.answered,
        # settled rows whose deliver_at was read from the log (point reads), since the start
        "settled_due_read": sub.settled.rows_read,
        "backlog": backlog,
        "pending_ack": sub.consumer_table.pending_count(),
        "buckets": buckets,
        "loaded_indexes": tracker.number_of_delayed_messages()
        + (sealed.loaded_rows() if sealed is not None else 0),
        "redelivery": len(sub.redelivery.redeliver),
        "dead_letter_pending": len(sub.redelivery.dead),
        "dead_lettered": cursor.dead_lettered,
        "read_ahead": reading.ready_count,
        "unread": len(reading.unread),
        "mark_delete": list(cursor.mark_delete),
        "log_mark": list(sub.marks.log_cursor.mark_delete),
        "read_position": list(reading.read_position),
        "tail": None if reading.tail is None else list(reading.tail),
        "consumers": len(sub.consumer_table),
        **sub.counters,
    }


def due_histogram(sub: Subscription, edges: np.ndarray, unsealed: Sequence[int]) -> list[int]:
    """Pending delayed messages of ``sub`` per due window (``len(edges) + 1`` counts, as
    the trackers count them), the settled ones left out: the tracker's, the sealed
    buckets' and ``unsealed``, the host's unsealed index's own histogram (zeros without
    sealed buckets). The settled rows whose deliver_at is not known here yet
    (:meth:`SettledDelayed.unknown_due`) are not taken off: learn them first."""
    out = np.asarray(sub.tracker.due_histogram(edges), dtype=np.int64)
    if sub.sealed is not None:
        out += np.asarray(sub.sealed.due_histogram(edges), dtype=np.int64)
        out += np.asarray(unsealed, dtype=np.int64)
        out -= sub.settled.due_histogram(edges)
    return np.maximum(out, 0).tolist()


def partition_entries(ledgers: Iterable[Sequence], tail: Sequence[int] | None) -> int:
    """Entries a partition's log holds: its ledgers' sizes ((id, size or None while
    open) pairs, as its host lists them), the open one's up to ``tail``."""
    held = 0
    for ledger_id, size in ledgers:
        if size is not None:
            held += int(size)
        elif tail is not None and int(tail[0]) == int(ledger_id):
            held += int(tail[1]) + 1
    return held


def topic_counts(partitions: Sequence[dict], subscriptions: Sequence[dict]) -> dict:
    """A topic's own counts (see the module docstring): ``entries`` held over its
    partitions (each host's ``stats``), and ``delayed``, the most of its subscriptions'
    (their ``stats``; None for one that could not be read)."""
    delayed = [int(s["delayed"]) for s in subscriptions if s.get("delayed") is not None]
    return {
        "entries": sum(partition_entries(p["ledgers"], p.get("tail")) for p in partitions),
        "delayed": max(delayed, default=0),
    }
