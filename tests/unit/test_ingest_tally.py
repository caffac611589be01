"""The ingest job's tally (raydelay.ingest.tally.Tally) as the plain object its actor runs."""

from __future__ import annotations

from raydelay.ingest.tally import Tally


def test_the_newest_attempt_of_a_split_replaces_the_older_ones_counts():
    # Given a split whose attempt 0 counted rows before attempt 1 took over
    tally = Tally()
    tally.add(split=0, attempt=0, rows=10, accepted=9, rejected=1)
    tally.add(split=0, attempt=1, rows=4, accepted=4, rejected=0)
    # When a late report of attempt 0 arrives, and another split reports
    tally.add(split=0, attempt=0, rows=10, accepted=10, rejected=0)
    tally.add(split=1, attempt=0, rows=5, accepted=3, rejected=2)
    tally.finish(1, {"rows": 5})
    # Then only the newest attempt of each split counts
    assert tally.snapshot() == {"rows": 9, "accepted": 7, "rejected": 2, "splits_done": 1}
    assert tally.final() == {1: {"rows": 5}}


def test_the_first_rows_are_timed_when_a_split_first_reports_rows():
    # Given a tally that has heard of nothing but an empty chunk
    tally = Tally()
    tally.add(split=0, attempt=0, rows=0, accepted=0, rejected=0)
    assert tally.first_rows_at() is None
    # When rows come, and then more
    tally.add(split=1, attempt=0, rows=5, accepted=5, rejected=0)
    first = tally.first_rows_at()
    tally.add(split=0, attempt=0, rows=5, accepted=5, rejected=0)
    # Then the first report of rows set the time, and later ones kept it
    assert first is not None and tally.first_rows_at() == first
