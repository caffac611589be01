"""The ObjectStore layer: one bytes-only interface and its backends (docs/storage.md).

The S3 backend and the config are imported lazily, so that importing this package (as
the pure core does, for the protocol and keys) pulls in neither boto3 nor the config.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raydelay.config import Config, StorageConfig
from raydelay.errors import InvalidArgument
from raydelay.storage.base import ObjectStore
from raydelay.storage.counting import CountingObjectStore
from raydelay.storage.faulty import FaultyObjectStore
from raydelay.storage.keys import validate_key, validate_name, validate_prefix
from raydelay.storage.local import LocalDirObjectStore
from raydelay.storage.memory import MemoryObjectStore

__all__ = [
    "ObjectStore",
    "MemoryObjectStore",
    "LocalDirObjectStore",
    "S3ObjectStore",
    "FaultyObjectStore",
    "CountingObjectStore",
    "make_store",
    "shared_store",
    "make_s3_client",
    "validate_key",
    "validate_name",
    "validate_prefix",
]


def make_store(config: Config | StorageConfig, *, s3_client: Any = None) -> ObjectStore:
    """Build the store a config names. ``s3_client`` overrides the boto3 client (tests)."""
    from raydelay.config import Config, StorageConfig

    storage = config.storage if isinstance(config, Config) else config
    if not isinstance(storage, StorageConfig):
        raise InvalidArgument(
            f"config: expected a Config or StorageConfig, got {type(config).__name__}"
        )
    store = _backend(storage, s3_client)
    if storage.faults.enabled:  # chaos tests: every actor's store misbehaves the same way
        faulty = FaultyObjectStore(store)
        faulty.set_failure_rate(storage.faults.failure_rate, seed=storage.faults.seed or None)
        faulty.set_outage_file(storage.faults.outage_file)
        return faulty
    return store


_shared: dict[str, ObjectStore] = {}  # storage config (JSON) -> its store, in this process
_shared_lock = threading.Lock()


def shared_store(config: Config | StorageConfig) -> ObjectStore:
    """The store a config names, made once per process and storage config and then shared:
    a host's partitions all use one (an S3 client costs tens of milliseconds of CPU to
    make, more while a failover starts many at once, and it is thread-safe). A memory
    store is never shared (each is a separate store)."""
    from raydelay.config import Config

    storage = config.storage if isinstance(config, Config) else config
    if storage.kind == "memory":
        return make_store(storage)
    key = storage.model_dump_json()
    with _shared_lock:
        store = _shared.get(key)
        if store is None:
            store = _shared[key] = make_store(storage)
    return store


def _backend(storage: StorageConfig, s3_client: Any) -> ObjectStore:
    if storage.kind == "memory":
        return MemoryObjectStore()
    if storage.kind == "local":
        return LocalDirObjectStore(storage.local.root)
    if storage.kind == "s3":
        from raydelay.storage.s3 import S3ObjectStore, make_s3_client

        s3 = storage.s3
        client = s3_client or make_s3_client(
            endpoint_url=s3.endpoint_url or None, region=s3.region, max_attempts=s3.max_attempts
        )
        return S3ObjectStore(
            client, s3.bucket, s3.prefix, sse=s3.sse, sse_kms_key_id=s3.sse_kms_key_id
        )
    raise InvalidArgument(f"storage.kind: unknown kind {storage.kind!r}")  # pragma: no cover


def __getattr__(name: str) -> Any:
    if name in ("S3ObjectStore", "make_s3_client"):
        from raydelay.storage import s3

        return getattr(s3, name)
    raise AttributeError(f"module 'raydelay.storage' has no attribute {name!r}")
