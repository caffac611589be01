"""The column form in which a subscription hands messages to a consumer (pure)."""

from __future__ import annotations

from typing import Any

import numpy as np

from raydelay.dispatch.keys import split_keys
from raydelay.dispatch.subscription import Delivery


def deliveries_to_wire(topic: str, partition: int, deliveries: list[Delivery]) -> dict[str, Any]:
    """Columns: ledger/entry ids, payloads, keys and properties (None when no message has
    any), publish times, deliver_at (epoch ms; -1 for an immediate message) and redelivery
    counts."""
    payloads: list[bytes] = []
    keys: list[str | None] | None = None
    props: list[dict[str, str] | None] | None = None
    times: list[int] = []
    for dv in deliveries:
        ents, idx = dv.obj.entries, dv.indexes.tolist()
        if ents.keys is not None and keys is None:
            keys = [None] * len(payloads)
        if ents.properties is not None and props is None:
            props = [None] * len(payloads)
        payloads.extend([ents.payloads[i] for i in idx])
        if keys is not None:
            keys.extend([ents.keys[i] for i in idx] if ents.keys is not None else [None] * len(idx))
        if props is not None:
            props.extend(
                [ents.properties[i] for i in idx]
                if ents.properties is not None
                else [None] * len(idx)
            )
        times.extend([dv.obj.publish_time_ms] * len(idx))
    if deliveries:
        all_keys = np.concatenate([dv.keys for dv in deliveries])
        ds = np.concatenate([dv.obj.entries.deliver_at_ms[dv.indexes] for dv in deliveries])
        counts = np.concatenate([dv.counts for dv in deliveries])
    else:
        all_keys = ds = counts = np.zeros(0, dtype=np.int64)
    ledgers, entries = split_keys(all_keys)
    return {
        "topic": topic,
        "partition": partition,
        "l": ledgers.tolist(),
        "e": entries.tolist(),
        "p": payloads,
        "k": keys,
        "pr": props,
        "t": times,
        "d": ds.tolist(),
        "r": counts.tolist(),
    }
