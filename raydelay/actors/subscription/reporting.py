"""What one subscription partition reports: deliveries and their lateness, and the
snapshot its actor's metrics loop records to Ray's metrics once a second.

Lateness is how long after its due instant a delayed message went out the first time
(redeliveries are not counted); :class:`PartitionReport` keeps a count per
``LATENESS_BOUNDARIES_MS`` bucket since the partition's state started, and the same
counts of each of its stages (:mod:`raydelay.dispatch.stages`).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

import numpy as np

from raydelay.actors.metrics import LATENESS_BOUNDARIES_MS, SubscriptionMetrics
from raydelay.dispatch.stages import SUBSCRIPTION_STAGES, StageCounts, bucket_counts, handed_out
from raydelay.dispatch.subscription import Delivery, Subscription

log = logging.getLogger(__name__)


def tracker_stats(sub: Subscription) -> dict:
    """The counters of the sealed buckets this subscription reads: buckets taken up
    (``sealed``), segments loaded (``loaded``); {} without sealed buckets."""
    sealed = sub.sealed
    if sealed is None:
        return {}
    c = sealed.counters
    return {"sealed": c["adopted"], "loaded": c["segments_loaded"], **c}


class PartitionReport:
    """One partition's deliveries counted for Ray's metrics and for its stats."""

    def __init__(
        self,
        metrics: SubscriptionMetrics,
        sub: Subscription,
        load_times: deque[tuple[str, float]],
    ) -> None:
        self._metrics = metrics
        self._sub = sub
        self._load_times = load_times  # (filled by the segment loads, emptied here)
        # first deliveries of delayed messages by lateness, since this state started: one
        # count per LATENESS_BOUNDARIES_MS bucket (at most that many ms late), then the rest
        self.late_counts = np.zeros(len(LATENESS_BOUNDARIES_MS) + 1, dtype=np.int64)
        # and the same first deliveries' lateness stage by stage (raydelay.dispatch.stages)
        self.stages = StageCounts(SUBSCRIPTION_STAGES)
        self._reported_stats: dict | None = None
        self._looked_at: tuple | None = None  # the steps, counts and cursor it last saw

    def dispatched(self, out: list[Delivery], now_ms: int) -> None:
        """``out`` went to a consumer at ``now_ms``."""
        got = handed_out(out, now_ms)
        self._metrics.dispatched(sum(map(len, out)), got)
        if len(got.lateness_ms):
            self.late_counts += bucket_counts(got.lateness_ms, got.weights)
            self.stages.add(got.stages_ms, got.weights)

    def snapshot(self) -> tuple[SubscriptionMetrics, dict, list[Any]] | None:
        """What this partition has to report to Ray's metrics (its gauges' values and the
        bucket operations since the last time), or None when nothing changed: its host
        records every partition's at once, on a thread, once a second."""
        try:
            # Counting (the delayed rows, the backlog) is not free: an idle partition, where
            # no step ran and no count or cursor moved since, is not counted again.
            sub = self._sub
            seen = (sub.stepped_ms, *sub.counters.values(), sub.marks.state())
            if seen == self._looked_at and not self._load_times:
                return None
            self._looked_at = seen
            stats = sub.stats() | tracker_stats(sub)
            times = self._load_times
            ops = [times.popleft() for _ in range(len(times))]
        except Exception:  # noqa: BLE001 - metrics must never stop the subscription
            log.exception("%s: reporting metrics failed", self._sub.name)
            return None
        if not ops and stats == self._reported_stats:
            return None
        self._reported_stats = stats
        return self._metrics, stats, ops
