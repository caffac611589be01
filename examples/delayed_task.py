"""A delayed Ray task: remind a user in 3 seconds, durably; cancel another reminder.

Run it with ``python examples/delayed_task.py``. It starts the embedded raydelay (a local
Ray and a local-dir store under ./.raydelay), or attaches to $RAYDELAY_ADDRESS. The call
is stored in the store until it is due: a crash or a restart of the cluster meanwhile
does not lose it, and the first client that connects afterwards starts its runners again.
"""

import json
import tempfile
import time
from pathlib import Path

import raydelay
from raydelay.tasks import current_task


def send_reminder(outbox: str, user: str, text: str) -> None:
    """The task: here it writes the reminder to a file (a mail service in real life),
    keyed by the call's idempotency key, so that a second run of it changes nothing."""
    key = current_task().idempotency_key
    sent = Path(outbox) / f"{key.replace('/', '_')}.json"
    if not sent.exists():  # at least once: a run cut short by a crash runs again
        sent.write_text(json.dumps({"user": user, "text": text}))


outbox = tempfile.mkdtemp(prefix="raydelay-outbox-")
with raydelay.connect() as cluster:
    # pickle_code=True: this function lives in a script, which the runners cannot import;
    # a function of an installed package travels by its import path instead
    ada = cluster.schedule(
        send_reminder, outbox, "ada", "your trial ends tomorrow", deliver_after=3, pickle_code=True
    )
    bob = cluster.schedule(
        send_reminder, outbox, "bob", "your trial ends tomorrow", deliver_after=3, pickle_code=True
    )
    print(f"scheduled {ada} and {bob}, due in 3 s")
    print(f"bob upgraded: cancelled = {cluster.cancel_task(bob)}")

    deadline = time.time() + 60
    while not list(Path(outbox).iterdir()) and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # (bob's was due at the same time: give it a chance to show up wrongly)
    sent = [json.loads(p.read_text()) for p in Path(outbox).iterdir()]
    print(f"sent: {sent}")
    assert [m["user"] for m in sent] == ["ada"], sent
    stats = cluster.task_stats()
    print(f"tasks: {stats['succeeded']} succeeded, {stats['scheduled']} still scheduled")
