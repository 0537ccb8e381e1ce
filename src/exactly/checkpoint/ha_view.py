"""What a high-availability job's records say, for the views: its leader, its live standbys
and its failovers with their causes and durations.

Read-only. It reads what ``exactly run --ha`` writes in the job store
(``<checkpoint>/exactly-job``, see :mod:`exactly.checkpoint.leader`): the leader lease
``ha/leader.json``, one member record per live launcher under ``ha/members/``, ``job.json``
(``supervisor.host`` and ``leader``, the leader generation) and the restart history's
``failover`` entries. Ages are measured from the store's modification times, never from a
writer's clock.

Nothing here raises for a record that is damaged (not JSON, not an object, a field of the
wrong type): the record is named in ``unreadable`` and everything else still shows. Only
the store's own errors (an unreachable S3 endpoint) propagate, as for every other view.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from exactly.checkpoint import layout
from exactly.checkpoint.leader import LEADER, MEMBERS
from exactly.checkpoint.status import ENDED as _ENDED
from exactly.checkpoint.store import LogStore


def leader_view(store: LogStore, *, now: float | None = None) -> dict[str, Any] | None:
    """The leader and the live standbys of the HA job in ``store`` (its job store); None
    when the job does not run with ``--ha`` (no lease, no member record, and no leader
    generation in ``job.json``; or ``job.json`` saying its run is not an HA run).

    Keys: ``host`` (the lease's holder, else ``job.json``'s ``supervisor.host``),
    ``generation``, ``since`` (when the lease was acquired), ``lease`` (``held`` |
    ``expired`` | ``released`` | ``ended`` | None without a readable lease), ``age_s`` (since
    the lease was last written, by the store's clock), ``lease_s``, ``ended`` (the job's end
    the leader recorded), ``standbys`` (hosts whose member record is fresh -- written less
    than its ``lease_s`` ago -- and says ``standby``; sorted) and ``unreadable`` (a line per
    damaged record)."""
    now = time.time() if now is None else now
    unreadable: list[str] = []
    job, _ = _record(store, layout.JOB_STATUS)
    lease, problem = _record(store, LEADER)
    members = sorted(name for name in store.list(MEMBERS) if name.endswith(".json"))
    generation = _integer((job or {}).get("leader"))
    if lease is None and problem is None and not members and generation is None:
        return None

    view: dict[str, Any] = {
        "host": _text(_get(job, "supervisor", "host")), "generation": generation,
        "since": None, "lease": None, "age_s": None, "lease_s": None, "ended": None,
        "standbys": [], "unreadable": unreadable}
    if lease is not None and _text(lease.get("host")) is None:
        problem = "names no host"
    if problem is not None:
        unreadable.append(f"{LEADER}: {problem}")
    elif lease is not None:
        _read_lease(store, lease, view, now)
    if (job is not None and "leader" in job and generation is None and not unreadable
            and view["lease"] in (None, "ended", "released", "expired")):
        return None  # job.json's run is not an HA run; a lease left is an earlier run's
    for name in members:
        member, problem = _record(store, f"{MEMBERS}/{name}")
        if member is None:
            if problem:  # None without a problem: deleted since it was listed (it left)
                unreadable.append(f"{MEMBERS}/{name}: {problem}")
            continue
        lease_s = _number(member.get("lease_s"))
        written = store.modified(f"{MEMBERS}/{name}")
        if lease_s is None:
            unreadable.append(f"{MEMBERS}/{name}: no lease_s, cannot tell whether it is live")
        elif (member.get("role") == "standby" and written is not None
              and now - written < lease_s):
            view["standbys"].append(_text(member.get("host")) or name.removesuffix(".json"))
    view["standbys"] = sorted(set(view["standbys"]))
    return view


def _read_lease(store: LogStore, lease: dict[str, Any], view: dict[str, Any],
                now: float) -> None:
    """Fill ``view`` from a readable ``leader.json``: the lease wins over job.json, which
    the new leader of a failover claims only after it took the lease."""
    view["host"] = _text(lease.get("host"))
    view["generation"] = _integer(lease.get("generation"), view["generation"])
    view["since"] = _number(lease.get("acquired_at"))
    view["lease_s"] = _number(lease.get("lease_s"))
    written = store.modified(LEADER)
    view["age_s"] = None if written is None else round(max(0.0, now - written), 3)
    ended = lease.get("ended")
    if isinstance(ended, dict):
        view["lease"] = "ended"
        view["ended"] = {"state": _text(ended.get("state")), "at": _number(ended.get("at")),
                         "detail": _text(ended.get("detail"))}
    elif lease.get("released") is True:
        view["lease"] = "released"
    elif view["age_s"] is not None and view["lease_s"] is not None:
        view["lease"] = "expired" if view["age_s"] >= view["lease_s"] else "held"


def failovers(entries: Sequence[dict[str, Any]], *, job_state: str | None = None,
              now: float | None = None) -> list[dict[str, Any]]:
    """Every failover in the restart history ``entries`` (oldest first), with its duration.

    A failover is a ``{"event": "failure", "kind": "failover"}`` entry. Its duration runs
    from ``since`` (the old leader's lease expiry) to the first epoch completed on the new
    host: the ``recovery_s`` of the next ``recovered`` entry of the same ``run``; when
    another failure of that run came between (whose recovery ``recovery_s`` measures from),
    it is that entry's ``at`` minus ``since``.

    Each dict: ``at`` (taken over), ``since``, ``from_host``, ``to_host``, ``run``,
    ``generation``, ``cause``, ``duration_s`` (None until recovered), ``epoch`` (the first
    epoch completed after it), ``outcome`` (``recovered`` | ``in_progress`` | ``superseded``:
    another failover came first | ``ended``: the job ended, ``job_state``, before an epoch
    completed), ``in_progress`` and ``elapsed_s`` (``now - since`` while in progress)."""
    now = time.time() if now is None else now
    found = []
    for index, entry in enumerate(entries):
        if entry.get("event") != "failure" or entry.get("kind") != "failover":
            continue
        run, since = entry.get("run"), _number(entry.get("since"))
        later = entries[index + 1:]
        recovered, failed_between = None, False
        for other in later:
            if other.get("run") != run:
                continue
            if other.get("event") == "recovered":
                recovered = other
                break
            failed_between = failed_between or other.get("event") == "failure"
        duration = None
        if recovered is not None:
            duration = _number(recovered.get("recovery_s"))
            end = _number(recovered.get("at"))
            if (failed_between or duration is None) and end is not None and since is not None:
                duration = round(end - since, 3)
        superseded = any(o.get("event") == "failure" and o.get("kind") == "failover"
                         for o in later)
        outcome = ("recovered" if recovered is not None else "superseded" if superseded
                   else "ended" if job_state in _ENDED else "in_progress")
        in_progress = outcome == "in_progress"
        found.append({
            "at": _number(entry.get("at")), "since": since,
            "from_host": _text(entry.get("from_host")), "to_host": _text(entry.get("to_host")),
            "run": _text(run), "generation": _integer(entry.get("generation")),
            "cause": _text(entry.get("cause")), "duration_s": duration,
            "epoch": _integer((recovered or {}).get("epoch")), "outcome": outcome,
            "in_progress": in_progress,
            "elapsed_s": round(max(0.0, now - since), 3) if in_progress and since is not None
            else None})
    return found


def _record(store: LogStore, name: str) -> tuple[dict[str, Any] | None, str | None]:
    """``(the JSON object in name, None)``; ``(None, what is wrong)`` for a damaged one;
    ``(None, None)`` when there is no such file."""
    try:
        data = store.read(name)
    except OSError as exc:  # a directory in its place, no permission
        return None, f"cannot be read ({exc.strerror or exc})"
    return (None, None) if data is None else _parse(data)


def _parse(data: bytes) -> tuple[dict[str, Any] | None, str | None]:
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None, f"not valid JSON ({len(data)} bytes)"
    if not isinstance(value, dict):
        return None, f"holds a JSON {type(value).__name__}, not an object"
    return value, None


def _get(value: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _integer(value: Any, default: int | None = None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
