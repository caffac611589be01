"""Recurring schedules with a manual clock: the catch-up policies, pause, daylight saving,
and months of simulated time with kills and outages (raydelay.tasks.simulation drives the
runner's own cron steps)."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from raydelay.errors import InvalidArgument
from raydelay.tasks import cron
from raydelay.tasks.simulation import simulate, simulate_overlap

MIN = 60_000
HOUR = 60 * MIN
DAY = 24 * HOUR


def _ms(*parts, tz="UTC") -> int:
    return int(datetime(*parts, tzinfo=ZoneInfo(tz)).timestamp() * 1000)


def _schedule(expr="*/15 * * * *", catch_up="all", tz="UTC", paused=False) -> cron.Schedule:
    return cron.Schedule("s", expr, tz, catch_up, b"", "t", "g", paused=paused)


def test_an_occurrence_on_time_runs_and_arms_the_next():
    s = _schedule()
    t = _ms(2026, 11, 25, 10, 15)
    d = cron.decide(s, t, t + 40, grace_ms=MIN)
    assert d == cron.Decision(True, t + 15 * MIN, "due")


def test_catch_up_all_runs_every_missed_occurrence_in_turn():
    s = _schedule(catch_up="all")
    t = _ms(2026, 11, 25, 10, 0)
    now = t + 50 * MIN  # down for 50 minutes: 10:00, 10:15, 10:30, 10:45 missed
    ran, armed = [], t
    while armed <= now:
        d = cron.decide(s, armed, now, grace_ms=MIN)
        assert d.run
        ran.append(armed)
        armed = d.arm_ms
    assert ran == [t, t + 15 * MIN, t + 30 * MIN, t + 45 * MIN]
    assert armed == t + 60 * MIN  # then back on the clock


def test_catch_up_latest_runs_only_the_most_recent_missed_one():
    s = _schedule(catch_up="latest")
    t = _ms(2026, 11, 25, 10, 0)
    now = t + 50 * MIN
    d = cron.decide(s, t, now, grace_ms=MIN)
    assert d == cron.Decision(False, t + 45 * MIN, "passed over")
    d2 = cron.decide(s, d.arm_ms, now + 5, grace_ms=MIN)  # 10:45 fires at once: it runs
    assert d2 == cron.Decision(True, t + 60 * MIN, "catch-up")


def test_catch_up_none_runs_none_of_the_missed_ones():
    s = _schedule(catch_up="none")
    t = _ms(2026, 11, 25, 10, 0)
    now = t + 50 * MIN
    assert cron.decide(s, t, now, grace_ms=MIN) == cron.Decision(False, t + 60 * MIN, "passed over")
    # within the grace it is not missed
    assert cron.decide(s, t, t + 30_000, grace_ms=MIN).run


def test_a_paused_schedule_keeps_its_chain_and_runs_nothing():
    s = _schedule(paused=True)
    t = _ms(2026, 11, 25, 10, 0)
    assert cron.decide(s, t, t + 10, grace_ms=MIN) == cron.Decision(False, t + 15 * MIN, "paused")
    # nothing is caught up for the time it was paused
    assert cron.decide(s, t, t + 50 * MIN, grace_ms=MIN).arm_ms == t + 60 * MIN


def test_daylight_saving():
    paris = "Europe/Paris"
    # autumn: 02:30 happens twice on 25 October; a daily job runs once
    t, days = _ms(2026, 10, 23, tz=paris), []
    for _ in range(4):
        t = cron.next_occurrence("30 2 * * *", paris, t)
        days.append(datetime.fromtimestamp(t / 1000, ZoneInfo(paris)).strftime("%d %H:%M %z"))
    assert days == ["23 02:30 +0200", "24 02:30 +0200", "25 02:30 +0200", "26 02:30 +0100"]
    # an every-30-minutes job keeps real time through the repeated hour
    t = _ms(2026, 10, 25, 0, 0)  # 02:00 CEST
    steps = []
    for _ in range(4):
        nxt = cron.next_occurrence("*/30 * * * *", paris, t)
        steps.append(nxt - t)
        t = nxt
    assert steps == [30 * MIN] * 4
    # spring: 02:30 does not exist on 29 March; it runs when the clock jumps to 03:00
    t = cron.next_occurrence("30 2 * * *", paris, _ms(2026, 3, 28, 12, tz=paris))
    assert datetime.fromtimestamp(t / 1000, ZoneInfo(paris)).strftime("%d %H:%M") == "29 03:00"


def test_200_days_with_kills_and_outages_skip_nothing():
    start = _ms(2026, 1, 1)
    outages = [
        (start + 30 * DAY, start + 30 * DAY + 5 * HOUR),
        (start + 120 * DAY, start + 121 * DAY),
    ]
    out = simulate(
        "*/15 * * * *", "Europe/Paris", start, 200, catch_up="all", kill_rate=0.05, outages=outages
    )
    assert len(out.expected) == 200 * 96
    assert out.kills > 2_000  # the kills landed between every pair of steps
    assert out.skipped == [] and out.unexpected == []
    # a call runs again only when a kill cut it (during the call, or before its done marker)
    assert len(out.ran_twice) <= out.kills
    twice_completed = [t for t, n in out.completed.items() if n > 1]
    assert twice_completed == []  # a done marker stops every later delivery of it


@pytest.mark.parametrize("policy", ["latest", "none"])
def test_outages_under_latest_and_none(policy):
    start = _ms(2026, 1, 1)
    # down from 00:02 to 05:02 on day 2: 00:15 .. 05:00, 20 occurrences of */15, missed
    down = (start + 2 * DAY + 2 * MIN, start + 2 * DAY + 5 * HOUR + 2 * MIN)
    out = simulate("*/15 * * * *", "UTC", start, 4, catch_up=policy, kill_rate=0.0, outages=[down])
    missed = [t for t in out.expected if down[0] <= t < down[1]]
    ran_missed = [t for t in missed if out.runs[t]]
    assert len(missed) == 20
    assert ran_missed == ([missed[-1]] if policy == "latest" else [])
    assert all(out.runs[t] == 1 for t in out.expected if t not in missed)


def test_bad_schedules():
    with pytest.raises(InvalidArgument, match="^cron: "):
        cron.check_cron("* * *")
    with pytest.raises(InvalidArgument, match="^cron: "):
        cron.check_cron(5)
    assert cron.check_cron("  0   2 * * * ") == "0 2 * * *"
    assert cron.check_cron("*/5 * * * * 30") == "*/5 * * * * 30"
    with pytest.raises(InvalidArgument, match="^timezone: "):
        cron.check_timezone("Europe/Atlantis")
    with pytest.raises(InvalidArgument, match="^timezone: "):
        cron.check_timezone(None)
    with pytest.raises(InvalidArgument, match="^catch_up: "):
        cron.check_catch_up("some")
    with pytest.raises(InvalidArgument, match="^name: "):
        cron.check_name("../escape")
    s = _schedule(tz="Asia/Tokyo")
    assert cron.Schedule.from_bytes(s.to_bytes()) == s
    assert datetime.fromtimestamp(s.next_after(_ms(2026, 1, 1)) / 1000, UTC).minute == 15


def test_start_and_end_bound_the_occurrences_and_the_chain_ends_after_the_last():
    start, end = _ms(2026, 3, 1, 9, 5), _ms(2026, 3, 1, 10, 0)
    s = cron.Schedule("s", "*/15 * * * *", "UTC", "all", b"", "t", "g", start_ms=start, end_ms=end)
    assert s.next_after(_ms(2026, 3, 1)) == _ms(2026, 3, 1, 9, 15)  # none before start
    assert s.occurrences(_ms(2026, 3, 1), _ms(2026, 3, 2), limit=10) == [
        _ms(2026, 3, 1, 9, 15), _ms(2026, 3, 1, 9, 30), _ms(2026, 3, 1, 9, 45), end,
    ]  # fmt: skip
    assert s.next_after(end) is None
    last = cron.decide(s, end, end + 10, grace_ms=MIN)
    assert last == cron.Decision(True, None, "due")  # it runs, and arms nothing
    # an occurrence exactly at start counts
    s.start_ms = _ms(2026, 3, 1, 9, 15)
    assert s.next_after(_ms(2026, 3, 1)) == s.start_ms
    with pytest.raises(InvalidArgument, match="more than 2 occurrences"):
        s.occurrences(_ms(2026, 3, 1), _ms(2026, 3, 2), limit=2)


def test_jitter_delays_each_occurrence_by_a_stable_offset_within_its_bound():
    s = cron.Schedule("s", "0 * * * *", "UTC", "all", b"", "t", "g", jitter_ms=30 * MIN)
    times = [_ms(2026, 3, 1, h) for h in range(24)]
    offsets = [s.due_ms(t) - t for t in times]
    assert all(0 <= o < 30 * MIN for o in offsets)
    assert len(set(offsets)) > 20  # spread, not one offset
    assert [s.due_ms(t) - t for t in times] == offsets  # armed again: the same time
    other = cron.Schedule("other", "0 * * * *", "UTC", "all", b"", "t", "g", jitter_ms=30 * MIN)
    assert [other.due_ms(t) - t for t in times] != offsets  # another schedule, other offsets
    # late is counted from the due time: an occurrence due 20 min after its hour is on time
    late_hour = next(t for t, o in zip(times, offsets, strict=True) if o > 5 * MIN)
    due = s.due_ms(late_hour)
    s.catch_up = "none"
    assert cron.decide(s, late_hour, due + 1_000, grace_ms=MIN).run is True


def test_a_stored_schedule_without_the_new_fields_reads_with_their_defaults():
    old = cron.Schedule("s", "0 * * * *", "UTC", "all", b"\x01", "t", "g")
    data = old.to_bytes().replace(b', "end_ms": null', b"").replace(b', "jitter_ms": 0', b"")
    data = data.replace(b', "start_ms": null', b"")
    assert b"jitter_ms" not in data and b"start_ms" not in data
    back = cron.Schedule.from_bytes(data)
    assert (back.start_ms, back.end_ms, back.jitter_ms) == (None, None, 0)


def test_90_days_with_a_start_an_end_a_jitter_kills_and_an_outage():
    start = _ms(2026, 1, 1)
    begin, finish = start + 10 * DAY + 7 * MIN, start + 80 * DAY
    out = simulate(
        "*/30 * * * *", "Europe/Paris", start, 90, catch_up="all", kill_rate=0.05,
        outages=[(start + 40 * DAY, start + 40 * DAY + 3 * HOUR)], start_at_ms=begin,
        end_at_ms=finish, jitter_ms=10 * MIN, seed=3,
    )  # fmt: skip
    assert out.expected[0] == begin + 23 * MIN and out.expected[-1] == finish
    assert len(out.expected) == 70 * 48
    assert out.kills > 500
    assert out.skipped == [] and out.unexpected == [] and out.early == []
    # each started at or after its jittered due time, within the bound (outage aside)
    delays = [out.started_ms[t] - t for t in out.expected]
    assert min(delays) >= 0 and sorted(delays)[len(delays) // 2] < 10 * MIN
    assert [t for t, n in out.completed.items() if n > 1] == []


def test_the_overlap_policy():
    slot = cron.Slot
    # nothing runs, or the one before is done: it runs, whatever the policy
    for policy in cron.OVERLAP:
        assert cron.overlap(policy, 20, slot()) == "run"
        assert cron.overlap(policy, 20, slot(running=10, running_done=True)) == "run"
        assert cron.overlap(policy, 20, slot(running=20, running_done=False)) == "run"  # itself
    busy = slot(running=10, running_done=False)
    assert cron.overlap("allow_all", 20, busy) == "run"
    assert cron.overlap("skip", 20, busy) == "skip"
    assert cron.overlap("buffer_one", 20, busy) == "wait"
    waiting = slot(running=10, running_done=False, buffered=20, buffered_done=False)
    assert cron.overlap("buffer_one", 20, waiting) == "wait"  # (looked at again: still waits)
    assert cron.overlap("buffer_one", 30, waiting) == "skip"  # one waits already
    its_turn = slot(running=10, running_done=True, buffered=20, buffered_done=False)
    assert cron.overlap("buffer_one", 20, its_turn) == "run"
    assert cron.overlap("buffer_one", 30, its_turn) == "skip"  # 20 goes first
    started = slot(running=20, running_done=False, buffered=20, buffered_done=False)
    assert cron.overlap("buffer_one", 30, started) == "wait"
    with pytest.raises(InvalidArgument, match="overlap: expected one of allow_all, skip"):
        cron.check_overlap("queue")


@pytest.mark.parametrize("policy", ["skip", "buffer_one", "allow_all"])
def test_12_days_of_runs_that_outlast_their_interval(policy):
    # every 10 minutes, runs of 5 to 25 minutes, a kill now and then
    out = simulate_overlap(
        "*/10 * * * *", _ms(2026, 1, 1), 12, overlap=policy, run_ms=(5 * MIN, 25 * MIN),
        kill_rate=0.01, seed=7,
    )  # fmt: skip
    assert len(out.expected) == 12 * 144 and out.kills > 8
    assert out.lost == []  # each occurrence ran, or was passed over by the policy
    if policy == "allow_all":
        assert out.most_running >= 2 and out.skipped == []
        return
    assert out.most_running == 1  # never two at once
    assert out.skipped and all(t not in out.started for t in out.skipped)
    if policy == "buffer_one":
        assert out.most_waiting == 1
        assert out.waits_ms and max(out.waits_ms) <= 1_000  # its turn comes at once
        # a held one runs, so fewer are passed over than with skip
        skip = simulate_overlap(
            "*/10 * * * *", _ms(2026, 1, 1), 12, overlap="skip", run_ms=(5 * MIN, 25 * MIN),
            kill_rate=0.01, seed=7,
        )  # fmt: skip
        assert len(out.skipped) < len(skip.skipped)


def test_a_run_cut_short_runs_again_ahead_of_the_one_waiting():
    cut = cron.Slot(running=10, running_done=False, buffered=20, buffered_done=False)
    assert cron.overlap("buffer_one", 10, cut) == "run"
    assert cron.overlap("skip", 10, cut) == "run"
