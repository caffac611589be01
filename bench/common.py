"""What the Ray benchmarks share: one way to start the local Ray they measure on."""

from __future__ import annotations

import ray

from raydelay.client.cluster import RAY_SYSTEM_CONFIG


def start_local_ray() -> None:
    """A local Ray on the machine's 2 cores, quiet, with raydelay's system config."""
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level="ERROR",
        configure_logging=False,
        log_to_driver=False,
        _system_config=RAY_SYSTEM_CONFIG,
    )
