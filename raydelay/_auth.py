"""Ray 2.60's token authentication, for clients that attach by address (no Ray import).

Ray 2.60 starts clusters with token authentication on (``ray start``, and the Ray that
``ray.init`` starts), but a process that attaches by address sends no token unless
``RAY_AUTH_MODE=token`` is set, and Ray reads that setting once, when it is imported.
So ``import raydelay`` sets it, when the user set no mode, this user has a token (Ray's
``~/.ray/auth_token``, or ``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH``) and Ray is not
imported yet. Without it, ``raydelay up`` followed by ``connect(address="auto")`` is
refused by the cluster it just started.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def send_token_by_default() -> bool:
    """Set ``RAY_AUTH_MODE=token`` as described above; True if it did."""
    if os.environ.get("RAY_AUTH_MODE") or "ray" in sys.modules:
        return False
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token"
    if os.environ.get("RAY_AUTH_TOKEN") or Path(path).is_file():
        os.environ["RAY_AUTH_MODE"] = "token"
        return True
    return False
