"""Actor names (one place, so every client and actor agrees on them).

- ``coordinator``: the one coordinator;
- ``host/<node>/<slot>``: a partition host, slot ``slot`` of node ``node`` (the first 16
  hex digits of Ray's node id), holding the logs of many partitions of any topics;
- ``sub/<topic>/<subscription>/<group>``: a subscription's actor, serving partition
  group ``group`` (all of its partitions, group 0, unless
  ``subscription.partitions_per_actor`` splits it);
- ``runner/<i>``: a runner of scheduled Ray calls (``raydelay.tasks``).
"""

from __future__ import annotations

NAMESPACE = "raydelay"
COORDINATOR = "coordinator"
HOST_PREFIX = "host/"
SUBSCRIPTION_PREFIX = "sub/"
RUNNER_PREFIX = "runner/"


def host_actor_name(node_id: str, slot: int) -> str:
    return f"{HOST_PREFIX}{node_id[:16]}/{slot}"


def host_node_prefix(name: str) -> str:
    """The node id prefix a host's name carries."""
    return name.split("/")[1]


def subscription_group(partition: int, per_actor: int) -> int:
    """The group (actor) of a subscription that serves ``partition``; ``per_actor`` <= 0
    (-1: no limit): one actor serves every partition."""
    return 0 if per_actor <= 0 else partition // per_actor


def subscription_groups(partitions: int, per_actor: int) -> dict[int, list[int]]:
    """Group -> the partitions its actor serves."""
    out: dict[int, list[int]] = {}
    for p in range(partitions):
        out.setdefault(subscription_group(p, per_actor), []).append(p)
    return out


def subscription_actor_name(topic: str, subscription: str, group: int = 0) -> str:
    return f"{SUBSCRIPTION_PREFIX}{topic}/{subscription}/{group}"
