import pytest


def test_ray_init_is_forbidden_in_the_unit_tier():
    import ray

    from tests.unit.conftest import RayForbidden

    with pytest.raises(RayForbidden, match="must not start Ray"):
        ray.init()
