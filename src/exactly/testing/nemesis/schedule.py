"""Faults at random times from a seed, run one after another, written to a fault log.

A :class:`FaultSchedule` is a list of :class:`Fault` (when, what kind, for how long, with
which parameters), drawn from a seed (:meth:`FaultSchedule.random`: every kind at least once,
in a shuffled order, then random kinds) or read back from a fault log
(:meth:`FaultSchedule.from_log`), so a failing run can be replayed with the same faults at
the same offsets. A :class:`Nemesis` runs a schedule in a thread: for each fault it waits for
its time, enters the action registered for its kind (a context manager that starts the fault
and ends it on exit), holds it for its duration, and writes both to the log. Faults never
overlap, and :meth:`Nemesis.stop` ends the current one before it returns: nothing is left
paused, partitioned or full after a run.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exactly.testing.nemesis.faultlog import FaultLog

#: what a kind of fault does: given the fault, a context manager that holds it
Action = Callable[["Fault"], AbstractContextManager[Any]]


@dataclass(frozen=True)
class Fault:
    """One fault: ``at`` seconds after the nemesis started, held ``duration`` seconds."""

    at: float
    kind: str
    duration: float
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FaultSchedule:
    seed: int | None
    faults: tuple[Fault, ...]

    @classmethod
    def random(cls, seed: int, kinds: Sequence[str], count: int, *,
               gap: tuple[float, float] = (0.5, 3.0),
               duration: tuple[float, float] = (0.5, 4.0),
               durations: Mapping[str, tuple[float, float]] | None = None) -> FaultSchedule:
        """``count`` faults (at least one of each kind when ``count >= len(kinds)``),
        ``gap`` seconds apart (uniform), each held ``duration`` seconds (uniform; per kind
        from ``durations`` when given)."""
        if not kinds:
            raise ValueError("a schedule needs at least one kind of fault")
        rng = random.Random(seed)
        order = list(kinds)
        rng.shuffle(order)
        picked = (order + [rng.choice(kinds) for _ in range(max(0, count - len(order)))])[:count]
        faults, at = [], 0.0
        for kind in picked:
            at += rng.uniform(*gap)
            low, high = (durations or {}).get(kind, duration)
            held = round(rng.uniform(low, high), 2)
            faults.append(Fault(round(at, 2), kind, held, {"draw": rng.random()}))
            at += held
        return cls(seed, tuple(faults))

    @classmethod
    def from_log(cls, path: str | Path) -> FaultSchedule:
        """The schedule a fault log recorded (its ``scheduled`` entries), to replay it."""
        faults, seed = [], None
        for line in Path(path).read_text().splitlines():
            entry = json.loads(line)
            if entry["kind"] == "log":
                seed = entry.get("seed")
            elif entry["phase"] == "scheduled":
                faults.append(Fault(entry["at"], entry["fault"], entry["duration"],
                                    entry.get("params", {})))
        return cls(seed, tuple(faults))

    def kinds(self) -> set[str]:
        return {f.kind for f in self.faults}


class Nemesis:
    """Runs a :class:`FaultSchedule` in a background thread against registered actions."""

    def __init__(self, schedule: FaultSchedule, actions: Mapping[str, Action],
                 log: FaultLog) -> None:
        missing = schedule.kinds() - set(actions)
        if missing:
            raise ValueError(f"no action for the fault kinds {sorted(missing)}")
        self.schedule = schedule
        self.actions = actions
        self.log = log
        self.done: list[Fault] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)
        for fault in schedule.faults:
            log.record("schedule", "nemesis", phase="scheduled", fault=fault.kind, at=fault.at,
                       duration=fault.duration, params=dict(fault.params))

    def start(self) -> Nemesis:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        for fault in self.schedule.faults:
            if self._stop.wait(max(0.0, self.started + fault.at - time.monotonic())):
                return
            try:
                with self.actions[fault.kind](fault) as detail:
                    self.log.record(fault.kind, "nemesis", phase="start",
                                    duration=fault.duration,
                                    **({"detail": detail} if detail is not None else {}))
                    self._stop.wait(fault.duration)
                self.log.record(fault.kind, "nemesis", phase="end")
                self.done.append(fault)
            except Exception as exc:  # an action that could not act (e.g. no such process)
                self.errors.append(f"{fault.kind} at {fault.at}s: {type(exc).__name__}: {exc}")
                self.log.record(fault.kind, "nemesis", phase="error", error=str(exc))

    def stop(self, timeout: float = 60) -> None:
        """End the current fault and skip the rest; returns once every fault is over."""
        self._stop.set()
        self._thread.join(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the schedule to finish; True if it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for fault in self.done:
            counts[fault.kind] = counts.get(fault.kind, 0) + 1
        return counts


@contextlib.contextmanager
def nothing(_: Fault) -> Any:
    """An action that does nothing (a pause in the schedule)."""
    yield None
