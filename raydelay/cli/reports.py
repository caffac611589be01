"""The ``raydelay`` commands that report: stats, tasks and schedules."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

import argcomplete

from raydelay.cli.attach import attach
from raydelay.cli.output import dumps, emit, wants_json
from raydelay.console import table
from raydelay.errors import InvalidArgument

# --- stats -------------------------------------------------------------------------------------


def cmd_stats(args: argparse.Namespace) -> int:
    cluster = attach(args)
    if args.subscription is None:
        info = cluster.stats(args.topic)
        if wants_json(args):
            each = {name: cluster.stats(args.topic, name) for name in info["subscriptions"]}
            print(dumps({"topic": args.topic, **info, "subscription_stats": each}))
            return 0
        rows = [
            [
                p,
                len(s["ledgers"]),
                s["held"],
                s["entries"],
                f"{s['tail'][0]}:{s['tail'][1]}" if s["tail"] else "-",
            ]
            for p, s in enumerate(info["partitions"])
        ]
        heads = ["partition", "ledgers", "messages held", "entries appended (this run)", "tail"]
        print(table(heads, rows))
        held = info["held"]
        noun = "message" if held == 1 else "messages"
        print(f"{args.topic} holds {num_text(held)} {noun} (entries of its log)")
        subs = []
        for name in info["subscriptions"]:
            s = cluster.stats(args.topic, name)
            subs.append(
                [name, s["type"]]
                + [num_text(s["delayed"]) + (" (counting)" if s.get("counting") else "")]
                + [s[k] for k in ("backlog", "pending_ack", "buckets", "dead_lettered")]
            )
        if subs:
            print()
            heads = ["subscription", "type", "delayed", "backlog", "pending ack", "buckets"]
            print(table([*heads, "dead-lettered"], subs))
        return 0
    s = cluster.stats(args.topic, args.subscription)
    hist = cluster.due_histogram(args.topic, args.subscription)
    if wants_json(args):
        due = [{"due": label, "pending": n} for label, n in hist]
        print(dumps({"topic": args.topic, "subscription": args.subscription, **s, "due": due}))
        return 0
    rows = [
        ["type", s["type"]],
        ["delayed", _delayed_text(s)],
        ["backlog", s["backlog"]],
        ["pending ack", s["pending_ack"]],
        ["buckets", s["buckets"]],
        ["redelivery queue", s["redelivery"]],
        ["dead-lettered (over its life)", s["dead_lettered"]],
        # counters of the actors' current lives: a restart starts them again
        ["delivered (since its units were opened)", s["delivered"]],
        ["acked (cancels and dead letters among them; since its units were opened)", s["acked"]],
        ["  of them cancelled (since its units were opened)", s["cancelled"]],
    ]
    print(table([f"{args.topic}/{args.subscription}", ""], [[k, num_text(v)] for k, v in rows]))
    print()
    if s["consumers"]:
        lease_s = cluster.config.subscription.consumer_lease_s
        consumers = [
            [cid, num_text(c["unacked"]), f"{c['lease_age_s']:.1f} s of {lease_s:g} s"]
            for cid, c in sorted(s["consumers"].items())
        ]
        print(table(["consumer", "unacked", "last heard from"], consumers))
    else:
        print("no consumers")
    print()
    total = sum(n for _, n in hist) or 1
    print(
        table(
            ["due", "pending", ""],
            [[label, n, "#" * round(30 * n / total)] for label, n in hist],
        )
    )
    return 0


def _delayed_text(s: dict) -> str:
    """The delayed count, said to be partial while partitions are recovering."""
    counting = s.get("counting") or []
    if not counting:
        return num_text(s["delayed"])
    parts = len(s.get("partitions", ())) or len(counting)
    noun = "partition" if parts == 1 else "partitions"
    return (
        f"{num_text(s['delayed'])} so far ({len(counting)} of {parts} {noun} recovering: "
        "not all counted yet)"
    )


def num_text(v: object) -> str:
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)


# --- tasks --------------------------------------------------------------------------------------


def cmd_tasks(args: argparse.Namespace) -> int:
    if getattr(args, "action", None) == "status":
        return _task_status(args)
    if args.next < 0:
        raise InvalidArgument(f"next: expected 0 or more, got {args.next}")
    cluster = attach(args)
    s = cluster.task_stats()
    topic = cluster.config.tasks.topic
    found = _next_tasks(cluster, topic, args.next) if args.next and s["delayed"] else []
    if wants_json(args):
        print(dumps({**s, "next": [_task_doc(m) for m in found]}))
        return 0
    rows = [
        ["scheduled (waiting for their time or a runner)", s["scheduled"]],
        ["  of which not due yet", s["delayed"]],
        ["running", s["running"]],
        ["succeeded (since the runners started)", s["succeeded"]],
        ["retried (since the runners started)", s["retried"]],
        ["dead-lettered (since the runners started)", s["dead"]],
        ["timed out (since the runners started)", s["timed_out"]],
        ["cron occurrences passed over", s["skipped"]],
        ["runners", s["runners"]],
        ["recurring schedules", s["schedules"]],
    ]
    print(table(["tasks", ""], rows))
    if found:
        print()
        print(
            table(
                ["task id", "due (UTC)", "calls", "schedule"],
                [
                    [d["task_id"], utc_text(d["due_ms"]), d["calls"] or "?", d["schedule"] or ""]
                    for d in map(_task_doc, found)
                ],
            )
        )
    return 0


def _task_status(args: argparse.Namespace) -> int:
    d = attach(args).task_status(args.task_id)
    if wants_json(args):
        print(dumps(d))
        return 0
    rows = [
        ["status", d["status"]],
        ["attempts", d["attempts"]],
        ["last error", d["error"] or ""],
        ["next try (UTC)", utc_text(d["next_try_ms"]) if d["next_try_ms"] else ""],
        ["result kept", "yes" if d["result_kept"] else (d["result_error"] or "no")],
        ["updated (UTC)", utc_text(d["updated_ms"]) if d["updated_ms"] else ""],
    ]
    print(table([d["task_id"], ""], rows))
    return 0


def _next_tasks(cluster, topic: str, limit: int) -> list:
    from raydelay.client.runner import RUNNERS_SUBSCRIPTION

    return cluster.peek(topic, RUNNERS_SUBSCRIPTION, limit=limit)


def _task_doc(m) -> dict:
    from raydelay.tasks.spec import PROP_SCHEDULE, PROP_TASK

    return {
        "task_id": str(m.message_id),
        "due_ms": m.deliver_at_ms,
        "calls": m.properties.get(PROP_TASK),
        "schedule": m.properties.get(PROP_SCHEDULE),
    }


def cmd_schedules(args: argparse.Namespace) -> int:
    action = args.action or "list"
    cluster = attach(args)
    if action == "list":
        if wants_json(args):
            print(dumps({"schedules": cluster.list_schedules()}))
            return 0
        rows = [
            [
                s["name"],
                s["cron"],
                s["timezone"],
                s["catch_up"],
                s["target"],
                _next_text(s),
            ]
            for s in cluster.list_schedules()
        ]
        if not rows:
            print("no schedules")
            return 0
        print(table(["name", "cron", "timezone", "catch up", "calls", "next (UTC)"], rows))
        return 0
    doc: dict = {"name": args.name, "action": action}
    if action == "add":
        s = _add_schedule(cluster, args)
        doc.update(next_ms=s["next_ms"], cron=s["cron"], target=s["target"])
        text = f"{args.name}: created; calls {s['target']}; next at {utc_text(s['next_ms'])} UTC"
    elif action == "trigger":
        doc["task_id"] = tid = str(cluster.trigger_schedule(args.name))
        text = f"{args.name}: triggered; task {tid}"
    elif action == "backfill":
        from raydelay.cli.messages import instant_arg

        ids = cluster.backfill_schedule(
            args.name, instant_arg(args.start, "start"), instant_arg(args.end, "end")
        )
        doc["task_ids"] = [str(i) for i in ids]
        text = f"{args.name}: {len(ids)} occurrences to run now"
    elif action == "pause":
        cluster.pause_schedule(args.name)
        text = f"{args.name}: paused"
    elif action == "resume":
        s = cluster.resume_schedule(args.name)
        doc["next_ms"] = s["next_ms"]
        when = f"next at {utc_text(s['next_ms'])} UTC" if s["next_ms"] else "past its end_at"
        text = f"{args.name}: resumed; {when}"
    else:
        cluster.delete_schedule(args.name)
        text = f"{args.name}: deleted"
    emit(args, doc, text)
    return 0


def _add_schedule(cluster, args: argparse.Namespace) -> dict:
    """``schedules add``: the function by its import path, its arguments from JSON."""
    import json

    from raydelay.cli.messages import instant_arg
    from raydelay.tasks.spec import resolve_function

    def loaded(field: str, text: str, kind: type) -> Any:
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise InvalidArgument(f"{field}: not JSON ({exc})") from None
        if not isinstance(value, kind):
            raise InvalidArgument(f"{field}: expected a JSON {kind.__name__}, got {text!r}")
        return value

    if ":" not in args.call:
        raise InvalidArgument(f"call: expected module:function, got {args.call!r}")
    fn = resolve_function(args.call)
    return cluster.schedule_cron(
        args.cron,
        fn,
        *loaded("args", args.args, list),
        name=args.name,
        timezone=args.timezone,
        catch_up=args.catch_up,
        kwargs=loaded("kwargs", args.kwargs, dict),
        options=loaded("options", args.options, dict),
        max_retries=args.max_retries,
        backoff=args.backoff,
        timeout_s=args.timeout_s,
        start_at=None if args.start_at is None else instant_arg(args.start_at, "start_at"),
        end_at=None if args.end_at is None else instant_arg(args.end_at, "end_at"),
        jitter_s=args.jitter_s,
        overlap=args.overlap,
        replace=args.replace,
    )


def _next_text(s: dict) -> str:
    """A schedule's next occurrence, or why none will come."""
    if s.get("armed") is False:  # (its chain is lost: see raydelay.client.armed)
        return "NOT ARMED: nothing will run (replace it)"
    return "paused" if s["paused"] else utc_text(s["next_ms"])


# --- completion ---------------------------------------------------------------------------------


def cmd_completion(args: argparse.Namespace) -> int:
    """The shell's completion script: it asks ``raydelay`` itself (argcomplete) for the
    words that may come next."""
    print(argcomplete.shellcode(["raydelay"], shell=args.shell))
    return 0


def utc_text(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
