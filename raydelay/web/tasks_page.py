"""The console's page of scheduled Ray calls: the runners' counts, the recurring schedules
(next occurrences, the last runs with their status, and, with ``--allow-writes``, pause,
resume and trigger, each after a confirmation), and the next calls due, shown by what
they call (their arguments stay pickled: the console unpickles nothing)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from raydelay.errors import InvalidArgument, NotFound
from raydelay.tasks.spec import PROP_SCHEDULE, PROP_TASK

NEXT_CALLS = 20  # the next calls due the page lists
LAST_RUNS = 5  # runs per schedule
ACTIONS = {
    "pause": ("Pause", "Pause schedule {name}? Its occurrences pass without running, and are "
              "not caught up later."),
    "resume": ("Resume", "Resume schedule {name}? It runs again from its next occurrence."),
    "trigger": ("Run now", "Run schedule {name}'s call once now, outside its chain? Its next "
                "occurrences stay as they are."),
}  # fmt: skip


class TasksData:
    """What the page reads and does, through the console's cluster client."""

    def __init__(self, cluster: Any, lock: threading.RLock) -> None:
        self._cluster = cluster
        self._lock = lock

    def overview(self) -> dict:
        with self._lock:
            stats = self._cluster.task_stats()
            schedules = self._cluster.list_schedules()
            runs = {
                s["name"]: self._cluster._tasks.schedules.last_runs(s["name"], LAST_RUNS)
                for s in schedules
            }
            topic = self._cluster.config.tasks.topic
            try:
                upcoming = self._cluster.peek(topic, "runners", limit=NEXT_CALLS)
            except NotFound:  # (no call was ever scheduled)
                upcoming = []
        now = time.time() * 1000
        for s in schedules:
            s["runs"] = [
                {**r, "occurrence": _iso(r["occurrence_ms"]), "ended": _iso(r["ended_ms"])}
                for r in runs[s["name"]]
            ]
            s["next"] = _iso(s["next_ms"]) if s["next_ms"] else ""
        calls = [
            {
                "id": str(m.message_id),
                "due": _iso(m.deliver_at_ms),
                "late": m.deliver_at_ms is not None and m.deliver_at_ms <= now,
                "calls": m.properties.get(PROP_TASK, "?"),
                "schedule": m.properties.get(PROP_SCHEDULE, ""),
            }
            for m in upcoming
        ]
        return {"stats": stats, "schedules": schedules, "calls": calls}

    def act(self, name: str, action: str) -> str:
        with self._lock:
            if action == "pause":
                self._cluster.pause_schedule(name)
                return f"{name}: paused"
            if action == "resume":
                s = self._cluster.resume_schedule(name)
                return f"{name}: resumed; next at {_iso(s['next_ms']) or 'none (past its end)'}"
            tid = self._cluster.trigger_schedule(name)
            return f"{name}: triggered; task {tid}"

    def check(self, name: str) -> None:
        with self._lock:
            self._cluster._tasks.schedules.load(name)  # NotFound, named


def add_routes(
    app: FastAPI,
    data: TasksData,
    page: Callable[..., HTMLResponse],
    live: Callable[[Request], dict],
    fields: Callable[[Request], Coroutine[Any, Any, dict[str, list[str]]]],
    confirmed: Callable[[dict[str, list[str]]], None],
    one: Callable[..., str],
) -> None:
    """The page and its actions on the console's ``app`` (``page``, ``live``, ``fields``,
    ``confirmed``, ``one``: the console's own helpers)."""

    @app.get("/tasks", response_class=HTMLResponse)
    def tasks(request: Request) -> HTMLResponse:
        state = live(request)
        return page("tasks.html", live=state, title="Scheduled calls", **data.overview())

    @app.post("/actions/schedule", response_class=HTMLResponse)
    async def schedule_action(request: Request) -> HTMLResponse:
        form = await fields(request)
        name, action = _action(form, one)
        await run_in_threadpool(data.check, name)
        button, question = ACTIONS[action]
        return page(
            "confirm.html",
            title=f"{button}: {name}",
            question=question.format(name=name),
            details=[],
            refused=[],
            action="/actions/schedule/confirm",
            hidden=[("name", name), ("do", action)],
            back="/tasks",
            button=button,
        )

    @app.post("/actions/schedule/confirm", response_class=HTMLResponse)
    async def schedule_confirmed(request: Request) -> HTMLResponse:
        form = await fields(request)
        confirmed(form)
        name, action = _action(form, one)
        summary = await run_in_threadpool(data.act, name, action)
        return page("done.html", title="Done", summary=summary, lines=[], back="/tasks")


def _action(form: dict[str, list[str]], one: Callable[..., str]) -> tuple[str, str]:
    name, action = one(form, "name"), one(form, "do")
    if action not in ACTIONS:
        raise InvalidArgument(f"do: expected one of {', '.join(ACTIONS)}, got {action!r}")
    return name, action


def _iso(ms: int | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
