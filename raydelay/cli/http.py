"""``raydelay serve`` (the HTTP API on Ray Serve) and ``raydelay tokens`` (its bearer
tokens): see docs/http.md."""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from raydelay.cli.attach import attach
from raydelay.cli.output import emit
from raydelay.cli.reports import utc_text
from raydelay.config import HttpConfig
from raydelay.errors import Unavailable
from raydelay.listen import LOOPBACK_NAMES

FIRST_ANSWER_WAIT_S = 120.0  # how long `serve` waits for the API's first answer


def cmd_serve(args: argparse.Namespace) -> int:
    cluster = attach(args)
    from raydelay.http import serve

    if args.stop:
        stopped = serve.stop()
        emit(args, {"stopped": stopped}, "stopped" if stopped else "the HTTP API was not running")
        return 0
    over = {
        k: v
        for k, v in (("host", args.host), ("port", args.port), ("replicas", args.replicas))
        if v is not None
    }
    http = HttpConfig(**{**_own_http(args).model_dump(), **over})
    if serve.proxy_address() is None:
        from raydelay.listen import check_listen

        check_listen(http.host, http.port)  # (here: Serve's proxy would retry for ever)
    url = serve.start(cluster.config, http)
    _wait_answering(url, http)
    emit(
        args,
        {"url": url, "replicas": http.replicas},
        f"raydelay HTTP API on {url} ({http.replicas} replica"
        f"{'s' if http.replicas != 1 else ''}); it runs in the cluster until "
        "`raydelay serve --stop`. Make a token: raydelay tokens create NAME --scope produce",
    )
    if http.host not in LOOPBACK_NAMES and not http.ssl_certfile:
        print(
            f"raydelay: the HTTP API listens on {http.host} without TLS: tokens cross the "
            "network in the clear (set http.ssl_certfile and http.ssl_keyfile)",
            file=sys.stderr,
        )
    return 0


def _own_http(args: argparse.Namespace) -> HttpConfig:
    """The ``[http]`` table of the command's own config (``--config``, RAYDELAY_CONFIG,
    ``RAYDELAY_HTTP__*``): the running cluster's config, which the client holds, has the
    coordinator's, not the caller's."""
    from raydelay.config import load_config

    return load_config(args.config).http


def _wait_answering(url: str, http: HttpConfig) -> None:
    """Until ``/v1/health`` answers through the proxy (Unavailable after the wait)."""
    host = "127.0.0.1" if http.host in ("0.0.0.0", "") else http.host
    shown = f"[{host}]" if ":" in host else host
    health = f"{url.split('://')[0]}://{shown}:{http.port}/v1/health"
    context = None
    if http.ssl_certfile:  # (our own certificate, maybe self-signed: the proxy is what is checked)
        import ssl

        context = ssl._create_unverified_context()
    deadline = time.monotonic() + FIRST_ANSWER_WAIT_S
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(health, timeout=5, context=context) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.25)
    raise Unavailable(
        f"the HTTP API did not answer at {health} within {FIRST_ANSWER_WAIT_S:.0f} s "
        f"({last}); `raydelay serve --stop` removes it"
    )


def _token_store(cluster: Any) -> Any:
    from raydelay.http.tokens import TokenStore
    from raydelay.storage import make_store

    return TokenStore(make_store(cluster.config))


def cmd_tokens(args: argparse.Namespace) -> int:
    cluster = attach(args)
    tokens = _token_store(cluster)
    if args.action == "create":
        rate = _own_http(args).default_rate_per_s if args.rate is None else args.rate
        record, token = tokens.create(args.name, args.scope or [], rate)
        doc = {**record.public(), "token": token}
        emit(
            args,
            doc,
            f"{token}\n(token {record.name!r}, id {record.token_id}, scopes "
            f"{', '.join(doc['scopes'])}; shown once: keep it now)",
        )
        return 0
    if args.action == "revoke":
        record = tokens.revoke(args.name)
        emit(
            args,
            record.public(),
            f"revoked {record.name!r} ({record.token_id}); servers stop taking it within "
            f"{_own_http(args).token_refresh_s:g} s",
        )
        return 0
    records = [r.public() for r in tokens.list()]

    def text() -> str:
        if not records:
            return "no tokens (raydelay tokens create NAME --scope ...)"
        lines = [f"{'NAME':<24} {'ID':<12}  {'SCOPES':<28} {'RATE/S':>8}  CREATED"]
        for r in records:
            rate = "-" if r["rate_per_s"] < 0 else f"{r['rate_per_s']:g}"
            lines.append(
                f"{r['name']:<24} {r['token_id']:<12}  {','.join(r['scopes']):<28} "
                f"{rate:>8}  {utc_text(r['created_ms'])}"
            )
        return "\n".join(lines)

    emit(args, {"tokens": records}, text)
    return 0
