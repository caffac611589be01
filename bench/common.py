"""What the Ray benchmarks share: one way to start the local Ray they measure on, and the
CPU seconds each of its processes spent."""

from __future__ import annotations

import time

import psutil
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


def ray_processes() -> dict[int, str]:
    """pid -> a role for the driver and every process of the local Ray (workers name
    themselves ``ray::<ActorClass>`` in their command line)."""
    me = psutil.Process().pid
    roles: dict[int, str] = {me: "driver (producer + consumer)"}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if proc.info["pid"] == me:
            continue
        if cmd.startswith("ray::"):
            roles[proc.info["pid"]] = cmd.split()[0][5:].split(".")[0]
        elif "gcs_server" in cmd:
            roles[proc.info["pid"]] = "ray gcs"
        elif "raylet" in cmd:
            roles[proc.info["pid"]] = "ray raylet"
    return roles


def cpu_times(roles: dict[int, str]) -> dict[str, float]:
    """CPU seconds (user + system) so far, summed per role."""
    out: dict[str, float] = {}
    for pid, role in roles.items():
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        out[role] = out.get(role, 0.0) + t.user + t.system
    return out


def ask(call, timeout_s: float = 120.0):
    """ray.get that waits out an actor restart."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(call(), timeout=30)
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.RayActorError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
