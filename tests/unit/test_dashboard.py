"""The Grafana dashboard and the alert rules in deploy/grafana/ query only
series the daemon exports: those of docs/metrics.md, which
``tests/core/test_metrics_reference.py`` checks against a real scrape."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "tierfs-dashboard.json"
ALERTS = ROOT / "deploy" / "grafana" / "tierfs-alerts.yaml"
REFERENCE = ROOT / "docs" / "metrics.md"

SERIES = re.compile(r"\btierfs_[a-z0-9_]+")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def documented() -> dict[str, str]:
    rows = re.findall(
        r"^\| `(tierfs_[a-z0-9_]+)` \| (counter|gauge|histogram) \|", REFERENCE.read_text(), re.M
    )
    return dict(rows)


def unknown_series(expr: str, known: dict[str, str]) -> list[str]:
    """The tierfs series ``expr`` names that are not exported (a histogram's
    ``_bucket``, ``_sum`` and ``_count`` are its family's)."""
    bad = []
    for name in SERIES.findall(expr):
        if name in known and known[name] != "histogram":
            continue
        family = next((name[: -len(s)] for s in HISTOGRAM_SUFFIXES if name.endswith(s)), None)
        if family is not None and known.get(family) == "histogram":
            continue
        bad.append(name)
    return bad


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [
        (panel["title"], target["expr"])
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            queries.append((f"${variable['name']}", variable["definition"]))
    return queries


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_the_checker_refuses_a_series_that_is_not_exported() -> None:
    known = {"tierfs_dirty_bytes": "gauge", "tierfs_s3_request_seconds": "histogram"}
    assert unknown_series("rate(tierfs_dirty_bytes[5m])", known) == []
    assert unknown_series("tierfs_s3_request_seconds_bucket", known) == []
    assert unknown_series("tierfs_dirty_bytes_total + tierfs_nope", known) == [
        "tierfs_dirty_bytes_total",
        "tierfs_nope",
    ]
    assert unknown_series("tierfs_s3_request_seconds", known) == ["tierfs_s3_request_seconds"]
    assert unknown_series("tierfs_dirty_bytes_count", known) == ["tierfs_dirty_bytes_count"]


def test_every_dashboard_query_is_of_exported_series() -> None:
    known = documented()
    assert len(known) > 60
    queries = dashboard_queries()
    assert len(queries) > 30
    for title, expr in queries:
        assert SERIES.search(expr), f"panel {title!r} queries no tierfs series"
        assert unknown_series(expr, known) == [], f"panel {title!r}: {expr}"


def test_the_dashboard_covers_what_operators_watch() -> None:
    exprs = " ".join(expr for _title, expr in dashboard_queries())
    for series in (
        "tierfs_tier_high_watermark_ratio",  # tiers against watermarks
        "tierfs_cache_hit_blocks_total",  # hit ratio
        "tierfs_fetched_bytes_total",  # bytes from the bucket
        "tierfs_shared_bytes_read_total",  # ... and from the shared tier
        "tierfs_dirty_bytes",
        "tierfs_uploaded_bytes_total",
        "tierfs_preload_bytes_done",
        "tierfs_prefetch_orders",
        "tierfs_quota_used_ratio",
        "tierfs_endpoint_reachable",
        "tierfs_shared_reachable",
    ):
        assert series in exprs, series


def test_panel_ids_are_unique_and_every_panel_uses_the_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_alert_rule_is_of_exported_series_and_says_what_it_means() -> None:
    known = documented()
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert unknown_series(rule["expr"], known) == [], rule["alert"]
        assert SERIES.search(rule["expr"]), rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]
    exprs = " ".join(rule["expr"] for rule in rules)
    for series in (
        "tierfs_quotas_warning",
        "tierfs_endpoint_reachable",
        "tierfs_dirty_bytes",
        "tierfs_shared_errors_total",
    ):
        assert series in exprs, series
