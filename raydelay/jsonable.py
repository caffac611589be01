"""Plain JSON values of what raydelay's calls return: what ``--json`` prints and what the
HTTP API answers."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from datetime import date, datetime
from typing import Any


def jsonable(value: Any) -> Any:
    """``value`` with what JSON cannot hold made plain: tuples and sets as lists, numpy
    scalars as numbers, times as ISO-8601, bytes as base64, dataclasses as dicts."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, datetime | date):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if hasattr(value, "tolist"):  # a numpy array or scalar
        return jsonable(value.tolist())
    return str(value)
