"""Runners: the consumers of the tasks topic, as Ray actors, that turn due calls into Ray
tasks.

A runner receives due calls from the shared subscription ``runners`` of the tasks topic,
submits each as a Ray task with its options (or calls the named actor's method), and
watches them finish:

- a call that succeeds is acknowledged;
- a call that fails is handed back (nack) to come again after its backoff, and after its
  ``max_retries`` it goes to the dead-letter topic (``<topic>-DLQ``) with the error, then is
  acknowledged;
- at most ``tasks.max_in_flight`` calls of one runner run at once: a burst of a million
  due calls waits in the topic, not in Ray's queue;
- a call that outlasts its ``timeout_s`` is cancelled (``ray.cancel``, forced for a
  task) and counts as a failed try at once: its slot is free again.

What the topic cannot tell about a call (a failed try and its error, its death, a kept
result, an occurrence passed over) the runner writes to the store before it acknowledges
or hands the call back (:mod:`raydelay.tasks.status`); runner 0 deletes the records older
than ``tasks.result_ttl_s``.

At least once: a runner that dies (or its node) holds its calls under its consumer lease;
when the lease lapses they are delivered to another runner, or to the restarted one, and
run again. Every call can read its idempotency key (task id and occurrence) from
:func:`raydelay.tasks.current_task`, the same on every run of the same occurrence.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
import traceback
from typing import Any

import numpy as np
import ray

from raydelay.actors.metrics import RunnerMetrics
from raydelay.client.armed import RUNNERS_SUBSCRIPTION
from raydelay.client.bootstrap import attach
from raydelay.client.peers import ClusterPeers, Session
from raydelay.client.runner_chores import TaskRecords, watch_schedules
from raydelay.client.topics import Topics
from raydelay.cluster import handles, placement, rpc
from raydelay.cluster.names import RUNNER_PREFIX
from raydelay.config import config_from_dict
from raydelay.dispatch.keys import key_hash
from raydelay.errors import InvalidArgument, NotFound
from raydelay.log.dedup import StaleSequence
from raydelay.log.entries import Entries
from raydelay.storage import make_store
from raydelay.tasks import cron
from raydelay.tasks import status as st
from raydelay.tasks.context import TaskContext, _invoke_remote
from raydelay.tasks.overlap import Overlaps
from raydelay.tasks.signing import CallSigner, parse_secrets
from raydelay.tasks.spec import (
    PROP_ATTEMPTS,
    PROP_ERROR,
    TaskSpec,
    decode_payload,
    task_payload,
)

log = logging.getLogger(__name__)

IN_RUNNER = False  # set in a runner's process: a connect() there starts no runners
_RECEIVE_MAX = 1_000  # calls taken in one receive
# a call that does nothing (it reads its own context), to start a worker for the calls
_WARM_UP = (
    "raydelay.tasks.context:current_task",
    None,
    pickle.dumps(((), {})),
    ("warm-up", 0, 0, None),
    False,
    0,
)


def runner_name(index: int) -> str:
    return f"{RUNNER_PREFIX}{index}"


class _StorePorts:
    """:class:`raydelay.tasks.cron.CronPorts` over the store and the tasks topic."""

    def __init__(self, store: Any, topics: Topics, topic: str, signer: CallSigner) -> None:
        self._store, self._topics, self._topic = store, topics, topic
        self._signer = signer  # (the runner's: it opens the record's call, signs the occurrence)

    def load(self, name: str) -> cron.Schedule | None:
        try:
            return cron.Schedule.from_bytes(self._store.get(cron.schedule_key(name)))
        except NotFound:
            return None

    def is_done(self, name: str, generation: str, occurrence_ms: int) -> bool:
        return self._store.exists(cron.done_key(name, generation, occurrence_ms))

    def mark_done(self, name: str, generation: str, occurrence_ms: int) -> None:
        self._store.put(cron.done_key(name, generation, occurrence_ms), b"")

    def arm(self, schedule: cron.Schedule, occurrence_ms: int) -> None:
        arm_occurrence(self._topics, self._topic, schedule, occurrence_ms, self._signer)


class TaskRunner:
    """One runner (see the module's docstring). Its loop runs on a thread of its own."""

    def __init__(self, config: dict, index: int, max_in_flight: int, secrets_text: str) -> None:
        global IN_RUNNER
        IN_RUNNER = True
        # the tasks secret of the client that started it (raydelay.tasks.signing): a call
        # runs only if one of them signed it
        self._signer = CallSigner(parse_secrets(secrets_text, "the runner's tasks secret"))
        self._config = config_from_dict(config)
        self._index = index
        self._cap = max_in_flight
        self._topic = self._config.tasks.topic
        self._grace_ms = int(self._config.tasks.misfire_grace_s * 1000)
        # a client of the topics only: a runner starts no runners (see tasks.resume_runners)
        found = attach(config)
        self._topics = Topics(
            ClusterPeers(found.coordinator, found.config, found.client), Session()
        )
        self._consumer = self._topics.subscribe(self._topic, RUNNERS_SUBSCRIPTION, "shared")
        self._dlq = self._topics.create_producer(f"{self._topic}-DLQ")
        self._store = make_store(self._config)
        self._ports = _StorePorts(self._store, self._topics, self._topic, self._signer)
        self._overlaps = Overlaps(self._store)
        self._max_result = self._config.tasks.max_result_bytes
        self._records = TaskRecords(
            self._store,
            index,
            int(self._config.tasks.result_ttl_s * 1000),
            self._config.tasks.max_result_bytes,
        )
        # ref -> (message, spec, when it started, monotonic s)
        self._inflight: dict[Any, tuple[Any, TaskSpec, float]] = {}
        self._ids: dict[str, Any] = {}  # task id -> its ref, while it runs
        self._remotes: dict[int, tuple[TaskSpec, Any]] = {}  # id(spec) -> (spec, options)
        self._actors: dict[tuple, Any] = {}  # (actor, namespace) -> handle
        self._counts = {
            "started": 0,
            "succeeded": 0,
            "retried": 0,
            "dead": 0,
            "skipped": 0,
            "timed_out": 0,
        }
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._draining = threading.Event()  # stopping: finish what runs, take nothing new
        self._drained = threading.Event()  # ... and nothing runs any more
        self._submitted = threading.Event()  # the loop started calls: the watcher looks
        self._finished: list = []  # refs of calls that finished, for the loop to settle
        self._seen: set = set()  # ... and not yet settled: the watcher waits on the rest
        self._finished_ready = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="task-runner", daemon=True)
        self._watcher = threading.Thread(target=self._watch, name="task-watcher", daemon=True)
        # a worker for the calls, started now (Ray starts one per task at first: ~1-2 s
        # that the first call due would otherwise wait), not waited for
        self._warm = _invoke_remote.remote(_WARM_UP)
        self._metrics = RunnerMetrics(index)
        self._late: list[int] = []  # start lateness (ms) of the calls started since a report
        self._reported = time.monotonic()
        self._thread.start()
        self._watcher.start()
        if index == 0:  # one runner deletes expired records and watches the schedules
            threading.Thread(
                target=self._records.sweep, args=(self._stop,), name="records", daemon=True
            ).start()
            threading.Thread(
                target=watch_schedules,
                args=(self._stop, self._store, self._ports.load, self._topics.peers,
                      self._topic, self._metrics),
                name="schedules",
                daemon=True,
            ).start()  # fmt: skip

    # --- calls --------------------------------------------------------------------------------

    def key_ids(self) -> list[str]:
        """The fingerprints of the tasks secrets this runner accepts."""
        return self._signer.key_ids()

    def stats(self) -> dict:
        with self._lock:
            return {
                **self._counts,
                "running": len(self._inflight),
                "max_in_flight": self._cap,
                "pid": os.getpid(),
            }

    def stop(self, drain_s: float = 10.0) -> None:
        """Stop taking calls, let those running finish (up to ``drain_s`` seconds), and
        close the consumer: what it still holds goes to another runner, or to this one
        when the cluster starts again (and runs again there)."""
        self._draining.set()
        self._drained.wait(timeout=drain_s)  # the loop says so, between two of its steps
        self._stop.set()
        self._thread.join(timeout=30)
        self._watcher.join(timeout=5)
        self._records.close()
        try:
            self._consumer.close()
            self._dlq.close()
        except Exception as exc:  # noqa: BLE001 - stopping: the lease hands them on anyway
            log.debug("closing runner %d: %s", self._index, exc)

    def pid(self) -> int:
        return os.getpid()

    def running(self, task_ids: list[str]) -> list[bool]:
        """Whether each of ``task_ids`` runs on this runner now."""
        with self._lock:
            return [t in self._ids for t in task_ids]

    # --- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._draining.is_set() and not self._inflight:
                self._drained.set()
                return
            try:
                self._step()
            except Exception as exc:  # noqa: BLE001 - a cluster restarting: go on
                if self._stop.is_set():
                    return
                log.warning("task runner %d: %s; going on", self._index, exc)
                time.sleep(0.5)

    def _step(self) -> None:
        """Take due calls while there is room (a long poll: it returns as soon as one is
        due), then settle the calls the watcher saw finish. Idle, it wakes once a second;
        with calls running, ten times a second at most, and at once when one finishes."""
        room = 0 if self._draining.is_set() else self._cap - len(self._inflight)
        if room > 0:
            wait_s = 0.1 if self._inflight else 1.0
            messages = self._consumer.receive(min(room, _RECEIVE_MAX), timeout_s=wait_s)
            if messages:
                self._start(messages)
        else:
            self._finished_ready.wait(timeout=0.5)
        self._expire_overdue()
        self._settle()
        for m, spec, args, schedule in self._overlaps.turn():  # (buffer_one: their turn came)
            try:
                self._launch(m, spec, args, int(time.time() * 1000), schedule)
            except Exception as exc:  # noqa: BLE001 - the store failed: try later
                self._give_back(m, exc)
        if time.monotonic() - self._reported >= 1.0:
            self._report()

    def _report(self) -> None:
        """The runner's metrics (see ``RunnerMetrics``), once a second."""
        self._reported = time.monotonic()
        with self._lock:
            counts, running = dict(self._counts), len(self._inflight)
            late, self._late = self._late, []
        try:
            self._metrics.report(counts, running, late)
        except Exception as exc:  # noqa: BLE001 - metrics never stop the runner
            log.debug("task runner %d: metrics: %s", self._index, exc)

    def _expire_overdue(self) -> None:
        """Cancel the calls that outlasted their ``timeout_s``; each is a failed try now
        (what it does after that is not waited for)."""
        now = time.monotonic()
        with self._lock:
            overdue = [
                (ref, m, spec)
                for ref, (m, spec, started) in self._inflight.items()
                if spec.timeout_s is not None and now - started > spec.timeout_s
            ]
            for ref, m, _ in overdue:
                self._drop(ref, m)
            self._counts["timed_out"] += len(overdue)
        for ref, m, spec in overdue:
            try:  # (an actor's method is not forced: that would kill the actor)
                ray.cancel(ref, force=spec.kind == "fn", recursive=True)
            except Exception as exc:  # noqa: BLE001 - it may have finished meanwhile
                log.debug("cancelling %s: %s", m.message_id, exc)
            if spec.kind == "actor":
                self._actors.pop((spec.actor, spec.namespace), None)
            error = f"TimeoutError: ran over its timeout_s of {spec.timeout_s:g} s; cancelled"
            try:
                self._failed(m, spec, error)
            except Exception as exc:  # noqa: BLE001 - a record or the nack failed
                self._give_back(m, exc)

    def _drop(self, ref: Any, m: Any) -> None:
        """Forget a running call (under the lock)."""
        self._inflight.pop(ref, None)
        self._seen.discard(ref)
        self._ids.pop(str(m.message_id), None)

    def _watch(self) -> None:
        """The watcher thread: waits on the running calls' refs (no actor calls) and hands
        the finished ones to the loop."""
        while not self._stop.is_set():
            self._submitted.clear()  # (before looking: a call started after it sets it again)
            with self._lock:
                refs = [r for r in self._inflight if r not in self._seen]
            if not refs:
                self._submitted.wait(timeout=1.0)
                continue
            # one wait over them all: back when all finished, or after 50 ms with those
            # that did (not fetched: the loop's get of a None is all that crosses)
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0.05, fetch_local=False)
            if ready:
                with self._lock:
                    self._seen.update(ready)
                    self._finished.extend(ready)
                self._finished_ready.set()

    def _settle(self) -> None:
        with self._lock:
            done, self._finished = self._finished, []
            self._finished_ready.clear()
        if done:
            self._finish(done)

    def _start(self, messages: list) -> None:
        now = int(time.time() * 1000)
        acks: list = []
        for m in messages:
            try:
                self._start_one(m, now, acks)
            except Exception as exc:  # noqa: BLE001 - the store or a topic failed: try later
                self._give_back(m, exc)
        if acks:
            self._consumer.ack(acks)

    def _start_one(self, m: Any, now: int, acks: list) -> None:
        try:
            # nothing of it is unpickled before its signature is checked
            spec, args = decode_payload(self._signer.open(m.payload))
        except InvalidArgument as exc:
            self._dead(m, None, str(exc))
            acks.append(m)
            return
        schedule = None
        if _in_chain(spec):
            try:
                schedule = self._fire(m, spec, now)
            except InvalidArgument as exc:  # its schedule's record is not signed: it ends here
                self._dead(m, spec, f"schedule {spec.schedule!r}: {exc}")
                acks.append(m)
                return
            if schedule is None:
                if not self._ports.is_done(str(spec.schedule), str(spec.generation),
                                           int(spec.occurrence_ms or 0)):  # fmt: skip
                    # (one done already, its ack lost, keeps the record of how it ended)
                    self._record(m, st.TaskRecord(st.SKIPPED, m.redelivery_count))
                    self._records.ran(spec, m, st.SKIPPED)
                acks.append(m)
                return
            occurrence = int(spec.occurrence_ms or 0)
            verdict = self._overlaps.verdict(schedule, occurrence)
            if verdict == "wait":  # (buffer_one: it runs once the one before is done)
                self._overlaps.hold(m, spec, args, schedule)
                return
            if verdict == "skip":
                why = "overlap: another occurrence of the schedule still runs"
                self._record(m, st.TaskRecord(st.SKIPPED, m.redelivery_count, why))
                self._ports.mark_done(schedule.name, schedule.generation, occurrence)
                self._records.ran(spec, m, st.SKIPPED, why)
                with self._lock:
                    self._counts["skipped"] += 1
                acks.append(m)
                return
        self._launch(m, spec, args, now, schedule)

    def _launch(
        self, m: Any, spec: TaskSpec, args: bytes, now: int, schedule: cron.Schedule | None
    ) -> None:
        """Submit the call of ``m`` (an occurrence of ``schedule``, when one)."""
        occurrence = spec.occurrence_ms
        if occurrence is None:
            occurrence = m.deliver_at_ms if m.deliver_at_ms is not None else m.publish_time_ms
        if schedule is not None:
            self._overlaps.started(schedule, int(occurrence))
        ctx = TaskContext(str(m.message_id), int(occurrence), m.redelivery_count, spec.schedule)
        try:
            ref = self._submit(spec, args, ctx)
        except Exception as exc:  # noqa: BLE001 - submitting failed: a failed try
            self._failed(m, spec, f"{type(exc).__name__}: {exc}")
            return
        with self._lock:
            self._inflight[ref] = (m, spec, time.monotonic())
            self._ids[str(m.message_id)] = ref
            self._counts["started"] += 1
            self._late.append(now - int(occurrence))
        self._submitted.set()

    def _give_back(self, m: Any, exc: BaseException) -> None:
        """A step of this call failed on the way (not the call itself): it comes back in a
        second, to this runner or another."""
        log.warning(
            "task runner %d: %s failed on the way (%s); again in 1 s",
            self._index,
            m.message_id,
            exc,
        )
        try:
            self._consumer.nack(m, delay_s=1.0)
        except Exception as again:  # noqa: BLE001 - the lease hands it on if this runner dies
            log.warning(
                "task runner %d: handing %s back failed too: %s", self._index, m.message_id, again
            )

    def _fire(self, m: Any, spec: TaskSpec, now_ms: int) -> cron.Schedule | None:
        """A cron occurrence: arm the next; its schedule if this one runs (None: not)."""
        assert spec.schedule is not None and spec.generation is not None
        occurrence = int(spec.occurrence_ms or 0)
        schedule, decision = cron.fire(
            self._ports, spec.schedule, spec.generation, occurrence, now_ms, self._grace_ms
        )
        if schedule is None or decision is None or not decision.run:
            with self._lock:
                self._counts["skipped"] += 1
            return None
        return schedule

    def _submit(self, spec: TaskSpec, args: bytes, ctx: TaskContext) -> Any:
        if spec.kind == "actor":
            handle = self._actors.get((spec.actor, spec.namespace))
            if handle is None:
                handle = ray.get_actor(str(spec.actor), namespace=spec.namespace)
                self._actors[(spec.actor, spec.namespace)] = handle
            a, kw = pickle.loads(args)
            if spec.pass_context:
                kw = {**kw, "raydelay_task": ctx}
            return getattr(handle, str(spec.method)).remote(*a, **kw)
        remote = self._remotes.get(id(spec))
        if remote is None or remote[0] is not spec:
            # one options() per distinct call spec (decode_payload hands out one object per
            # spec): Ray's options() costs more than the submission itself
            options = {"name": spec.target.rpartition(":")[2], **spec.options}
            if len(self._remotes) > 1024:
                self._remotes.clear()
            remote = self._remotes[id(spec)] = (spec, _invoke_remote.options(**options))
        fields = (ctx.task_id, ctx.occurrence_ms, ctx.attempt, ctx.schedule)
        keep = self._max_result if spec.keep_result else 0
        return remote[1].remote((spec.target, spec.code, args, fields, spec.pass_context, keep))

    def _finish(self, refs: list) -> None:
        values: dict = {}
        failed: dict = {}
        try:
            values = dict(zip(refs, ray.get(refs), strict=True))  # all at once, if none failed
        except Exception:  # noqa: BLE001 - one failed at least: look at each
            for ref in refs:
                try:
                    values[ref] = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - the call failed, however it failed
                    failed[ref] = exc
        ok: list = []
        records: list[tuple[Any, st.TaskRecord]] = []
        for ref in refs:
            with self._lock:
                held = self._inflight.get(ref)
                if held is None:  # (timed out meanwhile: settled then)
                    self._seen.discard(ref)
                    continue
                m, spec, _ = held
                self._drop(ref, m)
            try:
                if ref in failed:
                    if spec.kind == "actor":
                        self._actors.pop((spec.actor, spec.namespace), None)
                    self._failed(m, spec, _describe(failed[ref]))
                    continue
                if _in_chain(spec):
                    occurrence = int(spec.occurrence_ms or 0)
                    self._ports.mark_done(str(spec.schedule), str(spec.generation), occurrence)
                    self._records.ran(spec, m, st.SUCCEEDED)
                # (a call that failed before has a FAILED record to supersede)
                if spec.keep_result or m.redelivery_count > 0:
                    attempts = m.redelivery_count + 1
                    records.append((m, self._records.success(spec, values.get(ref), attempts)))
                ok.append(m)
            except Exception as exc:  # noqa: BLE001 - a done marker or a dead letter failed
                self._give_back(m, exc)
        if records:  # (before the acks: an acknowledged call's status is its record)
            written = self._records.write_many(records)
            for (m, _), fine in zip(records, written, strict=True):
                if not fine:
                    ok.remove(m)
                    self._give_back(m, RuntimeError("its status record was not written"))
        if ok:
            self._consumer.ack(ok)
            with self._lock:
                self._counts["succeeded"] += len(ok)

    def _record(self, m: Any, record: st.TaskRecord) -> None:
        self._records.write(m, record)

    def _failed(self, m: Any, spec: TaskSpec, error: str) -> None:
        failures = m.redelivery_count + 1
        if spec.retry.exhausted(failures):
            self._dead(m, spec, error)
            if _in_chain(spec):
                occurrence = int(spec.occurrence_ms or 0)
                self._ports.mark_done(str(spec.schedule), str(spec.generation), occurrence)
                self._records.ran(spec, m, st.DEAD, error)
            self._consumer.ack(m)
            return
        delay_s = spec.retry.delay_s(failures)
        record = st.TaskRecord(st.FAILED, failures, error[-2000:])
        record.next_try_ms = int(time.time() * 1000 + delay_s * 1000)
        self._record(m, record)
        with self._lock:
            self._counts["retried"] += 1
        self._consumer.nack(m, delay_s=delay_s)

    def _dead(self, m: Any, spec: TaskSpec | None, error: str) -> None:
        props = dict(m.properties)
        props[PROP_ERROR] = error[-2000:]
        props[PROP_ATTEMPTS] = str(m.redelivery_count + 1)
        props["raydelay.task.id"] = str(m.message_id)
        self._dlq.send(m.payload, key=m.key, properties=props)
        self._record(m, st.TaskRecord(st.DEAD, m.redelivery_count + 1, error[-2000:]))
        with self._lock:
            self._counts["dead"] += 1
        log.info("task %s is dead after %d tries: %s", m.message_id, m.redelivery_count + 1, error)


def _in_chain(spec: TaskSpec) -> bool:
    """Whether ``spec`` is an occurrence of a schedule's chain (not one run by hand)."""
    return spec.schedule is not None and spec.generation is not None and not spec.manual


def _describe(exc: BaseException) -> str:
    """The error of a failed call, in a few lines: the call's own exception when Ray wraps
    it (RayTaskError), else Ray's."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        lines = traceback.format_exception_only(type(cause), cause)
        return "".join(lines).strip()
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


def spawn_runner(config: dict, index: int, max_in_flight: int, signer: CallSigner) -> Any:
    """The runner called ``runner/<index>``, started if it does not run, with ``signer``'s
    secrets (they travel in its creation call, in Ray's control store, not in the store)."""
    name = runner_name(index)
    options = placement.floating_actor_options(name)
    return (
        ray.remote(TaskRunner)
        .options(**options)
        .remote(config, index, max_in_flight, signer.secret_text)
    )


def stop_runner_actors() -> int:
    """Stop every live runner of this Ray: each closes its consumer (what it held goes back
    to the tasks topic), then ends. Returns how many ran."""
    names = [n for n in handles.named_actors() if n.startswith(RUNNER_PREFIX)]
    live = [(n, h) for n in names if (h := placement.lookup_or_none(n)) is not None]
    if live:
        try:
            rpc.get([h.stop.remote() for _, h in live], what="task runner", timeout_s=60)
        finally:
            handles.stop([n for n, _ in live], graceful=True)
    return len(live)


def arm_occurrence(
    topics: Topics, topic: str, schedule: cron.Schedule, occurrence_ms: int, signer: CallSigner
) -> None:
    """Append the message of ``schedule``'s occurrence ``occurrence_ms``, due then (at once
    if that has passed), once: the schedule's named producer uses the occurrence as its
    sequence id, so arming it again appends nothing. The record's call is opened with
    ``signer`` (InvalidArgument if it is not signed) and the occurrence signed again."""
    spec, args = decode_payload(signer.open(schedule.spec))
    spec.occurrence_ms = int(occurrence_ms)
    payload = signer.sign(task_payload(spec.encode(), args))
    producer = topics.create_producer(topic, f"cron.{schedule.name}.{schedule.generation}")
    try:
        partition = key_hash(schedule.name) % producer.partitions
        entries = Entries.build(
            [payload],
            np.array([schedule.due_ms(occurrence_ms)], dtype=np.int64),
            [schedule.name],
            [spec.properties()],
        )
        try:
            producer.append_sequenced([(partition, int(occurrence_ms), entries)])
        except StaleSequence:
            pass  # armed long ago: this partition no longer remembers where
    finally:
        producer.close()
