"""The errors of the Pulsar-compatible client, by the ``pulsar`` package's names. Argument
errors are ``ValueError`` / ``TypeError`` and unsupported features ``NotImplementedError``,
as in Pulsar; these are the rest."""

from __future__ import annotations


class PulsarException(Exception):
    """The root of the Pulsar-compatible client's own errors (argument errors are
    ``ValueError`` / ``TypeError``, as in Pulsar)."""


class Timeout(PulsarException):
    """No message arrived within the receive timeout."""


class ConnectError(PulsarException):
    pass


class AlreadyClosed(PulsarException):
    pass


class ConsumerBusy(PulsarException):
    """An exclusive subscription already has a consumer."""


class CumulativeAcknowledgementNotAllowedError(PulsarException):
    pass


class OperationNotSupported(PulsarException):
    pass


class TopicNotFound(PulsarException):
    pass
