"""The scheduled Ray calls of a :class:`~raydelay.client.connection.Cluster`:
``schedule``, ``schedule_call``, ``schedule_many``, ``schedule_cron``, their cancelling,
schedules and runners. :class:`ScheduledCalls` is the part of Cluster's API that says so;
the work is :class:`raydelay.client.tasks.Tasks`'s."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from raydelay.client.tasks import Tasks, actor_spec


class ScheduledCalls:
    """Cluster's methods for scheduled Ray calls (see :mod:`raydelay.tasks`), each done by
    the client's :class:`~raydelay.client.tasks.Tasks`."""

    _tasks: Tasks

    def _check_open(self) -> None:
        raise NotImplementedError  # (the Cluster's)

    def schedule(
        self,
        fn: Any,
        *args: Any,
        deliver_after: float | timedelta | None = None,
        deliver_at: Any = None,
        kwargs: dict | None = None,
        options: dict | None = None,
        max_retries: int = 3,
        backoff: Any = 1.0,
        pickle_code: bool = False,
        pass_context: bool = False,
        keep_result: bool = False,
        timeout_s: float | timedelta | None = None,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` as a Ray task when it falls due: ``deliver_after``
        seconds (or a timedelta) from now, or at ``deliver_at`` (epoch ms or an aware
        datetime); neither: at once. Returns its :class:`~raydelay.tasks.TaskId` once the
        call is durable.

        - ``fn``: a ``@ray.remote`` function or a plain function the runners can import
          (stored by its import path); ``pickle_code=True`` stores its code instead (for
          ``__main__``, closures, lambdas).
        - ``options``: Ray options of the task (``num_cpus``, ``num_gpus``, ``memory``,
          ``resources``, ``accelerator_type``, ``runtime_env``, ``name``).
        - ``max_retries``: retries after a failure (0: none, -1: no limit), ``backoff``
          seconds before the first (or a timedelta, or a ``(first, max)`` pair), doubling,
          each wait stretched at random by up to half of itself (the jitter; a
          :class:`~raydelay.tasks.RetryPolicy` sets another); then the call goes to
          ``<tasks.topic>-DLQ`` with its error.
        - ``timeout_s``: a run that lasts longer is cancelled (``ray.cancel``) and counts
          as a failed try (None or -1: no limit).
        - ``keep_result=True``: what the call returns is kept (``tasks.result_ttl_s``) for
          :meth:`task_result`, up to ``tasks.max_result_bytes`` pickled.
        - ``pass_context=True`` passes ``raydelay_task=TaskContext`` to the call; inside
          any call, :func:`raydelay.tasks.current_task` gives the same.

        :meth:`task_status` says what became of it.

        At least once: a call whose runner dies while it runs runs again, with the same
        ``TaskContext.idempotency_key``. A function that cannot be imported, arguments that
        cannot be pickled, or bad options are an InvalidArgument, and nothing is stored."""
        self._check_open()
        spec = self._tasks.spec_of(
            fn, options, max_retries, backoff, pickle_code, pass_context, keep_result, timeout_s
        )
        return self._tasks.schedule(
            spec, args, kwargs, deliver_after=deliver_after, deliver_at=deliver_at
        )

    def schedule_call(
        self,
        actor_name: str,
        method: str,
        *args: Any,
        deliver_after: float | timedelta | None = None,
        deliver_at: Any = None,
        kwargs: dict | None = None,
        namespace: str | None = None,
        max_retries: int = 3,
        backoff: Any = 1.0,
        pass_context: bool = False,
        keep_result: bool = False,
        timeout_s: float | timedelta | None = None,
    ) -> Any:
        """Call ``method`` of the named actor ``actor_name`` (in Ray ``namespace``; None:
        the runner's, ``raydelay``) when it falls due; otherwise as :meth:`schedule`. The
        actor is looked up when the call runs: one that does not exist then is a failed
        try, retried. A method that outlasts ``timeout_s`` is cancelled without force
        (forcing would kill the actor): an async method stops, a running sync one is
        left to finish, and either way the try counts as failed and its slot is freed."""
        self._check_open()
        spec = actor_spec(
            actor_name,
            method,
            namespace=namespace,
            max_retries=max_retries,
            backoff=backoff,
            pass_context=pass_context,
            keep_result=keep_result,
            timeout_s=timeout_s,
        )
        return self._tasks.schedule(
            spec, args, kwargs, deliver_after=deliver_after, deliver_at=deliver_at
        )

    def schedule_many(
        self,
        fn: Any,
        args_list: Any,
        *,
        deliver_at: Any = None,
        deliver_after: Any = None,
        keys: Any = None,
        options: dict | None = None,
        max_retries: int = 3,
        backoff: Any = 1.0,
        pickle_code: bool = False,
        pass_context: bool = False,
        keep_result: bool = False,
        timeout_s: float | timedelta | None = None,
    ) -> Any:
        """Schedule ``fn`` once per item of ``args_list`` (a tuple of positional arguments
        each; anything else is one argument), in one batch: ``deliver_at`` / ``deliver_after``
        are one value for all or one per call (a numpy array is fine). Returns their ids
        as a :class:`~raydelay.client.message.MessageIds` sequence (``str(ids[i])`` is the
        TaskId of call ``i``). ``keys``: one per call (or None), as ``Producer.send_many``
        takes them: a call scheduled for later holds its key while it is pending, and a
        second call of a pending key is not scheduled (its id is the first's). The other
        options are :meth:`schedule`'s."""
        self._check_open()
        spec = self._tasks.spec_of(
            fn, options, max_retries, backoff, pickle_code, pass_context, keep_result, timeout_s
        )
        return self._tasks.schedule_many(
            spec, args_list, deliver_at=deliver_at, deliver_after=deliver_after, keys=keys
        )

    def cancel_task(self, task_id: Any) -> bool:
        """Cancel a scheduled call: True if it will not run, False if it ran (or was
        cancelled) before."""
        self._check_open()
        return self._tasks.cancel([task_id])[0]

    def cancel_tasks(self, task_ids: Any) -> list[bool]:
        """Cancel scheduled calls (TaskIds, their strings, or what ``schedule_many``
        returned); one bool each, as :meth:`cancel_task`."""
        self._check_open()
        return self._tasks.cancel(task_ids)

    def task_status(self, task_id: Any) -> dict:
        """What became of a scheduled call: ``status`` is one of ``"scheduled"`` (waiting
        for its time, or a runner), ``"running"``, ``"failed"`` (a try failed; it runs
        again at ``next_try_ms``), ``"succeeded"``, ``"dead"`` (out of tries: in the
        dead-letter topic), ``"cancelled"``, or ``"skipped"`` (a cron occurrence its
        schedule passed over); with ``attempts``, the last ``error``, ``result_kept`` and
        ``updated_ms``. Records are kept ``tasks.result_ttl_s``; after that a call that
        ended reads as succeeded. An id that is no call of the tasks topic is a NotFound."""
        self._check_open()
        return self._tasks.statuses.status(task_id)

    def task_result(self, task_id: Any, timeout: float | timedelta | None = None) -> Any:
        """What a call scheduled with ``keep_result=True`` returned, once it ended (waiting
        up to ``timeout`` seconds; None or -1: as long as it takes; then a TimeoutError).
        A dead call raises :class:`~raydelay.TaskFailed` with its last error; a cancelled
        one :class:`~raydelay.TaskCancelled`; one that succeeded without a kept result
        (not asked for, over ``tasks.max_result_bytes``, expired) a NotFound saying why."""
        self._check_open()
        return self._tasks.statuses.result(task_id, timeout)

    def schedule_cron(
        self,
        cron: str,
        fn: Any,
        *args: Any,
        name: str,
        timezone: str = "UTC",
        catch_up: str = "latest",
        kwargs: dict | None = None,
        options: dict | None = None,
        max_retries: int = 3,
        backoff: Any = 1.0,
        pickle_code: bool = False,
        pass_context: bool = False,
        replace: bool = False,
        timeout_s: float | timedelta | None = None,
        start_at: Any = None,
        end_at: Any = None,
        jitter_s: float | timedelta = 0,
        overlap: str = "allow_all",
    ) -> dict:
        """Run ``fn(*args)`` at every occurrence of the cron expression ``cron`` (5 fields,
        or 6 with seconds last; parsed by croniter) in ``timezone``, as the recurring
        schedule ``name``. Each occurrence is one delayed call; the next is armed when one
        fires, once, so a crash, a restart or a node loss neither skips an occurrence nor
        starts it twice (a call interrupted while it runs runs again, with the same
        idempotency key ``name@occurrence``).

        ``catch_up``: what occurrences missed while the cluster was down do, once it is up
        again: ``"all"`` run, one after the other; ``"latest"`` only the most recent one
        runs; ``"none"`` none runs (an occurrence is missed when it fires more than
        ``tasks.misfire_grace_s`` late). A schedule of that name existing already is an
        InvalidArgument unless ``replace=True``. ``timeout_s`` and the retries are
        :meth:`schedule`'s, for each occurrence.

        - ``start_at`` / ``end_at`` (epoch ms or aware datetimes): no occurrence before the
          one, nor after the other; the chain ends after the last.
        - ``jitter_s``: each occurrence is due up to that many seconds after its time, by
          an offset drawn from the schedule and the occurrence (the same if it is armed
          again), so that many schedules of one expression do not all start together.
          The idempotency key keeps the occurrence's own time.
        - ``overlap``: what an occurrence does when the one before still runs (a failed
          one waiting for its retry counts as running): ``"allow_all"`` runs it beside;
          ``"skip"`` passes it over; ``"buffer_one"`` lets it wait until the other is done
          (one at most: another that comes meanwhile is passed over).

        Returns the schedule as :meth:`list_schedules` shows it."""
        self._check_open()
        spec = self._tasks.spec_of(
            fn, options, max_retries, backoff, pickle_code, pass_context, timeout_s=timeout_s
        )
        return self._tasks.schedules.create(
            cron,
            spec,
            args,
            kwargs,
            name=name,
            timezone=timezone,
            catch_up=catch_up,
            replace=replace,
            start_at=start_at,
            end_at=end_at,
            jitter_s=jitter_s,
            overlap=overlap,
        )

    def list_schedules(self) -> list[dict]:
        """The recurring schedules: name, cron, timezone, catch_up, target, paused,
        ``next_ms`` (the next occurrence; None while paused, or past ``end_ms``),
        ``start_ms``, ``end_ms``, ``jitter_s``, and ``armed``: False when no occurrence of
        it waits in the tasks topic, so nothing of it will run again (replace it)."""
        self._check_open()
        return self._tasks.schedules.listed()

    def pause_schedule(self, name: str) -> dict:
        """Stop running a schedule's occurrences (they pass, and are not caught up later)."""
        self._check_open()
        return self._tasks.schedules.set_paused(name, True)

    def resume_schedule(self, name: str) -> dict:
        """Run a paused schedule's occurrences again, from the next one on."""
        self._check_open()
        return self._tasks.schedules.set_paused(name, False)

    def delete_schedule(self, name: str) -> None:
        """Delete a schedule: its next occurrence ends the chain, and nothing more runs.
        What its occurrences left in the store goes with it (how each ended, the markers
        of its overlap policy): a schedule made again under the name starts afresh."""
        self._check_open()
        self._tasks.schedules.delete(name)

    def trigger_schedule(self, name: str) -> Any:
        """Run a schedule's call once now, outside its chain (a paused schedule's too): the
        next occurrences stay as they are. Returns the call's TaskId; its idempotency key
        is ``name@<now>``."""
        self._check_open()
        return self._tasks.schedules.trigger(name)

    def backfill_schedule(self, name: str, start: Any, end: Any) -> list:
        """Run, now, every occurrence of a schedule in the past window ``[start, end]``
        (epoch ms or aware datetimes; at most 10,000), each as its own call with that
        occurrence's idempotency key (``name@occurrence``), outside the chain. They run
        side by side, as many at once as the runners take. The window is the caller's
        own: it may reach before the schedule's ``start_at``. Returns their TaskIds (an
        empty list when the window holds none)."""
        self._check_open()
        return self._tasks.schedules.backfill(name, start, end)

    def task_stats(self) -> dict:
        """Scheduled calls (waiting for their time, or for a runner), running, and, since
        each runner started: succeeded, retried, dead, skipped; runners and schedules."""
        self._check_open()
        return self._tasks.stats()

    def start_runners(self, count: int = 1, max_in_flight: int | None = None) -> int:
        """Make sure ``count`` runners run (``tasks.runners`` start with the first call);
        returns how many started now."""
        self._check_open()
        return self._tasks.start_runners(count, max_in_flight)

    def stop_runners(self) -> int:
        """Stop the runners; what they held goes back to the tasks topic."""
        self._check_open()
        return self._tasks.stop_runners()
