"""The HTTP API on Ray Serve: the deployment, its replicas' clients, and starting it.

Every Ray call of the HTTP API is made here or in the client the replica holds. A replica
(``HttpReplica``) is an actor of the cluster: it connects a raydelay client in its own
process (``raydelay.connect(config)``, as a Ray worker: it attaches to the Ray it runs in),
reads the token records from the cluster's store, and serves :func:`raydelay.http.api.create_api`
through ``serve.ingress``. Serve's proxy on each node takes the HTTP requests and hands them
to a replica; ``http.replicas`` sets how many.

``raydelay serve`` calls :func:`start`; a Serve config (KubeRay's RayService) names
:func:`app_builder` as its ``import_path`` (docs/http.md).
"""

from __future__ import annotations

import logging
from typing import Any

from raydelay._extras import require
from raydelay.config import Config, HttpConfig, config_from_dict, config_to_dict
from raydelay.errors import InvalidArgument

require("http")

import ray  # noqa: E402
from ray import serve  # noqa: E402

from raydelay.http.api import ApiContext, ApiSettings, create_api  # noqa: E402
from raydelay.http.tokens import TokenCache, TokenStore  # noqa: E402
from raydelay.storage import make_store  # noqa: E402

log = logging.getLogger(__name__)

APP_NAME = "raydelay-http"  # the Serve application
DEPLOYMENT_NAME = "raydelay-http"

_context: ApiContext | None = None  # this replica's (set by HttpReplica.__init__)


def _replica_context() -> ApiContext:
    if _context is None:  # (a request before __init__ finished: Serve does not route one)
        raise RuntimeError("the HTTP API replica is not initialized")
    return _context


def replica_context(config: Config) -> ApiContext:
    """What one replica serves from: a client of the cluster of ``config``, the tokens of
    its store, and the ``http`` limits."""
    from raydelay.client.connection import connect

    cluster = connect(config)
    http = config.http  # (the cluster's config is the running cluster's, without these)
    tokens = TokenCache(TokenStore(make_store(cluster.config)), http.token_refresh_s)
    settings = ApiSettings(
        max_body_bytes=http.max_body_bytes, max_batch_messages=http.max_batch_messages
    )
    return ApiContext(cluster, tokens, settings)


API = create_api(_replica_context)


@serve.ingress(API)
class HttpReplica:
    """One replica of the API: connects its client when it starts."""

    def __init__(self, config: dict) -> None:
        global _context
        _context = replica_context(config_from_dict(config))
        log.info("raydelay HTTP replica up")


def deployment(http: HttpConfig) -> Any:
    """The API's deployment with ``http``'s replicas and concurrency (each replica asks
    for no CPU: its work is waiting on the cluster's actors)."""
    return serve.deployment(
        HttpReplica,
        name=DEPLOYMENT_NAME,
        num_replicas=http.replicas,
        max_ongoing_requests=http.max_ongoing_requests,
        ray_actor_options={"num_cpus": 0},
        # a replica that dies is found and replaced within seconds (Serve's defaults: 10 s
        # between checks, 30 s to answer); requests to it wait meanwhile
        health_check_period_s=2.0,
        health_check_timeout_s=10.0,
        # (a log line per request cost a replica 1-2 ms of its 2 cores' time here)
        logging_config={"enable_access_log": False, "log_level": "WARNING"},
    )


def app_builder(args: dict) -> Any:
    """A Serve application of the API, for a Serve config's ``import_path``
    (``raydelay.http.serve:app_builder``); ``args``: ``{"config": <path of a raydelay
    TOML>}``, or none for the embedded default with ``RAYDELAY_*`` overrides."""
    from raydelay.config import load_config

    config = load_config((args or {}).get("config"))
    return deployment(config.http).bind(config_to_dict(config))


def start(config: Config, http: HttpConfig) -> str:
    """Start (or update) the API on the Ray this process is attached to, with Serve's
    proxy on ``http.host``:``http.port``; returns its URL. The replicas connect with
    ``config`` (the running cluster's) and serve with the limits of ``http``.

    InvalidArgument when Serve already runs on this cluster with its proxy elsewhere:
    a running proxy cannot move, and Serve would keep it where it is."""
    listening = proxy_address()
    if listening is not None and listening != (http.host, http.port):
        host, port = listening
        raise InvalidArgument(
            f"port: Ray Serve already runs on this cluster with its proxy on {host}:{port}; "
            f"serve the API there (--host {host} --port {port}), or stop it first "
            "(`raydelay serve --stop`, which also stops Serve when no other application "
            "of Serve runs)"
        )
    options: dict[str, Any] = {"host": http.host, "port": http.port}
    if http.ssl_certfile:
        options.update(ssl_certfile=http.ssl_certfile, ssl_keyfile=http.ssl_keyfile)
    # (Serve's controller and proxies log each deployment step at INFO: noise to a user)
    serve.start(http_options=options, logging_config={"log_level": "WARNING"})
    replicas_config = config.model_copy(update={"http": http})
    app = deployment(http).bind(config_to_dict(replicas_config))
    serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
    scheme = "https" if http.ssl_certfile else "http"
    shown = f"[{http.host}]" if ":" in http.host else http.host
    return f"{scheme}://{shown}:{http.port}"


def proxy_address() -> tuple[str, int] | None:
    """Where the proxies of the Serve that runs on this cluster listen (host, port), or
    None when Serve does not run."""
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    if client is None:
        return None
    options = client.http_config
    return options.host, options.port


def stop() -> bool:
    """Remove the API from Serve; False if it was not running. Serve itself (its
    controller and the proxies, which hold the port) stops too when no other application
    of Serve is left; else it stays for them."""
    if not ray.is_initialized() or proxy_address() is None:
        return False
    status = serve.status()
    if APP_NAME not in status.applications:
        return False
    serve.delete(APP_NAME)
    if not set(serve.status().applications) - {APP_NAME}:
        serve.shutdown()
    return True
