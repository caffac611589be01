"""Whether a server can listen where it is asked to, checked before anything attaches to
Ray: the console (``raydelay console``) and the HTTP API (``raydelay serve``)."""

from __future__ import annotations

import socket

from raydelay.errors import InvalidArgument

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def check_listen(host: str, port: int) -> None:
    """InvalidArgument now if nothing can listen on host:port (a bad port, taken, or not
    an address of this machine), rather than a server log line after attaching to Ray."""
    if not 1 <= port <= 65535:
        raise InvalidArgument(f"port: expected 1 to 65535, got {port}")
    if not host.strip():
        raise InvalidArgument("host: empty")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise InvalidArgument(f"host: {host!r} does not resolve ({exc})") from None
    family, kind, proto, _, where = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(where)
        except OSError as exc:
            raise InvalidArgument(
                f"port: cannot listen on {host}:{port} ({exc.strerror or exc})"
            ) from None
