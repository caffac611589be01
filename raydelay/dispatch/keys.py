"""The hash of a message key, written once.

A key's partition (the producer and ingestion route alike) and its key_shared hash slot
both derive from :func:`key_hash`. Position keys (``ledger << 32 | entry``) are another
thing, defined in :mod:`raydelay.positions`.
"""

from __future__ import annotations

import zlib

__all__ = ["key_hash"]


def key_hash(key: str) -> int:
    """The one hash of a message key (CRC-32 of its UTF-8): the producer and ingestion
    route a key to partition ``key_hash(key) % partitions`` with it, and a key_shared
    subscription derives its hash slot from it."""
    return zlib.crc32(key.encode("utf-8"))
