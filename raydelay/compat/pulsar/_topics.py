"""Pulsar topic names over raydelay topics: ``persistent://public/default/orders``,
``public/default/orders`` and ``orders`` all name the raydelay topic ``orders``; another
tenant or namespace maps to ``tenant.namespace.topic``; a ``non-persistent://`` topic is a
topic of its own (``non-persistent.<name>``). :class:`TopicMap` keeps a client's side of
it: the Pulsar names it used, and topics created on first use."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from raydelay.compat.pulsar._checks import check_type, unsupported
from raydelay.errors import InvalidArgument, NotFound
from raydelay.storage.keys import validate_name

_PULSAR_NAME = re.compile(r"^(?:(persistent|non-persistent)://)?(?:([^/]+)/([^/]+)/)?([^/]+)$")

NON_PERSISTENT = "non-persistent."  # the raydelay name's prefix of a non-persistent topic

# RegexSubscriptionMode (the C extension's enum, matched by name) -> the domains it reads
REGEX_MODES = {
    "PersistentOnly": ("persistent",),
    "NonPersistentOnly": ("non-persistent",),
    "AllTopics": ("persistent", "non-persistent"),
}


def parse_topic(topic: Any) -> tuple[str, str]:
    """(raydelay topic name, full Pulsar name) of a Pulsar topic name."""
    if isinstance(topic, (list, tuple)):
        raise unsupported("subscribing to several topics at once")
    check_type(str, topic, "topic")
    m = _PULSAR_NAME.match(topic)
    if not m:
        raise ValueError(f"topic: {topic!r} is not a Pulsar topic name")
    domain, tenant, ns, name = m.groups()
    domain, tenant, ns = domain or "persistent", tenant or "public", ns or "default"
    local = name if (tenant, ns) == ("public", "default") else f"{tenant}.{ns}.{name}"
    if domain == "non-persistent":  # (its own topic, stored durably as every raydelay one)
        local = f"{NON_PERSISTENT}{local}"
    try:
        validate_name("topic", local)
    except InvalidArgument as exc:
        raise ValueError(f"{exc} (from the Pulsar topic {topic!r})") from None
    return local, f"{domain}://{tenant}/{ns}/{name}"


def local_name(topic: str) -> str:
    return parse_topic(topic)[0]


def regex_mode(mode: Any) -> str:
    """The name of a RegexSubscriptionMode (None: PersistentOnly, Pulsar's default)."""
    if mode is None:
        return "PersistentOnly"
    name = getattr(mode, "name", mode)
    if name not in REGEX_MODES:
        raise ValueError(
            f"regex_subscription_mode: expected one of {sorted(REGEX_MODES)}, got {mode!r}"
        )
    return name


class TopicMap:
    """A client's topics: the Pulsar name each raydelay topic was used by, and the topics
    themselves, each created (one partition) on first use as Pulsar's auto-creation does.
    ``cluster_of`` gives the raydelay cluster (it raises once the client is closed)."""

    def __init__(self, cluster_of: Callable[[], Any]) -> None:
        self._cluster_of = cluster_of
        self._names: dict[str, str] = {}  # raydelay topic -> the Pulsar name it was used by

    @property
    def cluster(self) -> Any:
        return self._cluster_of()

    def open(self, topic: Any) -> tuple[str, str, int]:
        """(raydelay name, Pulsar name, partitions) of a topic, created if new."""
        local, full = parse_topic(topic)
        self._names[local] = full
        cluster = self.cluster
        try:
            n = cluster._partitions(local)
        except NotFound:
            cluster.create_topic(local, 1)
            n = cluster._partitions(local)
        return local, full, n

    def partitions(self, local: str) -> int:
        return self.cluster._partitions(local)

    def full_name(self, local: str) -> str:
        """The Pulsar name of a raydelay topic (as :meth:`open` mapped it, else in
        ``public/default``)."""
        known = self._names.get(local)
        if known is not None:
            return known
        if local.startswith(NON_PERSISTENT):
            return f"non-persistent://public/default/{local[len(NON_PERSISTENT) :]}"
        return f"persistent://public/default/{local}"

    def matcher(self, pattern: re.Pattern, mode: str) -> Callable[[str], bool]:
        """Whether a raydelay topic is one a pattern subscription reads: its full Pulsar
        name (``persistent://tenant/ns/name``, or without the domain) matches, in a domain
        the RegexSubscriptionMode ``mode`` (by name) reads."""
        domains = REGEX_MODES[mode]

        def match(local: str) -> bool:
            full = self.full_name(local)
            domain, bare = full.split("://", 1)
            return domain in domains and bool(pattern.fullmatch(full) or pattern.fullmatch(bare))

        return match
