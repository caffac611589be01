"""What one subscription reports of itself: the counts behind ``stats`` (pure: no Ray).

One definition, read from the subscription's parts, so that the actor's stats, the CLI,
the console and the metrics cannot each count in their own way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (the owner calls this with itself; no import at run time)
    from raydelay.dispatch.subscription import Subscription


def subscription_stats(sub: Subscription) -> dict:
    """The counts of ``sub`` on its partition: ``delayed`` (waiting for their time, in
    the tracker, the sealed buckets and the host's unsealed index), ``backlog``
    (unacknowledged up to the log's tail), what consumers hold, what waits for
    redelivery or the dead-letter topic, the marks, and the delivery counters."""
    tracker, sealed = sub.tracker, sub.sealed
    buckets = getattr(tracker, "immutable_bucket_count", lambda: 0)()
    delayed = tracker.number_of_delayed_messages()
    if sealed is not None:
        buckets += len(sealed.buckets)
        delayed += sealed.remaining() + sub.unsealed.delayed(sub.stepped_ms)
    cursor, reading = sub.cursor, sub.reading
    return {
        "type": sub.type,
        "delayed": delayed,
        "backlog": cursor.unacked_between(reading.tail),
        "pending_ack": sub.consumer_table.pending_count(),
        "buckets": buckets,
        "loaded_indexes": tracker.number_of_delayed_messages()
        + (sealed.loaded_rows() if sealed is not None else 0),
        "redelivery": len(sub.redelivery.redeliver),
        "dead_letter_pending": len(sub.redelivery.dead),
        "read_ahead": reading.ready_count,
        "unread": len(reading.unread),
        "mark_delete": list(cursor.mark_delete),
        "log_mark": list(sub.marks.log_cursor.mark_delete),
        "read_position": list(reading.read_position),
        "tail": None if reading.tail is None else list(reading.tail),
        "consumers": len(sub.consumer_table),
        **sub.counters,
    }
