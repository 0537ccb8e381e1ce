"""``exactly checkpoints``: a job's checkpoint overview, history and summary as terminal
tables (rich), or JSON for scripts."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from exactly.monitoring.overview import Overview


def when(at: float | None) -> str:
    """``HH:MM:SS`` today, ``YYYY-MM-DD HH:MM:SS`` otherwise (local time)."""
    if at is None:
        return "-"
    moment = datetime.fromtimestamp(at)
    today = moment.date() == datetime.now().date()
    return moment.strftime("%H:%M:%S" if today else "%Y-%m-%d %H:%M:%S")


def size(value: float | None) -> str:
    if value is None:
        return "-"
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(amount) < 1024 or unit == "GiB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} TiB"  # pragma: no cover


def millis(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f} ms" if value < 10_000 else f"{value / 1000:.1f} s"


def number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if value.is_integer() or abs(value) >= 100 else f"{value:.2f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _repeated(entry: dict[str, Any]) -> str:
    """`` (same cause 4 times in a row)`` for a failure whose cause repeated, else nothing."""
    repeats = entry.get("repeats")
    return f" (same cause {repeats} times in a row)" if isinstance(repeats, int) and repeats > 1 \
        else ""


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def spare_line(spare: dict[str, Any]) -> str:
    """``spare driver: ready (pid 4242, for 31s)``: what the next restart starts from."""
    if spare["state"] == "none":
        return "spare driver: none (a restart starts the next driver from scratch)"
    since = spare.get("since")
    age = f", for {max(0.0, time.time() - float(since)):.0f}s" if since else ""
    return f"spare driver: {spare['state']} (pid {spare.get('pid')}{age})"


def leader_line(leader: dict[str, Any]) -> str:
    """``leader: host-b (generation 4, since 12:00:03) · standbys: host-c`` for an HA job:
    the lease's state when it is not held (expired, released, the job ended, unreadable)."""
    facts = []
    if leader.get("generation") is not None:
        facts.append(f"generation {leader['generation']}")
    if leader.get("since") is not None:
        facts.append(f"since {when(leader['since'])}")
    lease = leader.get("lease")
    if lease == "expired" and leader.get("age_s") is not None and leader.get("lease_s"):
        facts.append(f"lease expired {seconds(leader['age_s'] - leader['lease_s'])} ago")
    elif lease == "released":
        facts.append("released its lease")
    elif lease == "ended":
        ended = leader.get("ended") or {}
        facts.append(f"the job {ended.get('state') or 'ended'} {when(ended.get('at'))}")
    elif lease is None and leader.get("unreadable"):
        facts.append("lease unreadable")
    standbys = ", ".join(leader.get("standbys") or []) or "none"
    detail = f" ({', '.join(facts)})" if facts else ""
    return f"leader: {leader.get('host') or 'unknown'}{detail} · standbys: {standbys}"


def failover_duration(failover: dict[str, Any]) -> str:
    """How long a failover took (lease expiry -> first epoch on the new host), or how long
    it has been going on."""
    outcome = failover.get("outcome")
    if outcome == "in_progress":
        return f"in progress ({seconds(failover.get('elapsed_s'))})"
    if outcome == "superseded":
        return "superseded by the next failover"
    if outcome == "ended":
        return "the job ended first"
    return seconds(failover.get("duration_s"))


def render(view: Overview, *, rows: int = 10) -> Group:
    """The overview card, the leader and standbys of an HA job, the latest checkpoints, the
    history (newest ``rows``), the summary, the failovers, the restarts, the configuration
    and any warning, as one printable group."""
    parts: list[Any] = []
    counts = view.counts
    head = Table.grid(padding=(0, 2))
    head.add_row(Text(f"job {view.job_id}", style="bold"), f"status: {view.status}",
                 f"checkpoint: {view.checkpoint}")
    parts.append(head)
    if view.status_detail:
        parts.append(Text(f"{view.status}: {view.status_detail}",
                          style="red" if view.status in ("failed", "lost") else "yellow"))
    if view.leader is not None:
        parts.append(Text(leader_line(view.leader), style="cyan"))
    if view.spare is not None:
        parts.append(Text(spare_line(view.spare),
                          style="green" if view.spare["state"] == "ready" else "yellow"))
    tally = Table(title="checkpoint counts", title_justify="left")
    for column in ("triggered", "in progress", "completed", "failed", "restored",
                   "restarts", "savepoints"):
        tally.add_column(column, justify="right")
    tally.add_row(*(str(counts.get(k.replace(" ", "_"), 0)) for k in
                    ("triggered", "in progress", "completed", "failed", "restored",
                     "restarts", "savepoints")))
    parts.append(tally)

    latest = Table(title="latest", title_justify="left")
    latest.add_column("what")
    latest.add_column("epoch", justify="right")
    latest.add_column("at")
    latest.add_column("detail")
    completed, failed = view.latest.get("completed"), view.latest.get("failed")
    if completed:
        latest.add_row("completed", str(completed["epoch"]), when(completed["end_at"]),
                       f"{millis(completed['duration_ms'])}, "
                       f"{size(completed['full_bytes'])} full")
    if failed:
        latest.add_row("failed", str(failed["epoch"]), when(failed["end_at"]),
                       f"{failed.get('failure') or ''}: {failed.get('cause') or ''}")
    savepoint, restore = view.latest.get("savepoint"), view.latest.get("restore")
    if savepoint:
        latest.add_row("savepoint", number(savepoint.get("epoch")), when(savepoint.get("at")),
                       str(savepoint.get("path") or ""))
    if restore:
        detail = f"from {restore['source']} {restore.get('path') or ''}".strip()
        if restore.get("after_failure"):
            detail += f" after: {restore['after_failure']}"
        latest.add_row("restore", number(restore.get("epoch")), when(restore.get("at")),
                       detail)
    upgrade = view.latest.get("upgrade")
    if upgrade:
        latest.add_row("upgrade", number(upgrade.get("epoch")), when(upgrade.get("at")),
                       f"to {upgrade.get('job_file')} (from {upgrade.get('from_job_file')}), "
                       f"through {upgrade.get('savepoint')}")
    parts.append(latest)

    history = Table(title=f"history (newest {min(rows, len(view.history))} of "
                          f"{len(view.history)})", title_justify="left")
    shown = view.history[:rows]
    causes = any(row.cause for row in shown)
    for column, justify in (("epoch", "right"), ("status", "left"), ("trigger", "left"),
                            ("duration", "right"), ("new", "right"), ("full", "right"),
                            ("rows in", "right"), ("rows out", "right"),
                            *((("cause", "left"),) if causes else ())):
        history.add_column(column, justify=justify, no_wrap=column != "cause")
    for row in shown:
        style = {"failed": "red", "in_progress": "yellow"}.get(row.status)
        status = row.status.replace("_", " ") + (" *" if row.restored else "")
        trigger = when(row.trigger_at) + (" (manual)" if row.trigger == "manual" else "")
        history.add_row(str(row.epoch), status,
                        trigger, millis(row.duration_ms), size(row.new_bytes),
                        size(row.full_bytes), number(row.rows_in), number(row.rows_out),
                        *((row.cause or "",) if causes else ()), style=style)
    parts.append(history)
    if any(row.restored for row in view.history[:rows]):
        parts.append(Text("* the first epoch after a restore", style="dim"))

    summary = Table(title="summary (completed checkpoints)", title_justify="left")
    for column in ("", "min", "avg", "max"):
        summary.add_column(column, justify="right" if column else "left")
    for label, key, fmt in (("end-to-end duration", "duration_ms", millis),
                            ("checkpointed size (new)", "new_bytes", size),
                            ("full checkpoint size", "full_bytes", size),
                            ("rows processed", "rows_in", number)):
        stats = view.summary.get(key) or {}
        summary.add_row(label, *(fmt(stats.get(k)) for k in ("min", "avg", "max")))
    parts.append(summary)

    if view.failovers:
        failovers = Table(title="failovers", title_justify="left")
        for column in ("taken over", "from", "to", "lease expired", "duration", "cause"):
            failovers.add_column(column, justify="right" if column == "duration" else "left")
        for failover in view.failovers[-rows:]:
            failovers.add_row(when(failover.get("at")), failover.get("from_host") or "-",
                              failover.get("to_host") or "-", when(failover.get("since")),
                              failover_duration(failover), failover.get("cause") or "",
                              style="yellow" if failover.get("in_progress") else None)
        parts.append(failovers)

    if view.restarts:
        restarts = Table(title="restarts and failures", title_justify="left")
        for column in ("at", "event", "kind", "action", "cause"):
            restarts.add_column(column)
        for entry in view.restarts[-rows:]:
            restarts.add_row(when(entry.get("at")), str(entry.get("event")),
                             str(entry.get("kind") or ""), str(entry.get("action") or ""),
                             str(entry.get("cause") or entry.get("recovery_s") or "")
                             + _repeated(entry))
        parts.append(restarts)

    config = Table(title="configuration", title_justify="left")
    config.add_column("setting")
    config.add_column("value")
    for key, value in view.config.items():
        if isinstance(value, dict):
            for inner, inner_value in value.items():
                config.add_row(f"{key}.{inner}", number(inner_value))
        else:
            config.add_row(key, number(value))
    parts.append(config)
    for warning in view.warnings:
        parts.append(Text(f"warning: {warning}", style="yellow"))
    parts.append(Text(f"read {when(view.updated_at)}", style="dim"))
    return Group(*parts)


def follow_interval(view: Overview) -> float:
    """How often ``--follow`` re-reads: the job's trigger interval, between 0.5 and 5 s."""
    interval = float(view.config.get("interval_s") or 1.0)
    return min(5.0, max(0.5, interval))
