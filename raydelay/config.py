"""Configuration: frozen pydantic models, loaded from TOML with ``tomllib``.

The model defaults *are* the embedded default (``configs/default.toml`` mirrors them, and
a test keeps the two equal). Values are strict: a TOML value must already have the key's
type. Single values are overridden by environment variables named
``RAYDELAY_<SECTION>__<KEY>`` (nested tables add more ``__`` parts, e.g.
``RAYDELAY_STORAGE__LOCAL__ROOT``), read by pydantic-settings and parsed as the key's type
(``none`` clears an optional value). Every validation failure is one ``InvalidArgument``
naming the key, and the variable when the value came from the environment.

S3 credentials are never read from here: boto3's standard chain provides them.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.sources.utils import parse_env_vars

from raydelay.errors import InvalidArgument
from raydelay.limits import check_limit

ENV_PREFIX = "RAYDELAY_"
ENV_DELIMITER = "__"
MIB = 1024 * 1024

Positive = Annotated[int, Field(gt=0)]
NonNegative = Annotated[int, Field(ge=0)]
PositiveSeconds = Annotated[float, Field(gt=0)]

# frozen (hashable, safe to share), strict (a TOML value must have the key's type), closed
_SECTION = ConfigDict(frozen=True, extra="forbid", strict=True)


def _limit_fields(section: str, *fields: str) -> Any:
    """A validator of ``fields`` of table ``section``: each a positive limit, or -1 for none
    (Pulsar's convention; see :func:`raydelay.limits.check_limit`)."""

    def check(cls: type, value: int, info: ValidationInfo) -> int:
        check_limit(f"{section}.{info.field_name}", value)
        return value

    return field_validator(*fields)(classmethod(check))


class _Section(BaseModel):
    """One table of the config. Built directly, it raises InvalidArgument like the loaders."""

    model_config = _SECTION
    _path: ClassVar[str]  # the table's key in the file, for error messages

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise _invalid(exc, self._path, {}) from None

    # pydantic calls a custom __init__ for nested tables too; marked as its base one, it runs
    # only for direct construction, and a nested error keeps its full key for the loader
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]


class LocalStorageConfig(_Section):
    """``storage.local``: the local-directory store."""

    _path = "storage.local"

    root: str = "./.raydelay/data"  # relative paths are taken from the working directory
    # the root is on a filesystem every node of the Ray cluster shares (NFS and the like);
    # without it a local store is refused on a cluster of more than one node
    shared: bool = False


class S3StorageConfig(_Section):
    """``storage.s3``: an S3 bucket. Credentials come from boto3's standard chain only."""

    _path = "storage.s3"

    bucket: str = ""
    prefix: str = ""
    endpoint_url: str = ""  # empty: AWS; set it for MinIO, moto and the like
    region: str = "us-east-1"
    max_attempts: Positive = 3  # boto3 standard-mode budget per call; our retries stack on it
    # server-side encryption asked for on every write: "" sends none (the bucket's default
    # encryption applies), "AES256" is SSE-S3, "aws:kms" is SSE-KMS
    sse: Literal["", "AES256", "aws:kms"] = ""
    # the KMS key of "aws:kms" (id, ARN or alias); empty: the AWS-managed key (aws/s3)
    sse_kms_key_id: str = ""

    @model_validator(mode="after")
    def _kms_key_needs_kms(self) -> S3StorageConfig:
        if self.sse_kms_key_id and self.sse != "aws:kms":
            raise InvalidArgument(
                f"storage.s3.sse_kms_key_id: only valid with storage.s3.sse = 'aws:kms' "
                f"(storage.s3.sse is {self.sse!r})"
            )
        return self


class FaultsConfig(_Section):
    """``storage.faults``: injected store failures, for chaos tests only (off by default)."""

    _path = "storage.faults"

    # each store call fails (retriably) with this probability
    failure_rate: Annotated[float, Field(ge=0, le=1)] = 0.0
    outage_file: str = ""  # while this file exists, every store call fails (retriably)
    seed: int = 0

    @property
    def enabled(self) -> bool:
        return self.failure_rate > 0 or bool(self.outage_file)


class StorageConfig(_Section):
    """``storage``: where the durable state lives."""

    _path = "storage"

    # memory is for tests: nothing survives a restart
    kind: Literal["local", "s3", "memory"] = "local"
    local: LocalStorageConfig = LocalStorageConfig()
    s3: S3StorageConfig = S3StorageConfig()
    faults: FaultsConfig = FaultsConfig()

    @model_validator(mode="after")
    def _s3_needs_a_bucket(self) -> StorageConfig:
        if self.kind == "s3" and not self.s3.bucket:
            raise InvalidArgument("storage.s3.bucket: required when storage.kind is 's3'")
        return self


class DelayedConfig(_Section):
    """``delayed``: the delayed-delivery index of each shared subscription."""

    _path = "delayed"

    tracker: Literal["bucket", "memory"] = "bucket"
    tick_time_ms: Positive = 10
    strict: bool = True  # never deliver before deliver_at
    min_index_count_per_bucket: Positive = 50_000
    max_indexes_per_segment: int = 5_000  # -1: no limit
    max_time_step_per_segment_ms: Positive = 300_000
    max_num_buckets: int = 64  # -1: never merge
    max_delay_ms: NonNegative = 0  # 0 = no limit
    fixed_delay_lookahead: NonNegative = 50_000  # in-memory tracker only

    _limits = _limit_fields("delayed", "max_indexes_per_segment", "max_num_buckets")


class TopicConfig(_Section):
    """``topic``: the partition logs."""

    _path = "topic"

    max_entries_per_ledger: Positive = 50_000
    # 0: a group commit starts as soon as none is in flight (what arrives meanwhile joins
    # the next); > 0: each commit lingers this long first, to gather more
    group_commit_ms: NonNegative = 0
    group_commit_max_bytes: Positive = 4 * MIB  # a group commit is written early past this
    max_message_bytes: Positive = 5 * MIB
    tail_cache_bytes: NonNegative = 64 * MIB  # recent ledger objects kept for readers
    index_cache_bytes: NonNegative = 64 * MIB  # object indexes kept for scattered reads
    retention_interval_ms: Positive = 5_000  # how often fully acknowledged ledgers go


class SubscriptionConfig(_Section):
    """``subscription``: defaults for new subscriptions."""

    _path = "subscription"

    # (a bound outside the union: the environment's text is parsed by the bare type)
    ack_timeout_s: Annotated[float | None, Field(gt=0)] = None  # None: no ack timeout
    max_redeliveries: Annotated[int | None, Field(gt=0)] = None  # None: never dead-letter
    read_ahead_entries: Positive = 10_000  # log entries held in memory waiting for a consumer
    # delayed rows due within this many ms are fetched from the topic's index ahead of
    # time and wait in the subscription, with their payloads, for their due instant
    lookahead_ms: NonNegative = 250
    # a consumer's receive takes delayed messages due within this many ms too, and its
    # client holds each until its due time: the reply's trip is made before the due
    # instant, not after it. A cancel in that last stretch finds the message handed out
    # (it returns False). 0: nothing is handed out before it is due.
    handout_ahead_ms: Annotated[int, Field(ge=0, le=60_000)] = 50
    cursor_persist_interval_ms: Positive = 1_000  # cursor writes: at most one per interval
    # a consumer not heard from (calls or its client's heartbeats) for this long is removed:
    # its unacked messages go to other consumers, failover promotes the next, exclusive frees
    consumer_lease_s: PositiveSeconds = 10.0
    # how many partitions one actor of a subscription serves; -1: all of them (one actor
    # per subscription); a busy subscription of many partitions may be split
    partitions_per_actor: int = -1

    _limits = _limit_fields("subscription", "partitions_per_actor")


class ProducerConfig(_Section):
    """``producer``: defaults of ``create_producer`` (Pulsar's names)."""

    _path = "producer"

    # sends (send_async) queued or on their way at once; -1: no limit
    max_pending_messages: int = 10_000
    # past max_pending_messages, send_async waits for room (else raises ProducerQueueIsFull)
    block_if_queue_full: bool = True

    _limits = _limit_fields("producer", "max_pending_messages")


class ClientConfig(_Section):
    """``client``: how clients treat actors that are dead or restarting."""

    _path = "client"

    retry_deadline_s: PositiveSeconds = 30.0  # calls are retried (with backoff) this long


MAX_HOSTS_PER_NODE = 64  # placement.hosts_per_node and subscription_hosts_per_node


class PlacementConfig(_Section):
    """``placement``: which nodes raydelay's actors go to (see raydelay/cluster/placement.py)."""

    _path = "placement"

    # keep actors off the head node (it runs Ray's control service) while a worker is alive
    avoid_head: bool = True
    # partition hosts per node: -1 is one per CPU of the node, at most
    # placement.MAX_AUTO_HOSTS (4); each host holds the logs of many partitions
    hosts_per_node: int = -1
    # subscription hosts per node, the same way: each serves many subscriptions' units
    subscription_hosts_per_node: int = -1
    # subscription hosts kept running on every node that may hold one, idle or not, so
    # that what a lost node served resumes in a running process (0: start them as needed)
    warm_subscription_hosts: NonNegative = 1
    # a second coordinator kept warm on another node, which takes over at once when the
    # coordinator's node is lost (false: a new coordinator is started then)
    standby_coordinator: bool = True

    @field_validator("hosts_per_node", "subscription_hosts_per_node")
    @classmethod
    def _per_node(cls, value: int, info: ValidationInfo) -> int:
        # (a host is a whole worker process: more than a few dozen on one node is a typo)
        if value != -1 and not 1 <= value <= MAX_HOSTS_PER_NODE:
            raise InvalidArgument(
                f"placement.{info.field_name}: must be 1..{MAX_HOSTS_PER_NODE}, or -1 for one "
                f"per CPU; got {value}"
            )
        return value


class TasksConfig(_Section):
    """``tasks``: scheduled Ray calls (``Cluster.schedule``) and their runners."""

    _path = "tasks"

    topic: str = "raydelay-tasks"  # the calls wait here; its dead letters go to <topic>-DLQ
    partitions: Positive = 4  # of the tasks topic, when the first call creates it
    runners: Positive = 1  # runner actors started with the first call (start_runners: more)
    max_in_flight: Positive = 1_000  # calls a runner has submitted and not seen finish
    # a cron occurrence later than this is "missed" for the catch_up policies
    misfire_grace_s: PositiveSeconds = 60.0
    # a file holding the secret that signs scheduled calls (raydelay.tasks.signing), when
    # RAYDELAY_TASKS_SECRET is not set; a store several machines share needs one of the two
    secret_file: str = ""
    # the records of what became of calls (task_status, results kept with keep_result=True)
    # are deleted this long after they were written
    result_ttl_s: PositiveSeconds = 7 * 86_400.0
    # a result kept with keep_result=True is refused over this (the call still succeeds)
    max_result_bytes: Positive = 1 * MIB


class HttpConfig(_Section):
    """``http``: the HTTP API (``raydelay serve``, docs/http.md). A request over
    ``max_body_bytes`` is refused (413), a batch over ``max_batch_messages`` too (400); a
    token made without ``--rate`` may make ``default_rate_per_s`` requests a second on each
    replica (-1: no limit); a revoked token stops working within ``token_refresh_s``. TLS:
    both ``ssl_certfile`` and ``ssl_keyfile`` (PEM paths on the node of the proxy)."""

    _path = "http"

    host: str = "127.0.0.1"  # where Ray Serve's proxy listens (0.0.0.0: every interface)
    port: Annotated[int, Field(ge=1, le=65535)] = 8643
    replicas: Positive = 1  # Serve replicas of the API, each with its own client
    max_ongoing_requests: Positive = 256  # per replica
    max_body_bytes: Positive = 16 * MIB
    max_batch_messages: Positive = 10_000
    default_rate_per_s: float = 1_000.0
    token_refresh_s: PositiveSeconds = 5.0
    ssl_certfile: str = ""
    ssl_keyfile: str = ""

    @field_validator("default_rate_per_s")
    @classmethod
    def _rate(cls, value: float) -> float:
        if value != -1 and not 0 < value < float("inf"):
            raise ValueError("must be > 0, or -1 for no limit")
        return value

    @model_validator(mode="after")
    def _tls_pair(self) -> HttpConfig:
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ValueError("ssl_certfile and ssl_keyfile go together: give both or neither")
        return self


class RayConfig(_Section):
    """``ray``: health checks of a Ray that raydelay starts itself (``connect()`` without an
    address, ``raydelay up``); on a cluster started with ``ray start``, pass the same values
    as ``--system-config`` on the head. A node is declared dead after
    ``health_check_failure_threshold`` failed checks ``health_check_period_ms`` apart (Ray's
    own defaults: 3000 ms x 5, about 15 s); a check slower than ``health_check_timeout_ms``
    fails."""

    _path = "ray"

    health_check_period_ms: Positive = 1_000
    health_check_timeout_ms: Positive = 5_000
    health_check_failure_threshold: Positive = 3

    def system_config(self) -> dict[str, int]:
        """The values as Ray's ``_system_config`` (``--system-config``) keys."""
        return self.model_dump()


class Config(BaseSettings):
    """The whole configuration. ``Config()`` is the embedded default.

    ``Config(...)`` and :func:`config_from_dict` take only what they are given: actors
    rebuild the config they are sent and must not pick up their own process's environment.
    :func:`load_config` is where the environment applies."""

    model_config = SettingsConfigDict(
        **_SECTION,
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_DELIMITER,
        env_parse_none_str="none",
        case_sensitive=False,
    )

    storage: StorageConfig = StorageConfig()
    delayed: DelayedConfig = DelayedConfig()
    topic: TopicConfig = TopicConfig()
    subscription: SubscriptionConfig = SubscriptionConfig()
    producer: ProducerConfig = ProducerConfig()
    client: ClientConfig = ClientConfig()
    placement: PlacementConfig = PlacementConfig()
    tasks: TasksConfig = TasksConfig()
    http: HttpConfig = HttpConfig()
    ray: RayConfig = RayConfig()

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise _invalid(exc, "", {}) from None

    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]  # as _Section's

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


class _EnvOverrides(EnvSettingsSource):
    """Config's ``RAYDELAY_<SECTION>__<KEY>`` variables of a given mapping (not necessarily
    ``os.environ``), as a nested dict with each value parsed as its key's type (a value
    that does not parse stays text, for validation to name)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        # only names with a delimiter are overrides (RAYDELAY_ADDRESS and the like are not)
        self._given = {k: v for k, v in env.items() if ENV_DELIMITER in k}
        super().__init__(Config)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(
            self._given, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str
        )


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Load a config file (or the embedded default when ``path`` is None), then apply
    ``RAYDELAY_<SECTION>__<KEY>`` overrides from ``env`` (``os.environ`` by default).

    Raises InvalidArgument naming the key (and the variable, for an override) for an
    unknown key, a wrongly typed value or a value out of range.
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
    env = os.environ if env is None else env
    names = _override_names(env)
    merged = _merge(raw, _EnvOverrides(env)())
    try:
        return Config.model_validate(merged)
    except ValidationError as exc:
        raise _invalid(exc, "", names) from None


def config_from_dict(raw: Mapping[str, Any]) -> Config:
    """Build a Config from a nested mapping shaped like the TOML file (no env overrides)."""
    if not isinstance(raw, Mapping):
        raise InvalidArgument(f"config: expected a table, got {type(raw).__name__}")
    try:
        return Config.model_validate(dict(raw))
    except ValidationError as exc:
        raise _invalid(exc, "", {}) from None


def config_to_dict(config: Config) -> dict[str, Any]:
    """The nested-dict form of a config (the inverse of :func:`config_from_dict`)."""
    return config.model_dump()


def _override_names(env: Mapping[str, str]) -> dict[str, str]:
    """Key path -> variable name of each override in ``env``. A variable that names no
    section is refused here: pydantic-settings reads only the sections it knows."""
    names: dict[str, str] = {}
    for name in env:
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or ENV_DELIMITER not in upper:
            continue  # e.g. RAYDELAY_CONFIG: not a value override
        parts = upper[len(ENV_PREFIX) :].lower().split(ENV_DELIMITER)
        if parts[0] not in Config.model_fields:
            raise InvalidArgument(f"{name}: unknown config key {parts[0]!r}")
        names[".".join(parts)] = name
    return names


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` laid on top, table by table."""
    out = dict(base)
    for key, value in over.items():
        below = out.get(key)
        if isinstance(value, Mapping) and isinstance(below, dict):
            out[key] = _merge(below, value)
        else:
            out[key] = value
    return out


_TYPE_NAMES = {
    "int_type": "int",
    "int_parsing": "int",
    "float_type": "float",
    "float_parsing": "float",
    "bool_type": "bool",
    "bool_parsing": "bool",
    "string_type": "str",
}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than_equal": "<="}


def _invalid(exc: ValidationError, prefix: str, env_names: Mapping[str, str]) -> InvalidArgument:
    """The first error of ``exc`` as our one-line InvalidArgument naming the key (and the
    environment variable that set it, if one did). ``prefix`` is the table validated."""
    err = exc.errors(include_url=False)[0]
    key = ".".join([prefix, *map(str, err["loc"])] if prefix else map(str, err["loc"]))
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    var = env_names.get(key) or next(
        (n for k, n in env_names.items() if k.startswith(f"{key}.")), None
    )
    if isinstance(ctx.get("error"), InvalidArgument):
        return ctx["error"]  # our own check: its message names the key already
    if kind == "extra_forbidden":
        if var is not None:
            return InvalidArgument(f"{var}: unknown config key {key!r}")
        return InvalidArgument(f"{key}: unknown config key")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return InvalidArgument(f"{key}: expected a table, got {type(value).__name__}")
    if var is not None and var != env_names.get(key):
        return InvalidArgument(f"{var}: {key} is not a table")
    if kind in _TYPE_NAMES and var is not None:
        return InvalidArgument(f"{key}: {var}={value!r} is not a valid {_TYPE_NAMES[kind]}")
    if kind in _TYPE_NAMES:
        return InvalidArgument(
            f"{key}: expected {_TYPE_NAMES[kind]}, got {type(value).__name__} ({value!r})"
        )
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()))
        bound = int(bound) if isinstance(bound, float) and bound.is_integer() else bound
        reason = f"must be {_BOUNDS[kind]} {bound}, got {value!r}"
    elif kind == "literal_error":
        reason = f"must be one of {ctx['expected']}; got {value!r}"
    else:
        reason = err["msg"]
    return InvalidArgument(f"{key}: {reason}" + (f" (from {var})" if var else ""))


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
