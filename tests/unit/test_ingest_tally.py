"""The ingest job's tally (raydelay.ingest.job._Tally) as the plain object its actor runs."""

from __future__ import annotations

from raydelay.ingest.job import _Tally


def test_the_newest_attempt_of_a_split_replaces_the_older_ones_counts():
    # Given a split whose attempt 0 counted rows before attempt 1 took over
    tally = _Tally()
    tally.add(split=0, attempt=0, rows=10, accepted=9, rejected=1)
    tally.add(split=0, attempt=1, rows=4, accepted=4, rejected=0)
    # When a late report of attempt 0 arrives, and another split reports
    tally.add(split=0, attempt=0, rows=10, accepted=10, rejected=0)
    tally.add(split=1, attempt=0, rows=5, accepted=3, rejected=2)
    tally.finish(1, {"rows": 5})
    # Then only the newest attempt of each split counts
    assert tally.snapshot() == {"rows": 9, "accepted": 7, "rejected": 2, "splits_done": 1}
    assert tally.final() == {1: {"rows": 5}}
