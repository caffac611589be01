"""The ObjectStore contract: bytes in, bytes out. Callers do their own serialization."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from raydelay.errors import Conflict, InvalidArgument, NotFound


@runtime_checkable
class ObjectStore(Protocol):
    """A flat key -> bytes store.

    - ``put`` is atomic: a reader sees the whole new value or the old one, never a part.
    - ``put_new`` is ``put`` for a key that must not exist yet (create-only). If an object
      is there with the same bytes it returns (a retried write whose answer was lost);
      with other bytes it raises :class:`~raydelay.errors.Conflict`.
    - ``get`` / ``get_range`` raise NotFound for a missing key.
    - ``get_range(key, start, end)`` returns bytes ``[start, end)`` clipped to the object.
    - ``delete`` of a missing key is a no-op (deletes are idempotent).
    - ``list(prefix)`` returns every key starting with ``prefix``, sorted.
    - Failures of the medium raise StorageError(retriable=...).
    """

    def put(self, key: str, data: bytes) -> None: ...

    def put_new(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def get_range(self, key: str, start: int, end: int) -> bytes: ...

    def delete(self, key: str) -> None: ...

    def list(self, prefix: str = "") -> list[str]: ...

    def exists(self, key: str) -> bool: ...


def check_data(data: object) -> bytes:
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if not isinstance(data, bytes):
        raise InvalidArgument(f"data: expected bytes, got {type(data).__name__}")
    return data


def check_range(start: object, end: object) -> tuple[int, int]:
    for field, v in (("start", start), ("end", end)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidArgument(f"{field}: expected an int, got {type(v).__name__}")
        if v < 0:
            raise InvalidArgument(f"{field}: must be >= 0, got {v}")
    if end < start:  # type: ignore[operator]
        raise InvalidArgument(f"end: {end} is before start {start}")
    return start, end  # type: ignore[return-value]


def same_or_conflict(store: ObjectStore, key: str, data: bytes) -> None:
    """After a create-only write found ``key`` taken: fine if it holds ``data``, else a
    :class:`~raydelay.errors.Conflict`."""
    try:
        there = store.get(key)
    except NotFound:  # deleted meanwhile: whoever did so owns it
        there = None
    if there != data:
        raise conflict(key)


def conflict(key: str) -> Conflict:
    return Conflict(
        f"put {key!r}: another object is already there (is a second raydelay cluster "
        "writing this store?)"
    )
