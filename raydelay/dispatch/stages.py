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

(``a >= c``; a row handed out ahead of its due time, to a client that holds it until then,
counts 0 in ``waited``, and its ``returned`` starts at ``d``.) A row staged ahead of its
due time spends nothing in ``reached``. The subscription measures the first three when it
hands the first delivery of a delayed message out; the consumer measures ``returned``,
from the time the reply was made (``ReceiveReply.made_ms``), or the due time of a row it
held, to the time its ``receive`` returns the rows.
Each is kept as counts per
:data:`LATENESS_EDGES_MS` bucket plus the sum of its milliseconds, so that partitions and
processes add up, and a stage's share of the lateness is exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from raydelay.dispatch.ports import Delivery
from raydelay.log.entries import NO_DELAY

# a lateness (or a stage of one) counts in the first bucket whose edge (ms) it does not
# exceed; the last bucket holds what exceeds the last edge
LATENESS_EDGES_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000)
SUBSCRIPTION_STAGES = ("written", "reached", "waited")
CONSUMER_STAGE = "returned"
STAGES = (*SUBSCRIPTION_STAGES, CONSUMER_STAGE)

_EDGES = np.asarray(LATENESS_EDGES_MS, dtype=np.int64)
# the bucket of every whole ms up to the last edge, and past it (a table look-up is a
# fraction of a search's cost: a receive of a burst counts tens of thousands at once)
_BUCKET_OF = np.searchsorted(_EDGES, np.arange(_EDGES[-1] + 2), side="left").astype(np.intp)


# A receive's first deliveries of delayed messages beyond this many, from one source, are
# measured on an even sample of this many (each standing for its share of them): a burst's
# receive hands out tens of thousands, and measuring each one cost a tenth of the
# subscription's time in a burst of 1M.
EXACT_ROWS = 256


@dataclass(frozen=True)
class Handed:
    """What :func:`handed_out` measured: the lateness (ms) of first deliveries of delayed
    messages and their stages (a row per SUBSCRIPTION_STAGES), each measurement standing
    for ``weights`` of them (None: one each)."""

    lateness_ms: np.ndarray
    stages_ms: np.ndarray
    weights: np.ndarray | None

    @property
    def count(self) -> int:
        """How many first deliveries the measurements stand for."""
        return len(self.lateness_ms) if self.weights is None else int(self.weights.sum())


def handed_out(out: list[Delivery], now_ms: int) -> Handed:
    """The first deliveries of delayed messages in ``out``, handed out at ``now_ms``: their
    lateness and their ``written``, ``reached`` and ``waited`` stages (see the module
    docstring), on an even sample of at most EXACT_ROWS of each delivery's."""
    lates, stages, weights = [], [], []
    sampled = False
    for dv in out:
        d = dv.source.entries.deliver_at_ms[dv.indexes]
        first = (d != NO_DELAY) & (dv.counts == 0)
        if first.all():
            idx = dv.indexes
        elif first.any():
            d, idx = d[first], dv.indexes[first]
        else:
            continue
        n = len(d)
        w = np.ones(n, dtype=np.int64)
        if n > EXACT_ROWS:
            step = -(-n // EXACT_ROWS)
            d, idx = d[::step], idx[::step]
            w = np.full(len(d), step, dtype=np.int64)
            w[-1] = n - step * (len(d) - 1)
            sampled = True
        # (a ledger object has one publish time: a scalar spares an array per stage)
        one = getattr(dv.source, "publish_time_ms", None)
        c = one if isinstance(one, int) else dv.source.publish_times(idx)
        arrived = int(getattr(dv.source, "arrived_ms", 0))
        block = np.empty((len(SUBSCRIPTION_STAGES), len(d)), dtype=np.int64)
        written, reached, waited = block
        np.subtract(c, d, out=written)
        np.maximum(written, 0, out=written)
        due_or_written = d + written  # max(d, c)
        if arrived:  # (not noted: the wait is counted from the due time)
            # (a = max(c, arrived): max(0, a - max(d, c)) is max(0, arrived - max(d, c)))
            np.subtract(arrived, due_or_written, out=reached)
            np.maximum(reached, 0, out=reached)
            np.add(due_or_written, reached, out=waited)  # max(d, a)
            np.subtract(now_ms, waited, out=waited)
        else:
            reached.fill(0)
            np.subtract(now_ms, due_or_written, out=waited)
        np.maximum(waited, 0, out=waited)
        # (a row handed out ahead of its time is not late: 0, never negative, which the
        # metrics' export drops whole batches of samples for)
        lates.append(np.maximum(now_ms - d, 0))
        stages.append(block)
        weights.append(w)
    if not lates:
        empty = np.zeros(0, dtype=np.int64)
        return Handed(empty, np.zeros((len(SUBSCRIPTION_STAGES), 0), np.int64), None)
    return Handed(
        np.concatenate(lates),
        np.concatenate(stages, axis=1),
        np.concatenate(weights) if sampled else None,
    )


def returned(
    deliver_at_ms: np.ndarray, redelivery_count: np.ndarray, made_ms: int, now_ms: int
) -> tuple[int, int]:
    """The ``returned`` stage (ms) of a reply made at ``made_ms`` and returned to the
    consumer at ``now_ms``, and how many of its rows (their deliver_at and redelivery
    counts) are first deliveries of delayed messages, which it counts for."""
    first = int(np.count_nonzero((deliver_at_ms != NO_DELAY) & (redelivery_count == 0)))
    return max(0, now_ms - made_ms), first


def _buckets(values: np.ndarray) -> np.ndarray:
    """The lateness bucket of each of ``values`` (ms; a negative one counts as 0)."""
    at = np.minimum(values, len(_BUCKET_OF) - 1)
    if at.size and at.min() < 0:  # (a clock that stepped back: not late at all)
        at = np.maximum(at, 0)
    return _BUCKET_OF[at]


def bucket_counts(values: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """How many of ``values`` (ms) fall in each lateness bucket (each standing for its
    ``weights``, when given)."""
    got = np.bincount(_buckets(values), weights=weights, minlength=len(_EDGES) + 1)
    return np.rint(got).astype(np.int64)  # (whole weights: exact)


class StageCounts:
    """Counts per lateness bucket and the sum of milliseconds, per stage of ``stages``."""

    def __init__(self, stages: Sequence[str]) -> None:
        self.stages = tuple(stages)
        self.counts = np.zeros((len(self.stages), len(_EDGES) + 1), dtype=np.int64)
        self.sums_ms = np.zeros(len(self.stages), dtype=np.int64)

    def add(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Add one (len(stages), n) array of stage durations (ms), each standing for its
        ``weights`` (one each when None)."""
        if values.shape[1] == 0:
            return
        n = values.shape[1] if weights is None else int(weights.sum())
        for i, row in enumerate(values):
            if not row.any():  # (rows staged ahead of their time: nothing written or reached)
                self.counts[i, 0] += n
                continue
            self.counts[i] += bucket_counts(row, weights)
            self.sums_ms[i] += int(row.sum() if weights is None else row @ weights)

    def add_one(self, stage: int, value_ms: int, n: int) -> None:
        """Add ``n`` measurements of ``value_ms`` to the stage at index ``stage``."""
        if n:
            self.counts[stage, int(_buckets(np.asarray(value_ms)))] += n
            self.sums_ms[stage] += value_ms * n

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
