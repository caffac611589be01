"""The checks every client entry point runs on times and durations (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from raydelay.client.message import MAX_DELIVER_AT_MS, check_number, deliver_at_of
from raydelay.errors import InvalidArgument
from raydelay.log.entries import NO_DELAY

NOW = 1_700_000_000_000


@pytest.mark.parametrize(
    "deliver_at, deliver_after, expected",
    [
        (None, None, NO_DELAY),
        (None, 1.5, NOW + 1_500),
        (None, timedelta(minutes=2), NOW + 120_000),
        (None, np.float32(0.25), NOW + 250),
        (None, np.int64(3), NOW + 3_000),
        (NOW + 7, None, NOW + 7),
        (np.int64(NOW + 9), None, NOW + 9),
        (datetime.fromtimestamp((NOW + 5_000) / 1000, UTC), None, NOW + 5_000),
        (MAX_DELIVER_AT_MS, None, MAX_DELIVER_AT_MS),
    ],
)
def test_times_a_python_user_brings_are_accepted(deliver_at, deliver_after, expected):
    assert deliver_at_of(deliver_at, deliver_after, NOW, 0) == expected


@pytest.mark.parametrize(
    "deliver_at, deliver_after, words",
    [
        (2**63, None, "deliver_at: 9223372036854775808 is after year 9999"),
        (MAX_DELIVER_AT_MS + 1, None, "after year 9999"),
        (np.uint64(2**64 - 1), None, "after year 9999"),
        (None, 1e300, "deliver_after: 1e\\+300 s from now is after year 9999"),
        (None, float("inf"), "deliver_after: must be a finite number of seconds >= 0"),
        (None, timedelta(days=-1), "deliver_after: must be a finite number of seconds >= 0"),
        (None, "5", "deliver_after: expected seconds .* or a timedelta, got str"),
        (None, True, "got bool"),
        (1.5, None, "deliver_at: expected epoch milliseconds"),
        # (the plain cases' fast path refuses what the full checks refuse)
        (None, float("nan"), "deliver_after: must be a finite number of seconds >= 0"),
        (None, -0.001, "deliver_after: must be a finite number of seconds >= 0"),
        (None, -1, "deliver_after: must be a finite number of seconds >= 0"),
        (-1, None, "deliver_at: must be >= 0"),
        (True, None, "deliver_at: expected epoch milliseconds .* got bool"),
        (NOW, 1.0, "give deliver_at or deliver_after, not both"),
    ],
)
def test_absurd_times_are_invalid_arguments_naming_the_field(deliver_at, deliver_after, words):
    with pytest.raises(InvalidArgument, match=words):
        deliver_at_of(deliver_at, deliver_after, NOW, 0)


@pytest.mark.parametrize(
    "deliver_at, deliver_after", [(None, 3_601), (None, 3_600.5), (NOW + 3_600_001, None)]
)
def test_a_time_beyond_max_delay_ms_is_refused_on_every_path(deliver_at, deliver_after):
    assert deliver_at_of(None, 3_600, NOW, 3_600_000) == NOW + 3_600_000  # (at the limit)
    with pytest.raises(InvalidArgument, match="beyond delayed.max_delay_ms"):
        deliver_at_of(deliver_at, deliver_after, NOW, 3_600_000)


def test_durations_take_a_timedelta_or_numpy_numbers():
    assert check_number("delay_s", timedelta(milliseconds=1500)) == 1.5
    assert check_number("timeout_s", np.float64(0.5)) == 0.5
    with pytest.raises(InvalidArgument, match="ack_timeout_s: must be a finite number >= 0.001"):
        check_number("ack_timeout_s", timedelta(0), minimum=0.001)
    with pytest.raises(InvalidArgument, match="delay_s: must be a finite number >= 0"):
        check_number("delay_s", 1e400)


def test_minus_one_means_no_limit_as_in_pulsar():
    import sys

    from raydelay.config import DelayedConfig
    from raydelay.limits import check_limit

    assert check_limit("max_num_buckets", -1) == sys.maxsize
    assert check_limit("max_num_buckets", 7) == 7
    for bad in (0, -2):
        with pytest.raises(InvalidArgument, match="max_num_buckets: must be > 0, or -1"):
            check_limit("max_num_buckets", bad)
    DelayedConfig(max_indexes_per_segment=-1, max_num_buckets=-1)  # accepted
    with pytest.raises(InvalidArgument, match="delayed.max_num_buckets: must be > 0, or -1"):
        DelayedConfig(max_num_buckets=0)
