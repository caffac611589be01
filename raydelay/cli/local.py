"""The ``raydelay`` commands that run things: up, down, topics, console, placement, demo and ingest."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from raydelay.cli.attach import attach
from raydelay.cli.output import Exit, dumps, emit, wants_json
from raydelay.console import table
from raydelay.errors import InvalidArgument, NotFound

# --- up / down ---------------------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    from raydelay.cluster import local
    from raydelay.config import load_config

    started = False
    own = args.port is not None or bool(args.temp_dir)
    if own and args.address is not None:
        raise InvalidArgument(
            "address: --address joins a running Ray; --port and --temp-dir start a new one: "
            "give one or the other"
        )
    is_local = args.address is None and not os.environ.get("RAYDELAY_ADDRESS")
    # --port or --temp-dir ask for a Ray of its own, even beside another one (and whatever
    # RAYDELAY_ADDRESS says: the new one is attached to)
    if own or (is_local and not local.local_ray_running()):
        address = local.start_head(
            load_config(args.config),
            num_cpus=args.num_cpus,
            port=args.port,
            temp_dir=args.temp_dir,
        )
        started = True
        if address and args.address is None:
            args.address = address
    cluster = attach(args)
    storage = cluster.config.storage
    where = storage.local.root if storage.kind == "local" else f"s3://{storage.s3.bucket}"
    doc = {
        "ray_address": cluster._ray_address,
        "started_ray": started,
        "store": {"kind": storage.kind, "where": where},
        "topics": len(cluster.topics()),
    }
    rows = [
        ["Ray", doc["ray_address"]],
        ["Ray started by this command", started],
        ["store", f"{storage.kind}: {where}"],
        ["topics", doc["topics"]],
    ]
    emit(args, doc, lambda: table(["raydelay is up", ""], rows))
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from raydelay.cluster import local

    if (
        args.address is None
        and not os.environ.get("RAYDELAY_ADDRESS")
        and not local.UP_MARKER.exists()
    ):
        # without a target, Ray's "auto" would join whatever Ray runs on this machine, and
        # its actors would be stopped: someone else's cluster, perhaps
        raise InvalidArgument(
            "address: `raydelay up` noted no Ray here (nothing to stop); give the cluster to "
            "stop with --address or RAYDELAY_ADDRESS"
        )
    cluster = attach(args)
    stopped = cluster._stop_everything()
    lines = [f"raydelay: stopped {stopped} actors (cursors persisted, ledgers closed)"]
    procs = None
    if not args.keep_ray and args.address is None:
        procs = local.stop_started_ray()
        if procs is not None:
            lines.append(
                f"raydelay: stopped the local Ray that `raydelay up` started ({procs} processes;"
                " any other Ray on this machine is left alone)"
            )
    emit(args, {"stopped_actors": stopped, "stopped_ray_processes": procs}, "\n".join(lines))
    return 0


# --- topics ------------------------------------------------------------------------------------


def cmd_topics_list(args: argparse.Namespace) -> int:
    cluster = attach(args)
    found = [
        {"topic": topic, "partitions": n, "subscriptions": cluster.stats(topic)["subscriptions"]}
        for topic, n in sorted(cluster.topics().items())
    ]
    rows = [[t["topic"], t["partitions"], ", ".join(t["subscriptions"]) or "-"] for t in found]
    emit(
        args,
        {"topics": found},
        lambda: table(["topic", "partitions", "subscriptions"], rows) if rows else "no topics",
    )
    return 0


def cmd_topics_create(args: argparse.Namespace) -> int:
    cluster = attach(args)
    cluster.create_topic(args.topic, args.partitions)
    emit(
        args,
        {"topic": args.topic, "partitions": args.partitions},
        f"topic {args.topic}: {args.partitions} partition(s)",
    )
    return 0


def cmd_topics_delete(args: argparse.Namespace) -> int:
    cluster = attach(args)
    objects = cluster.delete_topic(args.topic, force=args.force)
    emit(
        args,
        {"topic": args.topic, "deleted_objects": objects},
        f"topic {args.topic}: deleted ({objects:,} store objects)",
    )
    return 0


# --- console -----------------------------------------------------------------------------------


def cmd_console(args: argparse.Namespace) -> int:
    from raydelay.web.reader import AttachTarget
    from raydelay.web.serve import serve

    # a reader process attaches, and again after an outage: where is resolved there
    target = AttachTarget(config=args.config, address=args.address)
    serve(target, args.host, args.port, allow_writes=args.allow_writes)
    return 0


# --- demo / ingest -----------------------------------------------------------------------------


def cmd_placement(args: argparse.Namespace) -> int:
    cluster = attach(args)
    rows = cluster.placement()
    if wants_json(args):
        print(dumps({"actors": rows}))
        return 0
    nodes: dict[str, list[dict]] = {}
    for r in rows:
        nodes.setdefault(r["node"] or "-", []).append(r)
    summary = [
        [
            node[:12],
            (rs[0]["address"] or "-") + (" (head)" if rs[0]["head"] else ""),
            sum(r["class"] == "HostActor" for r in rs),
            sum(r.get("partitions", 0) for r in rs if r["class"] == "HostActor"),
            sum(r["class"] == "SubscriptionHost" for r in rs),
            sum(r.get("partitions", 0) for r in rs if r["class"] == "SubscriptionHost"),
            " ".join(
                "yes" if r.get("role") == "serving" else "standby"
                for r in rs
                if r["class"] == "CoordinatorActor"
            ),
        ]
        for node, rs in sorted(nodes.items())
    ]
    print(
        table(
            [
                "node",
                "address",
                "hosts",
                "partitions",
                "subscription hosts",
                "subscription partitions",
                "coordinator",
            ],
            summary,
        )
    )
    print()
    detail = [
        [
            r["name"],
            (r["node"] or "-")[:12],
            r["state"].lower(),
            r["pid"],
            r["restarts"],
            r.get("role") or _serves(r.get("serves", [])),
        ]
        for r in rows
    ]
    print(table(["actor", "node", "state", "pid", "restarts", "serves"], detail))
    return 0


def _serves(items: list[str], most: int = 6) -> str:
    """What an actor serves, shortened to ``most`` items."""
    if len(items) <= most:
        return " ".join(items)
    return " ".join(items[:most]) + f" (+{len(items) - most} more)"


def cmd_demo(args: argparse.Namespace) -> int:
    from raydelay.demo import run_demo

    messages, seconds = (20_000, 15.0) if args.quick else (args.messages, args.seconds)
    report = run_demo(
        messages=messages,
        spread_s=seconds,
        paid_share=args.paid_share,
        consumers=args.consumers,
        config=args.config,
        out=sys.stderr if wants_json(args) else None,  # the JSON alone on stdout
    )
    if wants_json(args):
        print(dumps(report.summary()))
    return Exit.OK if report.ok else Exit.FAILED


def cmd_ingest(args: argparse.Namespace) -> int:
    from raydelay.ingest import ingest_dataframe, read_input, start_spark, stop_spark

    if args.executors < 1:
        raise InvalidArgument(f"executors: expected >= 1, got {args.executors}")
    if not Path(args.input).exists() and "://" not in args.input:
        raise InvalidArgument(f"input: {args.input!r} does not exist")
    cluster = attach(args)
    if args.create_topic is not None:
        cluster.create_topic(args.topic, args.create_topic)
    else:
        try:
            cluster.topics()[args.topic]
        except KeyError:
            raise NotFound(
                f"topic {args.topic!r} does not exist (create it, or pass --create-topic N)"
            ) from None
    spark = start_spark(
        args.spark_master, executors=args.executors, executor_memory=args.executor_memory
    )
    try:
        df = read_input(spark, args.input, args.format)
        report = ingest_dataframe(
            df,
            args.topic,
            payload_col=args.payload_col,
            deliver_at_col=args.deliver_at_col,
            delay_col=args.delay_col,
            key_col=args.key_col,
            property_cols=args.property_col,
            reject_path=args.reject_path,
            cluster=cluster,
            job_id=args.job_id,
        )
    finally:
        stop_spark(spark, args.spark_master)
    if wants_json(args):  # (the progress line and the report's table went to stderr)
        print(dumps({**report.__dict__, "rows_per_s": round(report.rows_per_s, 1)}))
    return 0
