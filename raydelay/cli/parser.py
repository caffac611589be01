"""The ``raydelay`` command's arguments: one subcommand each, bound to its function."""

from __future__ import annotations

import argparse
import os

from raydelay import __version__
from raydelay.cli.http import cmd_serve, cmd_tokens
from raydelay.cli.local import (
    cmd_console,
    cmd_demo,
    cmd_down,
    cmd_ingest,
    cmd_placement,
    cmd_topics_create,
    cmd_topics_delete,
    cmd_topics_list,
    cmd_up,
)
from raydelay.cli.messages import (
    cmd_cancel,
    cmd_consume,
    cmd_peek,
    cmd_produce,
    cmd_redrive,
    cmd_reset_cursor,
)
from raydelay.cli.output import PAYLOAD_FORMATS, Exit
from raydelay.cli.reports import (
    cmd_completion,
    cmd_schedules,
    cmd_stats,
    cmd_tasks,
)

CONFIG_ENV = "RAYDELAY_CONFIG"


def _global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The options every command takes, before or after its name. On a subcommand they
    default to SUPPRESS, so that ``raydelay --json stats t`` is not undone by the
    subcommand's own default."""

    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    group = parser.add_argument_group("global options")
    group.add_argument(
        "--config",
        default=default(os.environ.get(CONFIG_ENV) or None),
        help=f"a config TOML (default: ${CONFIG_ENV}, else the embedded default)",
    )
    group.add_argument(
        "--address",
        default=default(None),
        help="the Ray cluster to attach to (default: $RAYDELAY_ADDRESS, else the local one)",
    )
    group.add_argument(
        "-v", "--verbose", action="store_true", default=default(False), help="log at INFO level"
    )
    group.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="print JSON: one object, or one per message (JSON Lines)",
    )
    group.add_argument(
        "--payload-format",
        choices=PAYLOAD_FORMATS,
        default=default("auto"),
        help="how payloads are shown: auto (text when it is UTF-8 text, else base64; the "
        "default), text, base64 or hex",
    )


def _on_every_subcommand(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:  # argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # (aliases repeat a parser)
                _global_options(sub, top=False)
                _on_every_subcommand(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raydelay", description="raydelay: delayed and scheduled messages, durably, on Ray."
    )
    parser.add_argument("--version", action="version", version=f"raydelay {__version__}")
    _global_options(parser, top=True)
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
    topics.set_defaults(func=lambda args: usage(topics))

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
    produce.add_argument(
        "--key",
        help="the messages' key: a message scheduled for later is its key's while pending "
        "(see --on-duplicate)",
    )
    produce.add_argument(
        "--on-duplicate",
        choices=("ignore", "replace", "error", "allow"),
        default="ignore",
        help="what a keyed message scheduled for later does when one is pending under its "
        "key: ignore it (default), replace that one, refuse (exit 5, nothing sent), or allow "
        "it beside that one (the key only routes)",
    )
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
        help="cancel scheduled messages by id, or by key",
        description="Cancel messages by id (topic/partition/ledger:entry, as produce --ids "
        "prints them), or the messages scheduled under keys: --topic T --key K [--key K2].",
    )
    cancel.add_argument("message_ids", nargs="*", metavar="MESSAGE_ID")
    cancel.add_argument("--topic", help="the topic of the keys (with --key)")
    cancel.add_argument(
        "--key", action="append", default=[], dest="keys", help="a key to cancel (repeatable)"
    )
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
    tsub = tasks.add_subparsers(dest="action", metavar="ACTION")
    status = tsub.add_parser(
        "status",
        help="what became of one call: scheduled, running, failed, succeeded, dead, cancelled",
        description="The status of a scheduled call (cluster.task_status): its attempts, "
        "last error, next try, and whether a result was kept. Exit status 0; an id that is "
        "no call is an error.",
    )
    status.add_argument("task_id", help="the id cluster.schedule returned (topic/p/ledger:entry)")
    tasks.set_defaults(func=cmd_tasks)

    schedules = sub.add_parser(
        "schedules",
        help="recurring schedules (cluster.schedule_cron): list, add, pause, resume, "
        "delete, trigger, backfill",
    )
    ssub = schedules.add_subparsers(dest="action", metavar="ACTION")
    ssub.add_parser("list", help="the schedules, with their next occurrence")
    add = ssub.add_parser(
        "add",
        help="create a schedule of a function the runners can import",
        description="Create the recurring schedule NAME (cluster.schedule_cron): call the "
        "function CALL (module:function, importable here and on the cluster) with --args "
        "and --kwargs (JSON) at every occurrence of --cron. Times are ISO-8601 with a zone, "
        "or epoch ms.",
    )
    add.add_argument("name")
    add.add_argument("--cron", required=True, help="5 fields, or 6 with seconds last")
    add.add_argument("--call", required=True, help="module:function")
    add.add_argument("--args", default="[]", help="a JSON list of positional arguments")
    add.add_argument("--kwargs", default="{}", help="a JSON object of keyword arguments")
    add.add_argument("--timezone", default="UTC", help="an IANA zone (default UTC)")
    add.add_argument(
        "--catch-up", default="latest", choices=("all", "latest", "none"),
        help="what runs of the occurrences missed while the cluster was down (default latest)",
    )  # fmt: skip
    add.add_argument(
        "--overlap", default="allow_all", choices=("allow_all", "skip", "buffer_one"),
        help="an occurrence that fires while the one before runs: run beside it (default), "
        "skip, or wait for it (one at most)",
    )  # fmt: skip
    add.add_argument("--start-at", help="no occurrence before this time")
    add.add_argument("--end-at", help="no occurrence after this time")
    add.add_argument(
        "--jitter-s", type=float, default=0.0, help="each occurrence due up to this much later"
    )
    add.add_argument(
        "--max-retries", type=int, default=3, help="retries of a failed run (-1: no limit)"
    )
    add.add_argument(
        "--backoff", type=float, default=1.0, help="seconds before the first retry, doubling"
    )
    add.add_argument("--timeout-s", type=float, help="a run that lasts longer is cancelled")
    add.add_argument("--options", default="{}", help="Ray options, a JSON object (num_cpus, ...)")
    add.add_argument("--replace", action="store_true", help="replace a schedule of that name")
    trigger = ssub.add_parser("trigger", help="run a schedule's call once now, outside its chain")
    trigger.add_argument("name")
    backfill = ssub.add_parser(
        "backfill", help="run now every occurrence of a schedule in a past window"
    )
    backfill.add_argument("name")
    backfill.add_argument("start", help="ISO-8601 with a zone, or epoch ms")
    backfill.add_argument("end", help="ISO-8601 with a zone, or epoch ms (not in the future)")
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

    api = sub.add_parser(
        "serve",
        help="start the HTTP API on Ray Serve (docs/http.md), or stop it",
        description="Start the HTTP API (produce, cancel, read, schedules; bearer tokens "
        "made by `raydelay tokens`) as a Ray Serve application of the cluster, wait until "
        "it answers, and return: it runs in the cluster until `raydelay serve --stop`. "
        "The options override the config's [http] table.",
    )
    api.add_argument("--host", default=None, help="where Serve's proxy listens (http.host)")
    api.add_argument("--port", type=int, default=None, help="its port (http.port, default 8643)")
    api.add_argument("--replicas", type=int, default=None, help="API replicas (http.replicas)")
    api.add_argument("--stop", action="store_true", help="remove the HTTP API from Serve")
    api.set_defaults(func=cmd_serve)

    tokens = sub.add_parser(
        "tokens",
        help="the HTTP API's bearer tokens: create, list, revoke",
        description="Tokens of the HTTP API, stored hashed in the cluster's store. A token "
        "is shown once, when it is made.",
    )
    toks = tokens.add_subparsers(dest="action", metavar="ACTION")
    tcreate = toks.add_parser("create", help="make a token (printed once)")
    tcreate.add_argument("name", help="a name for it ([A-Za-z0-9._@-], unique)")
    tcreate.add_argument(
        "--scope",
        action="append",
        choices=["produce", "cancel", "read", "admin"],
        help="what it may do (repeat for more; admin: everything)",
    )
    tcreate.add_argument(
        "--rate",
        type=float,
        default=None,
        help="requests/s on each replica (default http.default_rate_per_s; -1: no limit)",
    )
    toks.add_parser("list", help="the tokens (never the tokens themselves)")
    trevoke = toks.add_parser("revoke", help="revoke a token by name or id")
    trevoke.add_argument("name")
    tokens.set_defaults(func=cmd_tokens, action="list")

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

    completion = sub.add_parser(
        "completion",
        help="print the shell completion script (bash, zsh or fish)",
        description="Print a script that completes raydelay's commands and options in your "
        'shell: add `eval "$(raydelay completion bash)"` to ~/.bashrc (zsh: `eval "$(raydelay '
        'completion zsh)"` in ~/.zshrc; fish: `raydelay completion fish | source`).',
    )
    completion.add_argument("shell", choices=("bash", "zsh", "fish"))
    completion.set_defaults(func=cmd_completion)
    _on_every_subcommand(parser)
    return parser


def usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return Exit.USAGE
