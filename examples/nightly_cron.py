"""A nightly cron job: compact a directory every day at 02:00, Paris time.

Run it with ``python examples/nightly_cron.py``. It registers the schedule (again: it
replaces the one a previous run made) and shows it; the schedule lives in the store and
runs at 02:00 whenever the cluster is up. `raydelay schedules` lists it, and
`raydelay schedules delete nightly-compaction` removes it. With ``--delete`` this script
removes it itself at the end.

If the cluster is down at 02:00, ``catch_up="latest"`` runs the missed night once, when
the cluster is back.
"""

import sys
from datetime import datetime, timezone

import raydelay


def compact(directory: str) -> int:
    """The nightly job (here: count the files it would compact)."""
    from pathlib import Path

    return sum(1 for _ in Path(directory).glob("*.log"))


with raydelay.connect() as cluster:
    schedule = cluster.schedule_cron(
        "0 2 * * *",
        compact,
        "/var/log/myapp",
        name="nightly-compaction",
        timezone="Europe/Paris",
        catch_up="latest",
        pickle_code=True,  # defined in this script; an installed function needs no pickling
        replace=True,
    )
    at = datetime.fromtimestamp(schedule["next_ms"] / 1000, tz=timezone.utc)
    print(
        f"{schedule['name']}: {schedule['cron']} ({schedule['timezone']}), next {at:%Y-%m-%d %H:%M} UTC"
    )
    for s in cluster.list_schedules():
        state = "paused" if s["paused"] else "active"
        print(f"  {s['name']:<24} {s['cron']:<12} {s['timezone']:<14} {state}  calls {s['target']}")
    if "--delete" in sys.argv:
        cluster.delete_schedule("nightly-compaction")
        print("deleted nightly-compaction")
