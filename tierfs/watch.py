"""``tierfs status --watch``: a rich table of a mount, refreshed every second.

Everything comes from the control socket's ``status`` reply, the same
figures the Prometheus endpoint exports (``tierfs.metrics``); no
HTTP scraping, and it works with metrics off.  Rates are the difference of
two replies divided by the time between them (``status["time"]``), so the
first frame shows totals and "-" for rates.

``render_status(status, previous)`` is pure (a rich renderable from two
replies) and tested on its own; ``watch_status`` is the loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tierfs.units import format_size

Status = Mapping[str, Any]

#: Seconds between two refreshes.
REFRESH_SECONDS = 1.0
#: Operations shown per request table (the busiest first).
MAX_OPERATIONS = 12


def _rate(now: Status, before: Status | None, get: Callable[[Status], float]) -> float | None:
    """Per second, between two status replies; None without a previous one."""
    if before is None:
        return None
    elapsed = float(now["time"]) - float(before["time"])
    if elapsed <= 0:
        return None
    return max(0.0, (get(now) - get(before)) / elapsed)


def _per_second(value: float | None, *, size: bool = False) -> str:
    if value is None:
        return "-"
    return f"{format_size(int(value))}/s" if size else f"{value:,.1f}/s"


def _counter(name: str) -> Callable[[Status], float]:
    return lambda s: float(s["counters"][name])


def _tiers_table(status: Status, before: Status | None) -> Table:
    table = Table(title="tiers", title_justify="left", expand=False)
    for column in ("tier", "used", "capacity", "use%", "low/high", "files", "hits"):
        table.add_column(column, justify="left" if column == "tier" else "right")
    for index, tier in enumerate(status["tiers"]):
        name = tier["name"]
        hits = None
        if before is not None and index < len(before["tiers"]):
            hits = _rate(status, before, lambda s, i=index: float(s["tiers"][i]["hit_blocks"]))
        table.add_row(
            name,
            format_size(tier["used"]),
            format_size(tier["capacity"]),
            f"{tier['used_ratio'] * 100:.1f}%",
            f"{tier['low_watermark']:.0%}/{tier['high_watermark']:.0%}",
            f"{tier['files']:,}",
            _per_second(hits),
        )
    return table


def _flow_table(status: Status, before: Status | None) -> Table:
    """Reads, fetches, uploads, moves and queues: one line each."""
    counters = status["counters"]
    queues = status.get("queues") or {}
    table = Table(title="data", title_justify="left", show_header=False, expand=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_column("detail")
    hit, miss = _counter("hit_blocks"), _counter("miss_blocks")
    hits, misses = _rate(status, before, hit), _rate(status, before, miss)
    if hits is not None and misses is not None and hits + misses > 0:
        ratio = f"hit ratio {hits / (hits + misses):.1%} now"
    else:
        overall = status.get("hit_ratio")
        ratio = "hit ratio -" if overall is None else f"hit ratio {overall:.1%} overall"
    table.add_row(
        "read",
        _per_second(_rate(status, before, _counter("read_bytes")), size=True),
        f"{ratio}; misses {_per_second(misses)} (blocks)",
    )
    table.add_row(
        "fetched",
        _per_second(_rate(status, before, _counter("fetched_bytes")), size=True),
        f"{format_size(counters['fetched_bytes'])} in {counters['gets']:,} GETs; "
        f"{queues.get('fetches_in_flight', 0)} blocks in flight",
    )
    table.add_row(
        "uploaded",
        _per_second(_rate(status, before, _counter("uploaded_bytes")), size=True),
        f"{format_size(status['dirty_bytes'])} dirty; "
        f"{queues.get('journal_entries', status.get('pending_uploads', 0))} journal entries, "
        f"{queues.get('uploads_running', 0)} running",
    )
    table.add_row(
        "moved",
        _per_second(_rate(status, before, _counter("relocated_bytes")), size=True),
        f"between tiers; {queues.get('promotions_queued', 0)} promotions queued; "
        f"mover {(status.get('mover') or {}).get('state', '-')}",
    )
    endpoint = status.get("endpoint") or {}
    state = endpoint.get("state", "reachable")
    table.add_row(
        "endpoint",
        Text(state, style="green" if state == "reachable" else "bold red"),
        endpoint.get("last_error") or "",
    )
    return table


def _requests_table(
    title: str, now: Mapping[str, Any], before: Mapping[str, Any] | None, elapsed: float | None
) -> Table | None:
    """Per operation: requests/s, errors/s, mean latency over the interval
    (cumulative figures on the first frame)."""
    if not now:
        return None
    table = Table(title=title, title_justify="left", expand=False)
    for column in ("operation", "requests", "errors", "mean latency", "total"):
        table.add_column(column, justify="left" if column == "operation" else "right")
    rows = []
    for op, figures in now.items():
        prev = (before or {}).get(op, {"requests": 0, "errors": 0, "seconds": 0.0})
        count = figures["requests"] - prev["requests"]
        seconds = figures["seconds"] - prev["seconds"]
        errors = figures["errors"] - prev["errors"]
        if before is None or elapsed is None:
            count, seconds, errors = figures["requests"], figures["seconds"], figures["errors"]
        mean = f"{seconds / count * 1000:.2f} ms" if count else "-"
        if elapsed:
            shown = (_per_second(count / elapsed), _per_second(errors / elapsed))
        else:
            shown = (f"{count:,}", f"{errors:,}")
        rows.append((count, op, *shown, mean, f"{figures['requests']:,}"))
    rows.sort(key=lambda r: (-r[0], r[1]))
    for row in rows[:MAX_OPERATIONS]:
        table.add_row(*row[1:])
    return table


def _preload_table(status: Status) -> Table | None:
    """The preload jobs of ``status`` (``PreloadJob.snapshot`` each)."""
    jobs = status.get("preloads") or []
    if not jobs:
        return None
    table = Table(title="preloads", title_justify="left", expand=False)
    for column in ("job", "files", "bytes", "failed", "state"):
        table.add_column(column, justify="left" if column in ("job", "state") else "right")
    for job in jobs:
        scanning = job["state"] == "scanning"
        done = job["bytes_resident"] + job["bytes_fetched"]
        files = f"{job['files_done']:,}"
        size = format_size(done)
        if not scanning:
            files += f"/{job['files_total']:,}"
            size += f"/{format_size(job['bytes_total'])}"
            if job["bytes_total"]:
                size += f" ({done / job['bytes_total']:.0%})"
        table.add_row(job["id"], files, size, f"{job['files_failed']:,}", job["state"])
    return table


def render_status(status: Status, before: Status | None = None) -> Group:
    """The watch screen for one ``status`` reply (rates against ``before``)."""
    elapsed = float(status["time"]) - float(before["time"]) if before is not None else None
    if elapsed is not None and elapsed <= 0:
        elapsed = None
    header = Text(
        f"{status.get('mountpoint', '')}  (pid {status.get('pid', '?')})  "
        f"{time.strftime('%H:%M:%S', time.localtime(float(status['time'])))}",
        style="bold",
    )
    parts: list[Any] = [header, _tiers_table(status, before), _flow_table(status, before)]
    for title, key in (("FUSE requests", "fuse_requests"), ("S3 requests", "s3_requests")):
        table = _requests_table(
            title,
            status.get(key) or {},
            (before.get(key) or {}) if before is not None else None,
            elapsed,
        )
        if table is not None:
            parts.append(table)
    preloads = _preload_table(status)
    if preloads is not None:
        parts.append(preloads)
    return Group(*parts)


def watch_status(
    fetch: Callable[[], Status],
    *,
    interval: float = REFRESH_SECONDS,
    console: Console | None = None,
    frames: int | None = None,
) -> None:
    """Fetch and show a status reply every ``interval`` seconds, until
    interrupted (or ``frames`` frames were shown).  A control error ends it."""
    before: Status | None = None
    shown = 0
    with Live(console=console, auto_refresh=False) as live:
        while frames is None or shown < frames:
            status = fetch()
            live.update(render_status(status, before), refresh=True)
            before = status
            shown += 1
            if frames is None or shown < frames:
                time.sleep(interval)
