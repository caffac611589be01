"""What the console refuses before it serves anything (pure: no web framework).

- **A foreign Host** (DNS rebinding: a page of another site whose name was pointed at
  127.0.0.1 reaches the console as that name): only the address it listens on and the
  loopback names are served. A console listening on every interface (``0.0.0.0``) cannot
  know its public names, and serves any.
- **A POST from another origin** (cross-site request forgery): its ``Origin``, else its
  ``Referer``, must be the console's own. The form token is the second lock; a client
  that sends neither header (not a browser) needs the token alone.
- **Being framed** (clickjacking): every answer says ``frame-ancestors 'none'``.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from raydelay.listen import LOOPBACK_NAMES

# sent with every answer of the console
SECURITY_HEADERS = {
    "Content-Security-Policy": "frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
_ANY_INTERFACE = ("0.0.0.0", "::", "")


def allowed_hosts(listen_host: str) -> frozenset[str] | None:
    """The host names served when listening on ``listen_host`` (None: any)."""
    host = listen_host.strip().strip("[]").lower()
    if host in _ANY_INTERFACE:
        return None
    return LOOPBACK_NAMES | {host}


def host_name(host_header: str) -> str:
    """The name of a ``Host`` header, without its port (``[::1]:8642`` -> ``::1``)."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1 : h.find("]")] if "]" in h else h[1:]
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def refusal(method: str, headers: Mapping[str, str], hosts: frozenset[str] | None) -> str | None:
    """Why a request is refused (None: it is not). ``headers`` as received (names in any
    case); ``hosts``: :func:`allowed_hosts`."""
    got = {k.lower(): v for k, v in headers.items()}
    host = got.get("host", "")
    if hosts is not None and host_name(host) not in hosts:
        return f"Host {host!r} is not this console's (it answers to {', '.join(sorted(hosts))})"
    if method.upper() != "POST":
        return None
    origin = got.get("origin")
    if origin is not None:
        if origin == "null" or urlsplit(origin).netloc.lower() != host.lower():
            return f"a form posted from {origin!r}, not from this console"
        return None
    referer = got.get("referer")
    if referer is not None and urlsplit(referer).netloc.lower() != host.lower():
        return f"a form posted from a page of {urlsplit(referer).netloc!r}, not of this console"
    return None
