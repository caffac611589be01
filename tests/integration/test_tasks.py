"""Scheduled Ray calls on the session's cluster: a call runs once when due, a cancelled one
never, a failing one is retried with backoff and dead-lettered, a runner SIGKILLed in the
middle of a call runs it again with the same idempotency key, a cron schedule fires every
occurrence across a runner kill and obeys pause, resume and delete, and bad input stores
nothing.

The functions live in tests/integration/task_jobs.py (the runners' workers import them)
and leave a line in a file per run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid

import pytest
import ray

from raydelay.client.message import MessageId
from raydelay.client.runner import RUNNERS_SUBSCRIPTION, runner_name
from raydelay.errors import InvalidArgument, NotFound
from raydelay.tasks import TaskId
from raydelay.tasks.spec import decode_payload
from tests.integration import task_jobs
from tests.integration.helpers import now_ms, wait_until

_lines = task_jobs.lines


@pytest.fixture(scope="module", autouse=True)
def tasks_ready(ray_cluster):
    """The tasks topic, its runners' subscription and the runners, made before the tests
    (the per-test ``cluster`` fixture stops the actors a test made): fresh runners,
    whatever earlier modules did to the session's."""
    ray_cluster.stop_runners()  # (the next call starts them again)
    ray_cluster.schedule(task_jobs.record, os.devnull, "warm-up", deliver_after=0)
    wait_until("the runners took a call", lambda: ray_cluster.task_stats()["succeeded"] >= 1)
    yield


@pytest.fixture
def out(tmp_path):
    return str(tmp_path / f"out-{uuid.uuid4().hex[:6]}.txt")


def _topic(cluster) -> str:
    return cluster.config.tasks.topic


def _tail(cluster) -> list:
    return [p["tail"] for p in cluster.stats(_topic(cluster))["partitions"]]


def test_a_scheduled_call_runs_once_when_due(cluster, out):
    due = now_ms() + 1500
    tid = cluster.schedule(task_jobs.record, out, "hello", deliver_at=due)
    assert isinstance(tid, TaskId) and MessageId.parse(tid).topic == _topic(cluster)
    before = cluster.task_stats()["succeeded"]
    wait_until("the call ran", lambda: _lines(out))
    (label, key, ran_at, attempt), *more = _lines(out)
    assert (label, attempt, more) == ("hello", "0", [])
    assert int(ran_at) >= due  # never early
    assert key == f"{tid}@{due}"  # task id and occurrence
    # it is acknowledged: nothing of it waits any more, and it counts as succeeded
    wait_until("counted", lambda: cluster.task_stats()["succeeded"] >= before + 1)
    assert tid not in [
        str(m.message_id) for m in cluster.peek(_topic(cluster), RUNNERS_SUBSCRIPTION, limit=-1)
    ]
    assert len(_lines(out)) == 1
    # a @ray.remote function, and one of a named actor's methods
    cluster.schedule(task_jobs.record_remote, out, "remote", deliver_after=0.2)
    name = f"ledger-{uuid.uuid4().hex[:6]}"
    ledger = task_jobs.Ledger.options(name=name, namespace="raydelay-tests").remote()
    cluster.schedule_call(name, "add", "via-actor", namespace="raydelay-tests", deliver_after=0.2)
    wait_until("the remote function ran", lambda: any(r[0] == "remote" for r in _lines(out)))
    wait_until("the actor was called", lambda: ray.get(ledger.get.remote()) == ["via-actor"])
    ray.kill(ledger)


def test_the_context_can_be_passed_as_an_argument(cluster, out):
    tid = cluster.schedule(task_jobs.with_context, out, pass_context=True, deliver_after=0.1)
    wait_until("the call ran", lambda: _lines(out))
    assert _lines(out)[0][0] == "ctx" and _lines(out)[0][1].startswith(f"{tid}@")


def test_a_cancelled_call_never_runs(cluster, tmp_path):
    keep, drop = str(tmp_path / "keep"), str(tmp_path / "drop")
    due = now_ms() + 2000
    # the one that runs is due after the cancelled one: once it ran, the other's time passed
    cancelled = cluster.schedule(task_jobs.record, drop, "dropped", deliver_at=due)
    cluster.schedule(task_jobs.record, keep, "kept", deliver_at=due + 200)
    assert cluster.cancel_task(cancelled) is True
    assert cluster.cancel_task(str(cancelled)) is False  # once only
    wait_until("the other call ran", lambda: _lines(keep))
    assert not os.path.exists(drop)
    # many at once, from what schedule_many returned
    ids = cluster.schedule_many(
        task_jobs.record, [(drop, f"m{i}") for i in range(50)], deliver_after=3
    )
    assert cluster.cancel_tasks(ids) == [True] * 50
    sentinel = cluster.schedule(task_jobs.record, keep, "after-many", deliver_after=3.3)
    wait_until("the sentinel ran", lambda: len(_lines(keep)) == 2)
    assert not os.path.exists(drop)
    with pytest.raises(InvalidArgument, match="task_id: .* is not a task"):
        cluster.cancel_task(MessageId("elsewhere", 0, 1, 2))
    assert isinstance(sentinel, TaskId)


def test_a_failing_call_is_retried_with_backoff_then_dead_lettered(cluster, out):
    dlq = f"{_topic(cluster)}-DLQ"
    before = cluster.task_stats()
    reader_start = cluster.create_reader(dlq, "latest").get_last_message_id()
    tid = cluster.schedule(
        task_jobs.fail, out, "no luck today", max_retries=2, backoff=(0.4, 10), deliver_after=0.1
    )
    wait_until("three tries", lambda: len(_lines(out)) == 3, timeout_s=60)
    tries = _lines(out)
    assert [t[2] for t in tries] == ["0", "1", "2"]  # the attempt each run saw
    times = [int(t[1]) for t in tries]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert gaps[0] >= 400 and gaps[1] >= 800  # backoff doubles: 0.4 s, then 0.8 s

    def dead() -> list:
        reader = cluster.create_reader(dlq, reader_start or "earliest")
        try:
            return [m for m in reader.read_batch(100, timeout_s=1)]
        finally:
            reader.close()

    found = wait_until(
        "dead-lettered",
        lambda: [m for m in dead() if m.properties.get("raydelay.task.id") == str(tid)],
    )
    props = found[0].properties
    assert "RuntimeError: no luck today" in props["raydelay.task.error"]
    assert props["raydelay.task.attempts"] == "3"
    assert props["raydelay.task"] == "tests.integration.task_jobs:fail"
    after = wait_until(
        "counted dead", lambda: (s := cluster.task_stats())["dead"] > before["dead"] and s
    )
    assert after["dead"] == before["dead"] + 1 and after["retried"] == before["retried"] + 2
    assert len(_lines(out)) == 3  # no fourth try


def test_a_runner_killed_mid_call_runs_it_again_with_its_key(cluster, out):
    tid = cluster.schedule(task_jobs.slow, out, 3.0, deliver_after=0.1)
    wait_until("started", lambda: _lines(out))
    pid = ray.get(ray.get_actor(runner_name(0), namespace="raydelay").pid.remote())
    os.kill(pid, signal.SIGKILL)
    # Ray restarts the runner; the call comes back when the dead consumer's lease lapses
    wait_until("ran again", lambda: sum(r[0] == "start" for r in _lines(out)) >= 2, timeout_s=90)
    wait_until("finished", lambda: any(r[0] == "end" for r in _lines(out)), timeout_s=60)
    keys = {r[1] for r in _lines(out)}  # every run, interrupted or not, saw one key
    assert len(keys) == 1 and next(iter(keys)).startswith(f"{tid}@")


def test_cron_fires_every_occurrence_across_a_runner_kill(cluster, out):
    name = f"every-second-{uuid.uuid4().hex[:6]}"
    info = cluster.schedule_cron(
        "* * * * * *", task_jobs.record, out, "tick", name=name, catch_up="all"
    )
    assert info["name"] == name and info["next_ms"] % 1000 == 0
    assert [s["name"] for s in cluster.list_schedules() if s["name"] == name] == [name]
    wait_until("three ticks", lambda: len(_lines(out)) >= 3, timeout_s=30)
    pid = ray.get(ray.get_actor(runner_name(0), namespace="raydelay").pid.remote())
    os.kill(pid, signal.SIGKILL)
    seen = len(_lines(out))
    wait_until("ticks after the kill", lambda: len(_lines(out)) >= seen + 5, timeout_s=90)
    cluster.pause_schedule(name)
    paused_at = now_ms()
    skipped = cluster.task_stats()["skipped"]
    wait_until(
        "occurrences passed over while paused",
        lambda: cluster.task_stats()["skipped"] >= skipped + 2,
        timeout_s=30,
    )
    occurrences = [int(r[1].rsplit("@", 1)[1]) for r in _lines(out)]
    # every second from the first to the last: none skipped. An occurrence whose call the
    # kill interrupted runs again with its key (at least once), so it may show twice; no
    # other doubles
    distinct = sorted(set(occurrences))
    assert distinct == list(range(distinct[0], distinct[-1] + 1000, 1000))
    assert all(occurrences.count(o) <= 2 for o in distinct)
    assert len(occurrences) - len(distinct) <= 2, occurrences
    assert all(o <= paused_at + 1000 for o in distinct)
    cluster.resume_schedule(name)
    n = len(_lines(out))
    wait_until("ticks again", lambda: len(_lines(out)) >= n + 2, timeout_s=30)
    cluster.delete_schedule(name)
    assert name not in [s["name"] for s in cluster.list_schedules()]
    # the chain ends: its last armed occurrence is consumed, and nothing of it waits
    wait_until(
        "the chain ended",
        lambda: not cluster.peek(_topic(cluster), RUNNERS_SUBSCRIPTION, limit=-1, key=name),
        timeout_s=30,
    )
    last = len(_lines(out))
    other = cluster.schedule(task_jobs.record, out + ".sentinel", "s", deliver_after=1.5)
    wait_until("a later call ran", lambda: _lines(out + ".sentinel"))
    assert len(_lines(out)) <= last + 1 and isinstance(other, TaskId)
    with pytest.raises(NotFound, match="schedule: no schedule called"):
        cluster.pause_schedule(name)


def test_bad_input_stores_nothing(cluster, out):
    cluster.schedule(task_jobs.noop, deliver_after=0)  # (the topic and runners exist)
    tails = _tail(cluster)
    schedules = cluster.list_schedules()

    def local():
        return 1

    cases = [
        (
            lambda: cluster.schedule(local),
            r"^fn: .*local.* cannot be imported by the runner \(it is a closure",
        ),
        (lambda: cluster.schedule(lambda: 1), r"^fn: .* cannot be imported by the runner"),
        (lambda: cluster.schedule("os:getcwd"), r"^fn: expected a function, got str"),
        # (a generator: no pickler takes one; a lock is taken once ray.serve is imported,
        # which registers a reducer for it)
        (lambda: cluster.schedule(task_jobs.record, (x for x in [1])), r"^args: cannot be pickled"),
        (
            lambda: cluster.schedule(task_jobs.noop, options={"max_retries": 5}),
            r"^options: 'max_retries' is not an option",
        ),
        (
            lambda: cluster.schedule(task_jobs.noop, options={"num_cpus": -1}),
            r"^options.num_cpus: expected 0 or more",
        ),
        (
            lambda: cluster.schedule(task_jobs.noop, options={"num_cpus": "2"}),
            r"^options.num_cpus: expected int",
        ),
        (
            lambda: cluster.schedule(task_jobs.noop, max_retries=-2),
            r"^max_retries: expected 0 or more",
        ),
        (
            lambda: cluster.schedule(task_jobs.noop, max_retries=1.5),
            r"^max_retries: expected an int",
        ),
        (lambda: cluster.schedule(task_jobs.noop, backoff=-1), r"^backoff: expected 0 to 365 days"),
        (lambda: cluster.schedule(task_jobs.noop, backoff=(5, 1)), r"^backoff: the longest wait"),
        (lambda: cluster.schedule(task_jobs.noop, deliver_after="soon"), r"^deliver_after"),
        (lambda: cluster.schedule(task_jobs.noop, deliver_at=10**20), r"^deliver_at"),
        (lambda: cluster.schedule(task_jobs.noop, kwargs=[1]), r"^kwargs: expected a dict"),
        (lambda: cluster.schedule_many(task_jobs.noop, "abc"), r"^args_list: expected a list"),
        (lambda: cluster.schedule_many(task_jobs.noop, []), r"^args_list: empty"),
        (lambda: cluster.schedule_call("", "m"), r"^actor_name: expected the name"),
        (lambda: cluster.schedule_call("a", "not a method"), r"^method: expected a method name"),
        (
            lambda: cluster.schedule_cron("61 * * * *", task_jobs.noop, name="x"),
            r"^cron: '61 \* \* \* \*' is not a valid",
        ),
        (
            lambda: cluster.schedule_cron(
                "0 2 * * *", task_jobs.noop, name="x", timezone="Mars/Olympus"
            ),
            r"^timezone: 'Mars/Olympus' is not a known",
        ),
        (
            lambda: cluster.schedule_cron("0 2 * * *", task_jobs.noop, name="x", catch_up="some"),
            r"^catch_up: expected one of all, latest, none",
        ),
        (
            lambda: cluster.schedule_cron("0 2 * * *", task_jobs.noop, name="no spaces"),
            r"^name: expected 1-128",
        ),
        (lambda: cluster.cancel_tasks(42), r"^task_ids: expected task ids"),
    ]
    for call, message in cases:
        with pytest.raises(InvalidArgument, match=message):
            call()
    assert _tail(cluster) == tails
    assert cluster.list_schedules() == schedules
    # a name taken: refused unless replace=True
    name = f"nightly-{uuid.uuid4().hex[:6]}"
    cluster.schedule_cron("0 2 * * *", task_jobs.noop, name=name, timezone="Europe/Paris")
    with pytest.raises(InvalidArgument, match=f"name: a schedule called '{name}' exists"):
        cluster.schedule_cron("0 3 * * *", task_jobs.noop, name=name)
    replaced = cluster.schedule_cron("0 3 * * *", task_jobs.noop, name=name, replace=True)
    assert replaced["cron"] == "0 3 * * *"
    cluster.delete_schedule(name)


_RESTART = r"""
import sys, time
import raydelay
from tests.integration import task_jobs

store, out, phase = sys.argv[1], sys.argv[2], sys.argv[3]
config = {"storage": {"kind": "local", "local": {"root": store}}}
with raydelay.connect(config) as cluster:  # starts a Ray of its own, stops it at the end
    # (connect() returns once the runners it started take calls)
    up = sum(1 for h in cluster._tasks.runners() if h.key_ids.remote() is not None)
    print("connected", int(time.time() * 1000), "runners", up, flush=True)
    if phase == "first":
        cluster.schedule_cron("* * * * * *", task_jobs.record, out, "tick", name="ticks",
                              catch_up="all")
    want = int(sys.argv[4])

    def lines():
        try:
            with open(out) as f:
                return len(f.read().splitlines())
        except FileNotFoundError:
            return 0

    deadline = time.time() + 60
    while time.time() < deadline and lines() < want:
        time.sleep(0.2)
    assert lines() >= want, lines()
print("ok")
"""


def test_cron_occurrences_missed_while_the_cluster_was_down_run_after_a_restart(tmp_path):
    """The cluster stops (shutdown: Ray itself goes), stays down a few seconds, and starts
    again from the store: the occurrences due meanwhile run (catch_up="all"), none twice."""
    import subprocess
    import sys

    store, out = str(tmp_path / "store"), str(tmp_path / "ticks.txt")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    run = [sys.executable, "-c", _RESTART, store, out]
    first = subprocess.run(
        [*run, "first", "3"], capture_output=True, text=True, timeout=180, env=env
    )
    assert first.returncode == 0, first.stderr[-3000:]
    time.sleep(4)  # down: about four occurrences fall due with nothing running
    before = {int(r[1].rsplit("@", 1)[1]) for r in _lines(out)}
    restart_at = now_ms()
    second = subprocess.run(
        [*run, "again", str(len(before) + 8)], capture_output=True, text=True, timeout=180, env=env
    )
    assert second.returncode == 0, second.stderr[-3000:]
    # (caught-up occurrences run side by side, so they may finish out of order)
    occurrences = sorted(int(r[1].rsplit("@", 1)[1]) for r in _lines(out))
    assert occurrences == list(range(occurrences[0], occurrences[-1] + 1000, 1000))
    # due after the first cluster's last run and before the second one started (the first
    # one's shutdown can take seconds, so the window starts at what it ran, not at its exit)
    missed = [o for o in occurrences if o > max(before) and o <= restart_at - 1000]
    assert len(missed) >= 3  # they ran after the restart, late
    ran_at = {int(r[1].rsplit("@", 1)[1]): int(r[2]) for r in _lines(out)}
    assert all(ran_at[o] - o > 1000 for o in missed)
    # connect() returned with the runners up (the second run had none before it), and the
    # held occurrences ran from then on
    connected_ms, runners = (int(w) for w in second.stdout.split()[1:4:2])
    assert runners == 1
    first_held = min(ran_at[o] for o in missed)
    print(f"first held occurrence ran {first_held - connected_ms} ms after connect() returned")


def test_the_examples_run_as_written(cluster, tmp_path, monkeypatch, capsys):
    import runpy
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    examples = Path(__file__).resolve().parents[2] / "examples"
    runpy.run_path(str(examples / "delayed_task.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "bob upgraded: cancelled = True" in out
    assert "sent: [{'user': 'ada', 'text': 'your trial ends tomorrow'}]" in out
    monkeypatch.setattr("sys.argv", ["nightly_cron.py"])
    runpy.run_path(str(examples / "nightly_cron.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "nightly-compaction: 0 2 * * * (Europe/Paris), next " in out
    nightly = [s for s in cluster.list_schedules() if s["name"] == "nightly-compaction"]
    assert nightly and nightly[0]["target"] == "__main__:compact"
    # the next occurrence is 02:00 in Paris: 00:00 or 01:00 UTC
    assert time.gmtime(nightly[0]["next_ms"] / 1000).tm_hour in (0, 1)
    cluster.delete_schedule("nightly-compaction")


def test_the_tasks_and_schedules_commands(cluster, out, capsys):
    from tests.integration.test_cli import run

    tid = cluster.schedule(task_jobs.record, out, "later", deliver_after=3600)
    name = f"cli-{uuid.uuid4().hex[:6]}"
    cluster.schedule_cron("30 4 * * 1", task_jobs.noop, name=name, timezone="Asia/Tokyo")
    code, text, _ = run(capsys, "tasks", "-n", "500")
    assert code == 0
    assert re.search(r"scheduled \(waiting for their time or a runner\)\s+[1-9]", text)
    assert re.search(r"^runners\s+1$", text, re.M)
    assert f"{tid}" in text and "tests.integration.task_jobs:record" in text
    code, text, _ = run(capsys, "schedules")
    row = next(line for line in text.splitlines() if line.startswith(name))
    assert "30 4 * * 1" in row and "Asia/Tokyo" in row and "tests.integration.task_jobs:noop" in row
    assert run(capsys, "schedules", "pause", name)[1] == f"{name}: paused\n"
    row = next(
        line for line in run(capsys, "schedules", "list")[1].splitlines() if line.startswith(name)
    )
    assert row.rstrip().endswith("paused")
    assert run(capsys, "schedules", "resume", name)[1].startswith(f"{name}: resumed; next at ")
    assert run(capsys, "schedules", "delete", name)[1] == f"{name}: deleted\n"
    code, _, err = run(capsys, "schedules", "delete", name)
    assert code == 3 and err == f"raydelay: error: schedule: no schedule called '{name}'\n"
    code, _, err = run(capsys, "tasks", "-n", "-3")
    assert code == 2 and "next: expected 0 or more" in err
    assert cluster.cancel_task(tid)


def test_runners_can_be_started_before_the_first_call(cluster):
    """On a fresh store (a cluster of its own): start_runners creates what a runner
    consumes, and after stop_runners the next call starts them again; bad counts are
    refused."""
    import subprocess
    import sys

    script = (
        "import raydelay, sys\n"
        "with raydelay.connect({'storage': {'kind': 'local', 'local': {'root': sys.argv[1]}}}) as c:\n"
        "    print(c.start_runners(2, max_in_flight=10), c.task_stats()['runners'])\n"
        "    c.stop_runners()\n"  # (then the next call starts them again)
        "    tid = c.schedule(abs, -3, keep_result=True)\n"
        "    print(c.task_result(tid, timeout=60), c.task_stats()['runners'])\n"
    )
    import tempfile

    with tempfile.TemporaryDirectory() as store:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        done = subprocess.run(
            [sys.executable, "-c", script, store],
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-4:] == ["2", "2", "3", "1"]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidArgument, match="^count: expected a number of runners >= 1"):
            cluster.start_runners(bad)
    with pytest.raises(InvalidArgument, match="^max_in_flight: expected 1 or more"):
        cluster.start_runners(1, max_in_flight=0)


def _dead_letters(cluster, since, matching) -> list:
    reader = cluster.create_reader(f"{_topic(cluster)}-DLQ", since or "earliest")
    try:
        return [m for m in reader.read_batch(1_000, timeout_s=1) if matching(m)]
    finally:
        reader.close()


def test_a_call_not_signed_with_the_clusters_secret_never_runs(cluster, out):
    from raydelay.tasks.signing import CallSigner
    from raydelay.tasks.spec import TaskSpec, function_target, pickle_args, task_payload

    # Given calls written straight to the tasks topic, as anyone who can write there could:
    # one not signed at all, one signed with another secret, one with a changed argument
    since = cluster.create_reader(f"{_topic(cluster)}-DLQ", "latest").get_last_message_id()
    target, _ = function_target(task_jobs.record, False)
    spec = TaskSpec("fn", target)

    def payload(label: str) -> bytes:
        return task_payload(spec.encode(), pickle_args((out, label), {}))

    signed = cluster._tasks.signer().sign(payload("genuine"))
    forged = signed.replace(b"genuine", b"forged!")  # its argument changed, signature kept
    assert forged != signed
    producer = cluster.create_producer(_topic(cluster))
    sent = producer.send_many(
        [
            payload("unsigned"),
            CallSigner([b"not-the-cluster-secret"]).sign(payload("other")),
            forged,
        ],
        deliver_after=0,
        properties=spec.properties(),
    )
    ids = {str(m) for m in sent}
    # When the runners take them, each goes to the dead-letter topic with its reason
    found = wait_until(
        "the three dead-lettered",
        lambda: (
            (
                d := _dead_letters(
                    cluster, since, lambda m: m.properties.get("raydelay.task.id") in ids
                )
            )
            and len(d) == 3
            and d
        ),
        timeout_s=60,
        got=lambda: [
            (m.properties.get("raydelay.task.id"), m.properties.get("raydelay.task.error"))
            for m in _dead_letters(cluster, since, lambda m: True)
        ],
    )
    reasons = {m.properties["raydelay.task.id"]: m.properties["raydelay.task.error"] for m in found}
    ordered = [reasons[str(m)] for m in sent]
    assert "the call is not signed" in ordered[0]
    assert "matches none of this cluster's tasks secrets" in ordered[1]
    assert "matches none of this cluster's tasks secrets" in ordered[2]
    # Then none of them ran (a runner dead-letters a call instead of starting it)
    assert _lines(out) == []
    # And a call scheduled as usual still runs
    cluster.schedule(task_jobs.record, out, "scheduled", deliver_after=0)
    wait_until("the signed call ran", lambda: _lines(out))
    assert [r[0] for r in _lines(out)] == ["scheduled"]


def test_a_schedule_whose_stored_call_was_changed_stops_with_the_reason(cluster, out):
    from raydelay.storage import make_store
    from raydelay.tasks import cron
    from raydelay.tasks.spec import TaskSpec, function_target, pickle_args, task_payload

    # Given a schedule that ticks every second
    since = cluster.create_reader(f"{_topic(cluster)}-DLQ", "latest").get_last_message_id()
    name = f"tampered-{uuid.uuid4().hex[:6]}"
    cluster.schedule_cron("* * * * * *", task_jobs.record, out, "tick", name=name)
    wait_until("a tick", lambda: _lines(out), timeout_s=30)
    # When its stored call is replaced by an unsigned one of the same target
    store = make_store(cluster.config)
    record = cron.Schedule.from_bytes(store.get(cron.schedule_key(name)))
    target, _ = function_target(task_jobs.record, False)
    unsigned = TaskSpec("fn", target, schedule=name, generation=record.generation)
    record.spec = task_payload(unsigned.encode(), pickle_args((out, "injected"), {}))
    store.put(cron.schedule_key(name), record.to_bytes())
    # Then the next occurrence cannot arm from it: it is dead-lettered with the reason
    found = wait_until(
        "an occurrence dead-lettered",
        lambda: _dead_letters(
            cluster,
            since,
            lambda m: f"schedule {name!r}" in m.properties.get("raydelay.task.error", ""),
        ),
        timeout_s=30,
    )
    assert "not signed" in found[0].properties["raydelay.task.error"]
    # And the injected call never ran
    assert "injected" not in [r[0] for r in _lines(out)]
    cluster.delete_schedule(name)


def test_a_client_with_another_secret_than_the_runners_is_told_before_it_schedules(cluster, out):
    import subprocess
    import sys

    # Given runners that run with the session's tasks secret, and a second client process
    # whose RAYDELAY_TASKS_SECRET is another one
    script = (
        "import sys, raydelay\n"
        "from tests.integration import task_jobs\n"
        "c = raydelay.connect(address=sys.argv[1])\n"
        "try:\n"
        "    c.schedule(task_jobs.record, sys.argv[2], 'other-secret', deliver_after=0)\n"
        "except raydelay.InvalidArgument as exc:\n"
        "    print('REFUSED', exc)\n"
        "c.shutdown()\n"
    )
    env = {**os.environ, "RAYDELAY_TASKS_SECRET": "another-secret-" + "x" * 20}
    done = subprocess.run(
        [sys.executable, "-c", script, ray.get_runtime_context().gcs_address, out],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    # When it schedules, it is refused with what to do, and nothing is scheduled
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "REFUSED tasks secret: the runners already running hold other tasks secrets" in done.stdout
    )
    # Then the session's own calls still run (and the refused one was never written)
    cluster.schedule(task_jobs.record, out, "same-secret", deliver_after=0)
    wait_until("the call ran", lambda: _lines(out))
    assert [r[0] for r in _lines(out)] == ["same-secret"]


def test_a_schedules_armed_occurrence_cannot_be_cancelled_by_any_path(cluster, capsys):
    from raydelay.web.model import ConsoleData
    from tests.integration.test_cli import run

    # Given a schedule whose next occurrence waits in the tasks topic
    name = f"guarded-{uuid.uuid4().hex[:6]}"
    cluster.schedule_cron("0 3 * * *", task_jobs.noop, name=name)
    topic = _topic(cluster)
    (occurrence,) = cluster.peek(topic, RUNNERS_SUBSCRIPTION, key=name, limit=5)
    occ = str(occurrence.message_id)
    # When it is cancelled by id (API, the console's model, the CLI) or by key
    refusal = f"is the next occurrence of schedule '{name}'"
    with pytest.raises(InvalidArgument, match=refusal):
        cluster.cancel_task(occ)
    other = cluster.schedule(task_jobs.noop, deliver_after=3600)
    with pytest.raises(InvalidArgument, match=refusal):
        cluster.cancel([str(other), occ])  # (all or nothing: the other one stays too)
    with pytest.raises(InvalidArgument, match=refusal):
        ConsoleData(cluster).cancel([occ])
    code, _, err = run(capsys, "cancel", occ)
    assert code == 2 and refusal in err
    with pytest.raises(InvalidArgument, match=f"keys: '{name}' is the key of schedule"):
        cluster.cancel(topic, key=name)
    # Then it is still armed, the schedule lists as armed, and the other call is not cancelled
    assert [str(m.message_id) for m in cluster.peek(topic, RUNNERS_SUBSCRIPTION, key=name)] == [occ]
    (listed,) = [s for s in cluster.list_schedules() if s["name"] == name]
    assert listed["armed"] is True
    assert cluster.task_status(other)["status"] == "scheduled"
    assert cluster.cancel_task(other) is True
    # A schedule whose chain was lost some other way (here its record copied under a new
    # name, with no occurrence in the topic) lists as not armed, in the API and the CLI
    store = cluster._tasks.store()
    from raydelay.tasks import cron

    record = cron.Schedule.from_bytes(store.get(cron.schedule_key(name)))
    record.name = f"{name}-lost"
    store.put(cron.schedule_key(record.name), record.to_bytes())
    lost = [s for s in cluster.list_schedules() if s["name"] == record.name]
    assert lost[0]["armed"] is False
    code, text, _ = run(capsys, "schedules", "list")
    row = next(line for line in text.splitlines() if line.startswith(record.name))
    assert "NOT ARMED" in row
    # Deleting the schedule frees its occurrence: cancelling it is allowed then
    cluster.delete_schedule(record.name)
    cluster.delete_schedule(name)
    assert cluster.cancel_task(occ) is True


def test_a_schedule_triggered_by_hand_and_backfilled_runs_outside_its_chain(cluster, out):
    # Given a nightly schedule (its next occurrence far off)
    name = f"by-hand-{uuid.uuid4().hex[:6]}"
    made = cluster.schedule_cron("0 2 * * *", task_jobs.record, out, "run", name=name)
    (armed_before,) = cluster.peek(_topic(cluster), RUNNERS_SUBSCRIPTION, key=name)
    # When it is triggered now
    before = now_ms()
    tid = cluster.trigger_schedule(name)
    wait_until("the triggered run", lambda: _lines(out))
    ((label, key, ran_at, attempt),) = _lines(out)
    assert label == "run" and attempt == "0" and int(ran_at) >= before
    occurrence = int(key.rsplit("@", 1)[1])
    assert key == f"{name}@{occurrence}" and before <= occurrence <= int(ran_at)
    # (its acknowledgement follows the run's end: a loaded machine shows it running a moment)
    wait_until("it succeeded", lambda: cluster.task_status(tid)["status"] == "succeeded")
    # ... and backfilled over the last three days: one run per nightly occurrence in it
    day = 86_400_000
    runs = cluster.backfill_schedule(name, now_ms() - 3 * day, now_ms() - 1)
    assert len(runs) == 3
    wait_until("the backfill ran", lambda: len(_lines(out)) == 4)
    filled = sorted(int(r[1].rsplit("@", 1)[1]) for r in _lines(out)[1:])
    assert [t % day for t in filled] == [2 * 3_600_000] * 3  # 02:00 UTC, each day
    assert filled[1] - filled[0] == day and filled[2] - filled[1] == day
    # Then its chain is as it was: the same armed occurrence, the same next time
    (armed_after,) = cluster.peek(_topic(cluster), RUNNERS_SUBSCRIPTION, key=name)
    assert armed_after.message_id == armed_before.message_id
    (listed,) = [s for s in cluster.list_schedules() if s["name"] == name]
    assert listed["next_ms"] == made["next_ms"] and listed["armed"] is True
    # Bad windows are refused, and nothing runs
    for start, end, match in (
        (now_ms() - day, now_ms() + day, "end: .* is in the future"),
        (now_ms() - day, now_ms() - 2 * day, "end: must not be before start"),
        (now_ms() - 40 * day * 365, now_ms() - 1, "more than 10,000 occurrences"),
        ("yesterday", now_ms(), "start: expected epoch milliseconds"),
    ):
        with pytest.raises(InvalidArgument, match=match):
            cluster.backfill_schedule(name, start, end)
    quiet = (now_ms() // day - 1) * day + 3 * 3_600_000  # yesterday 03:00: no occurrence
    assert cluster.backfill_schedule(name, quiet, quiet + 60_000) == []
    with pytest.raises(NotFound, match="no schedule called"):
        cluster.trigger_schedule("no-such-schedule")
    cluster.delete_schedule(name)


def test_a_schedule_runs_between_its_start_and_end_with_its_jitter(cluster, out):
    # Given a schedule of every second, starting in 2 s and ending 3 s later, each
    # occurrence due up to 0.5 s after its time
    name = f"window-{uuid.uuid4().hex[:6]}"
    start = (now_ms() // 1000 + 2) * 1000
    made = cluster.schedule_cron(
        "* * * * * *", task_jobs.record, out, "tick", name=name, start_at=start,
        end_at=start + 3_000, jitter_s=0.5,
    )  # fmt: skip
    assert made["next_ms"] == start and made["jitter_s"] == 0.5
    # Then it runs at each of its four occurrences, never before its time, then stops
    wait_until("four runs", lambda: len(_lines(out)) == 4, timeout_s=30)
    ticks = sorted((int(r[1].rsplit("@", 1)[1]), int(r[2])) for r in _lines(out))
    assert [t for t, _ in ticks] == [start + i * 1000 for i in range(4)]
    assert all(ran >= t for t, ran in ticks)
    wait_until("the chain ended", lambda: not cluster.peek(
        _topic(cluster), RUNNERS_SUBSCRIPTION, key=name))  # fmt: skip
    (listed,) = [s for s in cluster.list_schedules() if s["name"] == name]
    assert listed["next_ms"] is None and listed["armed"] is True  # over, not lost
    assert len(_lines(out)) == 4
    # Bad bounds are refused, and nothing is stored
    for kw, match in (
        ({"start_at": start, "end_at": start - 1}, "end_at: must not be before start_at"),
        ({"end_at": now_ms() - 1_000}, "no occurrence after now"),
        ({"jitter_s": -1}, "jitter_s: expected 0 to"),
        ({"jitter_s": "1"}, "jitter_s: expected seconds"),
        ({"start_at": "tomorrow"}, "start_at: expected epoch"),
    ):
        with pytest.raises(InvalidArgument, match=match):
            cluster.schedule_cron("* * * * * *", task_jobs.noop, name=f"{name}-bad", **kw)
    assert f"{name}-bad" not in [s["name"] for s in cluster.list_schedules()]
    cluster.delete_schedule(name)


def test_schedules_are_added_triggered_and_backfilled_from_the_cli(cluster, out, capsys):
    from tests.integration.test_cli import run

    name = f"cli-add-{uuid.uuid4().hex[:6]}"
    code, text, err = run(
        capsys, "schedules", "add", name, "--cron", "0 4 * * *",
        "--call", "tests.integration.task_jobs:record", "--args", json.dumps([out, "cli"]),
        "--timezone", "Asia/Tokyo", "--catch-up", "none", "--jitter-s", "60",
        "--start-at", "2026-01-01T00:00:00+00:00", "--end-at", "2099-01-01T00:00:00Z",
        "--max-retries", "1", "--backoff", "2", "--timeout-s", "30",
        "--options", '{"num_cpus": 0.5}',
    )  # fmt: skip
    assert code == 0, err
    assert text.startswith(f"{name}: created; calls tests.integration.task_jobs:record; next at ")
    (listed,) = [s for s in cluster.list_schedules() if s["name"] == name]
    assert (listed["cron"], listed["timezone"], listed["catch_up"]) == (
        "0 4 * * *", "Asia/Tokyo", "none",
    )  # fmt: skip
    assert listed["jitter_s"] == 60 and listed["end_ms"] == 4070908800000
    record = cluster._tasks.schedules.load(name)
    spec, _ = decode_payload(cluster._tasks.signer().open(record.spec))
    assert (spec.retry.max_retries, spec.retry.first_s, spec.timeout_s) == (1, 2.0, 30.0)
    assert spec.options == {"num_cpus": 0.5}
    # a second add of the name is refused unless --replace
    again = ["schedules", "add", name, "--cron", "0 5 * * *", "--call",
             "tests.integration.task_jobs:noop"]  # fmt: skip
    code, _, err = run(capsys, *again)
    assert code == 2 and "exists; delete it first, or pass replace=True" in err
    assert run(capsys, *again, "--replace")[0] == 0
    code, text, _ = run(capsys, "schedules", "add", name, "--cron", "0 4 * * *", "--call",
                        "tests.integration.task_jobs:record", "--args", json.dumps([out, "cli"]),
                        "--replace")  # fmt: skip
    assert code == 0
    # trigger and backfill
    code, text, _ = run(capsys, "--json", "schedules", "trigger", name)
    tid = json.loads(text)["task_id"]
    assert code == 0
    wait_until("triggered", lambda: cluster.task_status(tid)["status"] == "succeeded")
    wait_until("the triggered run", lambda: len(_lines(out)) == 1)
    code, text, _ = run(capsys, "schedules", "backfill", name, "2026-01-01T00:00:00Z",
                        "2026-01-03T00:00:00Z")  # fmt: skip
    assert code == 0 and text == f"{name}: 2 occurrences to run now\n"
    wait_until("the backfill ran", lambda: len(_lines(out)) == 3)
    keys = sorted(r[1] for r in _lines(out)[1:])
    assert keys == [f"{name}@1767240000000", f"{name}@1767326400000"]  # 04:00 UTC, 1 and 2 Jan
    # bad input: each a clear error, nothing stored
    for argv, match in (
        (["--call", "nomodule"], "call: expected module:function"),
        (["--call", "tests.integration.task_jobs:nothing_here"], "cannot be imported"),
        (["--call", "tests.integration.task_jobs:noop", "--args", "{"], "args: not JSON"),
        (
            ["--call", "tests.integration.task_jobs:noop", "--args", "{}"],
            "args: expected a JSON list",
        ),
        (["--call", "tests.integration.task_jobs:noop", "--start-at", "soon"], "start_at: "),
    ):
        code, _, err = run(capsys, "schedules", "add", f"{name}-bad", "--cron", "* * * * *", *argv)
        assert code == 2 and match in err, err
    assert f"{name}-bad" not in [s["name"] for s in cluster.list_schedules()]
    cluster.delete_schedule(name)


@pytest.mark.parametrize("policy", ["skip", "buffer_one"])
def test_an_occurrence_that_fires_while_the_one_before_runs_follows_the_overlap_policy(
    cluster, out, policy
):
    # Given a schedule of every 2 s for 8 s whose runs take 3 s
    name = f"overlap-{policy.replace('_', '-')}-{uuid.uuid4().hex[:6]}"
    start = (now_ms() // 2000 + 2) * 2000
    cluster.schedule_cron(
        "* * * * * */2", task_jobs.slow, out, 3.0, name=name, start_at=start,
        end_at=start + 8_000, overlap=policy,
    )  # fmt: skip
    # Then no two runs overlap, and the occurrences in between are passed over (skip) or
    # one waits and runs as soon as the one before ends (buffer_one)
    wait_until("the chain ended", lambda: not cluster.peek(
        _topic(cluster), RUNNERS_SUBSCRIPTION, key=name), timeout_s=60)  # fmt: skip
    # (every occurrence, 0 to 8 s, ends with a record of how: ran or passed over; one
    # held by buffer_one is no longer pending, but has none until it ran)
    wait_until(
        "each occurrence ended",
        lambda: len(cluster._tasks.schedules.last_runs(name, 10)) == 5,
        timeout_s=60,
    )
    wait_until(
        "the last run ended",
        lambda: (
            _lines(out)
            and sum(r[0] == "start" for r in _lines(out)) == sum(r[0] == "end" for r in _lines(out))
        ),
        timeout_s=30,
    )
    spans: dict[str, list[int]] = {}
    for _kind, key, at in _lines(out):
        spans.setdefault(key, []).append(int(at))
    runs = sorted(spans.values())
    assert 2 <= len(runs) <= 4, runs
    for (_, end_before), (begin, _) in zip(runs, runs[1:]):
        assert begin >= end_before  # one at a time
        if policy == "buffer_one":
            assert begin - end_before < 2_000  # the waiting one went next, at once
    ran = {int(k.rsplit("@", 1)[1]) for k in spans}
    assert ran <= {start + i * 2000 for i in range(5)} and start in ran
    listed = [s for s in cluster.list_schedules() if s["name"] == name][0]
    assert listed["overlap"] == policy
    # and a delete takes what the occurrences left in the store with it
    from raydelay.tasks import cron
    from raydelay.tasks import status as st

    store = cluster._tasks.store()
    left = (cron.DONE_PREFIX, cron.RUNNING_PREFIX, st.RUNS_PREFIX)
    assert all(store.list(f"{prefix}{name}/") for prefix in left)
    cluster.delete_schedule(name)
    assert not any(store.list(f"{prefix}{name}/") for prefix in (*left, cron.BUFFERED_PREFIX))
    assert cluster._tasks.schedules.last_runs(name) == []


def test_an_occurrence_delivered_again_after_it_was_done_keeps_its_outcome(cluster, out):
    from raydelay.tasks import cron
    from raydelay.tasks import status as st

    # Given an occurrence whose done marker is in the store when it fires (its run ended
    # and its runner died before the acknowledgement: its message comes again)
    name = f"done-{uuid.uuid4().hex[:6]}"
    start = (now_ms() // 1000 + 3) * 1000
    cluster.schedule_cron(
        "* * * * * *", task_jobs.record, out, "tick", name=name, start_at=start, end_at=start
    )
    (first,) = cluster.peek(_topic(cluster), RUNNERS_SUBSCRIPTION, key=name)
    generation = cluster._tasks.schedules.load(name).generation
    cluster._tasks.store().put(cron.done_key(name, generation, start), b"")
    # When it fires, it does not run again, and nothing says it was skipped: its status
    # is what its run left (here none: succeeded, acknowledged)
    tid = str(first.message_id)
    ended = wait_until(
        "it ended", lambda: (s := cluster.task_status(tid)["status"]) in st.FINAL and s
    )
    assert ended == "succeeded"
    assert cluster._tasks.schedules.last_runs(name) == []
    assert _lines(out) == []
    cluster.delete_schedule(name)
