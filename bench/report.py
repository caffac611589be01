"""The report of ``bench/compare.py``: one markdown table of every figure with its
conditions, the ratio to each peer and the target, plus the PNG plots."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no screen here
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from raydelay.accounting import Lateness  # noqa: E402
from raydelay.dispatch import stages  # noqa: E402

NAMES = {"raydelay": "raydelay", "redis": "Redis sorted set", "heapq": "heapq"}
COLORS = {"raydelay": "tab:blue", "redis": "tab:red", "heapq": "tab:gray"}
MIB = 2**20


def _num(x, fmt: str = ",.0f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _ratio(a, b) -> str:
    return "n/a" if a is None or b in (None, 0) else f"{a / b:.2f}x"


def _get(results: dict, peer: str, *path):
    node = results["peers"].get(peer)
    for p in path:
        if node is None:
            return None
        node = node.get(p) if isinstance(node, dict) else None
    return node


def _memory_row(results: dict, peer: str, sent: int) -> dict | None:
    for row in _get(results, peer, "memory") or []:
        if row["sent"] == sent and not row.get("skipped"):
            return row
    return None


def without_samples(results: dict) -> dict:
    """The results without per-message arrays (lateness) and with curves thinned."""

    def strip(node):
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "lates"}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    out = strip(results)
    for peer in out["peers"].values():
        for key in ("burst", "burst_10k", "burst_receive"):
            burst = peer.get(key)
            if burst and len(burst["curve"]) > 200:
                burst["curve"] = burst["curve"][:: len(burst["curve"]) // 200 + 1]
    return out


PEERS = ("raydelay", "redis", "heapq")


def _line(scenario, figure, conditions, vals, fmt=",.0f", target="", ratios=True, text=None):
    """One table row from each peer's value (missing: n/a): the values, then raydelay's
    ratio to Redis and to heapq. ``text`` puts words in a peer's cell (and no ratio)."""
    text = text or {}
    cells = [text.get(p, _num(vals.get(p), fmt)) for p in PEERS]
    rat = [
        _ratio(vals.get("raydelay"), vals.get(p)) if ratios and p not in text else ""
        for p in PEERS[1:]
    ]
    return (scenario, figure, conditions, *cells, *rat, target)


def rows(results: dict) -> list[tuple]:
    """(scenario, figure, conditions, raydelay, redis, heapq, vs redis, vs heapq, target)."""
    plan = results["plan"]
    n = plan["ingest"]

    def each(*path) -> dict:
        return {p: _get(results, p, *path) for p in PEERS}

    durable = each("ingest", "durable_rate") | {
        "heapq": _get(results, "heapq", "ingest", "acked_rate")
    }
    disk = {p: _per(v, n) for p, v in each("ingest", "disk_bytes").items()}
    out = [
        _line("1 ingest", "msg/s until durable",
              f"{n:,} msgs, 100 B, due uniform over 1 h; raydelay: send_many x5000, 4 threads, "
              "4 partitions, fsync per write; Redis: ZADD pipelined, 4 threads, AOF everysec "
              "(+1 s for the last fsync); heapq: in memory, never durable",
              durable, target=">= 1.2x Redis (goal 1.5x)"),
        _line("1 ingest", "msg/s acknowledged", "as above; Redis replies before its fsync",
              each("ingest", "acked_rate")),
        _line("1 ingest", "disk bytes per message", "raydelay: store directory; Redis: appendonlydir",
              disk, ",.1f", text={"heapq": "0 (nothing kept)"}),
    ]  # fmt: skip
    for sent in plan["memory"]:
        at = f"at {sent / 1e6:g}M"
        mem = {p: _memory_row(results, p, sent) for p in PEERS}
        held = {p: r and r["memory_bytes"] for p, r in mem.items()}
        out += [
            _line("2 memory", f"bytes per pending message {at}",
                  "raydelay: RSS of the topic + subscription actor (1 partition), after the "
                  "log is read in; Redis: used_memory; heapq: process RSS",
                  {p: r and _per(r["memory_bytes"], r["pending"]) for p, r in mem.items()},
                  ",.1f", target="<= 0.1x Redis" if sent == 10_000_000 else ""),
            _line("2 memory", f"bytes per pending message above the idle baseline {at}",
                  "the same, less what the empty actors / server / interpreter held",
                  {p: r and _per(r["memory_bytes"] - r["baseline_bytes"], r["pending"])
                   for p, r in mem.items()}, ",.1f"),
            _line("2 memory", f"MiB in memory {at}",
                  "pending = sent - consumed at the moment of measuring",
                  {p: v and v / MIB for p, v in held.items()}, ratios=False),
            _line("2 memory", f"disk bytes per pending message {at}",
                  "raydelay: store directory; Redis: AOF",
                  {p: r and _per(r["disk_bytes"], r.get("stored", r["pending"]))
                   for p, r in mem.items()}, ",.1f", text={"heapq": "0"}),
        ]  # fmt: skip
    b = plan["burst"]
    drain_s = each("burst", "drain_s")
    delivered = each("burst", "delivered")
    rate = {p: b / s if s and delivered[p] == b else None for p, s in drain_s.items()}

    def raydelay_rate(key: str) -> dict:
        r = _get(results, "raydelay", key)
        ok = r and r["drain_s"] and r["delivered"] == b
        return {"raydelay": b / r["drain_s"] if ok else None}

    lr, ls = plan["lateness_rate"], plan["lateness_s"]
    late_cond = f"{lr:,} msg/s due for {ls} s, loaded ahead; receive time - deliver_at"
    out += [
        _line("3 burst", "seconds from the due instant to the last ack",
              f"{b:,} msgs due at one instant; one consumer thread (raydelay receive_batch "
              "x40000, i.e. 10,000 from each of 4 partitions, + ack(batch); Redis BLMPOP "
              "x1000)", drain_s, ".2f", ratios=False),
        _line("3 burst", "drain msg/s", "messages / the seconds above", rate,
              target=">= 0.5x Redis (goal 1.0x)"),
        _line("3 burst", "drain msg/s, receive_batch x10000",
              "the same burst, raydelay at the default max_messages (2,500 per partition)",
              raydelay_rate("burst_10k")),
        _line("3 burst", "drain msg/s, receive() path",
              "the same burst, raydelay consumed with receive() x40000 (Message objects) + "
              "ack(list)", raydelay_rate("burst_receive")),
        _line("4 lateness", "p50 ms", late_cond, each("lateness", "p50"), ".0f"),
        _line("4 lateness", "p99 ms", late_cond, each("lateness", "p99"), ".0f",
              target="<= 20 ms (goal 10)"),
        _line("4 lateness", "max ms", late_cond, each("lateness", "max"), ","),
        _line("4 lateness", "delivered early", "strict mode for raydelay",
              each("lateness", "early"), ",", target="0", ratios=False),
    ]  # fmt: skip
    out += _send_rows(results) + _steady_rows(results) + _topology_rows(results)
    for sent in plan["kill_at"]:
        rec = {p: (_memory_row(results, p, sent) or {}).get("recovery_s") for p in PEERS}
        out.append(
            _line("5 recovery", f"s from kill to first delivery at {sent / 1e6:g}M",
                  "raydelay: subscription actor SIGKILLed, Ray restarts it; Redis: "
                  "redis-server SIGKILLed and restarted at once over its AOF; heapq: no "
                  "durability", rec, ".2f", target="<= 2 s" if sent == 10_000_000 else "",
                  text={"heapq": "all lost"})
        )  # fmt: skip
    return out


def _send_rows(results: dict) -> list[tuple]:
    """4b: what one send costs: raydelay (durable when it returns) beside Redis with
    appendfsync everysec (acknowledged before it is on disk) and always (durable)."""
    if _get(results, "raydelay", "send") is None and _get(results, "redis", "send") is None:
        return []
    plan = results["plan"]
    none = {"heapq": "n/a"}

    def both(*path) -> list[dict]:
        ray = _get(results, "raydelay", "send", *path)
        return [
            {"raydelay": ray, "redis": _get(results, "redis", "send", fsync, *path)}
            for fsync in ("everysec", "always")
        ]

    cond = (f"{plan['send_loop']:,} sends one after another, 100 B; raydelay: 2 partitions, "
            "local dir, fsync per commit")  # fmt: skip
    out = []
    for (p50_e, p50_a), what, target in (
        (both("loop", "p50"), "p50", "<= 3 ms (goal 1.5)"),
        (both("loop", "p99"), "p99", ""),
    ):
        out += [
            _line("4b send", f"send() latency {what} ms", cond + "; Redis appendfsync everysec",
                  p50_e, ".2f", target=target, text=none),
            _line("4b send", f"send() latency {what} ms", cond + "; Redis appendfsync always",
                  p50_a, ".2f", text=none),
        ]  # fmt: skip
    floor = _get(results, "raydelay", "send", "floor_p50_ms")
    ray_p50 = _get(results, "raydelay", "send", "loop", "p50")
    if floor:
        out.append(
            _line("4b send", "send() latency p50 against the durable-write floor p50 (ms)",
                  "the floor: a 300 B object written, fsynced, linked and its directory "
                  "fsynced, as a commit is, in the same store root and run",
                  {}, target="<= 3x the floor (goal 1.5x)",
                  text={"raydelay": f"{_num(ray_p50, '.2f')} / {floor:.2f} = "
                        f"{_num(None if ray_p50 is None else ray_p50 / floor, '.1f')}x",
                        "redis": "", "heapq": ""})
        )  # fmt: skip
    loop_e, loop_a = both("loop", "rate")
    thr_e, thr_a = both("threads", "rate")
    asy_e, asy_a = both("async", "rate")
    out += [
        _line("4b send", "send() loop msg/s", cond + "; Redis everysec", loop_e,
              target=">= 300 (goal 600)", text=none),
        _line("4b send", "send() loop msg/s", cond + "; Redis always", loop_a, text=none),
        _line("4b send", "msg/s, 16 threads sharing one producer",
              f"{plan['send_threads_n']:,} sends; Redis everysec, a client per thread",
              thr_e, text=none),
        _line("4b send", "msg/s, 16 threads sharing one producer", "the same, Redis always",
              thr_a, text=none),
        _line("4b send", "send_async msg/s, one thread, until all durable",
              f"{plan['send_async']:,} send_async then flush; Redis: ZADD pipelined x1000, "
              "everysec", asy_e, target=">= 100k (goal 300k)", text=none),
        _line("4b send", "send_async msg/s, one thread, until all durable",
              "the same, Redis always", asy_a, text=none),
    ]  # fmt: skip
    return out


def _steady_rows(results: dict) -> list[tuple]:
    """4c: lateness of a steady stream, due 2 s after each send, per rate."""
    plan = results["plan"]
    none = {"heapq": "n/a"}
    out = []
    by_rate = {
        p: {r["rate"]: r for r in (_get(results, p, "steady") or [])} for p in ("raydelay", "redis")
    }
    fetched = {r["rate"]: r for r in (_get(results, "raydelay", "steady_prefetch") or [])}
    for rate in plan.get("steady_rates", []):
        cond = (f"{rate:,} msg/s for {plan['steady_s']} s, each due 2 s after it was sent; one "
                "producer thread (a send every 10 ms), one consumer thread stamping each batch "
                "as it arrives; raydelay: 2 partitions, receive_batch (each batch acked at the "
                "next call), strict mode; Redis: ZADD, a 1 ms mover, BLMPOP")  # fmt: skip

        def vals(key: str, rate: int = rate) -> dict:
            return {p: (by_rate[p].get(rate) or {}).get(key) for p in ("raydelay", "redis")}

        out += [
            _line("4c steady", f"lateness p50 ms at {rate // 1000}k/s", cond, vals("p50"), ".1f",
                  target="<= 5 ms (goal 2)" if rate == 20_000 else "", text=none),
            _line("4c steady", f"lateness p99 ms at {rate // 1000}k/s", cond, vals("p99"), ".1f",
                  target="<= 15 ms (goal 5)" if rate == 20_000 else "", text=none),
            _line("4c steady", f"lateness p99.9 ms at {rate // 1000}k/s", cond, vals("p999"),
                  ".1f", text=none),
            _line("4c steady", f"lateness max ms at {rate // 1000}k/s", cond, vals("max"), ",",
                  text=none),
            _line("4c steady", f"delivered early at {rate // 1000}k/s", cond, vals("early"), ",",
                  target="0", ratios=False, text=none),
            _line("4c steady", f"producer reached msg/s at {rate // 1000}k/s", cond,
                  vals("sent_rate"), text=none),
        ]  # fmt: skip
        by_stage = (by_rate["raydelay"].get(rate) or {}).get("stages")
        if by_stage:
            out += _stage_rows(f"at {rate // 1000}k/s", cond, by_stage)
        if rate in fetched:
            r = fetched[rate]
            out.append(
                _line("4c steady", f"with prefetch at {rate // 1000}k/s: p50 / p99 / p99.9 / "
                      "max ms", "the same stream, raydelay's consumer with prefetch=True", {},
                      text={"raydelay": f"{_num(r['p50'], '.1f')} / {_num(r['p99'], '.1f')} / "
                            f"{_num(r['p999'], '.1f')} / {_num(r['max'], ',')}",
                            "redis": "", "heapq": ""})
            )  # fmt: skip
    return out


def _stage_rows(where: str, cond: str, by_stage: dict) -> list[tuple]:
    """4c: raydelay's lateness of one stream by stage (raydelay.dispatch.stages): p50 and
    p99 as the lateness bucket edges they lie under, the mean and the stage's share."""
    out = []
    for r in stages.summary(by_stage):
        p50, p99 = (stages.edge_label(r[k]) for k in ("p50_ms", "p99_ms"))
        share = None if r["share"] is None else 100 * r["share"]
        cell = f"{p50} / {p99} / {_num(r['mean_ms'], '.1f')} ({_num(share, '.0f')}%)"
        out.append(
            _line("4c steady", f"lateness {where} in stage {r['stage']}: p50 / p99 / mean ms "
                  "(share)", cond, {}, text={"raydelay": cell, "redis": "", "heapq": ""})
        )  # fmt: skip
    return out


def _topology_rows(results: dict) -> list[tuple]:
    """9 topology: what a layout costs while idle (raydelay only)."""
    t = _get(results, "raydelay", "topology")
    if not t:
        return []
    layout = (
        f"{t['topics']} topics x {t['partitions']} partitions x {t['subscriptions']} shared "
        f"subscriptions, one consumer each, nothing sent; local Ray (bench/topology_bench.py)"
    )
    n = t["sub_partitions"]
    figures = [
        ("worker processes", t["processes"], ",.0f", "<= 40 (goal 36)"),
        (
            "PSS MiB per subscription-partition",
            t["pss_bytes"] / n / 2**20,
            ".1f",
            "<= 25 (goal 20)",
        ),
        ("idle CPU, % of a core", 100 * t["idle_cpu"], ".0f", "<= 40 (goal 20)"),
        ("set-up s", t["setup_s"], ".1f", "<= 60 (goal 20)"),
    ]
    return [
        _line("9 topology", name, layout, {"raydelay": v}, fmt, target, ratios=False)
        for name, v, fmt, target in figures
    ]


def _per(total, n):
    return None if total is None or not n else total / n


def markdown(results: dict, stem: Path) -> str:
    m = results["machine"]
    lines = [
        f"# raydelay side by side: {results['suite']} suite, {stem.name[:10]}",
        "",
        f"Command: `python bench/compare.py --suite {results['suite']}` "
        f"({'make bench' if results['suite'] == 'quick' else 'make bench-full'}); "
        f"{results['elapsed_s'] / 60:.1f} min in all.",
        f"Machine: {m['cpus']} cores, {m['ram_gib']} GiB RAM, Linux {m['kernel']}, Python "
        f"{m['python']}, Ray {m['ray']}, Redis {_get(results, 'redis', 'version') or 'n/a'}; "
        f"commit {m['commit']}. The peers ran one after another on 127.0.0.1.",
        "",
        "Ratios are raydelay / peer: above 1 is better for rates, below 1 is better for "
        "bytes, seconds and lateness.",
        "",
        "| scenario | figure | conditions | raydelay | Redis | heapq | vs Redis | vs heapq "
        "| target |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows(results):
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    lines += _warnings(results)
    lines += _cpu(results)
    lines += _recovery_detail(results)
    lines += _scale(results)
    lines += _fanout(results)
    lines += _drain(results)
    lines += ["", "## Plots", ""]
    for kind in _plots(results, stem):
        lines.append(f"![{kind}]({stem.name}-{kind}.png)")
    return "\n".join(lines) + "\n"


def _warnings(results: dict) -> list[str]:
    out = []
    for peer, res in results["peers"].items():
        for scen in ("burst", "lateness"):
            if (res.get(scen) or {}).get("late_load"):
                out.append(f"- {NAMES[peer]}: loading the {scen} scenario overran its lead time")
        b = res.get("burst")
        if b and b["delivered"] != results["plan"]["burst"]:
            out.append(f"- {NAMES[peer]}: burst delivered {b['delivered']:,} (not all)")
        late = res.get("lateness")
        n = results["plan"]["lateness_rate"] * results["plan"]["lateness_s"]
        if late and late["n"] != n:
            out.append(f"- {NAMES[peer]}: lateness received {late['n']:,} of {n:,}")
    for row in _get(results, "raydelay", "memory") or []:
        if row.get("not_settled"):
            out.append(
                f"- raydelay at {row['sent']:,}: measured after 600 s with {row['indexed']:,} "
                "read into the subscription (indexing lagged the load); bytes per pending use "
                "the delayed count the actors held"
            )
    s = _get(results, "raydelay", "scale")
    if s and s["indexed_at_drain"] < s["n"] * 0.99:
        out.append(
            f"- raydelay scale: the subscription had indexed {s['indexed_at_drain']:,} of "
            f"{s['n']:,} when the drain started (600 s after the load)"
        )
    return ["", "## Warnings", "", *out] if out else []


def _cpu(results: dict) -> list[str]:
    out = ["", "## Where the burst's time goes (CPU seconds per process, due instant to last ack)"]
    for peer, res in results["peers"].items():
        b = res.get("burst")
        if not b:
            continue
        out += ["", f"{NAMES[peer]} (drain {_num(b['drain_s'], '.2f')} s):", ""]
        out += ["| process | CPU s |", "|---|---:|"]
        for role, s in sorted(b["cpu"].items(), key=lambda kv: -kv[1]):
            if s >= 0.05:
                out.append(f"| {role} | {s:.2f} |")
    return out


def _recovery_detail(results: dict) -> list[str]:
    out = []
    for peer in ("raydelay", "redis"):
        for row in _get(results, peer, "memory") or []:
            if "recovery_detail" in row:
                d = ", ".join(f"{k} {v}" for k, v in row["recovery_detail"].items())
                out.append(f"- {NAMES[peer]} at {row['sent']:,}: {d}")
    return ["", "## Recovery detail", "", *out] if out else []


def _scale(results: dict) -> list[str]:
    s = _get(results, "raydelay", "scale")
    if not s:
        return []
    rss = [x["topic"] + x["subscription"] for x in s["samples"]]
    # how far the subscription's view of the index lagged the appends, in seconds of load
    behind = [x["sent"] - x["delayed"] - x["acked"] for x in s["samples"] if x["sent"] < s["n"]]
    lag_s = max(behind, default=0) / s["load_rate"]
    # the same before the first message falls due (60 s after the load starts): later, rows
    # due and waiting for a consumer (none while loading) count as not held as well
    early = [x["sent"] - x["delayed"] - x["acked"] for x in s["samples"] if x["t_s"] < 60]
    lag_early_s = max(early, default=0) / s["load_rate"]
    sub = [x["subscription"] for x in s["samples"]]
    return [
        "",
        f"## Scale: {s['n']:,} pending in one raydelay subscription (1 partition)",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| load msg/s (send_many x5000, 2 threads, no consumer) | {s['load_rate']:,.0f} |",
        f"| buckets after the load | {s['buckets']} |",
        f"| index lag: most messages appended but not yet held, in seconds of load "
        f"(samples every 5 s) | {lag_s:.1f} |",
        f"| the same, before any message fell due (the first 60 s) | {lag_early_s:.1f} |",
        f"| store GiB | {s['store_bytes'] / 2**30:,.2f} |",
        f"| bytes written (log + buckets) per payload byte appended "
        f"| {_num(s.get('written_per_appended'), '.2f')} |",
        f"| RSS MiB (topic + subscription actor): min / median / max over the run "
        f"| {min(rss) / MIB:,.0f} / {np.median(rss) / MIB:,.0f} / {max(rss) / MIB:,.0f} |",
        f"| subscription actor RSS MiB: min / max | {min(sub) / MIB:,.0f} / "
        f"{max(sub) / MIB:,.0f} |",
        f"| overdue when the consumer started (about) | {s['overdue_at_drain']:,} |",
        f"| drained in the window / drain msg/s | {s['drained']:,} / {s['drain_rate']:,.0f} |",
        f"| drain lateness p50 / p99 ms | {_num(s['drain_lateness']['p50'])} / "
        f"{_num(s['drain_lateness']['p99'])} |",
    ]


def _fanout(results: dict) -> list[str]:
    rows = _get(results, "raydelay", "fanout")
    if not rows:
        return []
    base = rows[0]
    out = [
        "",
        f"## Fan-out: K shared subscriptions of one partition index {base['n']:,} delayed "
        "messages (no consumer)",
        "",
        "Each K in a process of its own with a Ray of its own (bench/fanout_bulk.py). CPU is "
        "every Ray worker's, from the first send until every subscription held every "
        'message; "net" takes out the layout\'s idle floor (its idle CPU per second, '
        "measured before sending, times that wall time). Ratios are against K = 1 of the "
        "same run. Idle per subscription host is against a bare Ray actor's, in the same "
        "window. Store bytes 12 s after the load (retention runs every 5 s); written bytes "
        "are the log's and the sealed buckets'.",
        "",
        "| K | send s | vs K=1 | CPU s | vs K=1 | net CPU s | vs K=1 | idle floor ms/s "
        f"| idle ms/s, {base['n']:,} pending | idle per sub host / bare actor (ms/s) | worker processes "
        "| store bytes / payload byte | written / appended |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['k']} | {r['send_s']:.2f} | {_ratio(r['send_s'], base['send_s'])} | "
            f"{r['cpu_s']:.2f} | {_ratio(r['cpu_s'], base['cpu_s'])} | {r['net_cpu_s']:.2f} | "
            f"{_ratio(r['net_cpu_s'], base['net_cpu_s'])} | {1000 * r['floor_per_s']:.0f} | "
            f"{1000 * r['floor_after_per_s']:.0f} | "
            f"{1000 * r['idle_per_sub_host']:.1f} / {1000 * r['idle_bare']:.1f} | "
            f"{r['workers']} | {_num(r['store_per_payload'], '.2f')} | "
            f"{_num(r['written_per_appended'], '.2f')} |"
        )
    return out


def _drain(results: dict) -> list[str]:
    d = _get(results, "raydelay", "drain")
    if not d:
        return []
    return [
        "",
        f"## Overdue backlog drain: {d['n']:,} messages of one partition due over "
        f"{d['spread_s']} s, drained after all are due",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| load s | {d['load_s']:.1f} |",
        f"| sealed buckets when the consumer came | {d['buckets']} |",
        f"| drained / complete | {d['drained']:,} / {d['complete']} |",
        f"| drain seconds | {d['seconds']:.1f} |",
        f"| drain msg/s | {d['rate']:,.0f} |",
        f"| point reads of the log (topic actor) | {d['point_reads']:,} |",
    ]


def _plots(results: dict, stem: Path) -> list[str]:
    made = []
    peers = results["peers"]
    # memory against pending
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drew = False
    for peer in ("raydelay", "redis", "heapq"):
        pts = [r for r in (peers.get(peer, {}).get("memory") or []) if not r.get("skipped")]
        if pts:
            ax.plot([r["pending"] / 1e6 for r in pts], [r["memory_bytes"] / MIB for r in pts],
                    "o-", color=COLORS[peer], label=NAMES[peer])  # fmt: skip
            drew = True
    if drew:
        ax.set_xlabel("pending messages (millions)")
        ax.set_ylabel("memory (MiB)")
        ax.set_title("Memory against pending messages")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(f"{stem}-memory.png", dpi=110)
        made.append("memory")
    plt.close(fig)
    # lateness distribution (CDF)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drew = False
    for peer in ("raydelay", "redis", "heapq"):
        lates = (peers.get(peer, {}).get("lateness") or {}).get("lates")
        if lates is not None and len(lates):
            xs = np.sort(lates)
            ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), color=COLORS[peer],
                    label=f"{NAMES[peer]} (p99 {Lateness.of(xs).p99_ms:.0f} ms)")  # fmt: skip
            drew = True
    if drew:
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("lateness: receive time - deliver_at (ms)")
        ax.set_ylabel("fraction of messages")
        ax.set_title("Lateness distribution")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(f"{stem}-lateness.png", dpi=110)
        made.append("lateness")
    plt.close(fig)
    # burst drain curve
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drew = False
    for peer in ("raydelay", "redis", "heapq"):
        curve = (peers.get(peer, {}).get("burst") or {}).get("curve")
        if curve:
            ax.plot([c[0] for c in curve], [c[1] / 1e6 for c in curve], color=COLORS[peer],
                    label=NAMES[peer])  # fmt: skip
            drew = True
    if drew:
        ax.set_xlabel("seconds since the due instant")
        ax.set_ylabel("delivered and acked (millions)")
        ax.set_title("Burst: all messages due at one instant")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(f"{stem}-burst.png", dpi=110)
        made.append("burst")
    plt.close(fig)
    scale = _get(results, "raydelay", "scale")
    if scale and scale["samples"]:
        smp = scale["samples"]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        t = [x["t_s"] / 60 for x in smp]
        ax.plot(t, [x["subscription"] / MIB for x in smp], color="tab:blue",
                label="subscription actor RSS")  # fmt: skip
        ax.plot(t, [x["topic"] / MIB for x in smp], color="tab:cyan", label="topic actor RSS")
        ax.set_xlabel("minutes")
        ax.set_ylabel("RSS (MiB)")
        ax.set_ylim(bottom=0)
        ax2 = ax.twinx()
        ax2.plot(t, [(x["sent"] - x["acked"]) / 1e6 for x in smp], color="tab:orange",
                 linestyle="--", label="pending (millions)")  # fmt: skip
        ax2.set_ylabel("pending (millions)")
        ax2.set_ylim(bottom=0)
        lines = ax.get_legend_handles_labels()
        lines2 = ax2.get_legend_handles_labels()
        ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left")
        ax.set_title(f"Scale: {scale['n'] / 1e6:g}M pending in one subscription")
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(f"{stem}-scale.png", dpi=110)
        plt.close(fig)
        made.append("scale")
    return made


def write(results: dict, stem: Path) -> str:
    text = markdown(results, stem)
    Path(f"{stem}.md").write_text(text)
    return text
