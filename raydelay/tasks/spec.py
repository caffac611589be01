"""A scheduled call as a message: what to run, with what, how, and how often to retry.

The payload is msgpack. The function travels by import path (``module:qualname``), so the
runner imports the code its own cluster has; its code is pickled only when the caller asks
(``pickle_code=True``). The arguments are pickled with cloudpickle. Everything is checked
when the call is scheduled: a function the runner could not import, arguments that do not
pickle, or options Ray would refuse are an :class:`InvalidArgument` then, and nothing is
stored.
"""

from __future__ import annotations

import importlib
import math
import pickle
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import msgpack
from ray import cloudpickle

from raydelay.errors import InvalidArgument

SPEC_VERSION = 1
# What the properties of a task message say (peek, the console and `raydelay tasks` show them)
PROP_TASK = "raydelay.task"
PROP_SCHEDULE = "raydelay.schedule"
PROP_ERROR = "raydelay.task.error"
PROP_ATTEMPTS = "raydelay.task.attempts"

# Ray task options a scheduled call may carry: the resources it needs and where it runs.
# (Ray's own retries are left out: a failed call is retried by the runner, with backoff.)
_OPTIONS: dict[str, tuple[type, ...]] = {
    "num_cpus": (int, float),
    "num_gpus": (int, float),
    "memory": (int, float),
    "resources": (dict,),
    "accelerator_type": (str,),
    "runtime_env": (dict,),
    "name": (str,),
}
# a retry's wait is drawn from [backoff, backoff * (1 + DEFAULT_JITTER)] unless said otherwise
DEFAULT_JITTER = 0.5
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class RetryPolicy:
    """How a failed call is retried: after ``first_s``, then ``multiplier`` times longer
    each time, up to ``max_s``; ``max_retries`` retries (0: none; -1: no limit) before it
    goes to the dead-letter topic.

    ``jitter``: each wait is drawn at random from ``[d, d * (1 + jitter)]``, where ``d`` is
    the backoff above, so that calls that failed together do not all come back together
    (a thundering herd). The wait is never shorter than the backoff; 0 turns it off."""

    max_retries: int = 3
    first_s: float = 1.0
    max_s: float = 300.0
    multiplier: float = 2.0
    jitter: float = DEFAULT_JITTER

    def base_delay_s(self, attempt: int) -> float:
        """The backoff before retry number ``attempt + 1`` (``attempt`` failed tries so
        far), without its jitter."""
        return min(self.first_s * self.multiplier ** max(attempt - 1, 0), self.max_s)

    def delay_s(self, attempt: int, draw: Callable[[], float] = random.random) -> float:
        """The wait before retry number ``attempt + 1``: the backoff, stretched by up to
        ``jitter`` of itself (``draw``: a number in [0, 1))."""
        base = self.base_delay_s(attempt)
        return base * (1.0 + self.jitter * draw())

    def exhausted(self, failures: int) -> bool:
        return self.max_retries != -1 and failures > self.max_retries


def retry_policy(max_retries: Any, backoff: Any, jitter: Any = DEFAULT_JITTER) -> RetryPolicy:
    """The policy of ``max_retries``, ``backoff`` and ``jitter``. ``backoff``: seconds or
    a timedelta (the first wait, doubling up to 300 s), a ``(first, max)`` pair, or a
    RetryPolicy (its jitter is kept). ``jitter``: 0 to 10 (see :class:`RetryPolicy`)."""
    if isinstance(jitter, bool) or not isinstance(jitter, (int, float)):
        raise InvalidArgument(
            f"jitter: expected a number from 0 to 10, got {type(jitter).__name__}"
        )
    if not (math.isfinite(jitter) and 0 <= jitter <= 10):
        raise InvalidArgument(
            f"jitter: expected 0 (none) to 10 (a wait up to 11 times the backoff), got {jitter}"
        )
    if isinstance(max_retries, bool) or not isinstance(max_retries, int):
        raise InvalidArgument(
            f"max_retries: expected an int (-1: no limit), got {type(max_retries).__name__}"
        )
    if max_retries < -1:
        raise InvalidArgument(
            f"max_retries: expected 0 or more, or -1 (no limit), got {max_retries}"
        )
    if isinstance(backoff, RetryPolicy):
        return RetryPolicy(
            max_retries, backoff.first_s, backoff.max_s, backoff.multiplier, backoff.jitter
        )
    if isinstance(backoff, tuple):
        if len(backoff) != 2:
            raise InvalidArgument(f"backoff: expected (first, max) seconds, got {backoff!r}")
        first, most = (_seconds("backoff", v) for v in backoff)
    else:
        first, most = _seconds("backoff", backoff), 300.0
    if most < first:
        raise InvalidArgument(
            f"backoff: the longest wait ({most} s) is below the first ({first} s)"
        )
    return RetryPolicy(max_retries, first, max(most, first), jitter=float(jitter))


def check_timeout(timeout_s: Any) -> float | None:
    """``timeout_s`` of a call: None (no limit; -1 says the same), or seconds (or a
    timedelta) above 0, up to 365 days."""
    if timeout_s is None or (isinstance(timeout_s, int) and not isinstance(timeout_s, bool)
                             and timeout_s == -1):  # fmt: skip
        return None
    seconds = _seconds("timeout_s", timeout_s)
    if seconds <= 0:
        raise InvalidArgument(
            f"timeout_s: expected more than 0 seconds, or None (no limit), got {timeout_s}"
        )
    return seconds


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(
            f"{name}: expected seconds or a timedelta, got {type(value).__name__}"
        )
    if not math.isfinite(value) or value < 0 or value > 365 * 86400:
        raise InvalidArgument(f"{name}: expected 0 to 365 days in seconds, got {value}")
    return float(value)


_MAGIC = b"RDT1"
_spec_cache: dict[bytes, TaskSpec] = {}
_SPEC_CACHE_MAX = 4096


@dataclass
class TaskSpec:
    """One scheduled call, without its arguments. ``target`` is ``module:qualname`` (or
    ``actor.method``); ``code`` the pickled function when the caller opted in; ``actor``,
    ``namespace`` and ``method`` name an actor's method instead."""

    kind: str  # "fn" or "actor"
    target: str
    options: dict = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    code: bytes | None = None
    actor: str | None = None
    namespace: str | None = None
    method: str | None = None
    pass_context: bool = False
    schedule: str | None = None  # the recurring schedule this occurrence belongs to
    generation: str | None = None  # that schedule's generation
    occurrence_ms: int | None = None  # the cron occurrence it stands for
    keep_result: bool = False  # the runner stores what the call returns (task_result)
    # an occurrence run by hand (trigger_schedule, backfill_schedule): outside the chain,
    # it arms nothing and leaves no done marker
    manual: bool = False
    timeout_s: float | None = None  # a run that outlasts it is cancelled: a failed try

    def encode(self) -> bytes:
        """The spec's bytes: the same for every call of one ``schedule_many``."""
        r = self.retry
        return msgpack.packb(
            {
                "v": SPEC_VERSION,
                "kind": self.kind,
                "target": self.target,
                "options": self.options,
                "retry": [r.max_retries, r.first_s, r.max_s, r.multiplier, r.jitter],
                "code": self.code,
                "actor": self.actor,
                "ns": self.namespace,
                "method": self.method,
                "ctx": self.pass_context,
                "schedule": self.schedule,
                "gen": self.generation,
                "occ": self.occurrence_ms,
                "keep": self.keep_result,
                "timeout": self.timeout_s,
                "manual": self.manual,
            },
            use_bin_type=True,
        )

    @classmethod
    def _from_bytes(cls, data: bytes) -> TaskSpec:
        d = msgpack.unpackb(data, raw=False)
        if not isinstance(d, dict) or d.get("v") != SPEC_VERSION:
            raise ValueError(f"not a task of version {SPEC_VERSION}")
        retry = d["retry"]  # (a call stored before jitter: the default's)
        mr, first, most, mult = retry[:4]
        jitter = retry[4] if len(retry) > 4 else DEFAULT_JITTER
        return cls(
            kind=d["kind"],
            target=d["target"],
            options=d["options"],
            retry=RetryPolicy(mr, first, most, mult, jitter),
            code=d["code"],
            actor=d["actor"],
            namespace=d["ns"],
            method=d["method"],
            pass_context=d["ctx"],
            schedule=d["schedule"],
            generation=d["gen"],
            occurrence_ms=d["occ"],
            keep_result=bool(d.get("keep", False)),
            timeout_s=d.get("timeout"),
            manual=bool(d.get("manual", False)),
        )

    def properties(self) -> dict[str, str]:
        props = {PROP_TASK: self.target}
        if self.schedule:
            props[PROP_SCHEDULE] = self.schedule
        return props


def task_payload(spec_bytes: bytes, args: bytes) -> bytes:
    """A task message's payload: the spec (shared by a batch), then the pickled arguments."""
    return b"".join((_MAGIC, len(spec_bytes).to_bytes(4, "big"), spec_bytes, args))


def decode_payload(payload: bytes) -> tuple[TaskSpec, bytes]:
    """The spec and the pickled arguments of a task message (InvalidArgument if it is not
    one). Specs are cached: a batch of calls shares one."""
    try:
        if payload[:4] != _MAGIC:
            raise ValueError("no task header")
        n = int.from_bytes(payload[4:8], "big")
        spec_bytes, args = payload[8 : 8 + n], payload[8 + n :]
        spec = _spec_cache.get(spec_bytes)
        if spec is None:
            spec = TaskSpec._from_bytes(spec_bytes)
            if len(_spec_cache) >= _SPEC_CACHE_MAX:
                _spec_cache.clear()
            _spec_cache[spec_bytes] = spec
        return spec, args
    except Exception as exc:  # noqa: BLE001 - whatever the bytes were, say so once
        raise InvalidArgument(f"payload: not a raydelay task ({exc})") from None


# --- what to run -------------------------------------------------------------------------------


def function_target(fn: Any, pickle_code: bool) -> tuple[str, bytes | None]:
    """``module:qualname`` of ``fn`` (a plain function or a ``@ray.remote`` one), checked to
    import back to the same function; with ``pickle_code`` the pickled function as well,
    for code the runner could not import (``__main__``, a closure, a lambda)."""
    plain = _underlying(fn)
    if not callable(plain):
        raise InvalidArgument(f"fn: expected a function, got {type(fn).__name__}")
    module = getattr(plain, "__module__", None)
    qualname = getattr(plain, "__qualname__", None) or getattr(plain, "__name__", None)
    target = f"{module}:{qualname}"
    if pickle_code:
        try:
            return target, cloudpickle.dumps(plain)
        except Exception as exc:  # noqa: BLE001 - cloudpickle raises many kinds
            raise InvalidArgument(f"fn: {target} cannot be pickled ({exc})") from None
    why = None
    if not module or not qualname:
        why = "it has no module or name"
    elif module == "__main__":
        why = "it is defined in __main__, which the runner's process does not have"
    elif "<locals>" in qualname or "<lambda>" in qualname:
        why = "it is a closure or a lambda"
    else:
        try:
            found = resolve_function(target)
        except InvalidArgument as exc:
            why = str(exc).split(": ", 1)[-1]
        else:
            if _underlying(found) is not plain:
                why = f"{target} imports as another object"
    if why is not None:
        raise InvalidArgument(
            f"fn: {target} cannot be imported by the runner ({why}); move it into a module, "
            "or pass pickle_code=True to store its code with the call"
        )
    return target, None


def resolve_function(target: str) -> Any:
    """The function ``module:qualname`` names (a ``@ray.remote`` one as it is)."""
    module, _, qualname = target.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise InvalidArgument(f"fn: {target} cannot be imported ({exc})") from None
    return obj


def _underlying(fn: Any) -> Any:
    """The Python function of a ``@ray.remote`` function (itself otherwise)."""
    inner = getattr(fn, "_function", None)
    return inner if callable(inner) else fn


def actor_target(actor: Any, method: Any, namespace: Any) -> str:
    if not isinstance(actor, str) or not actor:
        raise InvalidArgument(f"actor_name: expected the name of a named actor, got {actor!r}")
    if not isinstance(method, str) or not _IDENT.match(method):
        raise InvalidArgument(f"method: expected a method name, got {method!r}")
    if namespace is not None and (not isinstance(namespace, str) or not namespace):
        raise InvalidArgument(f"namespace: expected a Ray namespace or None, got {namespace!r}")
    return f"{actor}.{method}"


def pickle_args(args: tuple, kwargs: dict) -> bytes:
    """The arguments of one call: plain pickle when it can (several times faster), else
    cloudpickle (lambdas, local classes); both load with ``pickle.loads``."""
    try:
        data = pickle.dumps((args, kwargs), protocol=5)
        # (a class or function of __main__ pickles by a reference the runner cannot follow)
        if b"__main__" not in data:
            return data
    except Exception:  # noqa: BLE001 - not plain-picklable: cloudpickle may manage
        pass
    try:
        return cloudpickle.dumps((args, kwargs), protocol=5)
    except Exception as exc:  # noqa: BLE001 - cloudpickle raises many kinds
        raise InvalidArgument(f"args: cannot be pickled ({type(exc).__name__}: {exc})") from None


def check_options(options: Any) -> dict:
    """Ray task options, checked: only the keys in ``_OPTIONS``, of the right types."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise InvalidArgument(
            f"options: expected a dict of Ray options, got {type(options).__name__}"
        )
    out: dict[str, Any] = {}
    for k, v in options.items():
        kinds = _OPTIONS.get(k)
        if kinds is None:
            raise InvalidArgument(
                f"options: {k!r} is not an option a scheduled call takes "
                f"(one of {', '.join(sorted(_OPTIONS))}; retries are max_retries and backoff)"
            )
        right_type = isinstance(v, kinds)  # (as a value: v keeps its type for what follows)
        if isinstance(v, bool) or not right_type:
            raise InvalidArgument(
                f"options.{k}: expected {kinds[0].__name__}, got {type(v).__name__}"
            )
        if k in ("num_cpus", "num_gpus", "memory") and not (
            math.isfinite(float(v)) and float(v) >= 0
        ):
            raise InvalidArgument(f"options.{k}: expected 0 or more, got {v}")
        if k == "resources":
            for name, amount in dict(v).items():
                if (
                    not isinstance(name, str)
                    or isinstance(amount, bool)
                    or not isinstance(amount, (int, float))
                    or amount < 0
                ):
                    raise InvalidArgument(
                        f"options.resources: expected names to amounts >= 0, got {name!r}: {amount!r}"
                    )
        out[k] = v
    try:
        msgpack.packb(out, use_bin_type=True)
    except Exception as exc:  # noqa: BLE001
        raise InvalidArgument(f"options: cannot be stored ({exc})") from None
    return out


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name}: expected True or False, got {value!r}")
    return value


def kwargs_of(kwargs: Any) -> dict:
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise InvalidArgument(f"kwargs: expected a dict of keyword arguments, got {kwargs!r}")
    return kwargs
