"""Which host serves each partition and each subscription unit (pure: no Ray).

Part of the cluster's metadata: :class:`Assignments` reads and changes the ``hosts``
and ``units`` tables of :class:`~raydelay.cluster.metadata.Metadata`'s state, and every
change goes through its journal. The coordinator passes in what Ray says (the slots,
their nodes, which hosts run), so that the choices here are plain functions of it.
"""

from __future__ import annotations

import zlib
from collections import Counter
from typing import TYPE_CHECKING

from raydelay.cluster.names import Unit
from raydelay.errors import InvalidArgument

if TYPE_CHECKING:
    from raydelay.cluster.metadata import Metadata


def _pk(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


class _Loads:
    """How many assigned items each live slot and each node serves, and how many of one
    family (a key prefix) each slot and each node holds. A dead host's items count for
    nobody."""

    def __init__(
        self,
        table: dict[str, str],
        slots: list[str],
        node_of: dict[str, str],
        family: str,
        skip: str | None = None,
    ) -> None:
        self.slot = dict.fromkeys(slots, 0)
        self.node: Counter[str] = Counter()
        self.family_slot: Counter[str] = Counter()
        self.family_node: Counter[str] = Counter()
        for key, host in table.items():
            if host not in self.slot or key == skip:
                continue
            self.slot[host] += 1
            self.node[node_of[host]] += 1
            if key.startswith(family):
                self.family_slot[host] += 1
                self.family_node[node_of[host]] += 1


class Assignments:
    def __init__(self, meta: Metadata) -> None:
        self._meta = meta

    @property
    def _hosts(self) -> dict[str, str]:
        return self._meta.state["hosts"]

    @property
    def _units(self) -> dict[str, str]:
        return self._meta.state["units"]

    # --- partition hosts ------------------------------------------------------------------

    def host_of(self, topic: str, partition: int) -> str | None:
        """The host the partition is assigned to (None: not assigned yet)."""
        self._meta.check_partition(topic, partition)
        return self._hosts.get(_pk(topic, partition))

    def assignments(self) -> dict[str, str]:
        """``"topic/partition"`` -> host, for every assigned partition."""
        return dict(self._hosts)

    def assign(self, topic: str, partition: int, host: str) -> str:
        """Assign the partition to ``host`` (journaled when it changes); returns ``host``."""
        self._meta.check_partition(topic, partition)
        if self._hosts.get(_pk(topic, partition)) != host:
            self._meta.change("assign", key=_pk(topic, partition), host=host)
        return host

    def choose_host(
        self,
        topic: str,
        partition: int,
        slots: list[str],
        node_of: dict[str, str],
        running: set[str] | None = None,
    ) -> str:
        """The host slot for a partition to go to, of ``slots`` (the live and the startable
        ones; ``node_of`` maps each to its node): the slot that serves the fewest
        partitions, then the one whose node serves the fewest, then the one that serves
        the fewest of this topic; ties go by a hash of the partition and the slot, so that
        partitions reassigned at once spread. ``running`` (its host was lost: the slots
        whose host runs): a running slot first, so that nothing starts on the way back,
        unless none runs."""
        if not slots:
            raise InvalidArgument("slots: no host slot to assign a partition to")
        loads = _Loads(self._hosts, slots, node_of, family=f"{topic}/")
        me = _pk(topic, partition)
        return min(
            slots,
            key=lambda h: (
                running is not None and h not in running,
                loads.slot[h],
                loads.node[node_of[h]],
                loads.family_slot[h],
                zlib.crc32(f"{me}@{h}".encode()),
            ),
        )

    # --- subscription hosts ------------------------------------------------------------------

    def unit_host(self, unit: Unit) -> str | None:
        """The subscription host the unit is assigned to (None: not assigned yet)."""
        self._meta.subscription(unit.topic, unit.subscription)  # NotFound once deleted
        return self._units.get(unit.key)

    def unit_assignments(self) -> dict[str, str]:
        """``"topic/subscription/group"`` -> subscription host, for every assigned unit."""
        return dict(self._units)

    def assign_unit(self, unit: Unit, host: str) -> str:
        """Assign the unit to ``host`` (journaled when it changes); returns ``host``."""
        self._meta.subscription(unit.topic, unit.subscription)
        if self._units.get(unit.key) != host:
            self._meta.change("assign_unit", key=unit.key, host=host)
        return host

    def release_unit(self, key: str) -> None:
        """Unassign a unit (its host stopped serving it; the next lookup assigns it again)."""
        if key in self._units:
            self._meta.change("assign_unit", key=key, host=None)

    def choose_subhost(
        self,
        unit: Unit,
        slots: list[str],
        node_of: dict[str, str],
        running: set[str],
        served: dict[str, int],
        moving: bool = False,
    ) -> str:
        """The subscription host slot for a unit, of ``slots`` (the live and the startable
        ones; ``node_of`` maps each to its node), by failure domain: the node holding the
        fewest units of the unit's own subscription, then the node serving the fewest
        units, then the slot holding the fewest of its subscription's (a subscription
        split with ``partitions_per_actor`` is split to use several processes), then the
        slot serving the fewest, then a slot already ``running``, then the
        node whose partition hosts serve most of the unit's partitions (``served``: node
        -> how many), then a hash of the unit and the slot, so that units reassigned at
        once spread. ``moving`` (its host was lost): a running slot of the chosen node
        before an emptier one, so that nothing starts on the way back."""
        if not slots:
            raise InvalidArgument("slots: no subscription host slot to assign a unit to")
        family = f"{unit.topic}/{unit.subscription}/"
        loads = _Loads(self._units, slots, node_of, family, skip=unit.key)
        return min(
            slots,
            key=lambda h: (
                loads.family_node[node_of[h]],
                loads.node[node_of[h]],
                moving and h not in running,
                loads.family_slot[h],
                loads.slot[h],
                h not in running,
                -served.get(node_of[h], 0),
                zlib.crc32(f"{unit.key}@{h}".encode()),
            ),
        )
