"""Bulk loading from Spark: ``ingest_dataframe`` and the Spark helpers (see README).

The names are loaded on first use, so that ``raydelay.ingest.rows`` (pure: no Ray, no
Spark) can be imported alone."""

from typing import Any

_NAMES = {
    "IngestReport": "raydelay.ingest.job",
    "ingest_dataframe": "raydelay.ingest.job",
    "RowSpec": "raydelay.ingest.rows",
    "read_input": "raydelay.ingest.spark",
    "start_spark": "raydelay.ingest.spark",
    "stop_spark": "raydelay.ingest.spark",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        import importlib

        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'raydelay.ingest' has no attribute {name!r}")
