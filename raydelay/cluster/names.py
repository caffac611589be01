"""Actor names (one place, so every client and actor agrees on them).

- ``coordinator`` and ``coordinator/1``: the coordinator and its warm standby on another
  node, in either order (the names do not say which serves: each actor says,
  ``CoordinatorActor.role``; see ``raydelay.actors.standby``);
- ``host/<node>/<slot>``: a partition host, slot ``slot`` of node ``node`` (the first 16
  hex digits of Ray's node id), holding the logs of many partitions of any topics;
- ``subhost/<node>/<slot>``: a subscription host, slot ``slot`` of node ``node``, serving
  many subscription units of any topics. A **unit** (``<topic>/<subscription>/<group>``)
  is partition group ``group`` of a subscription (all of its partitions, group 0, unless
  ``subscription.partitions_per_actor`` splits it);
- ``runner/<i>``: a runner of scheduled Ray calls (``raydelay.tasks``).
"""

from __future__ import annotations

from typing import NamedTuple

NAMESPACE = "raydelay"
COORDINATOR = "coordinator"
# the coordinator's two names: one serves, the other stands by on another node (a lone
# coordinator is the first to be created, and the first to be looked at)
COORDINATORS = (COORDINATOR, f"{COORDINATOR}/1")
HOST_PREFIX = "host/"
SUBHOST_PREFIX = "subhost/"
RUNNER_PREFIX = "runner/"


def host_actor_name(node_id: str, slot: int) -> str:
    return f"{HOST_PREFIX}{node_id[:16]}/{slot}"


def subhost_actor_name(node_id: str, slot: int) -> str:
    return f"{SUBHOST_PREFIX}{node_id[:16]}/{slot}"


def host_node_prefix(name: str) -> str:
    """The node id prefix a host's (or a subscription host's) name carries."""
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


class Unit(NamedTuple):
    """Partition group ``group`` of a subscription: what one subscription host serves as a
    whole, and what the coordinator assigns to a host (its ``key``)."""

    topic: str
    subscription: str
    group: int

    @property
    def key(self) -> str:
        return f"{self.topic}/{self.subscription}/{self.group}"

    @staticmethod
    def of_key(key: str) -> Unit:
        topic, subscription, group = key.split("/")
        return Unit(topic, subscription, int(group))
