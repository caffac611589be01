"""The coordinator-backed BucketRegistry a subscription's bucket tracker uses.

The tracker calls it from its I/O thread (never from the event loop), so the
blocking calls here never stall delivery. A put or remove is one journaled
coordinator call; a bucket holds tens of thousands of positions, so this is
already one call per large batch.
"""

from __future__ import annotations

from typing import Any

from raydelay.cluster import rpc


class CoordinatorRegistry:
    def __init__(self, coordinator: Any) -> None:
        self._coordinator = coordinator

    def list(self, name: str) -> dict[str, bytes]:
        return rpc.get_blocking(self._coordinator.registry_list.remote(name), what="coordinator")

    def put(self, name: str, bucket_key: str, record: bytes) -> None:
        self.apply([("put", name, bucket_key, record)])

    def remove(self, name: str, bucket_key: str) -> None:
        self.apply([("remove", name, bucket_key, None)])

    def apply(self, ops: list[tuple[str, str, str, bytes | None]]) -> None:
        """Several puts and removes in one coordinator call (one journal write)."""
        rpc.get_blocking(self._coordinator.registry_apply.remote(ops), what="coordinator")
