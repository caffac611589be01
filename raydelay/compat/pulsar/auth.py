"""What a Pulsar client is given to reach a secured or failing-over service: authentication
plugins, encryption keys and service info providers. raydelay runs inside your Ray cluster
and has none of them: they are accepted as values, and refused (``NotImplementedError``)
where they are used."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raydelay.compat.pulsar._checks import unsupported


class Authentication:
    """An authentication plugin. raydelay runs inside your Ray cluster and has none: a
    Client given one raises ``NotImplementedError``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs


class AuthenticationTLS(Authentication): ...


class AuthenticationToken(Authentication): ...


class AuthenticationBasic(Authentication): ...


class AuthenticationAthenz(Authentication): ...


class AuthenticationOauth2(Authentication): ...


class CryptoKeyReader:
    def __init__(self, public_key_path: str, private_key_path: str) -> None:
        raise unsupported("end-to-end encryption (CryptoKeyReader)")


class ServiceInfoProvider:
    """A source of service URLs (Pulsar's cluster failover). raydelay's "cluster" is the
    Ray it runs in: a Client given one raises ``NotImplementedError``."""

    def initial_service_info(self) -> Any:
        raise NotImplementedError

    def initialize(self, on_service_info_update: Callable[[Any], None]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class ServiceInfo:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise unsupported("service info providers (cluster failover)")


class AutoClusterFailover:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise unsupported("automatic cluster failover")
