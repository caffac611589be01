"""The coordinator's warm standby: who serves, and who takes over when its node is lost.

DESIGN rule 5: a process start is never on the recovery path. A coordinator re-created
after its node was lost costs a Ray worker start and a constructor (imports, an S3 client)
before the first call is served: 2 s and more on a loaded node. So while the coordinator
serves, a second ``CoordinatorActor`` stands by on another node (:class:`StandbyKeeper`),
with its imports done and its store client made, holding nothing: no claim on the store,
no metadata. Idle, it sleeps.

The two go by the names in ``COORDINATORS``, in either order; each says which it is
(``CoordinatorActor.role``, answered on a thread of its own so that a busy coordinator
answers at once). :func:`find_coordinator` is how every client and actor finds the
one that serves. When the serving one's node is lost, its callers end it (its node is
gone: ``placement.stranded``) and find the standby alone; the standby's first call takes
over (:meth:`Standing.take_over`): it claims the store (a higher epoch, which fences the
old one's journal writes, as a restart's claim does), replays the journal, and serves.
A new standby is started afterwards, on yet another node, off the recovery path.

Fencing is the store's, as before: the journal is written create-only and the claim's
epoch only grows, so a coordinator that lives on unaware (a frozen node) writes nothing
after the take-over. Two standbys never serve at once: a standby takes over only when the
other coordinator is gone, stranded, or says it stands by, and says it is taking over
before it asks (of two that ask each other, the second to ask sees the first).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent import futures
from typing import Any, NamedTuple, Protocol

from raydelay.cluster import placement
from raydelay.cluster.names import COORDINATORS
from raydelay.errors import Unavailable

log = logging.getLogger(__name__)

ROLE_GROUP = "role"  # the concurrency group ``CoordinatorActor.role`` is answered on
ROLE_TIMEOUT_S = 2.0  # how long a coordinator's answer to ``role`` is waited for
KEEP_EVERY_S = 5.0  # how often a serving coordinator looks at its standby
FIRST_LOOK_S = 1.0  # the first look after a coordinator starts serving ...
FIRST_LOOK_AFTER_TAKE_OVER_S = 3.0  # ... or after it took over (a recovery is under way)


class Role(enum.Enum):
    SERVING = "serving"
    TAKING_OVER = "taking over"
    STANDING_BY = "standing by"


class FoundCoordinator(NamedTuple):
    """The coordinator that serves: its actor's name and a handle to it."""

    name: str
    handle: Any


class Coordinators(Protocol):
    """The Ray calls this module makes (tests pass a fake)."""

    def lookup(self, name: str) -> Any | None:
        """The live actor called ``name``, or None."""

    def stranded(self, name: str) -> bool:
        """Whether the actor called ``name`` is pinned to a node that is gone."""

    def end(self, name: str, handle: Any) -> None:
        """End the actor for good, and wait until its name is free."""

    def roles(self, handles: dict[str, Any], timeout_s: float) -> dict[str, Role]:
        """What each of ``handles`` says it is; those that answered within ``timeout_s``
        (it may return as soon as one says it serves)."""

    def node_of(self, name: str) -> str | None:
        """The node of the live actor called ``name`` (None: none, or not placed yet)."""

    def other_nodes(self, node: str | None) -> list[str]:
        """The nodes raydelay's actors may go to, but ``node``; the least loaded first."""


class RayCoordinators:
    """:class:`Coordinators` over Ray (``raydelay.cluster.placement``)."""

    def __init__(self, avoid_head: bool = True) -> None:
        self._avoid_head = avoid_head

    def lookup(self, name: str) -> Any | None:
        return placement.lookup_or_none(name)

    def stranded(self, name: str) -> bool:
        return placement.stranded(name)

    def end(self, name: str, handle: Any) -> None:
        placement.end_stranded(name, handle)

    def roles(self, handles: dict[str, Any], timeout_s: float) -> dict[str, Role]:
        from raydelay.actors.coordinator import CoordinatorActor

        method = CoordinatorActor.role.__name__
        # (waited for through futures: this may run in a thread of an async actor)
        pending = {
            getattr(h, method).options(concurrency_group=ROLE_GROUP).remote().future(): name
            for name, h in handles.items()
        }
        out: dict[str, Role] = {}
        give_up = time.monotonic() + timeout_s
        while pending:
            done, _ = futures.wait(
                pending, timeout=max(0.0, give_up - time.monotonic()), return_when="FIRST_COMPLETED"
            )
            if not done:
                break
            for f in done:
                name = pending.pop(f)
                try:
                    out[name] = Role(f.result())
                except Exception:  # noqa: BLE001 - gone meanwhile: no answer
                    continue
            if Role.SERVING in out.values():
                break
        return out

    def node_of(self, name: str) -> str | None:
        return placement.node_of(name)

    def other_nodes(self, node: str | None) -> list[str]:
        candidates = [n for n in placement.candidate_nodes(self._avoid_head) if n != node]
        if not candidates:  # (a single node: looked at every KEEP_EVERY_S, so cheaply)
            return []
        load = Counter(a["node"] for a in placement.actors() if a["node"])
        return sorted(candidates, key=lambda n: (load[n], n))


def find_coordinator(coordinators: Coordinators | None = None) -> FoundCoordinator | None:
    """The coordinator that serves, or None when none runs (the caller creates one).

    Coordinators on a node that is gone are ended first. Of two left, the one that says
    it serves; when neither does (the serving one was lost and the other stands by, or
    one restarted), the one taking over, else the first by name, whose first call takes
    over. Unavailable when two run and neither answers within ROLE_TIMEOUT_S."""
    c = coordinators or RayCoordinators()
    live: dict[str, Any] = {}
    for name in COORDINATORS:
        handle = c.lookup(name)
        if handle is None:
            continue
        if c.stranded(name):
            c.end(name, handle)
            continue
        live[name] = handle
    if not live:
        return None
    if len(live) == 1:
        ((name, handle),) = live.items()
        return FoundCoordinator(name, handle)
    roles = c.roles(live, ROLE_TIMEOUT_S)
    for wanted in (Role.SERVING, Role.TAKING_OVER):
        for name in live:
            if roles.get(name) is wanted:
                return FoundCoordinator(name, live[name])
    if len(roles) < len(live):
        raise Unavailable(
            f"coordinator: cannot tell which of {', '.join(live)} serves "
            f"(no answer from {', '.join(n for n in live if n not in roles)})"
        )
    name = next(iter(live))
    return FoundCoordinator(name, live[name])


def other_name(name: str) -> str:
    """The other of the coordinator's two names."""
    return next(n for n in COORDINATORS if n != name)


class Standing:
    """One coordinator's role, and the check before a standby takes over."""

    def __init__(self, name: str, serving: bool, coordinators: Coordinators) -> None:
        self.name = name
        self.role = Role.SERVING if serving else Role.STANDING_BY
        self._c = coordinators

    def take_over(self, activate: Callable[[], None]) -> None:
        """Serve from now on: ``activate()`` (claim the store, load the metadata) once the
        other coordinator is known not to serve. Unavailable, with nothing taken, while it
        serves, is taking over itself, or does not answer: the caller looks again."""
        if self.role is Role.SERVING:
            return
        self.role = Role.TAKING_OVER  # (said before asking: see the module's docstring)
        try:
            other = other_name(self.name)
            handle = self._c.lookup(other)
            if handle is not None and self._c.stranded(other):
                self._c.end(other, handle)
                handle = None
            if handle is not None:
                said = self._c.roles({other: handle}, ROLE_TIMEOUT_S).get(other)
                if said is None:
                    raise Unavailable(
                        f"{self.name} stands by: {other} does not say whether it serves"
                    )
                if said is not Role.STANDING_BY:
                    raise Unavailable(f"{self.name} stands by: {other} is {said.value}")
            began = time.monotonic()
            activate()
        except BaseException:
            self.role = Role.STANDING_BY
            raise
        self.role = Role.SERVING
        log.warning(
            "%s took over as the coordinator in %.2f s (%s was gone)",
            self.name,
            time.monotonic() - began,
            other,
        )


class StandbyKeeper:
    """Keeps a standby coordinator running on another node while this one serves: a
    thread that looks every KEEP_EVERY_S (sleeping otherwise), and starts one with
    ``spawn(name, node)`` when none runs, or when the one that runs is stranded or shares
    this coordinator's node. With no other node (a single-node cluster) there is none."""

    def __init__(
        self,
        name: str,
        node: str | None,
        spawn: Callable[[str, str], Any],
        coordinators: Coordinators,
        every_s: float = KEEP_EVERY_S,
    ) -> None:
        self.name = name
        self.node = node  # this coordinator's node
        self.standby = other_name(name)
        self._spawn = spawn
        self._c = coordinators
        self._every_s = every_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def keep(self) -> str | None:
        """One look: the node the standby runs on or was started on, None when there is
        none (no other node)."""
        handle = self._c.lookup(self.standby)
        if handle is not None:
            node = self._c.node_of(self.standby)
            if node is None:
                return ""  # (being placed)
            if node != self.node and not self._c.stranded(self.standby):
                return node
            log.info("standby coordinator %s is on node %s: replacing it", self.standby, node[:8])
            self._c.end(self.standby, handle)
        nodes = self._c.other_nodes(self.node)
        if not nodes:
            return None
        log.info("starting the standby coordinator %s on node %s", self.standby, nodes[0][:8])
        self._spawn(self.standby, nodes[0])
        return nodes[0]

    def start(self, first_look_s: float) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, args=(first_look_s,), name="raydelay-standby", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _run(self, first_look_s: float) -> None:
        wait_s = first_look_s
        while not self._stop.is_set():
            self._wake.wait(wait_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.keep()
            except Exception as exc:  # noqa: BLE001 - Ray's control service in trouble: later
                log.warning("looking at the standby coordinator failed: %s", exc)
            wait_s = self._every_s
