"""Where raydelay's actors are created, with their Ray options (STYLE.md 1).

Every actor is named in the ``raydelay`` namespace, detached (it outlives the
client that created it) and restarted by Ray after a crash (``max_restarts=-1``);
a restarted actor rebuilds itself from the store in its constructor. Actors are
created with ``get_if_exists=True``, so any client may create or attach to them.
"""

from __future__ import annotations

from typing import Any

import ray

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.subscription import SubscriptionActor
from raydelay.actors.topic import TopicActor
from raydelay.cluster.names import (
    COORDINATOR,
    NAMESPACE,
    subscription_actor_name,
    topic_actor_name,
)

_COMMON: dict[str, Any] = {
    "namespace": NAMESPACE,
    "lifetime": "detached",
    "max_restarts": -1,
    "get_if_exists": True,
    "num_cpus": 0,  # I/O-bound shells: never hold a CPU slot
}


def coordinator(config: dict[str, Any]) -> Any:
    """The cluster's coordinator, created from ``config`` if it does not exist yet."""
    return (
        ray.remote(CoordinatorActor)
        # Its calls are idempotent (or harmless when repeated: an extra empty ledger), so
        # Ray may retry them across a restart.
        .options(name=COORDINATOR, max_concurrency=1, max_task_retries=-1, **_COMMON)
        .remote(config)
    )


def existing_coordinator() -> Any | None:
    try:
        return ray.get_actor(COORDINATOR, namespace=NAMESPACE)
    except ValueError:
        return None


def topic_actor(topic: str, partition: int, config: dict[str, Any]) -> Any:
    return (
        ray.remote(TopicActor)
        .options(name=topic_actor_name(topic, partition), **_COMMON)
        .remote(topic, partition, config)
    )


def subscription_actor(topic: str, partition: int, subscription: str, config: dict) -> Any:
    return (
        ray.remote(SubscriptionActor)
        .options(name=subscription_actor_name(topic, partition, subscription), **_COMMON)
        .remote(topic, partition, subscription, config)
    )


def lookup(name: str) -> Any:
    """An existing actor by name (raises ValueError when there is none)."""
    return ray.get_actor(name, namespace=NAMESPACE)
