"""The ``raydelay`` command: run a local raydelay, manage topics, produce, consume,
cancel, look at stats, ingest from files through Spark, and run the demo.

Every command but ``up`` and ``demo`` attaches to a running Ray: ``--address`` (or
``RAYDELAY_ADDRESS``), else the local one that ``raydelay up`` started. A mistake prints
one line (``raydelay: error: ...``) and exits with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from raydelay import __version__
from raydelay.console import table
from raydelay.errors import InvalidArgument, NotFound, RaydelayError, Unavailable

_BATCH = 10_000  # lines per send_many in ``produce``
# How many messages not due yet a ``consume`` that stops idle counts, at most (a peek)
_LATER_COUNTED = 10_000


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raydelay", description="raydelay: delayed and scheduled messages, durably, on Ray."
    )
    parser.add_argument("--version", action="version", version=f"raydelay {__version__}")
    parser.add_argument("--config", help="a config TOML (default: the embedded default)")
    parser.add_argument(
        "--address",
        help="the Ray cluster to attach to (default: $RAYDELAY_ADDRESS, else the local one)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    up = sub.add_parser(
        "up",
        help="start raydelay on a local Ray (or on --address)",
        description="Start a local Ray (unless one runs, or --address is given; --port or "
        "--temp-dir start one in any case) and raydelay's coordinator on it. Its actors "
        "outlive this command; `raydelay down` stops them, and the Ray it started.",
    )
    up.add_argument("--num-cpus", type=int, default=None, help="CPUs of a new local Ray")
    up.add_argument("--port", type=int, default=None, help="GCS port of a new local Ray")
    up.add_argument("--temp-dir", default=None, help="temp/session directory of a new local Ray")
    up.set_defaults(func=cmd_up)

    down = sub.add_parser(
        "down",
        help="stop raydelay (and the local Ray that `up` started)",
        description="Persist every subscription's cursor, close every open ledger, stop "
        "raydelay's actors, and stop the local Ray if `raydelay up` started it. "
        "The data stays in the store; `raydelay up` brings it back.",
    )
    down.add_argument("--keep-ray", action="store_true", help="leave the Ray cluster running")
    down.set_defaults(func=cmd_down)

    topics = sub.add_parser("topics", help="list, create or delete topics")
    tsub = topics.add_subparsers(dest="action", metavar="ACTION")
    tl = tsub.add_parser("list", help="the topics, their partitions and subscriptions")
    tl.set_defaults(func=cmd_topics_list)
    tc = tsub.add_parser("create", help="create a topic")
    tc.add_argument("topic")
    tc.add_argument("-p", "--partitions", type=int, default=1, help="partitions (default 1)")
    tc.set_defaults(func=cmd_topics_create)
    td = tsub.add_parser("delete", help="delete a topic, its log and its subscriptions")
    td.add_argument("topic")
    td.add_argument("--force", action="store_true", help="delete it even with subscriptions")
    td.set_defaults(func=cmd_topics_delete)
    topics.set_defaults(func=lambda args: _usage(topics))

    produce = sub.add_parser(
        "produce",
        help="publish one message per input line",
        description="Publish each line of FILE (or stdin) as one message (UTF-8, without its "
        "newline), in batches.",
    )
    produce.add_argument("topic")
    produce.add_argument("file", nargs="?", default="-", help="input file (default: stdin)")
    when = produce.add_mutually_exclusive_group()
    when.add_argument("--deliver-after", type=float, metavar="SECONDS", help="delay in seconds")
    when.add_argument(
        "--deliver-at", metavar="TIME", help="ISO-8601 time with an offset, or epoch ms"
    )
    produce.add_argument("--key", help="the messages' key")
    produce.add_argument(
        "--property", action="append", default=[], metavar="K=V", help="a property (repeatable)"
    )
    produce.add_argument("--ids", action="store_true", help="print each message id")
    produce.set_defaults(func=cmd_produce)

    consume = sub.add_parser(
        "consume",
        help="print messages of a subscription (and ack them with --ack)",
        description="Receive messages and print one tab-separated line each: message id, "
        "deliver_at, key, properties (k=v,...), redelivery count, payload. Without --ack "
        "they stay unacknowledged and are redelivered later.",
    )
    consume.add_argument("topic")
    consume.add_argument("subscription")
    consume.add_argument(
        "--type", default="shared", help="subscription type (default shared; see README)"
    )
    consume.add_argument("--ack", action="store_true", help="acknowledge what is printed")
    consume.add_argument(
        "-n", "--max", type=int, default=10, help="stop after N (default 10; -1: no limit)"
    )
    consume.add_argument(
        "--timeout", type=float, default=5.0, help="stop after this many idle seconds (default 5)"
    )
    consume.set_defaults(func=cmd_consume)

    peek = sub.add_parser(
        "peek",
        help="show the next scheduled messages of a subscription, changing nothing",
        description="Print the next scheduled messages of a shared or key_shared "
        "subscription that no consumer holds yet, in the order they will be delivered, one "
        "tab-separated line each as consume prints them. Nothing is delivered or "
        "acknowledged.",
    )
    peek.add_argument("topic")
    peek.add_argument("subscription")
    peek.add_argument(
        "-n", "--max", type=int, default=20, help="at most N (default 20; -1: no limit)"
    )
    peek.add_argument(
        "--due-after",
        help="only those due at or after this time (ISO-8601 with a zone, or epoch ms)",
    )
    peek.add_argument(
        "--due-before",
        help="only those due before this time (ISO-8601 with a zone, or epoch ms)",
    )
    peek.add_argument("--key", help="only the messages of this key")
    peek.set_defaults(func=cmd_peek)

    reset = sub.add_parser(
        "reset-cursor",
        help="move a subscription's cursor: replay from a time or a message, or skip ahead",
        description="Move the cursor of a subscription that has no consumers. TO is "
        "'earliest', 'latest', a message id (topic/partition/ledger:entry: that message is "
        "delivered again, and what follows it on its partition), or a time (ISO-8601 with a "
        "zone, or epoch ms: on every partition, the first entry published at or after it). "
        "What follows is delivered again; cancelled messages stay cancelled.",
    )
    reset.add_argument("topic")
    reset.add_argument("subscription")
    reset.add_argument("to", metavar="TO")
    reset.set_defaults(func=cmd_reset_cursor)

    redrive = sub.add_parser(
        "redrive",
        help="send a dead-letter topic's messages back to where they came from",
        description="Send the messages of a dead-letter topic back to the topic and partition "
        "each came from (or to --to TOPIC), due at once, with payload, key and properties, "
        "their redelivery count starting from 0, and acknowledge them in the dead-letter "
        "topic. Each goes back exactly once, even when a redrive is interrupted and run again.",
    )
    redrive.add_argument("dead_letter_topic")
    redrive.add_argument("--to", dest="to_topic", help="send them all to this topic instead")
    redrive.add_argument(
        "-n", "--max", type=int, default=-1, help="at most N (default -1: all of them)"
    )
    redrive.set_defaults(func=cmd_redrive)

    cancel = sub.add_parser(
        "cancel",
        help="cancel scheduled messages by id",
        description="Cancel messages by id (topic/partition/ledger:entry, as produce --ids "
        "prints them).",
    )
    cancel.add_argument("message_ids", nargs="+", metavar="MESSAGE_ID")
    cancel.set_defaults(func=cmd_cancel)

    stats = sub.add_parser(
        "stats",
        help="a topic's or a subscription's numbers, with pending messages by due window",
    )
    stats.add_argument("topic")
    stats.add_argument("subscription", nargs="?")
    stats.set_defaults(func=cmd_stats)

    tasks = sub.add_parser(
        "tasks",
        help="scheduled Ray calls: scheduled, running, succeeded, retried, dead",
        description="Counts of the scheduled Ray calls (cluster.schedule): waiting for their "
        "time or a runner, running, and, since each runner started, succeeded, retried, "
        "dead-lettered and passed over (cron occurrences); then the next ones due.",
    )
    tasks.add_argument(
        "-n", "--next", type=int, default=10, help="show the next N due calls (default 10; 0: none)"
    )
    tasks.set_defaults(func=cmd_tasks)

    schedules = sub.add_parser(
        "schedules",
        help="recurring schedules (cluster.schedule_cron): list, pause, resume, delete",
    )
    ssub = schedules.add_subparsers(dest="action", metavar="ACTION")
    ssub.add_parser("list", help="the schedules, with their next occurrence")
    for action, what in (
        ("pause", "stop running a schedule's occurrences (they pass, not caught up later)"),
        ("resume", "run a paused schedule's occurrences again"),
        ("delete", "delete a schedule: nothing more of it runs"),
    ):
        one = ssub.add_parser(action, help=what)
        one.add_argument("name")
    schedules.set_defaults(func=cmd_schedules)

    console = sub.add_parser(
        "console",
        help="the web console: topics, subscriptions, what is due when, scheduled messages",
        description="Serve the web console on http://HOST:PORT until interrupted. It is "
        "read-only unless --allow-writes is given: then it can cancel messages, reset "
        "cursors and redrive dead-letter topics, each after a confirmation. It has no "
        "authentication of its own: keep it on 127.0.0.1, or put it behind a proxy that "
        "authenticates.",
    )
    console.add_argument(
        "--host", default="127.0.0.1", help="the interface to listen on (default 127.0.0.1)"
    )
    console.add_argument("--port", type=int, default=8642, help="the port (default 8642)")
    console.add_argument(
        "--allow-writes",
        action="store_true",
        help="enable cancel, reset-cursor and redrive (each asks for confirmation)",
    )
    console.set_defaults(func=cmd_console)

    where = sub.add_parser(
        "placement", help="which Ray node holds which raydelay actor (and the actors per node)"
    )
    where.set_defaults(func=cmd_placement)

    demo = sub.add_parser(
        "demo",
        help="the main job: order timeouts ingested with Spark-on-Ray, cancelled and delivered",
        description="Generate order-timeout events, ingest them with Spark on Ray (RayDP), "
        "cancel the timeouts of orders that get paid, deliver the rest to shared consumers, "
        "and report timing. Runs on its own local Ray and a local-dir store.",
    )
    demo.add_argument(
        "--messages", type=int, default=200_000, help="order timeouts (default 200000)"
    )
    demo.add_argument(
        "--seconds", type=float, default=45.0, help="spread of the due times (default 45)"
    )
    demo.add_argument(
        "--paid-share", type=float, default=0.2, help="share of orders paid (default 0.2)"
    )
    demo.add_argument("--quick", action="store_true", help="20k messages over 15 s")
    demo.add_argument("--consumers", type=int, default=2, help="consumers (default 2)")
    demo.set_defaults(func=cmd_demo)

    ingest = sub.add_parser(
        "ingest",
        help="load a parquet, CSV or JSON file into a topic through Spark",
        description="One message per row. Bad rows are counted (and written to --reject-path "
        "with a reject_reason). Rerunning with the same --job-id writes nothing twice.",
    )
    ingest.add_argument("input", help="a file or directory (parquet, CSV with header, JSON lines)")
    ingest.add_argument("--topic", required=True)
    ingest.add_argument("--format", choices=("parquet", "csv", "json"), help="default: by name")
    ingest.add_argument("--payload-col", required=True)
    at = ingest.add_mutually_exclusive_group()
    at.add_argument("--deliver-at-col", help="epoch ms, aware timestamp or ISO-8601 with offset")
    at.add_argument("--delay-col", help="seconds from ingestion")
    ingest.add_argument("--key-col")
    ingest.add_argument("--property-col", action="append", default=[], help="(repeatable)")
    ingest.add_argument("--reject-path", help="where rejected rows go (parquet; must not exist)")
    ingest.add_argument("--job-id", help="rerun a job by its id to finish it without duplicates")
    ingest.add_argument(
        "--spark-master",
        default="raydp",
        help="raydp (Spark on this Ray, the default) or a Spark master URL such as local[2]",
    )
    ingest.add_argument("--executors", type=int, default=2, help="RayDP executors (default 2)")
    ingest.add_argument("--executor-memory", default="1g", help="per executor (default 1g)")
    ingest.add_argument(
        "--create-topic", type=int, metavar="PARTITIONS", help="create the topic first"
    )
    ingest.set_defaults(func=cmd_ingest)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe is caught below, not at exit
        return code
    except RaydelayError as exc:
        print(f"raydelay: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("raydelay: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `raydelay stats ... | head`: the reader has had enough
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the exit's flush does not fail again
        return 0
    finally:
        _detach(args)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


# --- attaching ---------------------------------------------------------------------------------


def _address(args: argparse.Namespace) -> str:
    """--address, else RAYDELAY_ADDRESS, else the Ray that `raydelay up` started, else auto."""
    from raydelay.cluster.local import up_address

    return args.address or os.environ.get("RAYDELAY_ADDRESS") or up_address() or "auto"


def _attach(args: argparse.Namespace) -> Any:
    """A client of the running raydelay (its coordinator is created if missing). When this
    joins Ray, the command's end leaves it again (``args.detach``, called by main)."""
    import ray

    from raydelay.client.bootstrap import attach_ray
    from raydelay.client.connection import connect

    address = _address(args)
    try:
        joined = not ray.is_initialized()  # (main() called in a process that runs Ray: no)
        if joined:
            # The actors' log lines are not the command's output; and with none to print,
            # leaving need not wait for them (see _detach)
            attach_ray(address, log_to_driver=False)
        cluster = connect(args.config, address=address)
    except ConnectionError as exc:
        where = "here" if address == "auto" else f"at {address}"
        raise Unavailable(
            f"no Ray cluster is running {where}; start one with `raydelay up` (or pass --address)"
        ) from exc
    if joined:
        args.detach = cluster.shutdown
    return cluster


def _detach(args: argparse.Namespace) -> None:
    """Leave the Ray that the command joined: its client's producers and consumers closed,
    then Ray's driver disconnected now. Left to Ray's exit hook, the disconnect would first
    sleep 0.5 s for worker log lines still on their way, which a command that asked for
    none (``log_to_driver=False``) does not wait for."""
    close = getattr(args, "detach", None)
    if close is None:
        return
    import ray

    try:
        close()
    except Exception as exc:  # noqa: BLE001 - the command is over: say why, and leave Ray
        logging.getLogger(__name__).warning("closing the client: %s", exc)
    finally:
        ray.shutdown()


# --- up / down ---------------------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    from raydelay.cluster import local
    from raydelay.config import load_config

    started = False
    is_local = args.address is None and not os.environ.get("RAYDELAY_ADDRESS")
    # --port or --temp-dir ask for a Ray of its own, even beside another one
    if is_local and (args.port is not None or args.temp_dir or not local.local_ray_running()):
        address = local.start_head(
            load_config(args.config),
            num_cpus=args.num_cpus,
            port=args.port,
            temp_dir=args.temp_dir,
        )
        started = True
        if address and args.address is None:
            args.address = address
    cluster = _attach(args)
    storage = cluster.config.storage
    where = storage.local.root if storage.kind == "local" else f"s3://{storage.s3.bucket}"
    rows = [
        ["Ray", cluster._ray_address],
        ["Ray started by this command", started],
        ["store", f"{storage.kind}: {where}"],
        ["topics", len(cluster.topics())],
    ]
    print(table(["raydelay is up", ""], rows))
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from raydelay.cluster import local

    cluster = _attach(args)
    stopped = cluster._stop_everything()
    print(f"raydelay: stopped {stopped} actors (cursors persisted, ledgers closed)")
    if not args.keep_ray and args.address is None:
        procs = local.stop_started_ray()
        if procs is not None:
            print(
                f"raydelay: stopped the local Ray that `raydelay up` started ({procs} processes;"
                " any other Ray on this machine is left alone)"
            )
    return 0


# --- topics ------------------------------------------------------------------------------------


def cmd_topics_list(args: argparse.Namespace) -> int:
    cluster = _attach(args)
    rows = []
    for topic, n in sorted(cluster.topics().items()):
        subs = cluster.stats(topic)["subscriptions"]
        rows.append([topic, n, ", ".join(subs) or "-"])
    print(table(["topic", "partitions", "subscriptions"], rows) if rows else "no topics")
    return 0


def cmd_topics_create(args: argparse.Namespace) -> int:
    cluster = _attach(args)
    cluster.create_topic(args.topic, args.partitions)
    print(f"topic {args.topic}: {args.partitions} partition(s)")
    return 0


def cmd_topics_delete(args: argparse.Namespace) -> int:
    cluster = _attach(args)
    objects = cluster.delete_topic(args.topic, force=args.force)
    print(f"topic {args.topic}: deleted ({objects:,} store objects)")
    return 0


# --- produce / consume / cancel ----------------------------------------------------------------


def _deliver_at_arg(text: str, field: str = "deliver_at") -> int:
    from raydelay.ingest.rows import AT_NAIVE, parse_time

    ms = parse_time(text)
    if ms == AT_NAIVE:
        raise InvalidArgument(f"{field}: {text!r} has no time zone (add e.g. +00:00)")
    if isinstance(ms, str):
        raise InvalidArgument(f"{field}: {text!r} is not an ISO-8601 time or epoch milliseconds")
    return ms


def _properties_arg(items: list[str]) -> dict[str, str] | None:
    props = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidArgument(f"property: expected K=V, got {item!r}")
        props[key] = value
    return props or None


def cmd_produce(args: argparse.Namespace) -> int:
    deliver_at = _deliver_at_arg(args.deliver_at) if args.deliver_at is not None else None
    props = _properties_arg(args.property)
    if args.file == "-":
        stream = sys.stdin.buffer
    else:
        try:
            stream = open(args.file, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise InvalidArgument(f"file: cannot read {args.file!r}: {exc.strerror}") from None
    cluster = _attach(args)
    producer = cluster.create_producer(args.topic)
    limit = cluster.config.topic.max_message_bytes
    sent = 0
    try:
        batch: list[bytes] = []
        for number, line in enumerate(stream, 1):
            payload = line.rstrip(b"\r\n")
            if len(payload) > limit:  # send the lines before it, then say where it stopped
                sent += _send(producer, batch, args, deliver_at, props) if batch else 0
                raise InvalidArgument(
                    f"line {number}: {len(payload):,} bytes is over topic.max_message_bytes "
                    f"({limit:,}); stopped there, {_sent_before(sent)}"
                )
            batch.append(payload)
            if len(batch) >= _BATCH:
                sent += _send(producer, batch, args, deliver_at, props)
                batch = []
        if batch:
            sent += _send(producer, batch, args, deliver_at, props)
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
        producer.close()
    empty = "" if sent else f" ({'stdin' if args.file == '-' else args.file} has no lines)"
    print(f"produced {_count(sent, 'message')} to {args.topic}{empty}", file=sys.stderr)
    return 0


def _sent_before(sent: int) -> str:
    """What went out before a line stopped a produce: the ``sent`` lines before it."""
    if sent == 0:
        return "nothing sent"
    lines = "line 1" if sent == 1 else f"lines 1-{sent}"
    return f"after sending {_count(sent, 'message')} ({lines})"


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _send(producer, payloads, args, deliver_at, props) -> int:
    n = len(payloads)
    ids = producer.send_many(
        payloads,
        deliver_after=args.deliver_after,
        deliver_at=deliver_at,
        keys=[args.key] * n if args.key is not None else None,
        properties=props,
    )
    if args.ids:
        print("\n".join(str(mid) for mid in ids))
    return n


def cmd_consume(args: argparse.Namespace) -> int:
    if args.max < 1 and args.max != -1:
        raise InvalidArgument(f"max: expected >= 1, or -1 for no limit, got {args.max}")
    limit = None if args.max == -1 else args.max
    if args.timeout <= 0:
        raise InvalidArgument(f"timeout: expected > 0 seconds, got {args.timeout}")
    cluster = _attach(args)
    consumer = cluster.subscribe(args.topic, args.subscription, args.type)
    # The idle clock starts once every partition's subscription actor answers: a new
    # subscription's actors start meanwhile (a Ray worker each, slow on a busy machine),
    # then read the topic from its first entry. That wait is not idleness.
    kind = cluster.stats(args.topic, args.subscription)["type"]
    got = 0
    later = ""
    idle_until = time.monotonic() + args.timeout
    try:
        while (limit is None or got < limit) and time.monotonic() < idle_until:
            want = 1_000 if limit is None else min(1_000, limit - got)
            msgs = consumer.receive(max_messages=want, timeout_s=0.5)
            if not msgs:
                continue
            idle_until = time.monotonic() + args.timeout
            for m in msgs:
                print(_message_line(m))
            if args.ack:
                consumer.ack(msgs)
            got += len(msgs)
        if limit is None or got < limit:  # stopped idle: say what is still to come
            later = _not_due_yet(cluster, args.topic, args.subscription, kind)
    finally:
        consumer.close()
    done = f"{_count(got, 'message')}{', acknowledged' if args.ack else ''}"
    print(done + later, file=sys.stderr)
    return 0


def _not_due_yet(cluster: Any, topic: str, subscription: str, kind: str) -> str:
    """ "; N scheduled for later, the next due at T (in S s) ...", when the subscription
    holds messages that are not due yet (a consume that got none knows why), else "".
    Counted by a peek (exact, and without what is cancelled), up to _LATER_COUNTED."""
    from raydelay.subscription_types import spreads

    if not spreads(kind):  # exclusive and failover ignore deliver_at: nothing waits
        return ""
    now_ms = int(time.time() * 1000)
    found = cluster.peek(topic, subscription, limit=_LATER_COUNTED + 1, due_after=now_ms)
    if not found:
        return ""
    many = f"more than {_LATER_COUNTED:,}" if len(found) > _LATER_COUNTED else f"{len(found):,}"
    due_ms = found[0].deliver_at_ms  # (a peek answers in delivery order)
    return (
        f"; {many} scheduled for later, the next due at {_utc(due_ms)} UTC "
        f"(in {max(0, due_ms - now_ms) / 1000:,.0f} s): --timeout SECONDS waits longer"
    )


def _message_line(m: Any) -> str:
    """One message as a tab-separated line: id, deliver_at, key, properties, redelivery
    count, payload."""
    due = (
        datetime.fromtimestamp(m.deliver_at_ms / 1000, timezone.utc).isoformat(
            timespec="milliseconds"
        )
        if m.deliver_at_ms is not None
        else "-"
    )
    props = ",".join(f"{k}={v}" for k, v in sorted((m.properties or {}).items()))
    return (
        f"{m.message_id}\t{due}\t{m.key or '-'}\t{props or '-'}\t"
        f"{m.redelivery_count}\t{m.payload.decode('utf-8', 'replace')}"
    )


def cmd_peek(args: argparse.Namespace) -> int:
    after, before = (
        None if text is None else _deliver_at_arg(text, field)
        for text, field in ((args.due_after, "due_after"), (args.due_before, "due_before"))
    )
    cluster = _attach(args)
    started = time.monotonic()  # (the peek itself, not attaching to Ray)
    found = cluster.peek(
        args.topic,
        args.subscription,
        limit=args.max,
        due_after=after,
        due_before=before,
        key=args.key,
    )
    for m in found:
        print(_message_line(m))
    print(
        f"{_count(len(found), 'scheduled message')} in {time.monotonic() - started:.2f} s",
        file=sys.stderr,
    )
    return 0


def cmd_reset_cursor(args: argparse.Namespace) -> int:
    to: Any = args.to
    if to not in ("earliest", "latest") and "/" not in to:
        to = _deliver_at_arg(to, "to")
    cluster = _attach(args)
    marks = cluster.reset_cursor(args.topic, args.subscription, to)
    for p, md in sorted(marks.items()):
        where = "from its first entry" if md[0] < 0 else f"from {md[0]}:{md[1] + 1} on"
        print(f"{args.topic}/{p}\tdelivers again {where}")
    return 0


def cmd_redrive(args: argparse.Namespace) -> int:
    cluster = _attach(args)
    started = time.monotonic()

    def progress(moved: int) -> None:
        print(f"moved {moved:,} ({time.monotonic() - started:.1f} s)", file=sys.stderr, flush=True)

    moved = cluster.redrive(args.dead_letter_topic, args.to_topic, args.max, progress=progress)
    print(f"{_count(moved, 'message')} sent back from {args.dead_letter_topic}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from raydelay.client.message import MessageId

    ids = [MessageId.parse(t) for t in args.message_ids]
    cluster = _attach(args)
    outcome = cluster.cancel(ids)
    for mid, ok in zip(ids, outcome, strict=True):
        print(f"{mid}\t{'cancelled' if ok else 'delivered already: not cancelled'}")
    return 0 if all(outcome) else 1


# --- stats -------------------------------------------------------------------------------------


def cmd_stats(args: argparse.Namespace) -> int:
    cluster = _attach(args)
    if args.subscription is None:
        info = cluster.stats(args.topic)
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
        print(f"{args.topic} holds {_num(info['held'])} messages (entries of its log)")
        subs = []
        for name in info["subscriptions"]:
            s = cluster.stats(args.topic, name)
            subs.append(
                [name, s["type"]]
                + [s[k] for k in ("delayed", "backlog", "pending_ack", "buckets", "dead_lettered")]
            )
        if subs:
            print()
            heads = ["subscription", "type", "delayed", "backlog", "pending ack", "buckets"]
            print(table([*heads, "dead-lettered"], subs))
        return 0
    s = cluster.stats(args.topic, args.subscription)
    rows = [
        ["type", s["type"]],
        ["delayed", s["delayed"]],
        ["backlog", s["backlog"]],
        ["pending ack", s["pending_ack"]],
        ["buckets", s["buckets"]],
        ["redelivery queue", s["redelivery"]],
        ["dead-lettered (over its life)", s["dead_lettered"]],
        # counters of the actors' current lives: a restart starts them again
        ["delivered (since its actors started)", s["delivered"]],
        ["acked (since its actors started)", s["acked"]],
        ["cancelled (since its actors started)", s["cancelled"]],
    ]
    print(table([f"{args.topic}/{args.subscription}", ""], [[k, _num(v)] for k, v in rows]))
    print()
    if s["consumers"]:
        lease_s = cluster.config.subscription.consumer_lease_s
        consumers = [
            [cid, _num(c["unacked"]), f"{c['lease_age_s']:.1f} s of {lease_s:g} s"]
            for cid, c in sorted(s["consumers"].items())
        ]
        print(table(["consumer", "unacked", "last heard from"], consumers))
    else:
        print("no consumers")
    print()
    hist = cluster.due_histogram(args.topic, args.subscription)
    total = sum(n for _, n in hist) or 1
    print(
        table(
            ["due", "pending", ""],
            [[label, n, "#" * round(30 * n / total)] for label, n in hist],
        )
    )
    return 0


def _num(v: object) -> str:
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)


# --- tasks --------------------------------------------------------------------------------------


def cmd_tasks(args: argparse.Namespace) -> int:
    if args.next < 0:
        raise InvalidArgument(f"next: expected 0 or more, got {args.next}")
    cluster = _attach(args)
    s = cluster.task_stats()
    rows = [
        ["scheduled (waiting for their time or a runner)", s["scheduled"]],
        ["  of which not due yet", s["delayed"]],
        ["running", s["running"]],
        ["succeeded (since the runners started)", s["succeeded"]],
        ["retried (since the runners started)", s["retried"]],
        ["dead-lettered (since the runners started)", s["dead"]],
        ["cron occurrences passed over", s["skipped"]],
        ["runners", s["runners"]],
        ["recurring schedules", s["schedules"]],
    ]
    print(table(["tasks", ""], rows))
    topic = cluster.config.tasks.topic
    if args.next and s["delayed"]:
        from raydelay.client.runner import RUNNERS_SUBSCRIPTION
        from raydelay.tasks.spec import PROP_SCHEDULE, PROP_TASK

        found = cluster.peek(topic, RUNNERS_SUBSCRIPTION, limit=args.next)
        print()
        print(
            table(
                ["task id", "due (UTC)", "calls", "schedule"],
                [
                    [
                        str(m.message_id),
                        _utc(m.deliver_at_ms),
                        m.properties.get(PROP_TASK, "?"),
                        m.properties.get(PROP_SCHEDULE, ""),
                    ]
                    for m in found
                ],
            )
        )
    return 0


def cmd_schedules(args: argparse.Namespace) -> int:
    action = args.action or "list"
    cluster = _attach(args)
    if action == "list":
        rows = [
            [
                s["name"],
                s["cron"],
                s["timezone"],
                s["catch_up"],
                s["target"],
                "paused" if s["paused"] else _utc(s["next_ms"]),
            ]
            for s in cluster.list_schedules()
        ]
        if not rows:
            print("no schedules")
            return 0
        print(table(["name", "cron", "timezone", "catch up", "calls", "next (UTC)"], rows))
        return 0
    if action == "pause":
        cluster.pause_schedule(args.name)
        print(f"{args.name}: paused")
    elif action == "resume":
        s = cluster.resume_schedule(args.name)
        print(f"{args.name}: resumed; next at {_utc(s['next_ms'])} UTC")
    else:
        cluster.delete_schedule(args.name)
        print(f"{args.name}: deleted")
    return 0


def _utc(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


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
    cluster = _attach(args)
    rows = cluster.placement()
    nodes: dict[str, list[dict]] = {}
    for r in rows:
        nodes.setdefault(r["node"] or "-", []).append(r)
    summary = [
        [
            node[:12],
            (rs[0]["address"] or "-") + (" (head)" if rs[0]["head"] else ""),
            sum(r["class"] == "HostActor" for r in rs),
            sum(r.get("partitions", 0) for r in rs if r["class"] == "HostActor"),
            sum(r["class"] == "SubscriptionActor" for r in rs),
            "yes" if any(r["class"] == "CoordinatorActor" for r in rs) else "",
        ]
        for node, rs in sorted(nodes.items())
    ]
    print(
        table(
            ["node", "address", "hosts", "partitions", "subscription actors", "coordinator"],
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
            _serves(r.get("serves", [])),
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
    )
    return 0 if report.ok else 1


def cmd_ingest(args: argparse.Namespace) -> int:
    from raydelay.ingest import ingest_dataframe, read_input, start_spark, stop_spark

    if args.executors < 1:
        raise InvalidArgument(f"executors: expected >= 1, got {args.executors}")
    if not Path(args.input).exists() and "://" not in args.input:
        raise InvalidArgument(f"input: {args.input!r} does not exist")
    cluster = _attach(args)
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
        ingest_dataframe(
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
