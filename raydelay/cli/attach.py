"""How a ``raydelay`` command joins the running cluster, and leaves it at its end."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from raydelay.errors import Unavailable


def attach_address(args: argparse.Namespace) -> tuple[str, str | None]:
    """Where the command attaches, and a note for stderr when the user did not name it:
    --address, else RAYDELAY_ADDRESS, else the Ray that `raydelay up` started, else
    RAY_ADDRESS or the last `ray start` on this machine while it runs (the note says which
    Ray was joined). Never a Ray merely found running (Ray's "auto" would join any):
    Unavailable when none of these names one, as `raydelay down` refuses without a marker."""
    from raydelay.cluster.local import attach_target

    found, unnamed = attach_target(args.address)
    if found is None:
        raise Unavailable(
            "no Ray cluster is running here that `raydelay up` started (nor one named by "
            "--address, RAYDELAY_ADDRESS or RAY_ADDRESS); start one with `raydelay up`"
        )
    if not unnamed:
        return found, None
    return found, (
        f"raydelay: no `raydelay up` here; joined the Ray at {found} that the last "
        "`ray start` on this machine left running (pass --address to choose another)"
    )


def attach(args: argparse.Namespace) -> Any:
    """A client of the running raydelay (its coordinator is created if missing). When this
    joins Ray, the command's end leaves it again (``args.detach``, called by main)."""
    import ray

    from raydelay.client.bootstrap import attach_ray
    from raydelay.client.connection import connect

    joined = not ray.is_initialized()  # (main() called in a process that runs Ray: no)
    address: str | None = None
    try:
        if joined:
            address, note = attach_address(args)
            if note:
                print(note, file=sys.stderr)
            # The actors' log lines are not the command's output; and with none to print,
            # leaving need not wait for them (see detach)
            attach_ray(address, log_to_driver=False)
        cluster = connect(args.config, address=address)
    except ConnectionError as exc:
        raise Unavailable(
            f"no Ray cluster is running at {address}; start one with `raydelay up` "
            "(or pass --address)"
        ) from exc
    if joined:
        args.detach = cluster.shutdown
    return cluster


def detach(args: argparse.Namespace) -> None:
    """Leave the Ray that the command joined: its client's producers and consumers closed,
    then Ray's driver disconnected now. Left to Ray's exit hook, the disconnect would first
    sleep 0.5 s for worker log lines still on their way, which a command that asked for
    none (``log_to_driver=False``) does not wait for."""
    close = getattr(args, "detach", None)
    if close is None:
        return
    import ray

    try:
        close()
    except Exception as exc:  # noqa: BLE001 - the command is over: say why, and leave Ray
        logging.getLogger(__name__).warning("closing the client: %s", exc)
    finally:
        ray.shutdown()
