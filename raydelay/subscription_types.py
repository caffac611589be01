"""The subscription types, one enum, and the one check of a type name (a leaf module: the
client, the coordinator's metadata and the dispatcher all use it).

A :class:`SubscriptionType` is a ``str``: it equals the plain name users pass
(``subscription_type="shared"``) and that the metadata journal stores, so neither changes.
"""

from __future__ import annotations

from enum import StrEnum

from raydelay.errors import InvalidArgument


class SubscriptionType(StrEnum):
    """How a subscription hands its messages to its consumers (as Pulsar's)."""

    SHARED = "shared"  # spread over the consumers, each message to one
    KEY_SHARED = "key_shared"  # as shared, one key's messages to one consumer at a time
    EXCLUSIVE = "exclusive"  # one consumer, in log order
    FAILOVER = "failover"  # the oldest consumer, in log order; the next one takes over

    @property
    def spreads(self) -> bool:
        """Spreads messages over consumers and honours deliver_at; exclusive and failover
        deliver in log order and ignore it (Pulsar's rule)."""
        return spreads(self)


def check_subscription_type(value: object) -> SubscriptionType:
    """The type ``value`` names, else an InvalidArgument listing them."""
    if isinstance(value, str):
        try:
            return SubscriptionType(value)
        except ValueError:
            pass
    raise InvalidArgument(
        f"subscription_type: must be one of {', '.join(SubscriptionType)}; got {value!r}"
    )


def spreads(subscription_type: object) -> bool:
    """Whether the type ``subscription_type`` names (a member or its plain name) spreads:
    see :attr:`SubscriptionType.spreads` (False for no type)."""
    return subscription_type in (SubscriptionType.SHARED, SubscriptionType.KEY_SHARED)
