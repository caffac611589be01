"""Scheduled Ray calls on a cluster: what ``Cluster.schedule``, ``schedule_many``,
``schedule_call``, ``schedule_cron`` and the rest do (the Cluster methods call these).

A call is a message on the tasks topic (``tasks.topic``), due at its time; the runners
(``raydelay.client.runner``) run it then. The first call creates the topic, its dead-letter
topic and the runners.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raydelay.client import runner
from raydelay.client.message import MessageId
from raydelay.client.operations import Operations
from raydelay.client.runner import (
    RUNNERS_SUBSCRIPTION,
    runner_name,
    spawn_runner,
    stop_runner_actors,
)
from raydelay.client.schedules import Schedules
from raydelay.client.task_status import TaskStatuses
from raydelay.client.topics import Topics
from raydelay.cluster import placement, rpc
from raydelay.config import Config
from raydelay.errors import InvalidArgument, NotFound
from raydelay.storage import make_store
from raydelay.tasks import cron
from raydelay.tasks.context import TaskId
from raydelay.tasks.signing import CallSigner, load_signer
from raydelay.tasks.spec import (
    TaskSpec,
    actor_target,
    check_options,
    check_timeout,
    flag,
    function_target,
    kwargs_of,
    pickle_args,
    retry_policy,
    task_payload,
)

log = logging.getLogger(__name__)

RUNNERS_READY_S = 60.0  # connect() waits this long at most for runners it started


class Tasks:
    """The tasks side of one Cluster client: its producer, and the topic and runners made
    sure of once."""

    def __init__(self, topics: Topics, operations: Operations) -> None:
        self._topics = topics
        self._operations = operations
        self.config = topics.config.tasks
        self.topic = self.config.topic
        self._producer: Any = None
        self._store: Any = None
        self._signer: CallSigner | None = None
        self.statuses = TaskStatuses(self)
        self.schedules = Schedules(self)

    @property
    def topics(self) -> Topics:
        return self._topics

    # --- set-up -----------------------------------------------------------------------------

    def ready(self) -> Any:
        """The producer of the tasks topic, after making sure the topic, its dead-letter
        topic and the runners exist."""
        if self._producer is None or self._producer._closed:
            self.start_runners(self.config.runners)
            self._producer = self._topics.create_producer(self.topic)
        return self._producer

    def signer(self) -> CallSigner:
        """This client's tasks secret (InvalidArgument, saying what to set, when there is
        none to be had)."""
        if self._signer is None:
            self._signer = signer_of(self._topics.config)
        return self._signer

    def _make_topics(self) -> None:
        """The tasks topic and its dead-letter topic, created when missing."""
        topics = self._topics.topics()
        for name, n in ((self.topic, self.config.partitions), (f"{self.topic}-DLQ", 1)):
            if name not in topics:
                try:
                    self._topics.create_topic(name, n)
                except InvalidArgument:
                    if name not in self._topics.topics():  # (another client made it)
                        raise

    def start_runners(self, count: int, max_in_flight: int | None = None) -> int:
        """Make sure runners ``runner/0`` .. ``runner/<count-1>`` run; returns how many
        were started now."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InvalidArgument(f"count: expected a number of runners >= 1, got {count!r}")
        cap = self.config.max_in_flight if max_in_flight is None else max_in_flight
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise InvalidArgument(f"max_in_flight: expected 1 or more, got {cap!r}")
        signer = self.signer()  # (before anything is made: without a secret, nothing is)
        self._make_topics()  # (a runner subscribes to them as it starts)
        started = 0
        handles = []
        for i in range(count):
            if placement.lookup_or_none(runner_name(i)) is None:
                started += 1
            handles.append(spawn_runner(self._topics.peers.config_dict, i, cap, signer))
        accepted = rpc.get([h.key_ids.remote() for h in handles], what="task runner", timeout_s=120)
        mine = signer.key_ids()[0]
        if any(mine not in ids for ids in accepted):
            raise InvalidArgument(
                "tasks secret: the runners already running hold other tasks secrets than the "
                f"one this client signs with (fingerprint {mine}), and would refuse its calls: "
                "stop them (cluster.stop_runners(), or `raydelay down`) so that they start "
                "again with it, or set this client's RAYDELAY_TASKS_SECRET or "
                "tasks.secret_file to theirs (docs/security.md)"
            )
        return started

    def runners(self) -> list[Any]:
        out = []
        i = 0
        while (h := placement.lookup_or_none(runner_name(i))) is not None:
            out.append(h)
            i += 1
        return out

    def stop_runners(self) -> int:
        """Stop every runner: each closes its consumer first, so what it held goes back.
        This client's next call starts them again."""
        self.close()  # (ready() starts the runners when it makes the producer again)
        return stop_runner_actors()

    def store(self) -> Any:
        if self._store is None:
            self._store = make_store(self._topics.config)
        return self._store

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None

    # --- one-off calls ------------------------------------------------------------------------

    def spec_of(
        self,
        fn: Any,
        options: Any,
        max_retries: Any,
        backoff: Any,
        pickle_code: bool,
        pass_context: bool,
        keep_result: bool = False,
        timeout_s: Any = None,
    ) -> TaskSpec:
        target, code = function_target(fn, flag("pickle_code", pickle_code))
        return TaskSpec(
            "fn",
            target,
            check_options(options),
            retry_policy(max_retries, backoff),
            code=code,
            pass_context=flag("pass_context", pass_context),
            keep_result=flag("keep_result", keep_result),
            timeout_s=check_timeout(timeout_s),
        )

    def schedule(self, spec: TaskSpec, args: tuple, kwargs: Any, **when: Any) -> TaskId:
        payload = self.signer().sign(
            task_payload(spec.encode(), pickle_args(args, kwargs_of(kwargs)))
        )
        mid = self.ready().send(payload, properties=spec.properties(), **when)
        return TaskId(str(mid))

    def schedule_many(
        self,
        spec: TaskSpec,
        args_list: Any,
        *,
        deliver_at: Any,
        deliver_after: Any,
        keys: Any,
    ) -> Any:
        if isinstance(args_list, (str, bytes)) or not isinstance(args_list, Sequence):
            raise InvalidArgument(
                f"args_list: expected a list (one tuple of arguments per call), got "
                f"{type(args_list).__name__}"
            )
        if not args_list:
            raise InvalidArgument("args_list: empty")
        head = spec.encode()
        sign = self.signer().sign
        payloads = [
            sign(task_payload(head, pickle_args(a if isinstance(a, tuple) else (a,), {})))
            for a in args_list
        ]
        return self.ready().send_many(
            payloads,
            deliver_at=deliver_at,
            deliver_after=deliver_after,
            keys=keys,
            properties=spec.properties(),
        )

    def cancel(self, ids: Any) -> list[bool]:
        mids = _message_ids(ids)
        for m in mids:
            if m.topic != self.topic:
                raise InvalidArgument(f"task_id: {m} is not a task (not on topic {self.topic})")
        return self._operations.cancel(mids)

    # --- numbers --------------------------------------------------------------------------------

    def stats(self) -> dict:
        """Scheduled (waiting for their time or a runner), running, and per runner since it
        started: succeeded, retried, dead, skipped (cron occurrences passed over), timed
        out (cancelled past their timeout_s)."""
        runners = self.runners()
        per = rpc.get([h.stats.remote() for h in runners], what="task runner") if runners else []
        out: dict[str, Any] = {"runners": len(runners)}
        for k in ("running", "started", "succeeded", "retried", "dead", "skipped", "timed_out"):
            out[k] = sum(int(r.get(k, 0)) for r in per)
        topics = self._topics.topics()
        if self.topic in topics:
            try:
                s = self._topics.stats(self.topic, RUNNERS_SUBSCRIPTION)
                out["scheduled"] = int(s["backlog"]) - int(s["pending_ack"])
                out["delayed"] = int(s["delayed"])
            except NotFound:
                out["scheduled"], out["delayed"] = 0, 0
        else:
            out["scheduled"], out["delayed"] = 0, 0
        out["schedules"] = len(self.store().list(cron.SCHEDULE_PREFIX))
        return out


def resume_runners(topics: Topics, wait_s: float = RUNNERS_READY_S) -> None:
    """Start the runners (``tasks.runners``) when the tasks topic exists and none runs: a
    cluster started again after a stop or a crash runs the calls and cron occurrences
    that waited meanwhile. Not from a runner itself.

    It returns once they are up and taking calls (each has subscribed), so that calls
    held while the cluster was down run as soon as ``connect()`` returns; after
    ``wait_s`` seconds it returns anyway (a warning says so), and they come up meanwhile."""
    if runner.IN_RUNNER:
        return
    tasks = topics.config.tasks
    if placement.lookup_or_none(runner_name(0)) is not None:
        return
    if tasks.topic not in topics.topics():
        return
    try:
        signer = signer_of(topics.config)
    except InvalidArgument as exc:  # (a client without the secret starts no runners)
        log.warning("scheduled calls wait: the runners are not started (%s)", exc)
        return
    started = time.monotonic()
    handles = [
        spawn_runner(topics.peers.config_dict, i, tasks.max_in_flight, signer)
        for i in range(tasks.runners)
    ]
    try:
        rpc.get([h.key_ids.remote() for h in handles], what="task runner", timeout_s=wait_s)
    except Exception as exc:  # noqa: BLE001 - they start meanwhile: connect() goes on
        log.warning("the task runners are not up after %.0f s (%s); calls wait", wait_s, exc)
        return
    log.info("task runners up in %.1f s", time.monotonic() - started)


def signer_of(config: Config) -> CallSigner:
    """The tasks secret of a client of ``config``: see :func:`raydelay.tasks.signing.load_signer`
    (a store of this machine alone may make its own)."""
    storage = config.storage
    local = storage.kind == "local" and not storage.local.shared
    root = str(Path(storage.local.root).resolve()) if local else None
    return load_signer(config.tasks.secret_file, root)


def _message_ids(ids: Any) -> list[MessageId]:
    if isinstance(ids, (str, MessageId)):
        ids = [ids]
    try:
        return [i if isinstance(i, MessageId) else MessageId.parse(str(i)) for i in ids]
    except TypeError:
        raise InvalidArgument(f"task_ids: expected task ids, got {type(ids).__name__}") from None


def actor_spec(
    actor_name: Any,
    method: Any,
    *,
    namespace: Any,
    max_retries: Any,
    backoff: Any,
    pass_context: bool,
    keep_result: bool = False,
    timeout_s: Any = None,
) -> TaskSpec:
    target = actor_target(actor_name, method, namespace)
    return TaskSpec(
        "actor",
        target,
        {},
        retry_policy(max_retries, backoff),
        actor=actor_name,
        namespace=namespace,
        method=method,
        pass_context=flag("pass_context", pass_context),
        keep_result=flag("keep_result", keep_result),
        timeout_s=check_timeout(timeout_s),
    )
