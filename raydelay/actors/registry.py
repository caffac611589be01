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
    """Calls ride out a coordinator restart (they are idempotent: a put names its key, a
    remove of a missing key does nothing), for up to ``deadline_s`` seconds."""

    def __init__(self, coordinator: Any, deadline_s: float = 30.0) -> None:
        self._coordinator = coordinator
        self._deadline_s = deadline_s

    def _call(self, submit: Any) -> Any:
        return rpc.call(
            submit, what="coordinator", deadline_s=self._deadline_s, wait=rpc.get_blocking
        )

    def list(self, name: str) -> dict[str, bytes]:
        return self._call(lambda: self._coordinator.registry_list.remote(name))

    def put(self, name: str, bucket_key: str, record: bytes) -> None:
        self.apply([("put", name, bucket_key, record)])

    def remove(self, name: str, bucket_key: str) -> None:
        self.apply([("remove", name, bucket_key, None)])

    def apply(self, ops: list[tuple[str, str, str, bytes | None]]) -> None:
        """Several puts and removes in one coordinator call (one journal write)."""
        self._call(lambda: self._coordinator.registry_apply.remote(ops))
