"""A shared subscription's part in the partition's sealed buckets (pure: no Ray).

The host seals buckets; each subscription *adopts* them (reads its due rows from them,
but for the ones it already took from the unsealed index), learns their ledgers and
cancel markers, and moves its progress over the segments it has wholly acknowledged.
The segments themselves are read by the :class:`~raydelay.delayed.reader.SealedReader`.
"""

from __future__ import annotations

import numpy as np
from pyroaring import BitMap64

from raydelay.delayed.index import bitmap64_values
from raydelay.delayed.reader import FINISHED, Progress, SealedReader
from raydelay.delayed.sealed import SealedMeta
from raydelay.dispatch.cancels import Cancels
from raydelay.dispatch.marks import CursorMarks
from raydelay.dispatch.reading import LogReading
from raydelay.dispatch.tail import UnsealedTail
from raydelay.positions import SHIFT, key_of

_NOTHING_AHEAD = BitMap64()


class BucketAdoption:
    """Adopting the host's sealed buckets, and finishing them."""

    def __init__(
        self,
        *,
        sealed: SealedReader,
        tail: UnsealedTail,
        marks: CursorMarks,
        cancels: Cancels,
        reading: LogReading,
    ) -> None:
        self.sealed = sealed
        self._tail = tail
        self._marks = marks
        self._cancels = cancels
        self._reading = reading
        # finished buckets whose cancel markers' targets were seen acknowledged in the cursor
        self._confirmed: set[str] = set()
        marks.watch(self.generation)  # (the cursor's periodic write reports the progress)

    def generation(self) -> tuple[int, ...]:
        """Changes whenever a bucket is adopted, merged or finished (with the cursor's
        acknowledgements, what the progress reported depends on)."""
        c = self.sealed.counters
        return (len(self.sealed.buckets), c["adopted"], c["merged"], c["finished"])

    def adopt(
        self,
        meta: SealedMeta,
        done: Progress = 0,
        later: tuple[int, tuple[int, int]] | None = None,
    ) -> list[str]:
        """The host sealed a bucket: read its rows from it, but for the ones already taken
        from the unsealed index. Call it before taking in a due query's answer that reports
        the bucket sealed. ``later`` = (ledger, taken after): its runs past that ledger were
        sealed after that answer was made, which took their due rows as ``taken after``
        says. A merged bucket takes over the buckets held whose runs it owns, where they
        stood; returns their keys."""
        if meta.key in self.sealed.buckets:
            return []
        held = self.sealed.held_runs(meta)
        fresh = [r.ledgers for r in meta.runs if r.key not in held]
        if fresh:
            # what the cursor and the cancels must learn of the ledgers new here (of a
            # merged bucket, only its runs not held yet: the others were learnt)
            def new_here(key: int) -> bool:
                lg = key >> SHIFT
                return any(lo <= lg <= hi for lo, hi in fresh)

            self._marks.learn_ledgers(
                [x for x in meta.ledgers if any(a <= x[0] <= b for a, b in fresh)],
                whole_log=False,
            )
            for marker, target in meta.markers:  # before any of its rows can go out
                if new_here(marker):
                    self._cancels.apply(marker, target)
        replaced = self.sealed.adopt(meta, done=done, taken=self._tail.taken, later=later)
        if meta.runs:  # (its rows count among the sealed ones now)
            end_ledger = max(r.ledgers[1] for r in meta.runs)
            self._tail.forget_unasked(through_ledger=end_ledger)
        if fresh:
            positions = meta.positions()
            if held:
                keep = BitMap64()
                for lo, hi in fresh:
                    keep.add_range(lo << SHIFT, (hi + 1) << SHIFT)
                positions = positions & keep
            self._marks.log_cursor.ack_keys(positions)
        if meta.keys:  # its rows exist: an ack of one is not past the end of the log
            self._reading.see_end(int(meta.keys.max()))
        return replaced

    def ack_gone_ledgers(self, present: set[int]) -> None:
        """Entries of a bucket's ledgers that are gone from the log and not in the bucket
        can never be read again (every subscription then had them acknowledged): a
        subscription made after their deletion acknowledges them too."""
        cursor = self._marks.cursor
        for b in self.sealed.buckets.values():
            for ledger_id, size in b.meta.ledgers:
                if ledger_id in present or ledger_id < cursor.mark_delete[0] or not size:
                    continue
                gone = BitMap64()
                gone.add_range(key_of(ledger_id, 0), key_of(ledger_id, size))
                gone -= b.meta.positions()
                if gone:
                    self._marks.ack(bitmap64_values(gone))

    def advance(self) -> list[str]:
        """Move each bucket's progress over segments whose rows are all acknowledged;
        returns the buckets this subscription is now done with."""
        self.sealed.trim_covered(key_of(*self._reading.read_position))
        return self.sealed.advance(self._all_acked)

    def progress(self) -> dict[str, Progress]:
        """The progress through each bucket, as retention is to go by it. A bucket counts as
        finished only once the targets of its cancel markers are acknowledged in the
        cursor as well (not only cancelled ahead of the read): every subscription's
        finishing it lets retention delete it, and with it the markers, which a restart
        of this one, its read resuming past the bucket's ledgers, learns from nowhere
        else. Until then it is reported as short of its last segments."""
        out = self.sealed.progress()
        for key, b in self.sealed.buckets.items():
            if out.get(key) != FINISHED or not b.meta.markers or key in self._confirmed:
                continue
            targets = np.fromiter(
                (t for _, t in b.meta.markers), dtype=np.int64, count=len(b.meta.markers)
            )
            if self._marks.all_acked(targets, _NOTHING_AHEAD):
                self._confirmed.add(key)
            else:
                out[key] = self.sealed.short_of_finished(key)
        self._confirmed &= self.sealed.buckets.keys()
        return out

    def _all_acked(self, keys: np.ndarray) -> bool:
        return self._marks.all_acked(keys, self._cancels.ahead)
