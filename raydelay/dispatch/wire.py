"""The column form in which a subscription hands messages to a consumer (pure)."""

from __future__ import annotations

from typing import Any

from raydelay.dispatch.subscription import Delivery, position_of
from raydelay.log.entries import NO_DELAY


def deliveries_to_wire(topic: str, partition: int, deliveries: list[Delivery]) -> dict[str, Any]:
    """Columns: ledger/entry ids, payloads, keys, properties, publish and deliver_at times
    (epoch ms; None for an immediate message) and redelivery counts."""
    cols: dict[str, Any] = {
        "topic": topic,
        "partition": partition,
        "l": [],
        "e": [],
        "p": [],
        "k": [],
        "pr": [],
        "t": [],
        "d": [],
        "r": [],
    }
    for dv in deliveries:
        ledger_id, entry_id = position_of(dv.key)
        ents = dv.obj.entries
        d = int(ents.deliver_at_ms[dv.index])
        cols["l"].append(ledger_id)
        cols["e"].append(entry_id)
        cols["p"].append(ents.payloads[dv.index])
        cols["k"].append(ents.key(dv.index))
        cols["pr"].append(ents.props(dv.index))
        cols["t"].append(dv.obj.publish_time_ms)
        cols["d"].append(None if d == NO_DELAY else d)
        cols["r"].append(dv.redelivery_count)
    return cols
