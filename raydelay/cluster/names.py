"""Actor names (one place, so every client and actor agrees on them)."""

from __future__ import annotations

NAMESPACE = "raydelay"
COORDINATOR = "coordinator"


def topic_actor_name(topic: str, partition: int) -> str:
    return f"topic/{topic}/{partition}"


def subscription_actor_name(topic: str, partition: int, subscription: str) -> str:
    return f"sub/{topic}/{partition}/{subscription}"
