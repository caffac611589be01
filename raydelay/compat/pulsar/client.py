"""Pulsar's client over raydelay: :class:`Client` checks Pulsar's arguments, refuses by name
what raydelay does not have, and opens producers, consumers and readers on the raydelay of
this Ray. Every Client of the process shares one raydelay connection (see the package's
docstring for what ``pulsar://`` URLs mean)."""

from __future__ import annotations

import os
import re
import threading
import uuid
from collections.abc import Callable
from typing import Any

from raydelay.client.connection import connect
from raydelay.compat.pulsar._checks import check_type, check_type_or_none, check_types, unsupported
from raydelay.compat.pulsar._endpoint import seek_target
from raydelay.compat.pulsar._topics import TopicMap, regex_mode
from raydelay.compat.pulsar.auth import Authentication, AutoClusterFailover, ServiceInfoProvider
from raydelay.compat.pulsar.consumer import Consumer, ConsumerSettings
from raydelay.compat.pulsar.enums import (
    BatchingType,
    CompressionType,
    ConsumerType,
    InitialPosition,
    KeySharedMode,
    PartitionsRoutingMode,
    ProducerAccessMode,
)
from raydelay.compat.pulsar.exceptions import AlreadyClosed, ConsumerBusy
from raydelay.compat.pulsar.message import Message, MessageId
from raydelay.compat.pulsar.policies import (
    DEFAULT_BATCH_POLICY,
    ConsumerBatchReceivePolicy,
    ConsumerDeadLetterPolicy,
    ConsumerKeySharedPolicy,
)
from raydelay.compat.pulsar.producer import Producer
from raydelay.compat.pulsar.reader import Reader
from raydelay.compat.pulsar.schema import BytesSchema, Schema
from raydelay.errors import ConsumerBusy as _CoreBusy

# Pulsar's subscription types -> raydelay's
_TYPES = {
    ConsumerType.Exclusive: "exclusive",
    ConsumerType.Shared: "shared",
    ConsumerType.Failover: "failover",
    ConsumerType.KeyShared: "key_shared",
}

_shared_lock = threading.Lock()
_shared: dict[str, Any] = {}  # "cluster": the process's one raydelay connection


def _shared_cluster(config: Any, address: str | None) -> Any:
    with _shared_lock:
        cluster = _shared.get("cluster")
        if cluster is None or cluster._closed:
            cluster = connect(config=config, address=address)
            _shared["cluster"] = cluster
        return cluster


class Client:
    """A Pulsar client over the raydelay of this Ray (see :mod:`raydelay.compat.pulsar`).

    Beyond Pulsar's arguments, three raydelay ones: ``cluster`` (a connected
    :class:`raydelay.Cluster` to use), ``config`` (a raydelay config for the shared
    connection) and ``address`` (the Ray to attach to; default ``$RAYDELAY_ADDRESS``,
    else the embedded default)."""

    def __init__(
        self,
        service_url: Any,
        authentication: Any = None,
        operation_timeout_seconds: int = 30,
        io_threads: int = 1,
        message_listener_threads: int = 1,
        concurrent_lookup_requests: int = 50000,
        log_conf_file_path: str | None = None,
        stats_interval_in_seconds: int = 600,
        use_tls: bool = False,
        tls_trust_certs_file_path: str | None = None,
        tls_allow_insecure_connection: bool = False,
        tls_validate_hostname: bool = False,
        logger: Any = None,
        connection_timeout_ms: int = 10000,
        listener_name: str | None = None,
        tls_private_key_file_path: str | None = None,
        tls_certificate_file_path: str | None = None,
        *,
        cluster: Any = None,
        config: Any = None,
        address: str | None = None,
    ) -> None:
        if isinstance(service_url, (ServiceInfoProvider, AutoClusterFailover)):
            raise unsupported("service info providers (cluster failover)")
        check_type(str, service_url, "service_url")
        if not service_url.startswith(("pulsar://", "pulsar+ssl://", "http://", "https://")):
            raise ValueError(
                f"service_url: {service_url!r} is not a Pulsar service URL (pulsar://host:port)"
            )
        if authentication is not None:
            check_type(Authentication, authentication, "authentication")
        check_types(
            int,
            operation_timeout_seconds=operation_timeout_seconds,
            io_threads=io_threads,
            message_listener_threads=message_listener_threads,
            concurrent_lookup_requests=concurrent_lookup_requests,
            stats_interval_in_seconds=stats_interval_in_seconds,
            connection_timeout_ms=connection_timeout_ms,
        )
        check_types(
            bool,
            use_tls=use_tls,
            tls_allow_insecure_connection=tls_allow_insecure_connection,
            tls_validate_hostname=tls_validate_hostname,
        )
        check_types(
            str,
            optional=True,
            log_conf_file_path=log_conf_file_path,
            tls_trust_certs_file_path=tls_trust_certs_file_path,
            listener_name=listener_name,
            tls_private_key_file_path=tls_private_key_file_path,
            tls_certificate_file_path=tls_certificate_file_path,
        )
        if authentication is not None:
            raise unsupported("authentication plugins")
        if use_tls or service_url.startswith(("pulsar+ssl://", "https://")):
            raise unsupported("TLS")
        if listener_name:
            raise unsupported("listener names (advertised listeners)")
        self.service_url = service_url
        self._own_cluster = cluster
        self._config, self._address = config, address or os.environ.get("RAYDELAY_ADDRESS")
        self._producers: list[Producer] = []
        self._consumers: list[Consumer] = []
        self._readers: list[Reader] = []
        self._closed = False
        self._topics = TopicMap(lambda: self._cluster)

    @property
    def _cluster(self) -> Any:
        if self._closed:
            raise AlreadyClosed("the client is closed")
        return self._own_cluster or _shared_cluster(self._config, self._address)

    def create_producer(
        self,
        topic: str,
        producer_name: str | None = None,
        schema: Schema = BytesSchema(),  # noqa: B008 - immutable, as Pulsar's
        initial_sequence_id: int | None = None,
        send_timeout_millis: int = 30000,
        compression_type: CompressionType = CompressionType.NONE,
        max_pending_messages: int = 1000,
        max_pending_messages_across_partitions: int = 50000,
        block_if_queue_full: bool = False,
        batching_enabled: bool = False,
        batching_max_messages: int = 1000,
        batching_max_allowed_size_in_bytes: int = 128 * 1024,
        batching_max_publish_delay_ms: int = 10,
        chunking_enabled: bool = False,
        message_routing_mode: PartitionsRoutingMode = PartitionsRoutingMode.RoundRobinDistribution,
        lazy_start_partitioned_producers: bool = False,
        properties: dict | None = None,
        batching_type: BatchingType = BatchingType.Default,
        encryption_key: str | None = None,
        crypto_key_reader: Any = None,
        access_mode: ProducerAccessMode = ProducerAccessMode.Shared,
        message_router: Callable[[Message, int], int] | None = None,
    ) -> Producer:
        """A producer on ``topic`` (created if it does not exist)."""
        check_type(str, topic, "topic")
        check_type_or_none(str, producer_name, "producer_name")
        check_type(Schema, schema, "schema")
        check_type_or_none(int, initial_sequence_id, "initial_sequence_id")
        check_types(
            int,
            send_timeout_millis=send_timeout_millis,
            max_pending_messages=max_pending_messages,
            max_pending_messages_across_partitions=max_pending_messages_across_partitions,
            batching_max_messages=batching_max_messages,
            batching_max_allowed_size_in_bytes=batching_max_allowed_size_in_bytes,
            batching_max_publish_delay_ms=batching_max_publish_delay_ms,
        )
        check_types(
            bool,
            block_if_queue_full=block_if_queue_full,
            batching_enabled=batching_enabled,
            chunking_enabled=chunking_enabled,
            lazy_start_partitioned_producers=lazy_start_partitioned_producers,
        )
        check_type(CompressionType, compression_type, "compression_type")
        check_type(PartitionsRoutingMode, message_routing_mode, "message_routing_mode")
        check_type(BatchingType, batching_type, "batching_type")
        check_type(ProducerAccessMode, access_mode, "access_mode")
        check_type_or_none(dict, properties, "properties")
        check_type_or_none(str, encryption_key, "encryption_key")
        if message_router is not None and not callable(message_router):
            raise ValueError("Argument message_router is expected to be a callable")
        if batching_enabled and chunking_enabled:
            raise ValueError("Batching and chunking of messages can't be enabled together.")
        if compression_type != CompressionType.NONE:
            raise unsupported(f"compression ({compression_type.name})")
        if chunking_enabled:
            raise unsupported("chunking (messages are limited to topic.max_message_bytes)")
        if encryption_key or crypto_key_reader is not None:
            raise unsupported("end-to-end encryption")
        if access_mode != ProducerAccessMode.Shared:
            raise unsupported(f"producer access mode {access_mode.name}")
        local, full, n = self._topics.open(topic)
        cluster = self._cluster
        core = cluster.create_producer(local, name=producer_name)
        p = Producer(core, cluster.config, full, n, schema, initial_sequence_id,
                     message_routing_mode, message_router)  # fmt: skip
        self._producers.append(p)
        return p

    def subscribe(
        self,
        topic: Any,
        subscription_name: str,
        consumer_type: ConsumerType = ConsumerType.Exclusive,
        schema: Schema = BytesSchema(),  # noqa: B008 - immutable, as Pulsar's
        message_listener: Callable[[Consumer, Message], None] | None = None,
        receiver_queue_size: int = 1000,
        max_total_receiver_queue_size_across_partitions: int = 50000,
        consumer_name: str | None = None,
        unacked_messages_timeout_ms: int | None = None,
        broker_consumer_stats_cache_time_ms: int = 30000,
        negative_ack_redelivery_delay_ms: int = 60000,
        is_read_compacted: bool = False,
        properties: dict | None = None,
        pattern_auto_discovery_period: int = 60,
        initial_position: InitialPosition = InitialPosition.Latest,
        crypto_key_reader: Any = None,
        replicate_subscription_state_enabled: bool = False,
        max_pending_chunked_message: int = 10,
        auto_ack_oldest_chunked_message_on_queue_full: bool = False,
        start_message_id_inclusive: bool = False,
        batch_receive_policy: ConsumerBatchReceivePolicy | None = None,
        key_shared_policy: ConsumerKeySharedPolicy | None = None,
        batch_index_ack_enabled: bool = False,
        regex_subscription_mode: Any = None,
        dead_letter_policy: ConsumerDeadLetterPolicy | None = None,
        crypto_failure_action: Any = None,
        is_pattern_topic: bool = False,
    ) -> Consumer:
        """A consumer of ``subscription_name`` on ``topic`` (both created if new)."""
        several = isinstance(topic, (list, tuple, re.Pattern)) or is_pattern_topic
        if is_pattern_topic and isinstance(topic, str):
            topic = re.compile(topic)
        if isinstance(topic, (list, tuple)):
            for t in topic:
                check_type(str, t, "topic")
        elif not isinstance(topic, re.Pattern):
            check_type(str, topic, "topic")
        check_type(int, pattern_auto_discovery_period, "pattern_auto_discovery_period")
        check_type(str, subscription_name, "subscription_name")
        check_type(ConsumerType, consumer_type, "consumer_type")
        check_type(Schema, schema, "schema")
        check_type(int, receiver_queue_size, "receiver_queue_size")
        check_type(
            int,
            max_total_receiver_queue_size_across_partitions,
            "max_total_receiver_queue_size_across_partitions",
        )
        check_type_or_none(str, consumer_name, "consumer_name")
        check_type_or_none(int, unacked_messages_timeout_ms, "unacked_messages_timeout_ms")
        check_type(int, broker_consumer_stats_cache_time_ms, "broker_consumer_stats_cache_time_ms")
        check_type(int, negative_ack_redelivery_delay_ms, "negative_ack_redelivery_delay_ms")
        check_type(bool, is_read_compacted, "is_read_compacted")
        check_type_or_none(dict, properties, "properties")
        check_type(InitialPosition, initial_position, "initial_position")
        check_type(bool, start_message_id_inclusive, "start_message_id_inclusive")
        check_type_or_none(ConsumerBatchReceivePolicy, batch_receive_policy, "batch_receive_policy")
        check_type_or_none(ConsumerKeySharedPolicy, key_shared_policy, "key_shared_policy")
        check_type_or_none(ConsumerDeadLetterPolicy, dead_letter_policy, "dead_letter_policy")
        check_type(bool, batch_index_ack_enabled, "batch_index_ack_enabled")
        if message_listener is not None and not callable(message_listener):
            raise ValueError("Argument message_listener is expected to be a callable")
        if receiver_queue_size < 0:
            raise ValueError(f"receiver_queue_size: must be >= 0, got {receiver_queue_size}")
        if negative_ack_redelivery_delay_ms < 0:
            raise ValueError("negative_ack_redelivery_delay_ms: must be >= 0")
        if crypto_key_reader is not None:
            raise unsupported("end-to-end encryption")
        if is_read_compacted:
            raise unsupported("compacted reads")
        if (
            key_shared_policy is not None
            and key_shared_policy.key_shared_mode == KeySharedMode.Sticky
        ):
            raise unsupported("Key_Shared sticky ranges (use KeySharedMode.AutoSplit)")
        settings = ConsumerSettings(
            subscription_name,
            consumer_name or uuid.uuid4().hex[:10],
            consumer_type,
            schema,
            receiver_queue_size,
            negative_ack_redelivery_delay_ms,
            batch_receive_policy or DEFAULT_BATCH_POLICY,
            start_message_id_inclusive,
        )
        options = {  # (raydelay's subscribe options, for one topic and for several)
            "subscription_type": _TYPES[consumer_type],
            "ack_timeout_s": None
            if not unacked_messages_timeout_ms
            else unacked_messages_timeout_ms / 1000,
            "initial_position": "earliest"
            if initial_position == InitialPosition.Earliest
            else "latest",
        }
        if several:
            if dead_letter_policy is not None:
                raise unsupported("dead letter policies on several topics at once")
            mode = regex_mode(regex_subscription_mode)
            core = self._subscribe_many(
                topic, subscription_name, options, mode, pattern_auto_discovery_period
            )
            full, n = "", 1  # (each message is named by its own topic)
        else:
            full, n, core = self._subscribe_one(
                topic, subscription_name, options, dead_letter_policy
            )
        c = Consumer(self._topics, core, full, n, settings)
        self._consumers.append(c)
        if message_listener is not None:
            c._start_listener(message_listener)
        return c

    def _subscribe_one(
        self,
        topic: str,
        subscription_name: str,
        options: dict[str, Any],
        dead_letter_policy: ConsumerDeadLetterPolicy | None,
    ) -> tuple[str, int, Any]:
        """(Pulsar name, partitions, raydelay consumer) of a subscription of one topic; its
        dead letter topic, and that topic's initial subscription, are made first."""
        local, full, n = self._topics.open(topic)
        cluster = self._cluster
        dlq = None
        if dead_letter_policy is not None:
            dlq_full = dead_letter_policy.dead_letter_topic or f"{full}-{subscription_name}-DLQ"
            dlq, _, _ = self._topics.open(dlq_full)
            if dead_letter_policy.initial_subscription_name:
                cluster.subscribe(
                    dlq, dead_letter_policy.initial_subscription_name, initial_position="earliest"
                ).close()
        try:
            core = cluster.subscribe(
                local,
                subscription_name,
                **options,
                max_redeliveries=None
                if dead_letter_policy is None
                else dead_letter_policy.max_redeliver_count,
                dead_letter_topic=dlq,
            )
        except _CoreBusy as exc:
            raise ConsumerBusy(str(exc)) from None
        return full, n, core

    def _subscribe_many(
        self,
        topics: Any,
        subscription_name: str,
        options: dict[str, Any],
        mode: str,
        period_s: int,
    ) -> Any:
        """A raydelay consumer of several topics: a list, or those a pattern matches by
        their full Pulsar names (``persistent://tenant/ns/name``, or without the domain)."""
        cluster = self._cluster
        if isinstance(topics, re.Pattern):
            target: Any = self._topics.matcher(topics, mode)
        else:
            target = [self._topics.open(t)[0] for t in topics]
        try:
            return cluster._subscribe_many(
                target, subscription_name, options, refresh_s=max(1, period_s)
            )
        except _CoreBusy as exc:
            raise ConsumerBusy(str(exc)) from None

    def create_reader(
        self,
        topic: str,
        start_message_id: MessageId,
        reader_listener: Callable[[Reader, Message], None] | None = None,
        receiver_queue_size: int = 1000,
        reader_name: str | None = None,
        subscription_role_prefix: str | None = None,
        is_read_compacted: bool = False,
        crypto_key_reader: Any = None,
        start_message_id_inclusive: bool = False,
    ) -> Reader:
        """A reader of ``topic`` (created if new) from ``start_message_id``
        (``MessageId.earliest``, ``MessageId.latest`` or a message's id: the entry after
        it, or it with ``start_message_id_inclusive``); it ignores deliver_at."""
        check_type(str, topic, "topic")
        check_type(MessageId, start_message_id, "start_message_id")
        check_type(int, receiver_queue_size, "receiver_queue_size")
        check_type_or_none(str, reader_name, "reader_name")
        check_type_or_none(str, subscription_role_prefix, "subscription_role_prefix")
        check_type(bool, is_read_compacted, "is_read_compacted")
        check_type(bool, start_message_id_inclusive, "start_message_id_inclusive")
        if reader_listener is not None and not callable(reader_listener):
            raise ValueError("Argument reader_listener is expected to be a callable")
        if is_read_compacted:
            raise unsupported("compacted reads")
        if crypto_key_reader is not None:
            raise unsupported("end-to-end encryption")
        local, full, n = self._topics.open(topic)
        start = seek_target(local, start_message_id)
        core = self._cluster.create_reader(local, start, inclusive=start_message_id_inclusive)
        name = reader_name or f"reader-{uuid.uuid4().hex[:10]}"
        r = Reader(self._topics, core, full, n, name, start_message_id_inclusive)
        self._readers.append(r)
        if reader_listener is not None:
            r._start_listener(reader_listener)
        return r

    def create_table_view(self, *args: Any, **kwargs: Any) -> Any:
        raise unsupported("table views")

    def get_topic_partitions(self, topic: str) -> list[str]:
        """The partitions of a topic by their Pulsar names (a one-partition topic is not
        partitioned: its own name)."""
        _, full, n = self._topics.open(topic)
        return [full] if n == 1 else [f"{full}-partition-{p}" for p in range(n)]

    def close(self) -> None:
        """Close this client's producers (flushing them) and consumers; the raydelay
        cluster goes on."""
        if self._closed:
            return
        for p in self._producers:
            p.close()
        for c in self._consumers:
            c.close()
        for r in self._readers:
            r.close()
        self._closed = True

    def shutdown(self) -> None:
        """Close without flushing: later calls of its producers and consumers raise
        :class:`AlreadyClosed`."""
        for p in self._producers:
            p._shutdown()
        for c in self._consumers:
            c.close()
        self._closed = True
