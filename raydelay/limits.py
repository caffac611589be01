"""Limits that -1 switches off, as in Pulsar's settings (a leaf module: config and the
trackers both use it)."""

from __future__ import annotations

import sys

from raydelay.errors import InvalidArgument

NO_LIMIT = -1  # Pulsar's convention for a limit that is off


def check_limit(field: str, value: object) -> int:
    """A positive limit, or -1 for none (then the largest int, so comparisons need no
    special case)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{field}: expected an int, got {type(value).__name__}")
    if value == NO_LIMIT:
        return sys.maxsize
    if value <= 0:
        raise InvalidArgument(f"{field}: must be > 0, or -1 for no limit; got {value}")
    return value
