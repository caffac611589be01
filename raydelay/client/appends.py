"""A producer's append calls: the messages of one send cut into one call per partition,
and the MessageIds taken from the calls' answers. Shared by the sync producer (which waits
for the answers) and the asyncio one (which awaits them): :class:`raydelay.Producer`
``submit`` and ``finish``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from raydelay.client.message import MessageIds
from raydelay.errors import RaydelayError
from raydelay.log.entries import Entries


@dataclass(frozen=True)
class Appends:
    """Append calls submitted and not answered yet: the messages' partitions, and per
    call (partition, each chunk's message indexes, the encoded batches, the reply)."""

    parts: np.ndarray
    calls: list[tuple[int, list[np.ndarray], list[bytes], Any]]

    def replies(self) -> list[Any]:
        return [call[3] for call in self.calls]


def chunks_by_partition(
    parts: np.ndarray,
    payloads: Any,
    keys: list | None,
    props: list | None,
    d: np.ndarray,
    partitions: int,
    chunk: int,
) -> dict[int, list[tuple[np.ndarray, Entries]]]:
    """The messages as entries, per partition in chunks of at most ``chunk``: (message
    indexes, entries) each, in order. ``keys`` / ``props`` may be None: no message has one."""
    any_keys = keys is not None and any(k is not None for k in keys)
    any_props = props is not None and any(p is not None for p in props)
    # The columns are built once for the whole call; each chunk is a slice of them
    # (keyless messages go to partitions in contiguous runs) or a take.
    block = Entries.build(payloads, d, keys if any_keys else None, props if any_props else None)
    by_partition: dict[int, list[tuple[np.ndarray, Entries]]] = {}
    for p in range(partitions):
        idx_all = np.flatnonzero(parts == p)
        for lo in range(0, len(idx_all), chunk):
            idx = idx_all[lo : lo + chunk]
            if idx[-1] - idx[0] + 1 == len(idx):
                entries = block.slice(int(idx[0]), int(idx[-1]) + 1)
            else:
                entries = block.take(idx)
            by_partition.setdefault(p, []).append((idx, entries))
    return by_partition


def ids_of(
    topic: str, appends: Appends, answer: Callable[[int, list[bytes], Any], list]
) -> tuple[MessageIds, dict[int, BaseException]]:
    """The MessageIds of submitted appends, in input order, and each failed partition's
    error (the ids of its messages are not valid: it appended none of them).
    ``answer(partition, batches, reply)`` gives a call's position ranges."""
    parts = appends.parts
    ledger_col = np.zeros(len(parts), dtype=np.int64)
    entry_col = np.zeros(len(parts), dtype=np.int64)
    failed: dict[int, BaseException] = {}
    for p, idxs, datas, ref in appends.calls:
        try:
            answers = answer(p, datas, ref)
        except Exception as exc:  # noqa: BLE001 - this partition's senders get it
            failed[p] = exc
            continue
        for idx, ranges in zip(idxs, answers, strict=True):
            ledgers = np.concatenate([np.full(c, lg, dtype=np.int64) for lg, _, c in ranges])
            positions = np.concatenate([np.arange(f, f + c, dtype=np.int64) for _, f, c in ranges])
            if len(ledgers) != len(idx):
                failed[p] = RaydelayError(
                    f"partition {p} returned {len(ledgers)} positions for {len(idx)} messages"
                )
                break
            ledger_col[idx] = ledgers
            entry_col[idx] = positions
    return MessageIds(topic, parts.astype(np.int64), ledger_col, entry_col), failed
