"""The local Ray that raydelay starts and stops itself: ``raydelay up`` / ``raydelay down``,
and the ``_system_config`` of any Ray that raydelay starts (``connect()`` too).

``up`` runs ``ray start --head`` and writes a marker file (address and session) so that
later commands attach to that Ray and ``down`` stops exactly it, leaving any other Ray of
the same user alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from raydelay.config import Config
from raydelay.errors import InvalidArgument, Unavailable

# - Batches of a few hundred KB travel inline with the call instead of through the
#   shared-memory object store (cheaper at these sizes).
# - A call in flight to an actor whose process died fails after 100 ms without news of
#   the death, not Ray's 1 s: the caller (a consumer, a producer, a subscription reading
#   its host) then asks the restarted actor at once. That wait was most of the time from a
#   subscription actor's kill to its next delivery (its constructor takes 0.07 s).
# - A worker process whose node's raylet died exits within 100 ms, not Ray's 1 s: until it
#   does, calls in flight to its actors neither fail nor get answered, so a SIGKILLed
#   node's partitions waited that long before anyone looked for a new host.
RAY_SYSTEM_CONFIG = {
    "max_direct_call_object_size": 1024 * 1024,
    "timeout_ms_task_wait_for_death_info": 100,
    "raylet_death_check_interval_milliseconds": 100,
}

UP_MARKER = Path(tempfile.gettempdir()) / f"raydelay-up-{os.getuid()}.json"


def ray_system_config(cfg: Config) -> dict[str, Any]:
    """Ray's ``_system_config`` for a Ray that raydelay starts: the above, and the health
    checks of ``cfg.ray`` (how soon a lost node is noticed)."""
    return {**RAY_SYSTEM_CONFIG, **cfg.ray.system_config()}


def up_address() -> str | None:
    """The address of the Ray that ``raydelay up`` started, if its marker is there."""
    try:
        return json.loads(UP_MARKER.read_text()).get("address")
    except (OSError, ValueError):
        return None


def ray_binary() -> str:
    local = Path(sys.executable).parent / "ray"
    found = str(local) if local.exists() else shutil.which("ray")
    if found is None:
        raise Unavailable("ray: the `ray` command is not installed next to this Python")
    return found


def local_ray_running() -> bool:
    result = subprocess.run(
        [ray_binary(), "status"], capture_output=True, text=True, timeout=60, check=False
    )
    return result.returncode == 0


def start_head(
    cfg: Config,
    *,
    num_cpus: int | None = None,
    port: int | None = None,
    temp_dir: str | None = None,
) -> str | None:
    """``ray start --head`` with raydelay's system config; writes the marker and returns
    the new Ray's address (None if Ray did not print one)."""
    if num_cpus is not None and (isinstance(num_cpus, bool) or num_cpus < 1):
        raise InvalidArgument(f"num_cpus: expected >= 1, got {num_cpus}")
    if port is not None and not 1 <= port <= 65535:
        raise InvalidArgument(f"port: expected 1..65535, got {port}")
    cmd = [
        ray_binary(),
        "start",
        "--head",
        "--disable-usage-stats",
        "--include-dashboard=false",
        f"--system-config={json.dumps(ray_system_config(cfg))}",
    ]
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    if port is not None:
        cmd.append(f"--port={port}")
    root = os.path.abspath(temp_dir) if temp_dir else default_ray_root()
    if temp_dir:
        cmd.append(f"--temp-dir={root}")
    began_s = time.time()
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        last = (result.stderr or result.stdout).strip().splitlines()[-1:]
        # a start that failed half-way (its raylet died) leaves the GCS and its helpers
        # running on the port, where nothing can stop them (no marker): stop them now
        stopped = _stop_session(_session_started_since(root, began_s))
        left = f"; the {stopped} processes it had started are stopped" if stopped else ""
        raise Unavailable(f"ray start failed: {' '.join(last)}{left}")
    found = re.search(r"--address='([^']+)'", result.stdout + result.stderr)
    address = found.group(1) if found else None
    session = os.path.basename(os.path.realpath(os.path.join(root, "session_latest")))
    UP_MARKER.write_text(
        json.dumps({"started_at": time.time(), "address": address, "session": session})
    )
    return address


def _session_started_since(root: str, since_s: float) -> str:
    """The session under ``root`` that began after ``since_s`` (epoch s): the one a
    ``ray start`` made, "" when there is none (an older session is never named)."""
    latest = os.path.join(root, "session_latest")
    try:
        path = os.path.realpath(latest)
        return os.path.basename(path) if os.stat(path).st_mtime >= since_s - 1 else ""
    except OSError:
        return ""


def default_ray_root() -> str:
    """Where ``ray start`` keeps its sessions without ``--temp-dir``: under ``RAY_TMPDIR``,
    else ``TMPDIR`` (Linux), else /tmp, as Ray decides it; the session ``up`` started is
    read from there, so that ``down`` never names another Ray's session."""
    base = os.environ.get("RAY_TMPDIR")
    if not base and sys.platform.startswith("linux"):
        base = os.environ.get("TMPDIR")
    return os.path.join(base or "/tmp", "ray")


def stop_started_ray() -> int | None:
    """Stop the Ray that ``raydelay up`` started (its marker's session) and remove the
    marker; the number of processes stopped, or None when there was no marker. Ray's own
    note of the last ``ray start`` goes too when it names that Ray: a later ``ray.init()``
    would otherwise try to attach to the stopped one."""
    if not UP_MARKER.exists():
        return None
    marker = json.loads(UP_MARKER.read_text() or "{}")
    address = marker.get("address")
    stopped = _stop_session(marker.get("session", ""), address)
    UP_MARKER.unlink(missing_ok=True)
    note = ray_address_file()
    if address and note is not None and note.exists() and note.read_text().strip() == address:
        note.unlink(missing_ok=True)
    return stopped


def ray_address_file() -> Path | None:
    """Where Ray notes the address of the last ``ray start`` on this machine (None if
    this Ray does not say)."""
    try:
        from ray._private.utils import get_ray_address_file

        return Path(get_ray_address_file(None))
    except Exception:  # noqa: BLE001 - a private API of Ray: absent in another release
        return None


def running_ray_address(
    noted: str | None = None, live: set[str] | None = None, env: str | None = None
) -> str | None:
    """The Ray a plain ``ray.init()`` would attach to, if it is alive: ``RAY_ADDRESS``, or
    the last ``ray start`` noted on this machine while a GCS with that address runs. None
    when there is none, or the note is stale (that Ray was stopped without ``ray stop``):
    then a new local Ray must be started explicitly. The arguments stand in for the
    environment, the note and the live GCS addresses (tests)."""
    env = os.environ.get("RAY_ADDRESS") if env is None else env
    if env:
        return env
    if noted is None:
        note = ray_address_file()
        if note is None or not note.exists():
            return None
        noted = note.read_text().strip()
    if not noted:
        return None
    if live is None:
        try:
            from ray._private.services import find_gcs_addresses

            live = set(find_gcs_addresses())
        except Exception:  # noqa: BLE001 - a private API of Ray: assume nothing runs
            return None
    return noted if noted in live else None


def attach_target(address: str | None = None) -> tuple[str | None, bool]:
    """Where a command or the console attaches: ``address`` (``--address``), else
    ``RAYDELAY_ADDRESS``, else the Ray that ``raydelay up`` started, else ``RAY_ADDRESS`` or
    the last ``ray start`` on this machine while it runs (never a Ray merely found running);
    None when none of these names one. The flag: the address came from that last
    ``ray start`` alone, which the user did not name (a command says which Ray it joined)."""
    named = address or os.environ.get("RAYDELAY_ADDRESS") or up_address()
    if named:
        return named, False
    found = running_ray_address()
    return found, found is not None and not os.environ.get("RAY_ADDRESS")


def _stop_session(session: str, address: str | None = None) -> int:
    """Stop the Ray cluster of one session (``session_<date>_<pid>``): its head processes
    carry the session's directory on their command lines, and its workers end with its
    raylet. Its Ray Client server (``python -m ray.util.client.server``) does not: it is
    known by ``address``, the GCS address it serves (else it outlives every ``down``). A
    bare ``ray stop`` would stop every Ray of this user on the machine."""
    import psutil

    if not session.startswith("session_"):
        return 0
    procs = []
    for proc in psutil.process_iter(["cmdline", "uids"]):
        try:
            if proc.info["uids"] and proc.info["uids"].real != os.getuid():
                continue
            cmdline = proc.info["cmdline"] or ()
            if any(session in part for part in cmdline) or _is_client_server_of(cmdline, address):
                procs.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    # and their children: the raylet's agents retitle themselves (ray::DashboardAgent) and
    # were seen outliving it, orphaned
    seen = {p.pid for p in procs}
    for proc in list(procs):
        try:
            for child in proc.children(recursive=True):
                if child.pid not in seen:
                    seen.add(child.pid)
                    procs.append(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=10)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    return len(procs)


def _is_client_server_of(cmdline: Any, address: str | None) -> bool:
    """Whether ``cmdline`` is the Ray Client server of the GCS at ``address``."""
    return (
        bool(address)
        and "ray.util.client.server" in cmdline
        and (f"--address={address}" in cmdline)
    )
