"""Message-key hashing, and the position-key names the client and log layers import from here.

A position key is defined once, in :mod:`raydelay.delayed.index` (``ledger_id << 32 |
entry_id`` as one non-negative int64); this module re-exports those names unchanged.
"""

from __future__ import annotations

import zlib

from raydelay.delayed.index import (
    LOW,
    MAX_LEDGER_ID,
    SHIFT,
    Position,
    key_of,
    position_in_range,
    position_of,
    split_keys,
)
from raydelay.delayed.index import position_keys as join_keys

__all__ = [
    "LOW",
    "MAX_LEDGER_ID",
    "SHIFT",
    "Position",
    "join_keys",
    "key_hash",
    "key_of",
    "position_in_range",
    "position_of",
    "split_keys",
]


def key_hash(key: str) -> int:
    """The one hash of a message key (CRC-32 of its UTF-8): the producer and ingestion
    route a key to partition ``key_hash(key) % partitions`` with it, and a key_shared
    subscription derives its hash slot from it."""
    return zlib.crc32(key.encode("utf-8"))
