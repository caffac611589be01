"""How a client reaches its cluster (docs/client.md): the config it connects with, the Ray
it joins or starts, the store's claim that decides which, and the coordinator it asks
(created if there is none). :func:`attach` does all of it; ``raydelay.connect`` builds a
:class:`~raydelay.client.connection.Cluster` on what it returns, and a task runner its own
topic client. The ``raydelay`` command joins Ray with :func:`attach_ray` first, to leave
the actors' log lines out of its output."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import ray

from raydelay.actors.coordinator import spawn_coordinator
from raydelay.actors.host import adopt_on_host, spawn_host
from raydelay.actors.standby import FoundCoordinator, find_coordinator
from raydelay.cluster import owner, rpc
from raydelay.cluster.local import ray_system_config, running_ray_address
from raydelay.cluster.names import COORDINATOR, NAMESPACE
from raydelay.cluster.nodes import check_store
from raydelay.config import ClientConfig, Config, config_from_dict, config_to_dict, load_config
from raydelay.errors import InvalidArgument, StorageError, StoreOwned, Unavailable
from raydelay.storage import make_store

log = logging.getLogger(__name__)

# How long connect() waits for another process that is starting a cluster on the same
# store to claim it, before it starts one of its own (a Ray start takes 5-30 s here).
START_TURN_WAIT_S = 120.0
# How often the waiting process looks at the store's claim meanwhile.
START_TURN_POLL_S = 0.1


@dataclasses.dataclass(frozen=True)
class Attached:
    """What :func:`attach` found: the coordinator that serves, the cluster's (the
    coordinator's) config, this client's own settings, whether this process started the
    Ray it is in, and whether it joined a running one (either is left at shutdown)."""

    coordinator: FoundCoordinator
    config: Config
    client: ClientConfig
    started_ray: bool
    joined_ray: bool = False


def attach(
    config: str | os.PathLike | Config | dict | None = None, address: str | None = None
) -> Attached:
    """Join (or start) the Ray of the cluster that owns ``config``'s store and find its
    coordinator: what ``raydelay.connect(config, address)`` does before it makes its
    Cluster (see there)."""
    cfg = resolve_config(config)
    with contextlib.ExitStack() as turn:
        started = joined = False
        if not ray.is_initialized():
            if address is None:
                # a store another live cluster owns: attach to that cluster, not a new Ray
                address = _owner_address(cfg) or running_ray_address()
            if address is None:
                # about to start a Ray: wait for any process starting one on this store now
                address = _take_start_turn(cfg, turn)
            if address is None:
                _start_ray(cfg)
                started = True
            else:
                attach_ray(address)
                joined = True
        try:
            coordinator, running = _coordinator(cfg)
        except StoreOwned as exc:
            if not started or not exc.owner.get("address"):
                raise
            # Another process claimed the store while this one started its Ray (an S3
            # store, or a turn given up on): this Ray holds nothing yet, so it goes.
            log.info(
                "the store was claimed meanwhile by %s: attaching to it",
                owner.Claim(**exc.owner).describe(),
            )
            ray.shutdown()
            started = False
            attach_ray(exc.owner["address"])
            joined = True
            coordinator, running = _coordinator(cfg)
    check_store(running.storage)  # (the cluster may have grown since it started)
    if running.storage != cfg.storage:
        # a warning only when the caller chose a config: the default just attaches
        (log.warning if config is not None else log.info)(
            "the coordinator runs with storage %s; using it instead of %s",
            running.storage,
            cfg.storage,
        )
    return Attached(coordinator, running, cfg.client, started, joined)


def _start_ray(cfg: Config) -> None:
    """Start a local Ray for this process (stopped by :meth:`Cluster.shutdown`)."""
    ray.init(
        address="local",  # a stale note of a stopped Ray must not be followed
        namespace=NAMESPACE,
        include_dashboard=False,
        logging_level=logging.WARNING,
        configure_logging=False,
        _system_config=ray_system_config(cfg),
    )


def attach_ray(address: str, *, log_to_driver: bool = True) -> None:
    """Attach this process to the running Ray cluster at ``address`` (or ``"auto"``):
    Unavailable, in one line, when nothing there lets it in. ``log_to_driver=False``
    leaves the actors' log lines out of this process's output (the ``raydelay``
    command's)."""
    if not_listening(address) is not None:  # Ray itself would retry for minutes first
        raise Unavailable(f"address: no Ray cluster is running at {address!r} (nothing listens)")
    try:
        ray.init(
            address=address,
            namespace=NAMESPACE,
            logging_level=logging.WARNING,
            log_to_driver=log_to_driver,
        )
    except Exception as exc:  # noqa: BLE001 - Ray raises several kinds here
        if address == "auto":
            raise
        raise Unavailable(_unreachable(address, exc)) from None


def _coordinator(cfg: Config) -> tuple[FoundCoordinator, Config]:
    """The coordinator of the Ray this process is in (created if there is none) and the
    config it runs with. StoreOwned if a coordinator created here is refused the store."""
    found = find_coordinator()
    on_failure = None
    if found is None:
        check_store(cfg.storage)  # a local store on several nodes: refused, nothing created
        _refuse_if_owned(cfg)  # before a coordinator of this Ray claims the store
        found = FoundCoordinator(
            COORDINATOR, spawn_coordinator(config_to_dict(cfg), spawn_host, adopt_on_host)
        )
        # a coordinator refused the store dies in its constructor: the store says why
        on_failure = functools.partial(_refuse_if_owned, cfg)
    running = config_from_dict(
        rpc.call(
            found.handle.config.remote,
            what="coordinator",
            deadline_s=cfg.client.retry_deadline_s,
            on_failure=on_failure,
        )
    )
    return found, running


def _take_start_turn(cfg: Config, turn: contextlib.ExitStack) -> str | None:
    """Wait until no other process is starting a cluster on ``cfg``'s store; then the
    address of the cluster that one started (as soon as it has claimed the store), or
    None with the turn held in ``turn`` (released when ``connect`` returns: by then this
    process's coordinator has claimed the store). See ``raydelay.cluster.owner``."""
    store, _ = _store_claim(cfg)
    start = owner.StartTurn(store)
    give_up = time.monotonic() + START_TURN_WAIT_S
    waited = False
    while True:
        if start.try_take():
            turn.callback(start.release)
            found = _owner_address(cfg)  # the holder before this one may have claimed it
            if found is not None:
                start.release()
            return found
        found = _owner_address(cfg)
        if found is not None:
            return found
        if time.monotonic() > give_up:
            log.warning(
                "process %s has been starting a raydelay cluster on this store for %.0f s "
                "without claiming it; starting one here",
                start.holder_pid() or "?",
                START_TURN_WAIT_S,
            )
            return None
        if not waited:
            log.info(
                "process %s is starting a cluster on this store: waiting for it",
                start.holder_pid() or "?",
            )
            waited = True
        time.sleep(START_TURN_POLL_S)


def _unreachable(address: str, exc: BaseException) -> str:
    """Why ``ray.init(address)`` failed, in one line: nothing listens there, or something
    does and refused this process (Ray 2.60's token authentication, on by default)."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if not_listening(address) is not None:
        return f"address: no Ray cluster is running at {address!r} ({first})"
    return (
        f"address: a Ray cluster answers at {address!r} but refused this process ({first}). "
        "Ray's token authentication is on by default: give this process that cluster's "
        "token (the same ~/.ray/auth_token, or RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH), or run "
        "both with RAY_AUTH_MODE=disabled"
    )


def not_listening(address: str, timeout_s: float = 2.0) -> str | None:
    """Why nothing can be attached at ``address`` (``host:port``) now: no connection is
    accepted there within ``timeout_s``. None when something listens, or for an address of
    another form (``"auto"``, ``ray://...``: Ray makes sense of those)."""
    host, _, port = address.rpartition(":")
    if not port.isdigit() or "://" in address:
        return None
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout_s):
            return None
    except OSError as exc:
        return f"no Ray cluster answers at {address} ({exc.strerror or exc})"


def _store_claim(cfg: Config) -> tuple[Any, owner.Claim | None]:
    """``cfg``'s store and its owner's claim, read from here: a store that cannot work
    (no such bucket, access denied, no credentials) fails now, in one line naming the
    config keys, rather than in actors that keep restarting."""
    try:
        store = make_store(cfg)
        return store, owner.current_claim(store)
    except StorageError as exc:
        if exc.retriable:
            raise
        st = cfg.storage
        where = (
            f"storage.local.root = {st.local.root!r}"
            if st.kind == "local"
            else f"storage.s3.bucket = {st.s3.bucket!r}, storage.s3.endpoint_url = "
            f"{st.s3.endpoint_url!r}"
            if st.kind == "s3"
            else f"storage.kind = {st.kind!r}"
        )
        raise StorageError(f"storage ({where}): {exc}", retriable=False) from None


def _owner_address(cfg: Config) -> str | None:
    """The Ray address of the live cluster that owns ``cfg``'s store, or None."""
    store, claim = _store_claim(cfg)
    if claim is None or not owner.claim_is_live(store, claim):
        return None
    log.info("the store is owned by %s: attaching to it", claim.describe())
    return claim.address


def _refuse_if_owned(cfg: Config) -> None:
    """StoreOwned if a live cluster other than this Ray's owns ``cfg``'s store."""
    store, claim = _store_claim(cfg)
    mine = ray.get_runtime_context().gcs_address
    if claim is not None and claim.address != mine and owner.claim_is_live(store, claim):
        raise StoreOwned(
            f"storage: the store is owned by {claim.describe()}, not by the Ray cluster at "
            f"{mine}; connect(address={claim.address!r}) attaches to it",
            dataclasses.asdict(claim),
        )


def resolve_config(config: Any) -> Config:
    """The Config that ``connect(config)`` uses: loaded from a path (or the embedded
    default for None, with ``RAYDELAY_*`` overrides), taken as is, or built from a dict;
    a local store's root made absolute (the actors run in other directories)."""
    if config is None or isinstance(config, (str, os.PathLike)):
        cfg = load_config(config)
    elif isinstance(config, Config):
        cfg = config
    elif isinstance(config, dict):
        cfg = config_from_dict(config)
    else:
        raise InvalidArgument(
            f"config: expected a path, a Config or a dict, got {type(config).__name__}"
        )
    if cfg.storage.kind == "local":  # actors run elsewhere: pin the root
        root = str(Path(cfg.storage.local.root).expanduser().resolve())
        local = cfg.storage.local.model_copy(update={"root": root})
        cfg = cfg.model_copy(update={"storage": cfg.storage.model_copy(update={"local": local})})
    return cfg
