"""How a ``raydelay`` command joins the running cluster, and leaves it at its end."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from raydelay.errors import Unavailable


def attach_address(args: argparse.Namespace) -> str:
    """--address, else RAYDELAY_ADDRESS, else the Ray that `raydelay up` started, else auto."""
    from raydelay.cluster.local import up_address

    return args.address or os.environ.get("RAYDELAY_ADDRESS") or up_address() or "auto"


def attach(args: argparse.Namespace) -> Any:
    """A client of the running raydelay (its coordinator is created if missing). When this
    joins Ray, the command's end leaves it again (``args.detach``, called by main)."""
    import ray

    from raydelay.client.bootstrap import attach_ray
    from raydelay.client.connection import connect

    address = attach_address(args)
    try:
        joined = not ray.is_initialized()  # (main() called in a process that runs Ray: no)
        if joined:
            # The actors' log lines are not the command's output; and with none to print,
            # leaving need not wait for them (see detach)
            attach_ray(address, log_to_driver=False)
        cluster = connect(args.config, address=address)
    except ConnectionError as exc:
        where = "here" if address == "auto" else f"at {address}"
        raise Unavailable(
            f"no Ray cluster is running {where}; start one with `raydelay up` (or pass --address)"
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
