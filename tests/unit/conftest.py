"""tests/unit never starts Ray: ray.init is replaced by a function that fails loudly."""

from __future__ import annotations

import pytest


class RayForbidden(RuntimeError):
    pass


@pytest.fixture(autouse=True)
def _forbid_ray_init():
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is a runtime dependency
        yield
        return
    original = ray.init

    def forbidden(*args, **kwargs):
        raise RayForbidden("tests/unit must not start Ray; move the test to tests/integration")

    ray.init = forbidden
    try:
        yield
    finally:
        ray.init = original
