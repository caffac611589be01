"""The enums of the ``pulsar`` package, by Pulsar's names and values: results, subscription
types, initial positions, and the producer and subscription options a caller may name
(those raydelay does not have are refused where they are used)."""

from __future__ import annotations

from enum import Enum, IntEnum


class Result(IntEnum):
    """Pulsar's result codes, with the values of its C++ client (``pulsar/Result.h``)."""

    Ok = 0
    UnknownError = 1
    InvalidConfiguration = 2
    Timeout = 3
    LookupError = 4
    ConnectError = 5
    AuthenticationError = 7
    AuthorizationError = 8
    ConsumerBusy = 13
    NotConnected = 14
    AlreadyClosed = 15
    InvalidTopicName = 21
    InvalidUrl = 22
    OperationNotSupported = 24
    ProducerQueueIsFull = 27
    MessageTooBig = 28
    TopicNotFound = 29
    SubscriptionNotFound = 30
    CumulativeAcknowledgementNotAllowedError = 37
    NotAllowedError = 40


class ConsumerType(Enum):
    Exclusive = 0
    Shared = 1
    Failover = 2
    KeyShared = 3


class InitialPosition(Enum):
    Latest = 0
    Earliest = 1


class CompressionType(Enum):
    NONE = 0
    LZ4 = 1
    ZLib = 2
    ZSTD = 3
    SNAPPY = 4


class PartitionsRoutingMode(Enum):
    UseSinglePartition = 0
    RoundRobinDistribution = 1
    CustomPartition = 2


class ProducerAccessMode(Enum):
    Shared = 0
    Exclusive = 1
    WaitForExclusive = 2
    ExclusiveWithFencing = 3


class KeySharedMode(Enum):
    AutoSplit = 0
    Sticky = 1


class RegexSubscriptionMode(Enum):
    PersistentOnly = 0
    NonPersistentOnly = 1
    AllTopics = 2


class BatchingType(Enum):
    Default = 0
    KeyBased = 1
