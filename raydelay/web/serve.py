"""Serving the console (``raydelay console``): the listen checks, the link to the
cluster, then uvicorn.

The web app itself is :func:`raydelay.web.app.create_app`; this module checks where it is
to listen before anything attaches to Ray, says where it serves, and warns when that is
not loopback (the console has no authentication of its own). The app reads the cluster
through a :class:`~raydelay.web.attach.ClusterLink` (a reader process attaches, not this
one), so that it outlives an outage of the cluster; each change of the link is one line
on stderr.
"""

from __future__ import annotations

import sys

from raydelay.listen import check_listen
from raydelay.web.app import create_app
from raydelay.web.attach import ClusterLink, LinkState, LinkStatus, RemoteCluster
from raydelay.web.guard import LOOPBACK_NAMES
from raydelay.web.reader import AttachTarget

# how long the console waits for its first attach before it gives up with an error
FIRST_ATTACH_WAIT_S = 180.0


def serve(target: AttachTarget, host: str, port: int, *, allow_writes: bool) -> None:
    """Check the address, attach to ``target`` (Unavailable when nothing runs there), and
    serve the console on host:port until interrupted."""
    check_listen(host, port)
    import uvicorn

    link = ClusterLink(target, on_change=_ChangeLog())
    link.start()
    try:
        link.wait_attached(FIRST_ATTACH_WAIT_S)
        app = create_app(RemoteCluster(link), allow_writes=allow_writes, listen_host=host)
        mode = "writes allowed" if allow_writes else "read-only; --allow-writes enables actions"
        shown = f"[{host}]" if ":" in host else host
        print(f"raydelay console on http://{shown}:{port} ({mode}); Ctrl-C stops it", flush=True)
        if host not in LOOPBACK_NAMES:
            print(
                f"raydelay: the console listens on {host} with no authentication of its own: "
                "anyone who reaches that port sees every topic"
                + (" and can cancel, reset and redrive" if allow_writes else ""),
                file=sys.stderr,
            )
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        link.stop()


class _ChangeLog:
    """One line on stderr when the cluster goes down or comes back: a reader unsure for a
    moment (a slow answer) that then hears back, or a down cluster's reason changing,
    says nothing new."""

    def __init__(self) -> None:
        self._said: LinkState | None = None

    def __call__(self, status: LinkStatus) -> None:
        if status.state is LinkState.UP and self._said is not LinkState.UP:
            print(
                f"raydelay console: attached to the Ray cluster at {status.address}",
                file=sys.stderr,
            )
            self._said = LinkState.UP
        elif status.state is LinkState.DOWN and self._said is not LinkState.DOWN:
            print(
                f"raydelay console: the cluster is unreachable ({status.reason}); pages answer "
                "503 until it is back",
                file=sys.stderr,
            )
            self._said = LinkState.DOWN
