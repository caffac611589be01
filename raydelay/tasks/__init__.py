"""Scheduled and recurring Ray calls: the durable timer Ray does not have.

``cluster.schedule(fn, *args, deliver_after=...)`` stores a call as a delayed message on
the tasks topic; when it falls due, a runner actor submits it as a Ray task, acknowledges
it when it succeeds, retries it with backoff when it fails, and dead-letters it after
``max_retries``. ``cluster.schedule_cron(...)`` does the same at every occurrence of a cron
expression. See ``docs/tasks.md``.

This package is what the calls are (their format, the cron policy, the context a call
sees); the runners and the Cluster side live in ``raydelay.client`` (``runner``, ``tasks``),
which use the client to consume and produce.
"""

from raydelay.tasks.context import TaskContext, TaskId, current_task
from raydelay.tasks.spec import RetryPolicy

__all__ = ["RetryPolicy", "TaskContext", "TaskId", "current_task"]
