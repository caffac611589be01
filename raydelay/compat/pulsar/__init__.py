"""A Pulsar-compatible client: the names and behaviour of the ``pulsar`` package, over
raydelay. A Pulsar program moves by changing its import::

    import raydelay.compat.pulsar as pulsar

    client = pulsar.Client("pulsar://localhost:6650")
    producer = client.create_producer("orders")
    producer.send(b"cancel order 17", deliver_after=timedelta(minutes=30))

What it maps, and how:

- **The service URL.** Any ``pulsar://`` URL means "the raydelay of this Ray": the
  cluster of ``address=`` (a raydelay extension), else ``$RAYDELAY_ADDRESS``, else the
  embedded default (a local Ray and a local-dir store). One raydelay connection is
  shared by every :class:`Client` of the process. ``Client.close()`` closes that
  client's producers and consumers, never the cluster.
- **Topics.** ``persistent://public/default/orders``, ``public/default/orders`` and
  ``orders`` all name the raydelay topic ``orders``; another tenant or namespace maps
  to ``tenant.namespace.topic``; a ``non-persistent://`` topic is a topic of its own
  (``non-persistent.<name>``), stored durably like every raydelay topic (nothing is
  dropped, which Pulsar's non-persistent topics may do). A topic is created (one partition) on first use, as
  Pulsar's auto-creation does; a raydelay topic of N partitions is a partitioned topic.
- **Subscription types.** Exclusive, Failover, Shared and KeyShared are raydelay's
  ``exclusive``, ``failover``, ``shared`` and ``key_shared``. As in Pulsar, only Shared
  and KeyShared honour ``deliver_at`` / ``deliver_after``.
- **Keys.** The partition key (else the ordering key) is the raydelay message key: it
  picks the partition and, on a KeyShared subscription, the consumer. The ordering key,
  the producer name, the event time and a null value travel as message properties
  whose names start with ``__pulsar.`` (hidden from :meth:`Message.properties`).
- **Sequence ids** are per producer. A send that repeats one the topic holds from a
  producer of the same name is not stored again (Pulsar's deduplication, always on).

- **Readers, seek and several topics.** ``create_reader``, ``Consumer.seek`` and
  ``Reader.seek`` (a message id, ``MessageId.earliest`` / ``latest``, or a publish time in
  epoch ms), ``get_last_message_id``, and ``subscribe`` with a list of topics or a
  compiled pattern (matched against the full Pulsar names, looked for again every
  ``pattern_auto_discovery_period`` seconds) map onto raydelay's own (see
  ``raydelay.Cluster.create_reader``, ``Consumer.seek`` and ``subscribe``).

What is not supported raises ``NotImplementedError`` naming the feature: TLS,
authentication plugins, encryption, compression, chunking, producer access modes,
compacted reads, table views, sticky key ranges and structured schemas.

The package re-exports; each concept is a module of its own: ``client`` (:class:`Client`),
``producer``, ``consumer``, ``reader``, ``message`` (:class:`MessageId`, :class:`Message`),
``policies`` (the consumer policies), ``enums``, ``exceptions``, ``auth`` (authentication,
encryption and failover values, refused when used) and ``schema``.
"""

from __future__ import annotations

from raydelay.compat.pulsar import schema
from raydelay.compat.pulsar.auth import (
    Authentication,
    AuthenticationAthenz,
    AuthenticationBasic,
    AuthenticationOauth2,
    AuthenticationTLS,
    AuthenticationToken,
    AutoClusterFailover,
    CryptoKeyReader,
    ServiceInfo,
    ServiceInfoProvider,
)
from raydelay.compat.pulsar.client import Client
from raydelay.compat.pulsar.consumer import Consumer
from raydelay.compat.pulsar.enums import (
    BatchingType,
    CompressionType,
    ConsumerType,
    InitialPosition,
    KeySharedMode,
    PartitionsRoutingMode,
    ProducerAccessMode,
    RegexSubscriptionMode,
    Result,
)
from raydelay.compat.pulsar.exceptions import (
    AlreadyClosed,
    ConnectError,
    ConsumerBusy,
    CumulativeAcknowledgementNotAllowedError,
    OperationNotSupported,
    PulsarException,
    Timeout,
    TopicNotFound,
)
from raydelay.compat.pulsar.message import Message, MessageId
from raydelay.compat.pulsar.policies import (
    ConsumerBatchReceivePolicy,
    ConsumerDeadLetterPolicy,
    ConsumerKeySharedPolicy,
)
from raydelay.compat.pulsar.producer import Producer
from raydelay.compat.pulsar.reader import Reader

__all__ = [
    "AlreadyClosed",
    "Authentication",
    "AuthenticationAthenz",
    "AuthenticationBasic",
    "AuthenticationOauth2",
    "AuthenticationTLS",
    "AuthenticationToken",
    "AutoClusterFailover",
    "BatchingType",
    "Client",
    "CompressionType",
    "ConnectError",
    "Consumer",
    "ConsumerBatchReceivePolicy",
    "ConsumerBusy",
    "ConsumerDeadLetterPolicy",
    "ConsumerKeySharedPolicy",
    "ConsumerType",
    "CryptoKeyReader",
    "CumulativeAcknowledgementNotAllowedError",
    "InitialPosition",
    "KeySharedMode",
    "Message",
    "MessageId",
    "OperationNotSupported",
    "PartitionsRoutingMode",
    "Producer",
    "ProducerAccessMode",
    "PulsarException",
    "Reader",
    "RegexSubscriptionMode",
    "Result",
    "ServiceInfo",
    "ServiceInfoProvider",
    "Timeout",
    "TopicNotFound",
    "schema",
]
