"""Chaos tests share the session's Ray; their store outage switch is the OUTAGE file."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def outage(cluster):
    """A switch for a store outage seen by every actor (the cluster's outage file)."""
    flag = Path(cluster.config.storage.faults.outage_file)

    class Switch:
        def on(self) -> None:
            flag.touch()

        def off(self) -> None:
            flag.unlink(missing_ok=True)

    switch = Switch()
    yield switch
    switch.off()
