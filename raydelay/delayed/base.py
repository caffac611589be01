"""The DelayedDeliveryTracker protocol (docs/delayed-index.md; after Pulsar PIP-26 / PIP-195).

All times are integer milliseconds since the epoch. ``cutoff = now + tick`` by
default and ``cutoff = now`` in strict mode; a position is due when
``deliver_at <= cutoff``. Trackers are single-threaded: one caller at a time.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class DelayedDeliveryTracker(Protocol):
    def add_message(self, ledger_id: int, entry_id: int, deliver_at_ms: int) -> bool:
        """Track a position until ``deliver_at_ms``. False means: deliver it now."""
        ...

    def add_messages(self, ledger_ids, entry_ids, deliver_ats) -> np.ndarray:
        """Batch form of add_message: a numpy bool array, one result per position."""
        ...

    def get_scheduled_messages(self, max_messages: int) -> list[tuple[int, int]]:
        """Remove and return up to ``max_messages`` due positions (earliest due first),
        sorted by (ledger_id, entry_id)."""
        ...

    def has_message_available(self) -> bool: ...

    def number_of_delayed_messages(self) -> int: ...

    def buffer_memory_usage(self) -> int: ...

    def should_pause_all_deliveries(self) -> bool: ...

    def next_delivery_time(self) -> int | None:
        """The earliest deliver_at (epoch ms) the tracker knows of, or None when empty."""
        ...

    def reset_tick_time(self, tick_time_ms: int) -> None: ...

    def contains_message(self, ledger_id: int, entry_id: int) -> bool: ...

    def remove_message(self, ledger_id: int, entry_id: int) -> bool: ...

    def clear(self) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...
