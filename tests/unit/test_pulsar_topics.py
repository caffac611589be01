"""The Pulsar-compatible client's topic names (raydelay.compat.pulsar._topics), with no Ray:
Pulsar names onto raydelay topics, and a client's TopicMap over a stand-in cluster."""

from __future__ import annotations

import re

import pytest

from raydelay.compat.pulsar._topics import TopicMap, parse_topic, regex_mode
from raydelay.compat.pulsar.enums import RegexSubscriptionMode
from raydelay.errors import NotFound


@pytest.mark.parametrize(
    "pulsar_name, local, full",
    [
        ("orders", "orders", "persistent://public/default/orders"),
        ("public/default/orders", "orders", "persistent://public/default/orders"),
        ("persistent://public/default/orders", "orders", "persistent://public/default/orders"),
        ("persistent://acme/eu/orders", "acme.eu.orders", "persistent://acme/eu/orders"),
        (
            "non-persistent://public/default/ticks",
            "non-persistent.ticks",
            "non-persistent://public/default/ticks",
        ),
    ],
)
def test_a_pulsar_name_maps_onto_a_raydelay_topic(pulsar_name, local, full):
    assert parse_topic(pulsar_name) == (local, full)


def test_names_that_are_not_topics_are_refused():
    with pytest.raises(ValueError, match="not a Pulsar topic name"):
        parse_topic("a/b/c/d")
    with pytest.raises(ValueError, match="topic"):
        parse_topic(17)
    with pytest.raises(NotImplementedError, match="several topics"):
        parse_topic(["a", "b"])


def test_regex_modes_by_name_or_enum():
    assert regex_mode(None) == "PersistentOnly"
    assert regex_mode(RegexSubscriptionMode.AllTopics) == "AllTopics"
    with pytest.raises(ValueError, match="regex_subscription_mode"):
        regex_mode("Sometimes")


class _Cluster:
    """What TopicMap asks of a raydelay cluster: partitions of a topic, and creating one."""

    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = topics

    def _partitions(self, topic: str) -> int:
        if topic not in self.topics:
            raise NotFound(topic)
        return self.topics[topic]

    def create_topic(self, topic: str, partitions: int) -> None:
        self.topics[topic] = partitions


def test_a_topic_is_created_on_first_use_and_keeps_the_name_it_was_used_by():
    cluster = _Cluster({"orders": 4})
    topics = TopicMap(lambda: cluster)
    assert topics.open("persistent://public/default/orders") == (
        "orders",
        "persistent://public/default/orders",
        4,
    )
    assert topics.open("acme/eu/new") == ("acme.eu.new", "persistent://acme/eu/new", 1)
    assert cluster.topics["acme.eu.new"] == 1
    assert topics.full_name("acme.eu.new") == "persistent://acme/eu/new"
    # a topic it never opened: its name in public/default
    assert topics.full_name("other") == "persistent://public/default/other"
    assert topics.full_name("non-persistent.t") == "non-persistent://public/default/t"


def test_a_pattern_matches_full_names_in_the_domains_of_its_mode():
    topics = TopicMap(lambda: _Cluster({}))
    persistent_only = topics.matcher(re.compile(r"public/default/o.*"), "PersistentOnly")
    assert persistent_only("orders")
    assert not persistent_only("non-persistent.orders")
    everything = topics.matcher(re.compile(r".*://public/default/o.*"), "AllTopics")
    assert everything("orders") and everything("non-persistent.orders")
    assert not everything("items")
