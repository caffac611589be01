"""The end of one client: closing its producers and consumers, and, when it started Ray
(or for ``raydelay down``), persisting every subscription's cursor, closing every
partition's open ledger and stopping the actors. What ``Cluster.shutdown`` does."""

from __future__ import annotations

import logging

import ray

from raydelay.actors.subscription import SubscriptionHost
from raydelay.client.peers import Session
from raydelay.client.runner import stop_runner_actors
from raydelay.cluster import handles, placement, rpc
from raydelay.cluster.handles import Peer

log = logging.getLogger(__name__)


class Lifecycle:
    """How one client (its :class:`Session`) ends."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def shutdown(self) -> None:
        """See :meth:`Cluster.shutdown`."""
        if self._session.closed:
            return
        self._session.closed = True
        for producer in list(self._session.producers):
            producer.close()
        for consumer in list(self._session.consumers):
            try:
                consumer.close()
            except Exception as exc:  # noqa: BLE001 - shutting down: report and go on
                log.warning("closing a consumer failed: %s", exc)
        if self._session.started_ray:
            try:
                flush_all()
                # before Ray itself stops (an actor torn down in the middle of a call can
                # crash its process): subscriptions between calls, then the hosts they called
                handles.stop_all(graceful=True)
            finally:
                ray.shutdown()
        elif self._session.joined_ray:
            # Ray's own exit hook would leave it too, but after this process's last line:
            # by then the Ray may be stopped, and a worker that finds its GCS gone waits
            # 60 s for it and then ends the process with an error
            ray.shutdown()

    def stop_everything(self) -> int:
        """``raydelay down``: persist every subscription's cursor, close every partition's
        open ledger, stop every raydelay actor of this Ray for good, and disconnect.
        Returns how many actors were stopped. Ray itself keeps running."""
        self._session.check_open()
        for producer in list(self._session.producers):
            producer.close()
        for consumer in list(self._session.consumers):
            consumer.close()
        flush_all()
        stopped = handles.stop_all(graceful=False)
        self._session.closed = True
        ray.shutdown()
        return stopped


def flush_all() -> None:
    """Persist every subscription's cursor and stop its loops, then close every partition's
    open ledger (which answers the hosts' standing long polls). Every live subscription
    host is closed, whoever made it: one left reading would see its hosts stop under it."""
    stop_runner_actors()  # consumers themselves: they go before their subscription
    refs = []
    for name in placement.live_hosts("SubscriptionHost"):
        handle = placement.lookup_or_none(name)
        if handle is not None:  # each unit persists, then stops its loops
            refs.append(Peer(name, lambda: None, name, handle).submit(SubscriptionHost.close))
    if refs:
        rpc.get(refs, what="subscription")
    hosts = [placement.lookup_or_none(h) for h in placement.live_hosts()]
    closes = [h.close_ledgers.remote() for h in hosts if h is not None]
    if closes:
        rpc.get(closes, what="host")
