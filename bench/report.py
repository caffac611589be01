"""The report of ``bench/compare.py``: one markdown table of every figure with its
conditions, the ratio to each peer and the target, plus the PNG plots."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no screen here
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

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
        burst = peer.get("burst")
        if burst and len(burst["curve"]) > 200:
            burst["curve"] = burst["curve"][:: len(burst["curve"]) // 200 + 1]
    return out


def rows(results: dict) -> list[tuple]:
    """(scenario, metric, conditions, raydelay, redis, heapq, vs redis, vs heapq, target)."""
    plan = results["plan"]
    out: list[tuple] = []
    n = plan["ingest"]

    def ing(peer, key):
        return _get(results, peer, "ingest", key)

    out.append(
        (
            "1 ingest",
            "msg/s until durable",
            f"{n:,} msgs, 100 B, due uniform over 1 h; raydelay: send_many x5000, 4 threads, "
            "4 partitions, fsync per write; Redis: ZADD pipelined, 4 threads, AOF everysec "
            "(+1 s for the last fsync); heapq: in memory, never durable",
            _num(ing("raydelay", "durable_rate")),
            _num(ing("redis", "durable_rate")),
            _num(ing("heapq", "acked_rate")),
            _ratio(ing("raydelay", "durable_rate"), ing("redis", "durable_rate")),
            _ratio(ing("raydelay", "durable_rate"), ing("heapq", "acked_rate")),
            ">= 1.0x Redis",
        )
    )
    out.append(
        (
            "1 ingest",
            "msg/s acknowledged",
            "as above; Redis replies before its fsync",
            _num(ing("raydelay", "acked_rate")),
            _num(ing("redis", "acked_rate")),
            _num(ing("heapq", "acked_rate")),
            _ratio(ing("raydelay", "acked_rate"), ing("redis", "acked_rate")),
            _ratio(ing("raydelay", "acked_rate"), ing("heapq", "acked_rate")),
            "",
        )
    )
    out.append(
        (
            "1 ingest",
            "disk bytes per message",
            "raydelay: store directory; Redis: appendonlydir",
            _num(_per(ing("raydelay", "disk_bytes"), n), ",.1f"),
            _num(_per(ing("redis", "disk_bytes"), n), ",.1f"),
            "0 (nothing kept)",
            _ratio(ing("raydelay", "disk_bytes"), ing("redis", "disk_bytes")),
            "",
            "",
        )
    )
    for sent in plan["memory"]:
        rd, rs, hq = (_memory_row(results, p, sent) for p in ("raydelay", "redis", "heapq"))
        per = {k: _per(r["memory_bytes"], r["pending"]) if r else None
               for k, r in (("raydelay", rd), ("redis", rs), ("heapq", hq))}  # fmt: skip
        target = "<= 0.1x Redis" if sent == 10_000_000 else ""
        out.append(
            (
                "2 memory",
                f"bytes per pending message at {sent / 1e6:g}M",
                "raydelay: RSS of the topic + subscription actor (1 partition), after the "
                "log is read in; Redis: used_memory; heapq: process RSS",
                _num(per["raydelay"], ",.1f"),
                _num(per["redis"], ",.1f"),
                _num(per["heapq"], ",.1f"),
                _ratio(per["raydelay"], per["redis"]),
                _ratio(per["raydelay"], per["heapq"]),
                target,
            )
        )
        growth = {k: _per(r["memory_bytes"] - r["baseline_bytes"], r["pending"]) if r else None
                  for k, r in (("raydelay", rd), ("redis", rs), ("heapq", hq))}  # fmt: skip
        out.append(
            (
                "2 memory",
                f"bytes per pending message above the idle baseline at {sent / 1e6:g}M",
                "the same, less what the empty actors / server / interpreter held",
                _num(growth["raydelay"], ",.1f"),
                _num(growth["redis"], ",.1f"),
                _num(growth["heapq"], ",.1f"),
                _ratio(growth["raydelay"], growth["redis"]),
                _ratio(growth["raydelay"], growth["heapq"]),
                "",
            )
        )
        out.append(
            (
                "2 memory",
                f"MiB in memory at {sent / 1e6:g}M",
                "pending = sent - consumed at the moment of measuring",
                _mib(rd),
                _mib(rs),
                _mib(hq),
                "",
                "",
                "",
            )
        )
        out.append(
            (
                "2 memory",
                f"disk bytes per pending message at {sent / 1e6:g}M",
                "raydelay: store directory; Redis: AOF",
                _num(_per(rd and rd["disk_bytes"], rd and rd.get("stored", rd["pending"])), ",.1f"),
                _num(_per(rs and rs["disk_bytes"], rs and rs["pending"]), ",.1f"),
                "0",
                _ratio(rd and rd["disk_bytes"], rs and rs["disk_bytes"]),
                "",
                "",
            )
        )
    b = plan["burst"]

    def rate(peer):
        s = _get(results, peer, "burst", "drain_s")
        d = _get(results, peer, "burst", "delivered")
        return None if not s or d != b else b / s

    out.append(
        (
            "3 burst",
            "seconds from the due instant to the last ack",
            f"{b:,} msgs due at one instant; one consumer thread (raydelay receive x10000 + "
            "ack, 4 partitions; Redis BLMPOP x1000)",
            _num(_get(results, "raydelay", "burst", "drain_s"), ".2f"),
            _num(_get(results, "redis", "burst", "drain_s"), ".2f"),
            _num(_get(results, "heapq", "burst", "drain_s"), ".2f"),
            "",
            "",
            "",
        )
    )
    out.append(
        (
            "3 burst",
            "drain msg/s",
            "messages / the seconds above",
            _num(rate("raydelay")),
            _num(rate("redis")),
            _num(rate("heapq")),
            _ratio(rate("raydelay"), rate("redis")),
            _ratio(rate("raydelay"), rate("heapq")),
            ">= 1.0x Redis",
        )
    )
    lr, ls = plan["lateness_rate"], plan["lateness_s"]
    for key, label, fmt in (("p50", "p50", ".0f"), ("p99", "p99", ".0f"), ("max", "max", ",")):
        vals = {p: _get(results, p, "lateness", key) for p in ("raydelay", "redis", "heapq")}
        out.append(
            (
                "4 lateness",
                f"{label} ms",
                f"{lr:,} msg/s due for {ls} s, loaded ahead; receive time - deliver_at",
                _num(vals["raydelay"], fmt),
                _num(vals["redis"], fmt),
                _num(vals["heapq"], fmt),
                _ratio(vals["raydelay"], vals["redis"]),
                _ratio(vals["raydelay"], vals["heapq"]),
                "<= 50 ms" if key == "p99" else "",
            )
        )
    early = {p: _get(results, p, "lateness", "early") for p in ("raydelay", "redis", "heapq")}
    out.append(
        (
            "4 lateness",
            "delivered early",
            "strict mode for raydelay",
            _num(early["raydelay"], ","),
            _num(early["redis"], ","),
            _num(early["heapq"], ","),
            "",
            "",
            "0",
        )
    )
    for sent in plan["kill_at"]:
        rd, rs = _memory_row(results, "raydelay", sent), _memory_row(results, "redis", sent)
        out.append(
            (
                "5 recovery",
                f"s from kill to first delivery at {sent / 1e6:g}M",
                "raydelay: subscription actor SIGKILLed, Ray restarts it; Redis: redis-server "
                "SIGKILLed and restarted at once over its AOF; heapq: no durability",
                _num(rd and rd.get("recovery_s"), ".2f"),
                _num(rs and rs.get("recovery_s"), ".2f"),
                "all lost",
                _ratio(rd and rd.get("recovery_s"), rs and rs.get("recovery_s")),
                "",
                "<= 2 s" if sent == 10_000_000 else "",
            )
        )
    return out


def _per(total, n):
    return None if total is None or not n else total / n


def _mib(row) -> str:
    return "n/a" if row is None else f"{row['memory_bytes'] / MIB:,.0f}"


def markdown(results: dict, stem: Path) -> str:
    m = results["machine"]
    plan = results["plan"]
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
    lines += _recovery_detail(results, plan)
    lines += _scale(results)
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


def _recovery_detail(results: dict, plan: dict) -> list[str]:
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
    sub = [x["subscription"] for x in s["samples"]]
    return [
        "",
        f"## Scale: {s['n']:,} pending in one raydelay subscription (1 partition)",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| load msg/s (send_many x5000, 2 threads, no consumer) | {s['load_rate']:,.0f} |",
        f"| buckets after the load | {s['buckets']} |",
        f"| store GiB | {s['store_bytes'] / 2**30:,.2f} |",
        f"| RSS MiB (topic + subscription actor): min / median / max over the run "
        f"| {min(rss) / MIB:,.0f} / {np.median(rss) / MIB:,.0f} / {max(rss) / MIB:,.0f} |",
        f"| subscription actor RSS MiB: min / max | {min(sub) / MIB:,.0f} / "
        f"{max(sub) / MIB:,.0f} |",
        f"| overdue when the consumer started (about) | {s['overdue_at_drain']:,} |",
        f"| drained in the window / drain msg/s | {s['drained']:,} / {s['drain_rate']:,.0f} |",
        f"| drain lateness p50 / p99 ms | {_num(s['drain_lateness']['p50'])} / "
        f"{_num(s['drain_lateness']['p99'])} |",
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
                    label=f"{NAMES[peer]} (p99 {np.percentile(xs, 99):.0f} ms)")  # fmt: skip
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
