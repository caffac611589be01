import time

import pytest

from raydelay import Clock, InvalidArgument, ManualClock, SystemClock


def test_manual_clock_starts_where_told_and_moves_only_when_told():
    clock = ManualClock(now_ms=1_000)
    assert clock.now_ms() == 1_000
    assert clock.advance(250) == 1_250
    clock.set(5_000)
    assert clock.now_ms() == 5_000


def test_manual_clock_defaults_to_zero():
    assert ManualClock().now_ms() == 0


def test_manual_clock_rejects_going_backwards_and_bad_values():
    clock = ManualClock(now_ms=100)
    with pytest.raises(InvalidArgument, match="ms: 50 is before"):
        clock.set(50)
    with pytest.raises(InvalidArgument, match="ms: must be >= 0"):
        clock.advance(-1)
    with pytest.raises(InvalidArgument, match="expected an int"):
        clock.advance(1.5)
    with pytest.raises(InvalidArgument, match="now_ms"):
        ManualClock(now_ms=-3)
    assert clock.now_ms() == 100


def test_system_clock_reads_epoch_milliseconds():
    before = int(time.time() * 1000)
    now = SystemClock().now_ms()
    after = int(time.time() * 1000)
    assert before - 1 <= now <= after + 1
    assert isinstance(now, int)


def test_both_clocks_satisfy_the_protocol():
    assert isinstance(SystemClock(), Clock)
    assert isinstance(ManualClock(), Clock)
