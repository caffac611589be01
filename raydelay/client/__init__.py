"""The client API (docs/client.md): connect, Cluster, Producer, Consumer, Message, MessageBatch,
MessageId."""

from raydelay.client.connection import Cluster, connect
from raydelay.client.consumer import Consumer
from raydelay.client.message import Message, MessageBatch, MessageId, MessageIds
from raydelay.client.producer import Producer

__all__ = [
    "connect",
    "Cluster",
    "Producer",
    "Consumer",
    "Message",
    "MessageBatch",
    "MessageId",
    "MessageIds",
]
