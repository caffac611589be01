"""An ingest job's tally: what its splits wrote, counted by a small actor of the job.

Its own module, importing nothing but the standard library: the actor's process loads
only this, so it starts quickly on every job."""

from __future__ import annotations

import time


class Tally:
    """Per split: the newest attempt's running counts, and the counts of the attempt
    that finished (one per split; a split that finished twice counted the same rows).
    A plain class: ``ingest_dataframe`` runs it as a named actor of the job."""

    def __init__(self) -> None:
        self.live: dict[int, list[int]] = {}  # split -> [attempt, rows, accepted, rejected]
        self.done: dict[int, dict] = {}
        self.first_at: float | None = None  # epoch seconds of the first rows written

    def add(self, split: int, attempt: int, rows: int, accepted: int, rejected: int) -> None:
        if self.first_at is None and rows:
            self.first_at = time.time()
        cur = self.live.get(split)
        if cur is None or cur[0] < attempt:
            cur = self.live[split] = [attempt, 0, 0, 0]
        elif cur[0] > attempt:
            return  # a late report of an attempt that was replaced
        cur[1] += rows
        cur[2] += accepted
        cur[3] += rejected

    def finish(self, split: int, totals: dict) -> None:
        self.done[split] = totals

    def snapshot(self) -> dict:
        live = list(self.live.values())
        return {
            "rows": sum(x[1] for x in live),
            "accepted": sum(x[2] for x in live),
            "rejected": sum(x[3] for x in live),
            "splits_done": len(self.done),
        }

    def final(self) -> dict[int, dict]:
        return self.done

    def first_rows_at(self) -> float | None:
        return self.first_at
