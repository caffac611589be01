"""What a scheduled call sees while it runs, and how a runner's Ray task calls it.

A call runs in a Ray task through :func:`_invoke`, which imports (or unpickles) the
function, sets :func:`current_task` for the call, and calls it.
"""

from __future__ import annotations

import contextvars
import pickle
from dataclasses import dataclass
from typing import Any

import ray
from ray import cloudpickle

from raydelay.tasks.spec import resolve_function


class TaskId(str):
    """The id of a scheduled call: its message id as a string
    (``topic/partition/ledger:entry``; ``MessageId.parse`` reads it)."""


@dataclass(frozen=True)
class TaskContext:
    """What a running call knows about itself. ``idempotency_key`` is the same on every
    run of one occurrence (a retry, or a run again after its runner died)."""

    task_id: str
    occurrence_ms: int  # when it was due (a cron occurrence's own time)
    attempt: int  # 0 on the first run
    schedule: str | None  # the recurring schedule it belongs to

    @property
    def idempotency_key(self) -> str:
        return f"{self.schedule or self.task_id}@{self.occurrence_ms}"


_current: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "raydelay_task", default=None
)


def current_task() -> TaskContext | None:
    """The context of the scheduled call running in this task (None outside one)."""
    return _current.get()


_code_cache: dict[bytes, Any] = {}  # pickled functions, unpickled once per worker


def _invoke(call: tuple) -> tuple[bytes | None, str | None] | None:
    """Runs in the Ray task: import (or unpickle) the function, then call it. ``call`` is
    (target, code, pickled args, the TaskContext's fields, pass_ctx, keep): one task
    argument, which Ray hands over cheaper than six (a no-op call ran 8-16% more often a
    second). ``keep``: 0, the call's return value is dropped here (the runner only needs
    to know it succeeded); else the largest result to keep, in pickled bytes, and what
    comes back is :func:`kept_result`'s."""
    target, code, args, ctx, pass_ctx, keep = call
    if code is not None:
        fn = _code_cache.get(code)
        if fn is None:
            if len(_code_cache) > 256:
                _code_cache.clear()
            fn = _code_cache[code] = cloudpickle.loads(code)
    else:
        fn = resolve_function(target)
    fn = getattr(fn, "_function", fn)  # a @ray.remote function: its Python function
    a, kw = pickle.loads(args)
    context = TaskContext(*ctx)
    if pass_ctx:
        kw = {**kw, "raydelay_task": context}
    token = _current.set(context)
    try:
        value = fn(*a, **kw)
    finally:
        _current.reset(token)
    return kept_result(value, keep) if keep else None


def kept_result(value: Any, max_bytes: int) -> tuple[bytes | None, str | None]:
    """(the pickled ``value``, None), or (None, why it is not kept): it does not pickle,
    or it is over ``max_bytes`` (``tasks.max_result_bytes``)."""
    try:
        data = pickle.dumps(value, protocol=5)
    except Exception:  # noqa: BLE001 - not plain-picklable: cloudpickle may manage
        try:
            data = cloudpickle.dumps(value, protocol=5)
        except Exception as exc:  # noqa: BLE001 - cloudpickle raises many kinds
            return None, f"the result ({type(value).__name__}) cannot be pickled: {exc}"
    if len(data) > max_bytes:
        return None, (
            f"the result is {len(data):,} bytes pickled, over tasks.max_result_bytes "
            f"({max_bytes:,}): not kept"
        )
    return data, None


_invoke_remote = ray.remote(_invoke)
