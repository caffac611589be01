"""The Ray cluster's nodes, as raydelay needs to know them."""

from __future__ import annotations

import ray

from raydelay.config import StorageConfig, store_refusal
from raydelay.errors import InvalidArgument


def live_nodes() -> int:
    """How many nodes of the Ray cluster this process is attached to are alive."""
    return sum(1 for n in ray.nodes() if n.get("Alive"))


def check_store(storage: StorageConfig) -> None:
    """Refuse a store that cannot serve this Ray cluster (see ``store_refusal``): an
    InvalidArgument that names the fix."""
    if storage.kind != "local" or storage.local.shared:
        return  # (without asking Ray for its nodes: every actor's recovery checks this)
    why = store_refusal(storage, live_nodes())
    if why is not None:
        raise InvalidArgument(why)
