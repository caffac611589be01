"""What became of a scheduled call, as a user asks it: ``task_status`` through a call's
life (scheduled, running, failed with its error and next try, succeeded, dead,
cancelled by every path), ``task_result`` with results kept, refused over the size bound,
and not kept; ``timeout_s`` cancelling a call that hangs; ``raydelay tasks status``.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
import ray

from raydelay import NotFound, TaskCancelled, TaskFailed
from raydelay.client.message import MessageId
from raydelay.errors import InvalidArgument
from tests.integration import task_jobs
from tests.integration.helpers import now_ms, wait_until
from tests.integration.test_cli import run

_lines = task_jobs.lines


@pytest.fixture(scope="module", autouse=True)
def tasks_ready(ray_cluster):
    """The tasks topic and its runners, made before the tests: fresh runners, whatever
    earlier modules did to the session's (stopped them, dropped their units)."""
    ray_cluster.stop_runners()  # (the next call starts them again)
    tid = ray_cluster.schedule(task_jobs.noop, deliver_after=0)
    wait_until(
        "the runners took a call", lambda: ray_cluster.task_status(tid)["status"] == "succeeded"
    )
    yield


@pytest.fixture
def out(tmp_path):
    return str(tmp_path / f"out-{uuid.uuid4().hex[:6]}.txt")


def _status(cluster, tid) -> str:
    return cluster.task_status(tid)["status"]


def test_a_call_is_scheduled_then_running_then_succeeded_with_its_result(cluster, out):
    # Given a call that takes 2 s, scheduled 1.5 s ahead, whose result is kept
    tid = cluster.schedule(task_jobs.slow, out, 2.0, deliver_after=1.5, keep_result=True)
    # Then it reads scheduled before its time, running while it runs, succeeded after
    first = cluster.task_status(tid)
    assert first["status"] == "scheduled" and first["attempts"] == 0
    assert first["task_id"] == str(tid)
    wait_until("it started", lambda: _lines(out))
    assert _status(cluster, tid) == "running"
    assert cluster.task_result(tid, timeout=30) is None  # what slow() returns
    done = cluster.task_status(tid)
    assert done["status"] == "succeeded" and done["attempts"] == 1 and done["result_kept"]
    # ... and a result is what the function returned, for a function and an actor's method
    tid = cluster.schedule(task_jobs.square, 12, keep_result=True)
    assert cluster.task_result(tid, timeout=30) == 144
    name = f"ledger-{uuid.uuid4().hex[:6]}"
    ledger = task_jobs.Ledger.options(name=name, namespace="raydelay-tests").remote()
    tid = cluster.schedule_call(name, "add", "x", namespace="raydelay-tests", keep_result=True)
    assert cluster.task_result(tid, timeout=30) == 1
    assert ray.get(ledger.get.remote()) == ["x"]
    # ... and the same for each call of a batch
    ids = cluster.schedule_many(task_jobs.square, [1, 2, 3], keep_result=True)
    assert [cluster.task_result(str(i), timeout=30) for i in ids] == [1, 4, 9]


def test_a_result_not_kept_says_why_and_the_call_still_succeeded(cluster):
    # Given a call without keep_result, and one whose result is over the size bound
    plain = cluster.schedule(task_jobs.square, 3)
    limit = cluster.config.tasks.max_result_bytes
    big = cluster.schedule(task_jobs.blob, limit + 1, keep_result=True)
    fits = cluster.schedule(task_jobs.blob, limit - 100, keep_result=True)
    # Then each succeeded; the first kept nothing, the second was refused, with the reason
    wait_until(
        "all ran", lambda: {_status(cluster, t) for t in (plain, big, fits)} == {"succeeded"}
    )
    with pytest.raises(NotFound, match="without keep_result=True"):
        cluster.task_result(plain, timeout=5)
    refused = cluster.task_status(big)
    assert refused["status"] == "succeeded" and not refused["result_kept"]
    assert "over tasks.max_result_bytes" in refused["result_error"]
    with pytest.raises(NotFound, match="over tasks.max_result_bytes"):
        cluster.task_result(big, timeout=5)
    assert len(cluster.task_result(fits, timeout=5)) == limit - 100


def test_a_failing_call_reads_failed_with_its_error_then_dead(cluster, out):
    # Given a call that always fails, with one retry 5 s after the first try (a window
    # that a loaded machine's status calls do not miss)
    tid = cluster.schedule(
        task_jobs.fail, out, "the disk is full", max_retries=1, backoff=5.0, keep_result=True
    )
    # Then between its tries it reads failed: the attempts, the error, when it runs again
    wait_until("the first try failed", lambda: _status(cluster, tid) == "failed")
    failed = cluster.task_status(tid)
    assert failed["attempts"] == 1 and "RuntimeError: the disk is full" in failed["error"]
    first_try_ms = int(_lines(out)[0][1])
    assert failed["next_try_ms"] >= first_try_ms + 5_000  # the backoff, and its jitter on top
    assert failed["next_try_ms"] <= first_try_ms + 5_000 * 1.5 + 5_000
    # ... then dead, and its result is the error
    with pytest.raises(TaskFailed, match="dead after 2 tries: RuntimeError: the disk is full"):
        cluster.task_result(tid, timeout=60)
    dead = cluster.task_status(tid)
    assert dead["status"] == "dead" and dead["attempts"] == 2
    # A call that fails once and then succeeds ends succeeded, its failures counted
    tid = cluster.schedule(task_jobs.fail_then_return, out + "2", 1, backoff=0.2, keep_result=True)
    assert cluster.task_result(tid, timeout=60) == "succeeded on try 1"
    assert cluster.task_status(tid)["attempts"] == 2


def test_a_cancelled_call_reads_cancelled_whichever_way_it_was_cancelled(cluster, out, capsys):
    # Given calls scheduled for later, one cancelled by each path a user has
    later = now_ms() + 60_000
    by_task = cluster.schedule(task_jobs.record, out, "a", deliver_at=later, keep_result=True)
    by_id = cluster.schedule(task_jobs.record, out, "b", deliver_at=later)
    key = f"order-{uuid.uuid4().hex[:6]}"
    (by_key,) = cluster.schedule_many(task_jobs.record, [(out, "c")], deliver_at=later, keys=[key])
    kept = cluster.schedule(task_jobs.record, out, "d", deliver_at=later)
    assert cluster.cancel_task(by_task) is True
    assert cluster.cancel([by_id]) == [True]
    assert cluster.cancel(cluster.config.tasks.topic, key=key) is True
    # Then each reads cancelled, and its result says so
    for tid in (by_task, by_id, str(by_key)):
        assert _status(cluster, tid) == "cancelled", tid
    with pytest.raises(TaskCancelled, match="cancelled; it did not run"):
        cluster.task_result(by_task, timeout=5)
    # ... and the CLI's cancel too
    assert run(capsys, "cancel", str(kept))[0] == 0
    assert _status(cluster, kept) == "cancelled"


def test_a_call_that_outlasts_its_timeout_is_cancelled_and_counts_as_a_failed_try(cluster, out):
    before = cluster.task_stats()["timed_out"]
    # Given a call of 30 s with a timeout of 3 s and no retry
    tid = cluster.schedule(task_jobs.slow, out, 30.0, timeout_s=3, max_retries=0)
    # Then it is stopped, and dead with the reason
    with pytest.raises(TaskFailed, match="TimeoutError: ran over its timeout_s of 3 s"):
        cluster.task_result(tid, timeout=30)
    assert [r[0] for r in _lines(out)] == ["start"]  # it never got to its end
    assert cluster.task_stats()["timed_out"] >= before + 1
    # An actor's async method is cancelled too, and a retry runs it again
    name = f"sleeper-{uuid.uuid4().hex[:6]}"
    sleeper = task_jobs.Sleeper.options(name=name, namespace="raydelay-tests").remote()
    ray.get(sleeper.__ray_ready__.remote())  # (its start is not the call's time)
    tid = cluster.schedule_call(
        name, "nap", out + "2", 30.0, namespace="raydelay-tests", timeout_s=3.0,
        max_retries=1, backoff=0.1,
    )  # fmt: skip
    with pytest.raises(TaskFailed, match="dead after 2 tries: TimeoutError"):
        cluster.task_result(tid, timeout=60)
    assert [r[0] for r in _lines(out + "2")] == ["start", "start"]
    ray.kill(sleeper)


def test_bad_ids_options_and_timeouts_are_refused(cluster):
    topic = cluster.config.tasks.topic
    with pytest.raises(InvalidArgument, match="task_id: .* is not a task"):
        cluster.task_status(MessageId("elsewhere", 0, 1, 2))
    with pytest.raises(NotFound, match="is not in the log"):
        cluster.task_status(MessageId(topic, 0, 10**12, 0))
    with pytest.raises(NotFound, match="no partition 99"):
        cluster.task_status(MessageId(topic, 99, 1, 0))
    with pytest.raises(InvalidArgument, match="task_id: expected a TaskId"):
        cluster.task_status(12)
    with pytest.raises(InvalidArgument, match="message_id"):
        cluster.task_status("not an id")
    for bad, match in (
        (0, "timeout_s: expected more than 0"),
        (-5, "timeout_s: expected 0 to 365 days"),
        ("1", "timeout_s: expected seconds"),
    ):
        with pytest.raises(InvalidArgument, match=match):
            cluster.schedule(task_jobs.noop, timeout_s=bad)
    with pytest.raises(InvalidArgument, match="keep_result: expected True or False"):
        cluster.schedule(task_jobs.noop, keep_result="yes")
    tid = cluster.schedule(task_jobs.noop, deliver_after=60)
    for bad in (-2, "soon", float("nan")):
        with pytest.raises(InvalidArgument, match="timeout"):
            cluster.task_result(tid, timeout=bad)
    with pytest.raises(TimeoutError, match="still scheduled after 0.2 s"):
        cluster.task_result(tid, timeout=0.2)
    assert cluster.cancel_task(tid)


def test_the_tasks_status_command(cluster, capsys):
    tid = cluster.schedule(task_jobs.square, 5, keep_result=True)
    assert cluster.task_result(tid, timeout=30) == 25
    code, text, _ = run(capsys, "tasks", "status", str(tid))
    assert code == 0
    assert str(tid) in text and re.search(r"^status\s+succeeded$", text, re.M)
    assert re.search(r"^result kept\s+yes$", text, re.M)
    code, text, _ = run(capsys, "--json", "tasks", "status", str(tid))
    doc = json.loads(text)
    assert code == 0 and doc["status"] == "succeeded" and doc["result_kept"] is True
    topic = cluster.config.tasks.topic
    code, _, err = run(capsys, "tasks", "status", f"{topic}/0/{10**12}:0")
    assert code == 3 and "is not in the log" in err
