"""Configuration: frozen dataclasses, loaded from TOML with ``tomllib``.

The dataclass defaults *are* the embedded default (``configs/default.toml``
mirrors them, and a test keeps the two equal). Single values are overridden by
environment variables named ``RAYDELAY_<SECTION>__<KEY>`` (nested tables add
more ``__`` parts, e.g. ``RAYDELAY_STORAGE__LOCAL__ROOT``), typed by the field.

S3 credentials are never read from here: boto3's standard chain provides them.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the project targets 3.11
    import tomli as tomllib

from raydelay.errors import InvalidArgument
from raydelay.limits import check_limit

ENV_PREFIX = "RAYDELAY_"
MIB = 1024 * 1024


def _positive(path: str, value: int | float) -> None:
    if value <= 0:
        raise InvalidArgument(f"{path}: must be > 0, got {value}")


def _non_negative(path: str, value: int | float) -> None:
    if value < 0:
        raise InvalidArgument(f"{path}: must be >= 0, got {value}")


def _choice(path: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InvalidArgument(f"{path}: must be one of {', '.join(choices)}; got {value!r}")


@dataclass(frozen=True)
class LocalStorageConfig:
    """``storage.local``: the local-directory store."""

    root: str = "./.raydelay/data"  # relative paths are taken from the working directory
    # the root is on a filesystem every node of the Ray cluster shares (NFS and the like);
    # without it a local store is refused on a cluster of more than one node
    shared: bool = False


@dataclass(frozen=True)
class S3StorageConfig:
    """``storage.s3``: an S3 bucket. Credentials come from boto3's standard chain only."""

    bucket: str = ""
    prefix: str = ""
    endpoint_url: str = ""  # empty: AWS; set it for MinIO, moto and the like
    region: str = "us-east-1"
    max_attempts: int = 3  # boto3 standard-mode budget per call; our retries stack on it

    def __post_init__(self) -> None:
        _positive("storage.s3.max_attempts", self.max_attempts)


@dataclass(frozen=True)
class FaultsConfig:
    """``storage.faults``: injected store failures, for chaos tests only (off by default)."""

    failure_rate: float = 0.0  # each store call fails (retriably) with this probability
    outage_file: str = ""  # while this file exists, every store call fails (retriably)
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.failure_rate <= 1:
            raise InvalidArgument(
                f"storage.faults.failure_rate: must be in [0, 1], got {self.failure_rate}"
            )

    @property
    def enabled(self) -> bool:
        return self.failure_rate > 0 or bool(self.outage_file)


@dataclass(frozen=True)
class StorageConfig:
    """``storage``: where the durable state lives."""

    kind: str = "local"  # local | s3 | memory (memory is for tests: nothing survives a restart)
    local: LocalStorageConfig = field(default_factory=LocalStorageConfig)
    s3: S3StorageConfig = field(default_factory=S3StorageConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)

    def __post_init__(self) -> None:
        _choice("storage.kind", self.kind, ("local", "s3", "memory"))
        if self.kind == "s3" and not self.s3.bucket:
            raise InvalidArgument("storage.s3.bucket: required when storage.kind is 's3'")


@dataclass(frozen=True)
class DelayedConfig:
    """``delayed``: the delayed-delivery index of each shared subscription."""

    tracker: str = "bucket"  # bucket | memory
    tick_time_ms: int = 10
    strict: bool = True  # never deliver before deliver_at
    min_index_count_per_bucket: int = 50_000
    max_indexes_per_segment: int = 5_000
    max_time_step_per_segment_ms: int = 300_000
    max_num_buckets: int = 64
    max_delay_ms: int = 0  # 0 = no limit
    fixed_delay_lookahead: int = 50_000  # in-memory tracker only

    def __post_init__(self) -> None:
        _choice("delayed.tracker", self.tracker, ("bucket", "memory"))
        _positive("delayed.tick_time_ms", self.tick_time_ms)
        _positive("delayed.min_index_count_per_bucket", self.min_index_count_per_bucket)
        check_limit("delayed.max_indexes_per_segment", self.max_indexes_per_segment)
        _positive("delayed.max_time_step_per_segment_ms", self.max_time_step_per_segment_ms)
        check_limit("delayed.max_num_buckets", self.max_num_buckets)
        _non_negative("delayed.max_delay_ms", self.max_delay_ms)
        _non_negative("delayed.fixed_delay_lookahead", self.fixed_delay_lookahead)


@dataclass(frozen=True)
class TopicConfig:
    """``topic``: the partition logs."""

    max_entries_per_ledger: int = 50_000
    group_commit_ms: int = 5
    group_commit_max_bytes: int = 4 * MIB  # a group commit is written early once this much gathers
    max_message_bytes: int = 5 * MIB
    tail_cache_bytes: int = 64 * MIB  # recent ledger objects kept in memory for readers
    index_cache_bytes: int = 64 * MIB  # object indexes kept for reads of scattered positions
    retention_interval_ms: int = 5_000  # how often a partition deletes fully acknowledged ledgers

    def __post_init__(self) -> None:
        _positive("topic.max_entries_per_ledger", self.max_entries_per_ledger)
        _non_negative("topic.tail_cache_bytes", self.tail_cache_bytes)
        _non_negative("topic.index_cache_bytes", self.index_cache_bytes)
        _positive("topic.retention_interval_ms", self.retention_interval_ms)
        _non_negative("topic.group_commit_ms", self.group_commit_ms)
        _positive("topic.group_commit_max_bytes", self.group_commit_max_bytes)
        _positive("topic.max_message_bytes", self.max_message_bytes)


@dataclass(frozen=True)
class SubscriptionConfig:
    """``subscription``: defaults for new subscriptions."""

    ack_timeout_s: float | None = None  # None: no ack timeout
    max_redeliveries: int | None = None  # None: never dead-letter
    read_ahead_entries: int = 10_000  # log entries held in memory waiting for a consumer
    cursor_persist_interval_ms: int = 1_000  # cursor writes are throttled to one per interval
    # a consumer not heard from (calls or its client's heartbeats) for this long is removed:
    # its unacked messages go to other consumers, failover promotes the next, exclusive frees
    consumer_lease_s: float = 10.0

    def __post_init__(self) -> None:
        _positive("subscription.read_ahead_entries", self.read_ahead_entries)
        _positive("subscription.consumer_lease_s", self.consumer_lease_s)
        _positive("subscription.cursor_persist_interval_ms", self.cursor_persist_interval_ms)
        if self.ack_timeout_s is not None:
            _positive("subscription.ack_timeout_s", self.ack_timeout_s)
        if self.max_redeliveries is not None:
            _positive("subscription.max_redeliveries", self.max_redeliveries)


@dataclass(frozen=True)
class ClientConfig:
    """``client``: how clients treat actors that are dead or restarting."""

    retry_deadline_s: float = 30.0  # calls are retried (with backoff) this long, then fail

    def __post_init__(self) -> None:
        _positive("client.retry_deadline_s", self.retry_deadline_s)


@dataclass(frozen=True)
class PlacementConfig:
    """``placement``: which nodes raydelay's actors go to (see raydelay/cluster/placement.py)."""

    # keep actors off the head node (it runs Ray's control service) while a worker is alive
    avoid_head: bool = True


@dataclass(frozen=True)
class RayConfig:
    """``ray``: health checks of a Ray that raydelay starts itself (``connect()`` without an
    address, ``raydelay up``); on a cluster started with ``ray start``, pass the same values
    as ``--system-config`` on the head. A node is declared dead after
    ``health_check_failure_threshold`` failed checks ``health_check_period_ms`` apart (Ray's
    own defaults: 3000 ms x 5, about 15 s); a check slower than ``health_check_timeout_ms``
    fails."""

    health_check_period_ms: int = 1_000
    health_check_timeout_ms: int = 5_000
    health_check_failure_threshold: int = 3

    def __post_init__(self) -> None:
        _positive("ray.health_check_period_ms", self.health_check_period_ms)
        _positive("ray.health_check_timeout_ms", self.health_check_timeout_ms)
        _positive("ray.health_check_failure_threshold", self.health_check_failure_threshold)

    def system_config(self) -> dict[str, int]:
        """The values as Ray's ``_system_config`` (``--system-config``) keys."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Config:
    """The whole configuration. ``Config()`` is the embedded default."""

    storage: StorageConfig = field(default_factory=StorageConfig)
    delayed: DelayedConfig = field(default_factory=DelayedConfig)
    topic: TopicConfig = field(default_factory=TopicConfig)
    subscription: SubscriptionConfig = field(default_factory=SubscriptionConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    ray: RayConfig = field(default_factory=RayConfig)


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Load a config file (or the embedded default when ``path`` is None), then apply
    ``RAYDELAY_<SECTION>__<KEY>`` overrides from ``env`` (``os.environ`` by default).

    Raises InvalidArgument naming the key for an unknown key or a wrongly typed value.
    """
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            with p.open("rb") as f:
                raw = tomllib.load(f)
        except FileNotFoundError:
            raise InvalidArgument(f"config: file not found: {p}") from None
        except tomllib.TOMLDecodeError as exc:
            raise InvalidArgument(f"config: {p} is not valid TOML: {exc}") from exc
    _apply_env(raw, os.environ if env is None else env)
    return _build(Config, raw, "")


def config_from_dict(raw: Mapping[str, Any]) -> Config:
    """Build a Config from a nested mapping shaped like the TOML file (no env overrides)."""
    return _build(Config, dict(raw), "")


def config_to_dict(config: Config) -> dict[str, Any]:
    """The nested-dict form of a config (the inverse of :func:`config_from_dict`)."""
    return dataclasses.asdict(config)


def _apply_env(raw: dict[str, Any], env: Mapping[str, str]) -> None:
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue  # e.g. RAYDELAY_CONFIG: not a value override
        parts = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        cls: Any = Config
        hints = _hints(cls)
        for i, part in enumerate(parts):
            if part not in hints:
                where = ".".join(parts[: i + 1])
                raise InvalidArgument(f"{name}: unknown config key {where!r}")
            if i < len(parts) - 1:
                cls = hints[part]
                if not dataclasses.is_dataclass(cls):
                    raise InvalidArgument(f"{name}: {'.'.join(parts[: i + 1])} is not a table")
                hints = _hints(cls)
        key_path = ".".join(parts)
        typed = _parse_env_value(name, key_path, value, hints[parts[-1]])
        node = raw
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise InvalidArgument(f"{key_path}: the file sets a value where a table belongs")
        node[parts[-1]] = typed


def _parse_env_value(env_name: str, key_path: str, text: str, tp: Any) -> Any:
    optional, base = _unwrap_optional(tp)
    if optional and text.strip().lower() in ("", "none", "null"):
        return None
    try:
        if base is bool:
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if base is int:
            return int(text.strip())
        if base is float:
            return float(text.strip())
        if base is str:
            return text
    except ValueError:
        raise InvalidArgument(
            f"{key_path}: {env_name}={text!r} is not a valid {base.__name__}"
        ) from None
    raise InvalidArgument(f"{key_path}: cannot be set from the environment")


def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _unwrap_optional(tp: Any) -> tuple[bool, Any]:
    origin = typing.get_origin(tp)
    if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return True, args[0]
    return False, tp


def _build(cls: Any, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise InvalidArgument(f"{path or 'config'}: expected a table, got {type(data).__name__}")
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        key_path = f"{path}.{key}" if path else key
        if key not in hints:
            raise InvalidArgument(f"{key_path}: unknown config key")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, key_path)
        else:
            kwargs[key] = _check_type(key_path, value, tp)
    return cls(**kwargs)


def _check_type(path: str, value: Any, tp: Any) -> Any:
    optional, base = _unwrap_optional(tp)
    if value is None:
        if optional:
            return None
        raise InvalidArgument(f"{path}: may not be empty")
    ok = False
    if base is bool:
        ok = isinstance(value, bool)
    elif base is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif base is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif base is str:
        ok = isinstance(value, str)
    if not ok:
        raise InvalidArgument(
            f"{path}: expected {base.__name__}, got {type(value).__name__} ({value!r})"
        )
    return value


def store_refusal(storage: StorageConfig, nodes: int) -> str | None:
    """Why ``storage`` cannot serve a Ray cluster of ``nodes`` live nodes (None: it can).
    A local directory is private to each node unless it is a shared filesystem: on more
    than one node, each actor would keep its state where the others cannot see it, and a
    node's loss would take its part of the data with it."""
    if storage.kind != "local" or storage.local.shared or nodes <= 1:
        return None
    return (
        f"storage.kind: a local store ({storage.local.root}) on a Ray cluster of {nodes} nodes "
        "scatters the data over the nodes' own disks and loses what a lost node held; use "
        'S3 (storage.kind = "s3", see configs/s3.toml), or set storage.local.shared = '
        "true if the root is a filesystem every node shares"
    )
