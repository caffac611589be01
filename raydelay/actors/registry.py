"""The coordinator-backed BucketRegistry a subscription's bucket tracker uses.

The tracker calls it from its I/O thread (never from the event loop), so the
blocking calls here never stall delivery. A put or remove is one journaled
coordinator call; a bucket holds tens of thousands of positions, so this is
already one call per large batch.
"""

from __future__ import annotations

import builtins

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.cluster.handles import Peer


class CoordinatorRegistry:
    """Calls ride out a coordinator restart (they are idempotent: a put names its key, a
    remove of a missing key does nothing), for up to the peer's ``deadline_s``."""

    def __init__(self, coordinator: Peer[CoordinatorActor]) -> None:
        self._coordinator = coordinator

    def list(self, name: str) -> dict[str, bytes]:
        return self._coordinator.call_from_thread(CoordinatorActor.registry_list, name)

    def put(self, name: str, bucket_key: str, record: bytes) -> None:
        self.apply([("put", name, bucket_key, record)])

    def remove(self, name: str, bucket_key: str) -> None:
        self.apply([("remove", name, bucket_key, None)])

    def apply(self, ops: builtins.list[tuple[str, str, str, bytes | None]]) -> None:
        """Several puts and removes in one coordinator call (one journal write)."""
        self._coordinator.call_from_thread(CoordinatorActor.registry_apply, ops)
