"""The ``raydelay`` commands on messages: produce, consume, peek, cancel, redrive and reset-cursor."""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

from raydelay.cli.attach import attach
from raydelay.cli.output import Exit, dumps, emit, print_message, wants_json
from raydelay.cli.reports import utc_text
from raydelay.errors import InvalidArgument

_BATCH = 10_000  # lines per send_many in ``produce``
# How many messages not due yet a ``consume`` that stops idle counts, at most (a peek)
_LATER_COUNTED = 10_000


# --- produce / consume / cancel ----------------------------------------------------------------


def instant_arg(text: str, field: str = "deliver_at") -> int:
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
    deliver_at = instant_arg(args.deliver_at) if args.deliver_at is not None else None
    props = _properties_arg(args.property)
    if args.file == "-":
        stream = sys.stdin.buffer
    else:
        try:
            stream = open(args.file, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise InvalidArgument(f"file: cannot read {args.file!r}: {exc.strerror}") from None
    cluster = attach(args)
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
    if wants_json(args) and not args.ids:
        print(dumps({"topic": args.topic, "produced": sent}))
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
        on_duplicate=args.on_duplicate,
    )
    if args.ids and wants_json(args):
        print("\n".join(dumps({"message_id": str(mid)}) for mid in ids))
    elif args.ids:
        print("\n".join(str(mid) for mid in ids))
    return n


def cmd_consume(args: argparse.Namespace) -> int:
    if args.max < 1 and args.max != -1:
        raise InvalidArgument(f"max: expected >= 1, or -1 for no limit, got {args.max}")
    limit = None if args.max == -1 else args.max
    if not math.isfinite(args.timeout) or args.timeout <= 0:
        raise InvalidArgument(
            f"timeout: expected a finite number of seconds > 0, got {args.timeout}"
        )
    cluster = attach(args)
    consumer = cluster.subscribe(args.topic, args.subscription, args.type)
    # The idle clock starts once every partition's subscription unit answers: a new
    # subscription's units open meanwhile (and a subscription host may start: a Ray worker,
    # slow on a busy machine), then read the topic from its first entry. That wait is not
    # idleness.
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
                print_message(args, m)
            if args.ack:
                consumer.ack(msgs)
            got += len(msgs)
        if limit is None or got < limit:  # stopped idle: say what is still to come
            later = _not_due_yet(cluster, args.topic, args.subscription, kind)
    finally:
        consumer.close()
    done = f"{_count(got, 'message')}{', acknowledged' if args.ack and got else ''}"
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
        f"; {many} scheduled for later, the next due at {utc_text(due_ms)} UTC "
        f"(in {duration_text(max(0, due_ms - now_ms) / 1000)}): --timeout SECONDS waits longer"
    )


def duration_text(seconds: float) -> str:
    """A wait as a reader says it: "42 s", "58 min 35 s", "3 h 5 min", "2 d 4 h"."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"
    if s < 86400:
        m = s // 60
        return f"{m // 60} h {m % 60} min" if m % 60 else f"{m // 60} h"
    h = s // 3600
    return f"{h // 24:,} d {h % 24} h" if h % 24 else f"{h // 24:,} d"


def cmd_peek(args: argparse.Namespace) -> int:
    after, before = (
        None if text is None else instant_arg(text, field)
        for text, field in ((args.due_after, "due_after"), (args.due_before, "due_before"))
    )
    cluster = attach(args)
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
        print_message(args, m)
    print(
        f"{_count(len(found), 'scheduled message')} in {time.monotonic() - started:.2f} s",
        file=sys.stderr,
    )
    return 0


def cmd_reset_cursor(args: argparse.Namespace) -> int:
    to: Any = args.to
    if to not in ("earliest", "latest") and "/" not in to:
        to = instant_arg(to, "to")
    cluster = attach(args)
    marks = cluster.reset_cursor(args.topic, args.subscription, to)
    doc = {
        "topic": args.topic,
        "subscription": args.subscription,
        # per partition, the first entry delivered again (None: from the partition's start)
        "delivers_from": {
            p: None if md[0] < 0 else f"{md[0]}:{md[1] + 1}" for p, md in marks.items()
        },
    }

    def text() -> str:
        lines = []
        for p, md in sorted(marks.items()):
            where = "from its first entry" if md[0] < 0 else f"from {md[0]}:{md[1] + 1} on"
            lines.append(f"{args.topic}/{p}\tdelivers again {where}")
        return "\n".join(lines)

    emit(args, doc, text)
    return 0


def cmd_redrive(args: argparse.Namespace) -> int:
    cluster = attach(args)
    started = time.monotonic()

    def progress(moved: int) -> None:
        print(f"moved {moved:,} ({time.monotonic() - started:.1f} s)", file=sys.stderr, flush=True)

    moved = cluster.redrive(args.dead_letter_topic, args.to_topic, args.max, progress=progress)
    emit(
        args,
        {"dead_letter_topic": args.dead_letter_topic, "to": args.to_topic, "moved": moved},
        f"{_count(moved, 'message')} sent back from {args.dead_letter_topic}",
    )
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from raydelay.client.message import MessageId

    if args.keys or args.topic is not None:
        return _cancel_keys(args)
    if not args.message_ids:
        raise InvalidArgument("message_ids: give message ids, or --topic T --key K")
    ids = [MessageId.parse(t) for t in args.message_ids]
    cluster = attach(args)
    outcome = cluster.cancel(ids)
    pairs = list(zip(ids, outcome, strict=True))
    emit(
        args,
        {"results": [{"message_id": str(mid), "cancelled": bool(ok)} for mid, ok in pairs]},
        lambda: "\n".join(
            f"{mid}\t{'cancelled' if ok else 'not cancelled: delivered already, or cancelled before'}"
            for mid, ok in pairs
        ),
    )
    return Exit.OK if all(outcome) else Exit.REFUSED


def _cancel_keys(args: argparse.Namespace) -> int:
    """``raydelay cancel --topic T --key K ...``: the messages scheduled under the keys."""
    if args.message_ids:
        raise InvalidArgument("message_ids: give ids, or --topic and --key, not both")
    if args.topic is None or not args.keys:
        raise InvalidArgument("--key: a cancel by key needs --topic and at least one --key")
    outcome = attach(args).cancel(args.topic, keys=list(args.keys))
    pairs = list(zip(args.keys, outcome, strict=True))
    emit(
        args,
        {"results": [{"key": k, "cancelled": bool(ok)} for k, ok in pairs]},
        lambda: "\n".join(
            f"{k}\t{'cancelled' if ok else 'not cancelled: nothing scheduled under it'}"
            for k, ok in pairs
        ),
    )
    return Exit.OK if all(outcome) else Exit.REFUSED
