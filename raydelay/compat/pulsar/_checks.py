"""Argument checks of the Pulsar-compatible client, worded as the ``pulsar`` package words
them (a wrong type is a ``ValueError`` naming the argument), and the error for a feature
raydelay does not have."""

from __future__ import annotations

from typing import Any


def unsupported(feature: str) -> NotImplementedError:
    return NotImplementedError(f"raydelay.compat.pulsar: {feature} is not supported")


def check_type(kind: type | tuple, value: Any, name: str) -> None:
    if isinstance(value, bool) and kind in (int, (int,)):
        raise ValueError(f"Argument {name} is expected to be of type 'int', not 'bool'")
    if not isinstance(value, kind):
        want = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ValueError(
            f"Argument {name} is expected to be of type '{want}' and not '{type(value).__name__}'"
        )


def check_type_or_none(kind: type | tuple, value: Any, name: str) -> None:
    if value is not None:
        check_type(kind, value, name)


def check_types(kind: type, *, optional: bool = False, **named: Any) -> None:
    """``check_type`` (or ``check_type_or_none``) of every keyword argument."""
    for name, value in named.items():
        if not (optional and value is None):
            check_type(kind, value, name)
