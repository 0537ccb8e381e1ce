"""The target-state part of the sink contract: what a target knows of the queries that wrote it.

A restore (:mod:`exactly.savepoints`) makes a new query that continues the savepoint's epoch
numbers at N+1, as a restored Flink job gets a new job id. Before it runs, the rule of
:mod:`exactly.savepoints.sinks` asks the sink's target, through the methods of
:class:`~exactly.protocol.contract.TwoPhaseCommitSink` this module types:

* ``target_state(query_id)`` -> :class:`TargetState`: the query the target belongs to (its
  *owner*), the owner's **lineage** (which query it was restored from at which epoch, and so
  on back), and how far that line got in the target (its *progress*);
* ``rollback_support(state, epoch)`` -> :class:`RollbackSupport`: whether the target can take
  back the line's epochs after ``epoch`` (``--sink-rollback retract``) and what keeping them
  means (``--sink-rollback keep``);
* ``retract_after(state, epoch)``: take those epochs back;
* ``hand_over(state, to_query, lineage)``: make the target the restored query's, recording
  its lineage; in a fresh target (a fork) too, where it supersedes no query
  (:meth:`TargetState.superseded`) and the target may not exist yet.

Lineage. Query B restored from query A's savepoint at epoch 10 continues A: A's output up to
epoch 10 is B's too. A savepoint of A at epoch N may therefore be restored into a target
whose owner is A or descends from A. The line *left* A at epoch 10 (:meth:`TargetState.left_at`):
a savepoint of A at N > 10 holds epochs 11..N that this line of the target never kept (a
branch), and is refused. Rolling back to A's savepoint at N <= 10 is a rollback over
everything the line wrote after N, B's epochs included.

Two kinds of target record lineage differently:

* a target **bound to one query at a time** (the file sink's directory, the PostgreSQL 2PC
  sink's table) records the owner and its lineage in one place; a savepoint of a query
  outside that lineage is "not this job's output";
* a target **several queries may write** (Kafka topics, Delta tables, write-ahead tables)
  records each hand-over as an :class:`Edge`; :func:`line_state` goes back from the
  savepoint's query to the first of its ancestors the target records (the *root*), then
  follows the newest hand-over from each query to the newest query descending from the
  root: the owner of the line. A savepoint whose query is neither that owner nor one of its
  ancestors is of a branch a later restore replaced (:attr:`TargetState.savepoint_lineage`
  names where they split). A query without edges is a line of its own there: its own
  progress counts, and such a target is never "another job's output".

Every restore records its hand-over, a fork (a restore into a target holding nothing of
the line) too: restoring the same savepoint into that target again, or an older savepoint
of the same query, is then judged on the line the fork started.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from exactly.errors import ExactlyError


class SinkRollback(str, Enum):
    """What a restore does when the target is ahead of the savepoint (``--sink-rollback``)."""

    REFUSE = "refuse"
    RETRACT = "retract"
    KEEP = "keep"


class LineageRecordError(ExactlyError):
    """A target's lineage record cannot be read; the message names where it is."""


@dataclass(frozen=True)
class Restored:
    """One step back in a lineage: restored from query ``query_id``'s savepoint at ``epoch``
    (the restored query's first epoch is ``epoch + 1``)."""

    query_id: str
    epoch: int

    def to_json(self) -> dict[str, Any]:
        return {"query_id": self.query_id, "epoch": self.epoch}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Restored:
        return Restored(str(data["query_id"]), int(data["epoch"]))


#: a query's ancestors, its parent first
Lineage = tuple[Restored, ...]


def lineage_to_json(lineage: Lineage) -> list[dict[str, Any]]:
    return [step.to_json() for step in lineage]


def lineage_from_json(data: Any, where: str) -> Lineage:
    """The lineage recorded by :func:`lineage_to_json` (``None``/empty: none); raises
    LineageRecordError naming ``where`` for anything else."""
    if data in (None, "", []):
        return ()
    try:
        steps = json.loads(data) if isinstance(data, str) else data
        return tuple(Restored.from_json(step) for step in steps)
    except (TypeError, ValueError, KeyError) as exc:
        raise LineageRecordError(
            f"the lineage recorded in {where} is malformed ({exc!r}); it lists the queries the "
            "target's owner was restored from. Repair it by hand (a JSON list of "
            '{"query_id": ..., "epoch": N}, parent first) or remove it (the owner then counts '
            "as a query that was never restored)") from None


@dataclass(frozen=True)
class Edge:
    """A hand-over recorded by a target several queries may write: ``query_id`` was restored
    from ``parent`` and took the target over at time ``at`` (seconds since the epoch; the
    newest hand-over from a query decides its line)."""

    query_id: str
    parent: Restored
    at: float

    def to_json(self) -> dict[str, Any]:
        return {"query_id": self.query_id, "parent": self.parent.to_json(), "at": self.at}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Edge:
        return Edge(str(data["query_id"]), Restored.from_json(data["parent"]),
                    float(data.get("at", 0.0)))


def ancestors(edges: Iterable[Edge], query_id: str) -> Lineage:
    """``query_id``'s lineage as ``edges`` record it (its newest edge per query)."""
    parent_of: dict[str, Edge] = {}
    for edge in edges:
        known = parent_of.get(edge.query_id)
        if known is None or edge.at >= known.at:
            parent_of[edge.query_id] = edge
    steps: list[Restored] = []
    seen = {query_id}
    current = query_id
    while current in parent_of:
        step = parent_of[current].parent
        if step.query_id in seen:
            break  # a cycle cannot come from restores; stop rather than loop
        steps.append(step)
        seen.add(step.query_id)
        current = step.query_id
    return tuple(steps)


def line_head(edges: Iterable[Edge], query_id: str) -> str:
    """The newest query descending from ``query_id``: from each query, the one restored from
    it most recently (``query_id`` itself when nothing was restored from it)."""
    children: dict[str, list[Edge]] = defaultdict(list)
    for edge in edges:
        children[edge.parent.query_id].append(edge)
    head, seen = query_id, {query_id}
    while children.get(head):
        newest = max(children[head], key=lambda e: (e.at, e.query_id))
        if newest.query_id in seen:
            break
        head = newest.query_id
        seen.add(head)
    return head


@dataclass(frozen=True)
class TargetState:
    """The target as a restore finds it.

    ``owner``: the query the target (or, for targets several queries write, the line of the
    query asked about) belongs to now; None when it holds no output of that line.
    ``lineage``: the owner's ancestors, parent first. ``progress``: the newest epoch of the
    owner's line visible in the target (None: none). ``known``: False for a target that
    cannot tell (a sink without a target-state part). ``savepoint_lineage``: the ancestors
    of the query asked about as the target records them (targets several queries write;
    empty elsewhere): when that query is not in the owner's line, where it left the line.
    """

    target: str
    owner: str | None = None
    lineage: Lineage = ()
    progress: int | None = None
    known: bool = True
    savepoint_lineage: Lineage = ()

    @classmethod
    def unknown(cls, target: str) -> TargetState:
        return cls(target, known=False)

    @property
    def fresh(self) -> bool:
        """No output of the line, no owner: a restore there is a fork."""
        return self.known and self.owner is None and self.progress is None

    @property
    def members(self) -> tuple[str, ...]:
        """The owner and its ancestors, newest first."""
        return ((self.owner,) if self.owner else ()) + tuple(s.query_id for s in self.lineage)

    def holds(self, query_id: str) -> bool:
        """``query_id`` is the owner or one of its ancestors."""
        return query_id in self.members

    def left_at(self, query_id: str) -> int | None:
        """The epoch at which the line left ``query_id`` (its child was restored from its
        savepoint there); None for the owner and for queries outside the lineage."""
        for step in self.lineage:
            if step.query_id == query_id:
                return step.epoch
        return None

    def branch_point(self, query_id: str) -> Restored | None:
        """For ``query_id`` outside the owner's line: the nearest of its recorded ancestors
        the line holds (``query_id``, or a query it descends from, was restored from that
        query's savepoint at that epoch; the line went on from there on another branch).
        None when the target records no shared ancestor."""
        if self.holds(query_id):
            return None
        return next((step for step in self.savepoint_lineage if self.holds(step.query_id)),
                    None)

    def superseded(self, lineage: Lineage) -> tuple[str, ...]:
        """The queries a hand-over to a query with ``lineage`` supersedes in this target:
        the line's members and the savepoint's query; none in a fresh target (a fork: the
        savepoint's query may still run elsewhere, its transactions are not this target's)."""
        if self.fresh:
            return ()
        return tuple(dict.fromkeys([*self.members, lineage[0].query_id]))

    def retracted_members(self, epoch: int) -> tuple[str, ...]:
        """The queries of the line whose output after ``epoch`` is the line's, newest first:
        the owner and its ancestors back to (not including) the first one the line left at
        or before ``epoch``; what that one and older ones wrote after ``epoch`` is another
        branch's (rows a ``keep`` left), not the line's to take back."""
        members = []
        for query in self.members:
            left = self.left_at(query)
            if left is not None and left <= epoch:
                break
            members.append(query)
        return tuple(members)

    def continued(self, query_id: str, epoch: int) -> Lineage:
        """The lineage of a query restored from ``query_id``'s savepoint at ``epoch``:
        ``query_id`` at ``epoch``, then ``query_id``'s own ancestors."""
        ids = [s.query_id for s in self.lineage]
        if query_id == self.owner:
            rest = self.lineage
        elif query_id in ids:
            rest = self.lineage[ids.index(query_id) + 1:]
        else:
            rest = ()
        return (Restored(query_id, epoch), *rest)

    def describe_line(self, query_id: str) -> str:
        """``query B (restored from A at epoch 10)``: the owner, back to ``query_id``."""
        if self.owner is None:
            return "the line being restored (the target records no owner)"
        text = f"query {self.owner}"
        steps = []
        for step in self.lineage:
            steps.append(f"restored from {step.query_id} at epoch {step.epoch}")
            if step.query_id == query_id:
                break
        return f"{text} ({', '.join(steps)})" if steps and self.owner != query_id else text


@dataclass(frozen=True)
class RollbackSupport:
    """What ``--sink-rollback`` can do on a target that is ahead of a savepoint.

    ``retract``: None when the target can take back the line's epochs after the savepoint,
    else why it cannot. ``keep``: what keeping them leaves in the target (one sentence).
    """

    retract: str | None
    keep: str

    @property
    def can_retract(self) -> bool:
        return self.retract is None


def line_state(target: str, edges: Sequence[Edge], query_id: str,
               last_epoch: Callable[[str], int | None]) -> TargetState:
    """The state of ``query_id``'s line in a target several queries may write.

    The line starts at the *root*, the oldest of ``query_id``'s ancestors the edges record
    (``query_id`` itself without one); its owner is the newest query descending from the
    root (:func:`line_head`), which may be on another branch than ``query_id`` when a later
    restore replaced ``query_id``'s (then ``query_id`` is not in the owner's lineage and
    :meth:`TargetState.branch_point` says where they split). ``last_epoch(q)`` is the newest
    epoch of query ``q`` visible in the target (None: none). The line's progress is the
    owner's newest epoch there, or, before the owner wrote any, the epoch it was restored
    from. A line without output is fresh (owner None).
    """
    own = ancestors(edges, query_id)
    head = line_head(edges, own[-1].query_id if own else query_id)
    lineage = ancestors(edges, head)
    last = last_epoch(head)
    progress = last if last is not None else (lineage[0].epoch if lineage else None)
    if progress is None:
        return TargetState(target)
    return TargetState(target, head, lineage, progress, savepoint_lineage=own)
