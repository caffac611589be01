"""dashboards/raydelay.json: a Grafana dashboard whose every query names a metric raydelay
registers (``raydelay.actors.metrics.METRICS``), under the name Ray 2.60 exports it by."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from raydelay.actors import metrics as metrics_module
from raydelay.actors.metrics import METRICS, SubscriptionMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "raydelay.json"
GRID_COLUMNS = 24

# Ray 2.60's Prometheus export of each kind: counters get "_total", histograms are read
# through their "_bucket", "_sum" and "_count" series, gauges keep their name
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
RAY_PREFIX = "ray_"

# PromQL words that are not series names (an identifier followed by "(" is a function)
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
_KEYWORDS |= {"and", "or", "unless", "inf", "nan"}
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\()?")


def series_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads (label matchers, strings, ranges and
    grouping clauses left out; ``label_values(expr, label)`` is read as ``expr``)."""
    found = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", expr, re.S)
    if found:
        expr = found.group(1)
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings may hold anything
    expr = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # ranges and subqueries' steps
    expr = _GROUPING.sub(" ", expr)
    names = set()
    for name, call in _IDENT.findall(expr):
        if not call and name.lower() not in _KEYWORDS:
            names.add(name)
    return names


def registered_as(series: str) -> str | None:
    """The registered metric whose export ``series`` is, or None."""
    if not series.startswith(RAY_PREFIX):
        return None
    name = series[len(RAY_PREFIX) :]
    for metric, spec in METRICS.items():
        for suffix in SUFFIXES[spec.kind]:
            if name == metric + suffix:
                return metric
    return None


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(where, expr) of every panel target and every query variable."""
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", ()):
            out.append((f"panel {panel['title']!r} target {target['refId']}", target["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            out.append(
                (f"variable {var['name']}", query["query"] if isinstance(query, dict) else query)
            )
    return out


# --- the checker itself can fail ----------------------------------------------------------------


def test_series_names_skip_functions_labels_ranges_and_grouping():
    expr = (
        'histogram_quantile(0.99, sum by (le, topic) (rate(ray_a_bucket{topic=~"x{y}", le!=""}'
        "[$__rate_interval]))) / on (topic) group_left max without (op) (ray_b offset 5m)"
    )
    assert series_names(expr) == {"ray_a_bucket", "ray_b"}
    assert series_names('label_values(ray_c{topic=~"$topic"}, subscription)') == {"ray_c"}


def test_an_export_name_must_match_its_metrics_kind():
    kinds = {spec.kind: name for name, spec in METRICS.items()}
    counter, gauge, histogram = kinds["counter"], kinds["gauge"], kinds["histogram"]
    assert registered_as(f"ray_{counter}_total") == counter
    assert registered_as(f"ray_{counter}") is None  # Ray 2.60 exports no bare counter name
    assert registered_as(f"ray_{gauge}") == gauge
    assert registered_as(f"ray_{gauge}_total") is None
    assert registered_as(f"ray_{histogram}_bucket") == histogram
    assert registered_as(f"ray_{histogram}") is None
    assert registered_as(counter + "_total") is None  # without Ray's prefix
    assert registered_as("ray_raydelay_no_such_metric") is None


# --- the dashboard --------------------------------------------------------------------------------


def test_every_query_of_the_dashboard_names_a_metric_raydelay_registers():
    dashboard = load()
    found = queries(dashboard)
    assert found
    unknown = []
    for where, expr in found:
        names = series_names(expr)
        assert names, f"{where}: no series in {expr!r}"
        unknown += [f"{where}: {s}" for s in sorted(names) if registered_as(s) is None]
    assert not unknown, f"series raydelay does not export: {unknown}"


def test_quantiles_read_bucket_series_grouped_by_le():
    for where, expr in queries(load()):
        if "histogram_quantile" not in expr:
            continue
        names = series_names(expr)
        assert names and all(n.endswith("_bucket") for n in names), where
        assert re.search(r"\bby\s*\([^)]*\ble\b", expr), f"{where}: not grouped by le"


def test_the_dashboard_has_the_panels_the_issue_asks_for():
    # publish and dispatch rates, backlog, delayed; lateness; buckets sealed and loaded;
    # consumers, redeliveries, dead letters: each metric is read by some panel
    wanted = {
        "raydelay_published_messages",
        "raydelay_dispatched_messages",
        "raydelay_backlog",
        "raydelay_delayed_messages",
        "raydelay_dispatch_lateness_ms",
        "raydelay_immutable_buckets",
        "raydelay_loaded_indexes",
        "raydelay_consumers",
        "raydelay_redeliveries",
        "raydelay_dead_lettered",
        "raydelay_dead_letters",
    }
    read = {
        registered_as(series)
        for panel in load()["panels"]
        for target in panel.get("targets", ())
        for series in series_names(target["expr"])
    }
    assert wanted <= read, f"no panel reads {sorted(wanted - read)}"
    quantiles = {
        float(q)
        for _, expr in queries(load())
        for q in re.findall(r"histogram_quantile\(\s*([0-9.]+)\s*,[^;]*dispatch_lateness", expr)
    }
    assert {0.5, 0.99} <= quantiles


def test_the_dashboard_is_a_valid_grafana_model():
    dashboard = load()
    assert dashboard["title"] and dashboard["uid"] and isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    source = variables["datasource"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    taken: dict[tuple[int, int], str] = {}
    for panel in panels:
        title = panel.get("title")
        assert isinstance(title, str) and title.strip(), f"panel {panel['id']} has no title"
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("x", "y", "w", "h")), title
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= GRID_COLUMNS, title
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in taken, f"{title!r} overlaps {taken[(x, y)]!r}"
                taken[(x, y)] = title
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", title
        assert panel["datasource"]["type"] == "prometheus", title
        targets = panel["targets"]
        assert targets, f"{title!r} has no queries"
        refs = [t["refId"] for t in targets]
        assert len(refs) == len(set(refs)), title
        for target in targets:
            assert target["datasource"]["uid"] == "${datasource}", title
            assert target["expr"].strip(), title
    # every variable a query uses is defined
    for where, expr in queries(dashboard):
        for name in re.findall(r"\$(\w+)", expr):
            assert name.startswith("__") or name in variables, f"{where}: ${name} undefined"


# --- the metrics registry ---------------------------------------------------------------------


def test_the_metrics_module_table_lists_the_registry():
    # the docstring's table is what readers see: it must say what METRICS holds
    doc = metrics_module.__doc__ or ""
    rows = re.findall(r"^\| (raydelay_\w+) \| (\w+) \|", doc, re.M)
    assert dict(rows) == {name: spec.kind for name, spec in METRICS.items()}


class _FakeMetric:
    """A stand-in for a ray.util.metrics object: what was set, added and observed."""

    def __init__(self, name: str, **_: Any) -> None:
        self.name = name
        self.values: dict[tuple, float] = {}

    def set(self, value: float, tags: dict) -> None:
        self.values[tuple(sorted(tags.items()))] = value

    def inc(self, value: float, tags: dict) -> None:
        key = tuple(sorted(tags.items()))
        self.values[key] = self.values.get(key, 0) + value

    def observe(self, value: float, tags: dict) -> None:
        self.inc(1, tags)


@pytest.fixture
def fake_metrics(monkeypatch) -> dict[str, _FakeMetric]:
    made: dict[str, _FakeMetric] = {}
    fake = dict.fromkeys(("counter", "gauge", "histogram"), _FakeMetric)
    monkeypatch.setattr(metrics_module, "_KINDS", fake)
    monkeypatch.setattr(metrics_module, "_made", made)
    return made


def test_a_subscription_report_sets_its_backlog_and_consumers(fake_metrics):
    # Given a subscription partition's metrics
    m = SubscriptionMetrics("orders", 2, "billing")
    # When its periodic report carries the stats the subscription keeps
    m.report({"delayed": 7, "buckets": 2, "backlog": 40, "consumers": 3}, [])
    m.report({"delayed": 5, "buckets": 2, "backlog": 31, "consumers": 1}, [])
    # Then the gauges hold the last values, under the partition's tags
    tags = (("partition", "2"), ("subscription", "billing"), ("topic", "orders"))
    assert fake_metrics["raydelay_backlog"].values == {tags: 31}
    assert fake_metrics["raydelay_consumers"].values == {tags: 1}
    assert fake_metrics["raydelay_delayed_messages"].values == {tags: 5}
    # and every metric made came from the registry
    assert set(fake_metrics) <= set(METRICS)


def test_the_dead_letter_gauge_is_the_lifes_count_and_the_counter_this_processs(fake_metrics):
    # Given the metrics of a subscription partition whose cursor counted 5 dead letters
    # before this process started
    m = SubscriptionMetrics("orders", 0, "billing")
    # When it reports, then dead-letters 2 more
    m.report({"dead_lettered": 5, "dead_lettered_since_start": 0}, [])
    m.report({"dead_lettered": 7, "dead_lettered_since_start": 2}, [])
    # Then the gauge says 7 and the counter counts only the 2 of this process
    tags = (("partition", "0"), ("subscription", "billing"), ("topic", "orders"))
    assert fake_metrics["raydelay_dead_letters"].values[tags] == 7
    assert fake_metrics["raydelay_dead_lettered"].values[tags] == 2
