"""The ``raydelay`` command against the session's Ray: topics, produce, stats, cancel,
consume, delete; one-line errors; and ``ingest`` from CSV through a plain local Spark."""

from __future__ import annotations

import base64
import json
import re
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import ray

from raydelay.cli import Exit, main
from tests.integration.helpers import host_of, unit_host_of, wait_until

RAYDELAY = [sys.executable, "-m", "raydelay.cli"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, _without_ray_logs(captured.out), _without_ray_logs(captured.err)


def _without_ray_logs(text: str) -> str:
    """The CLI's own output: Ray forwards its workers' log lines (a warning about how many
    worker processes the session started, say) to this process's streams as well."""
    return "".join(line for line in text.splitlines(keepends=True) if not RAY_LOG.match(line))


RAY_LOG = re.compile(r"(\x1b\[\d+m)?\((raylet|\w+ pid=\d+)")


def command(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """The ``raydelay`` command in a process of its own, attached to the session's Ray."""
    address = ray.get_runtime_context().gcs_address
    return subprocess.run(
        [*RAYDELAY, "--address", address, *argv],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_topic_from_create_to_delete(cluster, topic_name, capsys, tmp_path):
    # Given a topic made with the CLI
    assert run(capsys, "topics", "create", topic_name, "-p", "2")[0] == 0
    code, out, _ = run(capsys, "topics", "list")
    assert code == 0 and topic_name in out
    cluster.subscribe(topic_name, "audit")  # exists before anything is produced
    # When lines are produced: 3 due in a minute or so, 2 due tomorrow, 1 now
    soon = tmp_path / "soon.txt"
    soon.write_text("a\nb\nc\n")
    code, out, err = run(capsys, "produce", topic_name, str(soon), "--deliver-after", "45", "--ids")
    assert code == 0 and "produced 3 messages" in err
    ids = out.split()
    assert len(ids) == 3 and all(i.startswith(f"{topic_name}/") for i in ids)
    later = tmp_path / "later.txt"
    later.write_text("x\ny\n")
    assert run(capsys, "produce", topic_name, str(later), "--deliver-after", "86000")[0] == 0
    now = tmp_path / "now.txt"
    now.write_text("hello\n")
    assert run(capsys, "produce", topic_name, str(now), "--key", "k1", "--property", "a=b")[0] == 0
    # Then stats shows the pending messages by due window
    code, out, _ = run(capsys, "stats", topic_name, "audit")
    assert code == 0
    counts = {}
    for line in out.splitlines():
        parts = line.split()
        if line.startswith("<= "):
            counts[f"<={parts[1]}"] = int(parts[2])
        elif line.startswith("later"):
            counts["later"] = int(parts[1])
    assert counts == {"<=1m": 3, "<=1h": 0, "<=1d": 2, "later": 0}
    # and the consumers with what they hold and when they were last heard from, and counts
    # that say they start again with the actors
    assert "last heard from" in out and " s of 10 s" in out
    assert "delivered (since its units were opened)" in out
    # and peek shows the five scheduled ones in the order they will go out, due first
    code, out, err = run(capsys, "peek", topic_name, "audit")
    assert code == 0 and "5 scheduled messages in " in err
    lines = [line.split("\t") for line in out.strip().splitlines()]
    assert [x[0] for x in lines[:3]] == ids and [x[-1] for x in lines] == list("abcxy")
    code, out, _ = run(capsys, "peek", topic_name, "audit", "-n", "2")
    assert code == 0 and [x.split("\t")[-1] for x in out.strip().splitlines()] == ["a", "b"]
    tomorrow = lines[3][1]  # (the ISO time peek printed is what --due-after takes)
    code, out, _ = run(capsys, "peek", topic_name, "audit", "--due-after", tomorrow)
    assert code == 0 and [x.split("\t")[-1] for x in out.strip().splitlines()] == ["x", "y"]
    # When one of the soon ones is cancelled
    code, out, _ = run(capsys, "cancel", ids[0])
    assert code == 0 and out.strip() == f"{ids[0]}\tcancelled"
    # Then peek no longer shows it
    code, out, _ = run(capsys, "peek", topic_name, "audit", "-n", "-1")
    assert code == 0 and [x.split("\t")[-1] for x in out.strip().splitlines()] == list("bcxy")
    # and reset-cursor says it needs the consumers gone, then replays from the earliest
    code, out, err = run(capsys, "reset-cursor", topic_name, "audit", "earliest")
    assert code == 2 and "has 1 consumer" in err
    for c in list(cluster._consumers):
        c.close()
    code, out, _ = run(capsys, "reset-cursor", topic_name, "audit", "earliest")
    assert code == 0 and out.splitlines() == [
        f"{topic_name}/{p}\tdelivers again from its first entry" for p in (0, 1)
    ]
    # Then consuming (with no limit on the count) gets the immediate message only, and acks it
    code, out, err = run(
        capsys, "consume", topic_name, "audit", "--ack", "--timeout", "1", "-n", "-1"
    )
    assert code == 0
    lines = out.strip().splitlines()
    # (id, due, key, properties, redelivery_count, payload)
    assert len(lines) == 1 and lines[0].split("\t")[1:] == ["-", "k1", "a=b", "0", "hello"]
    assert "1 message, acknowledged" in err
    # and the topic's table lists the subscription
    code, out, _ = run(capsys, "stats", topic_name)
    assert code == 0 and "audit" in out
    # When it is deleted: only with --force, since it has a subscription
    code, _, err = run(capsys, "topics", "delete", topic_name)
    assert code == 2 and "--force" in err
    code, out, _ = run(capsys, "topics", "delete", topic_name, "--force")
    assert code == 0 and "deleted" in out
    assert topic_name not in cluster.topics()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["cancel", "not-an-id"], "message_id: 'not-an-id' is not topic/partition/ledger:entry"),
        (["produce", "t", "/no/such/file"], "file: cannot read '/no/such/file'"),
        (["produce", "t", "--deliver-at", "2030-01-01T10:00:00"], "has no time zone"),
        (["consume", "t", "s", "-n", "0"], "max: expected >= 1, or -1 for no limit, got 0"),
        (["peek", "t", "s", "--due-after", "2030-01-01T10:00"], "due_after: '2030-01-01T10:00'"),
        (["peek", "t", "s", "--due-before", "soon"], "due_before: 'soon' is not an ISO-8601"),
        (["reset-cursor", "t", "s", "2030-01-01T10:00"], "to: '2030-01-01T10:00' has no time zone"),
        (["ingest", "/no/such.parquet", "--topic", "t", "--payload-col", "p"], "does not exist"),
    ],
)
def test_user_mistakes_print_one_line_and_exit_2(argv, message):
    result = subprocess.run([*RAYDELAY, *argv], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("raydelay: error: ")
    assert message in lines[0]


def test_an_address_where_nothing_listens_is_one_line_at_once():
    # Given a port nothing listens on (Ray would retry there for minutes)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Then the command says so at once, in one line
    result = subprocess.run(
        [*RAYDELAY, "--address", f"127.0.0.1:{port}", "topics", "list"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == Exit.UNAVAILABLE == 4
    assert result.stderr.strip().splitlines() == [
        f"raydelay: error: address: no Ray cluster is running at '127.0.0.1:{port}' "
        "(nothing listens)"
    ]


def test_produce_stops_at_an_oversize_line_and_says_how_much_was_sent(
    cluster, topic_name, capsys, tmp_path
):
    cluster.create_topic(topic_name)
    limit = cluster.config.topic.max_message_bytes
    lines = tmp_path / "lines.txt"
    lines.write_bytes(b"one\ntwo\n" + b"x" * (limit + 1) + b"\nfour\n")
    code, _, err = run(capsys, "produce", topic_name, str(lines))
    assert code == 2
    assert "line 3: " in err and "after sending 2 messages (lines 1-2)" in err
    assert sum(p["entries"] for p in cluster.stats(topic_name)["partitions"]) == 2


def test_produce_stopped_at_its_first_line_says_nothing_was_sent(
    cluster, topic_name, capsys, tmp_path
):
    cluster.create_topic(topic_name)
    limit = cluster.config.topic.max_message_bytes
    lines = tmp_path / "lines.txt"
    lines.write_bytes(b"x" * (limit + 1) + b"\ntwo\n")
    code, _, err = run(capsys, "produce", topic_name, str(lines))
    assert code == 2
    assert err.strip().splitlines() == [
        f"raydelay: error: line 1: {limit + 1:,} bytes is over topic.max_message_bytes "
        f"({limit:,}); stopped there, nothing sent"
    ]
    assert cluster.stats(topic_name)["partitions"][0]["tail"] is None


def test_produce_of_no_lines_says_so(cluster, topic_name, capsys, tmp_path):
    cluster.create_topic(topic_name)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    code, _, err = run(capsys, "produce", topic_name, str(empty))
    assert code == 0
    assert err.strip() == f"produced 0 messages to {topic_name} ({empty} has no lines)"


def test_the_first_consume_of_a_new_subscription_gets_what_is_due(
    cluster, topic_name, capsys, tmp_path
):
    # Given lines produced due at once, by the command in a process of its own, to a topic
    # that has no subscription yet
    assert run(capsys, "topics", "create", topic_name, "-p", "3")[0] == 0
    lines = "".join(f"{i}\n" for i in range(1, 1000))
    produced = command("produce", topic_name, stdin=lines)
    assert produced.returncode == 0, produced.stderr
    # When a new subscription consumes right after (it starts at the topic's first entry)
    consumed = command("consume", topic_name, "first", "--ack", "-n", "999")
    # Then it gets every one of them, and the command's output is its own (no Ray log lines)
    assert consumed.returncode == 0, consumed.stderr
    got = sorted(int(line.split("\t")[-1]) for line in consumed.stdout.splitlines())
    assert got == list(range(1, 1000))
    assert consumed.stderr.strip() == "999 messages, acknowledged"
    # When four more are produced due in ten minutes, one of them is cancelled, and the
    # subscription holds the other three
    later = tmp_path / "later.txt"
    later.write_text("a\nb\nc\nd\n")
    code, out, _ = run(capsys, "produce", topic_name, str(later), "--deliver-after", "600", "--ids")
    assert code == 0
    assert run(capsys, "cancel", out.split()[0])[0] == 0
    wait_until(
        "the three scheduled in the subscription",
        lambda: len(cluster.peek(topic_name, "first", limit=-1)) == 3,
    )
    # Then a consume finds nothing due (the acks of the first one held, as that process
    # left) and says what is scheduled, and when the next is due
    code, out, err = run(capsys, "consume", topic_name, "first", "--timeout", "1", "-n", "-1")
    assert code == 0 and out == ""
    due_ms = min(m.deliver_at_ms for m in cluster.peek(topic_name, "first", limit=-1))
    due = datetime.fromtimestamp(due_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
    assert err.startswith(f"0 messages; 3 scheduled for later, the next due at {due} UTC (in ")
    assert err.rstrip().endswith(" min): --timeout SECONDS waits longer") or err.rstrip().endswith(
        " s): --timeout SECONDS waits longer"
    )
    assert " min" in err  # (600 s ahead, said in minutes)


def test_an_absurd_delay_is_one_line_and_nothing_is_sent(cluster, topic_name, capsys, tmp_path):
    cluster.create_topic(topic_name)
    lines = tmp_path / "lines.txt"
    lines.write_text("a\n")
    code, _, err = run(capsys, "produce", topic_name, str(lines), "--deliver-after", "1e300")
    assert code == 2
    assert err.strip().splitlines() == [
        "raydelay: error: deliver_after: 1e+300 s from now is after year 9999"
    ]
    assert cluster.stats(topic_name)["partitions"][0]["tail"] is None


def test_stats_into_a_closed_pipe_ends_quietly(cluster, topic_name):
    # `raydelay stats ... | head`: the reader is gone before the table is written
    cluster.create_topic(topic_name, partitions=3)
    address = ray.get_runtime_context().gcs_address
    proc = subprocess.Popen(
        [*RAYDELAY, "--address", address, "stats", topic_name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_an_unknown_topic_is_one_line(cluster, capsys):
    code, _, err = run(capsys, "stats", "no-such-topic")
    assert code == Exit.NOT_FOUND == 3
    assert err.strip() == "raydelay: error: topic 'no-such-topic' does not exist"


def test_every_command_has_help():
    for argv in (
        ["--help"],
        ["ingest", "--help"],
        ["stats", "--help"],
        ["topics", "create", "--help"],
    ):
        result = subprocess.run([*RAYDELAY, *argv], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and result.stdout.startswith("usage: raydelay")


def test_ingest_a_csv_through_a_plain_local_spark(cluster, topic_name, tmp_path):
    # Given a CSV with a bad row, and a topic
    cluster.create_topic(topic_name, partitions=2)
    csv = tmp_path / "orders.csv"
    rows = ["order_id,body,delay"] + [f"o{i},timeout {i},{i % 5}" for i in range(500)]
    rows.append("o-bad,negative,-3")
    csv.write_text("\n".join(rows) + "\n")
    rejects = tmp_path / "rejects"
    # When the CLI ingests it with Spark local[2], its workers attaching to this Ray
    address = ray.get_runtime_context().gcs_address
    result = subprocess.run(
        [
            *RAYDELAY,
            "--address",
            address,
            "ingest",
            str(csv),
            "--topic",
            topic_name,
            "--payload-col",
            "body",
            "--delay-col",
            "delay",
            "--key-col",
            "order_id",
            "--reject-path",
            str(rejects),
            "--spark-master",
            "local[2]",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    # Then it loaded the good rows, counted the bad one and wrote it out
    assert result.returncode == 0, result.stderr[-2000:]
    assert "accepted" in result.stderr and "delay: negative" in result.stderr
    entries = sum(p["entries"] for p in cluster.stats(topic_name)["partitions"])
    assert entries == 500
    import pyarrow.parquet as pq

    bad = pq.read_table(rejects).to_pylist()
    assert [(r["order_id"], r["reject_reason"]) for r in bad] == [("o-bad", "delay: negative")]


def test_placement_lists_every_actor_with_its_node(cluster, topic_name, capsys):
    cluster.create_topic(topic_name, partitions=2)
    cluster.subscribe(topic_name, "s")
    code, out, _ = run(capsys, "placement")
    assert code == 0
    node = ray.get_runtime_context().get_node_id()
    # one node here: it holds the coordinator, the hosts of this topic's partitions and the
    # subscription host of its unit (the table of nodes counts the whole session's actors, so it is
    # checked per actor), and each says what it serves
    assert f"{node[:12]}" in out and "coordinator" in out
    serves = {r["name"]: r["serves"] for r in cluster.placement()}
    for p in (0, 1):
        host = host_of(topic_name, p)
        line = next(ln for ln in out.splitlines() if ln.startswith(host))
        assert node[:12] in line and "alive" in line, line
        assert f"{topic_name}/{p}" in serves[host]  # (the table shows the first few)
    line = next(ln for ln in out.splitlines() if ln.startswith(unit_host_of(topic_name, "s")))
    assert node[:12] in line and "alive" in line, line
    assert f"{topic_name}/s/0" in line and f"{topic_name}/s/1" in line, line


def test_a_script_reads_every_answer_as_json(cluster, topic_name, capsys, tmp_path):
    # Given a topic made, and lines produced, with --json (before or after the command)
    code, out, _ = run(capsys, "--json", "topics", "create", topic_name, "-p", "2")
    assert code == 0 and json.loads(out) == {"topic": topic_name, "partitions": 2}
    lines = tmp_path / "lines.bin"
    lines.write_bytes(b"plain text\n\xff\xfe binary\nwith\ttab\n")
    code, out, _ = run(
        capsys, "produce", topic_name, str(lines), "--deliver-after", "3600", "--ids", "--json"
    )
    ids = [json.loads(line)["message_id"] for line in out.splitlines()]
    assert code == 0 and len(ids) == 3
    cluster.subscribe(topic_name, "audit")
    # Then peek gives one JSON object per message, payloads without loss
    code, out, _ = run(capsys, "peek", topic_name, "audit", "--json")
    docs = {d["message_id"]: d for d in map(json.loads, out.splitlines())}
    assert code == 0 and set(docs) == set(ids)
    payloads = {
        base64.b64decode(d["payload"]) if d["payload_encoding"] == "base64" else d["payload"]
        for d in docs.values()
    }
    assert payloads == {"plain text", b"\xff\xfe binary", b"with\ttab"}
    # and stats, topics list and tasks are one JSON object each
    code, out, _ = run(capsys, "stats", topic_name, "audit", "--json")
    stats = json.loads(out)
    assert code == 0 and stats["delayed"] == 3 and stats["type"] == "shared"
    assert sum(d["pending"] for d in stats["due"]) == 3
    code, out, _ = run(capsys, "stats", topic_name, "--json")
    assert json.loads(out)["subscription_stats"]["audit"]["delayed"] == 3
    code, out, _ = run(capsys, "topics", "list", "--json")
    mine = [t for t in json.loads(out)["topics"] if t["topic"] == topic_name]
    assert mine == [{"topic": topic_name, "partitions": 2, "subscriptions": ["audit"]}]
    code, out, _ = run(capsys, "tasks", "--json")
    assert code == 0 and {"scheduled", "running", "next"} <= set(json.loads(out))
    # A cancel says what it did; one that came too late exits "refused"
    code, out, _ = run(capsys, "cancel", ids[0], "--json")
    assert code == 0 and json.loads(out) == {"results": [{"message_id": ids[0], "cancelled": True}]}
    code, out, _ = run(capsys, "cancel", ids[0], ids[1], "--json")
    assert code == Exit.REFUSED == 5
    assert [r["cancelled"] for r in json.loads(out)["results"]] == [False, True]
