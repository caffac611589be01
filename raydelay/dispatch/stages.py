"""Where a delayed message's lateness went, stage by stage (pure: no Ray).

A delayed message is due at ``d``. Its partition's log committed it at ``c`` (its publish
time); its subscription got the row at ``a`` (read from the log, staged from the host's
unsealed index, or loaded from a sealed segment: the time its process received it); a
receive handed it out at ``h``; the consumer's ``receive`` returned it at ``r``. Its
lateness ``r - d`` is the sum of four stages, each the part of it spent in one place:

| stage | what | of |
|---|---|---|
| ``written`` | ``max(0, c - d)`` | the producer: it wrote the message after its due time |
| ``reached`` | ``max(0, a - max(d, c))`` | the log and the index, up to the subscription |
| ``waited`` | ``h - max(d, a)`` | the subscription, until a receive asked for it |
| ``returned`` | ``r - h`` | the way back to the consumer, and its client's buffer |

(``h >= d``: nothing goes out early; ``a >= c``.) A row staged ahead of its due time spends
nothing in ``reached``. The subscription measures the first three when it hands the first
delivery of a delayed message out; the consumer measures ``returned``, from the time the
reply was made (it travels with the reply). Each is kept as counts per
:data:`LATENESS_EDGES_MS` bucket plus the sum of its milliseconds, so that partitions and
processes add up, and a stage's share of the lateness is exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from raydelay.dispatch.ports import Delivery
from raydelay.log.entries import NO_DELAY

# a lateness (or a stage of one) counts in the first bucket whose edge (ms) it does not
# exceed; the last bucket holds what exceeds the last edge
LATENESS_EDGES_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000)
SUBSCRIPTION_STAGES = ("written", "reached", "waited")
CONSUMER_STAGE = "returned"
STAGES = (*SUBSCRIPTION_STAGES, CONSUMER_STAGE)
# the key of a delivery record batch's schema metadata that says when it was made (epoch ms)
HANDED_KEY = b"raydelay.handed_ms"

_EDGES = np.asarray(LATENESS_EDGES_MS, dtype=np.int64)


def handed_out(out: list[Delivery], now_ms: int) -> tuple[np.ndarray, np.ndarray]:
    """The first deliveries of delayed messages in ``out``, handed out at ``now_ms``: their
    lateness (ms), and a (3, n) array of their ``written``, ``reached`` and ``waited``
    stages (see the module docstring)."""
    lates, stages = [], []
    for dv in out:
        d = dv.source.entries.deliver_at_ms[dv.indexes]
        first = (d != NO_DELAY) & (dv.counts == 0)
        if not first.any():
            continue
        d = d[first]
        c = dv.source.publish_times(dv.indexes[first])
        arrived = int(getattr(dv.source, "arrived_ms", 0))
        due_or_written = np.maximum(d, c)
        # (a source whose arrival was not noted: its wait is counted from when it was due)
        a = np.maximum(c, arrived) if arrived else due_or_written
        due_or_arrived = np.maximum(d, a)
        lates.append(now_ms - d)
        stages.append(
            np.stack(
                [
                    due_or_written - d,
                    np.maximum(a - due_or_written, 0),
                    np.maximum(now_ms - due_or_arrived, 0),
                ]
            )
        )
    if not lates:
        return np.zeros(0, dtype=np.int64), np.zeros((len(SUBSCRIPTION_STAGES), 0), np.int64)
    return np.concatenate(lates), np.concatenate(stages, axis=1)


def returned(
    deliver_at_ms: np.ndarray, redelivery_count: np.ndarray, handed_ms: int, now_ms: int
) -> np.ndarray:
    """The ``returned`` stage (ms) of the first deliveries of delayed messages among a
    reply's rows (their deliver_at and redelivery counts), made at ``handed_ms`` and
    returned to the consumer at ``now_ms``."""
    first = (deliver_at_ms != NO_DELAY) & (redelivery_count == 0)
    return np.full(int(first.sum()), max(0, now_ms - handed_ms), dtype=np.int64)


def bucket_counts(values: np.ndarray) -> np.ndarray:
    """How many of ``values`` (ms) fall in each lateness bucket."""
    return np.bincount(
        np.searchsorted(_EDGES, values, side="left"), minlength=len(_EDGES) + 1
    ).astype(np.int64)


class StageCounts:
    """Counts per lateness bucket and the sum of milliseconds, per stage of ``stages``."""

    def __init__(self, stages: Sequence[str]) -> None:
        self.stages = tuple(stages)
        self.counts = np.zeros((len(self.stages), len(_EDGES) + 1), dtype=np.int64)
        self.sums_ms = np.zeros(len(self.stages), dtype=np.int64)

    def add(self, values: np.ndarray) -> None:
        """Add one (len(stages), n) array of stage durations (ms)."""
        if values.shape[1] == 0:
            return
        for i, row in enumerate(values):
            self.counts[i] += bucket_counts(row)
        self.sums_ms += values.sum(axis=1)

    def as_dict(self) -> dict[str, dict]:
        """``{stage: {"counts": [...], "sum_ms": n}}`` (what ``stats`` reports)."""
        return {
            stage: {"counts": self.counts[i].tolist(), "sum_ms": int(self.sums_ms[i])}
            for i, stage in enumerate(self.stages)
        }


def merge(parts: Iterable[Mapping[str, Mapping]]) -> dict[str, dict]:
    """Several ``StageCounts.as_dict`` (partitions, consumers) added up, stage by stage."""
    out: dict[str, dict] = {}
    for part in parts:
        for stage, got in part.items():
            have = out.setdefault(stage, {"counts": [0] * (len(_EDGES) + 1), "sum_ms": 0})
            have["counts"] = [
                a + int(b) for a, b in zip(have["counts"], got["counts"], strict=True)
            ]
            have["sum_ms"] += int(got["sum_ms"])
    return out


def quantile_ms(counts: Sequence[int], q: float) -> int | None:
    """The edge (ms) of the bucket that holds the ``q`` quantile of ``counts`` (an upper
    bound of it); None without counts, -1 when it lies past the last edge."""
    total = sum(counts)
    if total == 0:
        return None
    at = int(np.searchsorted(np.cumsum(counts), q * total, side="left"))
    return int(_EDGES[at]) if at < len(_EDGES) else -1


def edge_label(ms: int | None) -> str:
    """A quantile of :func:`quantile_ms` as words: "<= 20 ms", "> 10,000 ms", or "n/a"."""
    if ms is None:
        return "n/a"
    return f"> {LATENESS_EDGES_MS[-1]:,} ms" if ms < 0 else f"<= {ms:,} ms"


def summary(stages: Mapping[str, Mapping]) -> list[dict]:
    """One row per stage, in STAGES order: how many were measured, p50 and p99 (bucket
    edges, -1: past the last one), the mean, and the stage's share of all the stages'
    milliseconds."""
    total_ms = sum(int(s["sum_ms"]) for s in stages.values())
    rows = []
    for stage in [s for s in STAGES if s in stages]:
        counts, sum_ms = stages[stage]["counts"], int(stages[stage]["sum_ms"])
        n = sum(counts)
        rows.append(
            {
                "stage": stage,
                "measured": n,
                "p50_ms": quantile_ms(counts, 0.5),
                "p99_ms": quantile_ms(counts, 0.99),
                "mean_ms": sum_ms / n if n else None,
                "share": sum_ms / total_ms if total_ms else None,
            }
        )
    return rows
