"""What both trackers share: argument checks, the cutoff, and the pop loop's output shape."""

from __future__ import annotations

from raydelay.clock import Clock
from raydelay.errors import InvalidArgument


def check_clock(clock: object) -> Clock:
    if not callable(getattr(clock, "now_ms", None)):
        raise InvalidArgument("clock: expected an object with now_ms() (a raydelay.clock.Clock)")
    return clock  # type: ignore[return-value]


def check_positive_int(field: str, value: object, *, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{field}: expected an int, got {type(value).__name__}")
    if value < 0 or (value == 0 and not allow_zero):
        raise InvalidArgument(f"{field}: must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return value


def check_max_messages(value: object) -> int:
    return check_positive_int("max_messages", value, allow_zero=True)


class TickMixin:
    """cutoff = now + tick (default) or now (strict)."""

    _clock: Clock
    _tick_time_ms: int
    _strict: bool

    def _cutoff(self) -> int:
        now = self._clock.now_ms()
        return now if self._strict else now + self._tick_time_ms

    def reset_tick_time(self, tick_time_ms: int) -> None:
        """Change the tick (milliseconds): the cutoff margin in non-strict mode."""
        self._tick_time_ms = check_positive_int("tick_time_ms", tick_time_ms)

    @property
    def tick_time_ms(self) -> int:
        return self._tick_time_ms
