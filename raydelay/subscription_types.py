"""The subscription types and the one check of a type name (a leaf module: the client,
the coordinator's metadata and the dispatcher all use it)."""

from __future__ import annotations

from raydelay.errors import InvalidArgument

SUBSCRIPTION_TYPES = ("shared", "key_shared", "exclusive", "failover")
# The types that spread messages over consumers and honour deliver_at; exclusive and
# failover deliver in log order and ignore it (Pulsar's rule).
SPREAD_TYPES = ("shared", "key_shared")


def check_subscription_type(value: object) -> str:
    """``value`` if it names a subscription type, else an InvalidArgument listing them."""
    if not isinstance(value, str) or value not in SUBSCRIPTION_TYPES:
        raise InvalidArgument(
            f"subscription_type: must be one of {', '.join(SUBSCRIPTION_TYPES)}; got {value!r}"
        )
    return value
