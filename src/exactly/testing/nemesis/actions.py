"""The nemesis's standard actions: what each kind of fault does to a running job.

Each action takes a :class:`~exactly.testing.nemesis.schedule.Fault` and is a context
manager that starts the fault on entry and ends it on exit (instant faults -- a cut, a
kill -- act on entry and hold nothing). The fault's ``params["draw"]`` (a number in [0, 1)
drawn from the schedule's seed) picks its variant, so a replayed schedule repeats it.

Kinds (:data:`NETWORK`, :data:`PROCESS`, ...): ``net.delay``, ``net.drop`` (one direction),
``net.blackhole``, ``net.cut``, ``net.answer`` (the answer to the sink's final commit request
dropped, cut, late, or the request itself late), ``pause.driver``, ``pause.executor``,
``pause.server``, ``disk.full``, ``kill`` (the driver's whole process tree, SIGKILL).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import psutil

from exactly.procs import kill_job
from exactly.testing.nemesis.faultlog import FaultLog
from exactly.testing.nemesis.processes import paused
from exactly.testing.nemesis.proxy import Answer, Direction, FaultProxy, MatcherFactory
from exactly.testing.nemesis.schedule import Action, Fault

NETWORK = ("net.delay", "net.drop", "net.blackhole", "net.cut")
ANSWER = "net.answer"
PAUSES = ("pause.driver", "pause.executor")
SERVER_PAUSE = "pause.server"
DISK = "disk.full"
KILL = "kill"

#: how long an answer fault waits past its duration for a commit request to meet it
ANSWER_WAIT_S = 30.0
#: the variants of an answer fault, picked by the fault's draw
ANSWERS = (Answer.DROP, Answer.CUT, Answer.LATE, Answer.LATE_REQUEST)


def _draw(fault: Fault) -> float:
    return float(fault.params.get("draw", 0.0))


def network_actions(proxy: FaultProxy, commit_request: MatcherFactory | None = None
                    ) -> dict[str, Action]:
    """Link faults through ``proxy``; with ``commit_request``, also ``net.answer`` on the
    first request it recognizes while the fault lasts."""

    @contextlib.contextmanager
    def delay(fault: Fault) -> Iterator[Any]:
        seconds = round(0.1 + 1.4 * _draw(fault), 2)
        proxy.delay(seconds, Direction.BOTH)
        try:
            yield {"seconds": seconds}
        finally:
            proxy.heal()

    @contextlib.contextmanager
    def drop(fault: Fault) -> Iterator[Any]:
        direction = Direction.UP if _draw(fault) < 0.5 else Direction.DOWN
        proxy.drop(direction)
        try:
            yield {"direction": direction.value}
        finally:
            proxy.heal()

    @contextlib.contextmanager
    def blackhole(fault: Fault) -> Iterator[Any]:
        proxy.blackhole()
        try:
            yield None
        finally:
            proxy.heal()

    @contextlib.contextmanager
    def cut(fault: Fault) -> Iterator[Any]:
        yield {"connections": proxy.cut()}

    actions: dict[str, Action] = {"net.delay": delay, "net.drop": drop,
                                  "net.blackhole": blackhole, "net.cut": cut}
    if commit_request is not None:
        @contextlib.contextmanager
        def answer(fault: Fault) -> Iterator[Any]:
            kind = ANSWERS[int(_draw(fault) * len(ANSWERS)) % len(ANSWERS)]
            late = max(1.0, fault.duration)
            trigger = proxy.on_request(commit_request, kind,
                                       delay=late if kind in (Answer.LATE,
                                                              Answer.LATE_REQUEST) else 0.0)
            detail: dict[str, Any] = {"answer": kind.value}
            try:
                yield detail
                # held until a commit request met it (the job may be between epochs)
                trigger.fired.wait(ANSWER_WAIT_S)
            finally:
                detail["fired"] = trigger.count
                proxy.heal()
        actions[ANSWER] = answer
    return actions


def pause_action(pids: Callable[[], list[int]], target: str, log: FaultLog) -> Action:
    """SIGSTOP the processes ``pids()`` names for the fault's duration."""

    @contextlib.contextmanager
    def pause(fault: Fault) -> Iterator[Any]:
        with paused(pids(), target=target, log=log) as stopped:
            yield {"pids": stopped}
    return pause


def kill_action(driver_pid: Callable[[], int | None]) -> Action:
    """SIGKILL the driver's whole process tree (a host crash of the driver); nothing to do
    while no driver runs."""

    @contextlib.contextmanager
    def kill(fault: Fault) -> Iterator[Any]:
        pid = driver_pid()
        if pid is None or not psutil.pid_exists(pid):
            yield {"killed": 0}
            return
        try:
            root = psutil.Process(pid)
        except psutil.Error:
            yield {"killed": 0}
            return
        killed = kill_job(None, root, what="the driver")
        yield {"killed": len(killed), "driver": pid}
    return kill


def disk_action(fill: Callable[[], Any], free: Callable[[], Any]) -> Action:
    """Fill a disk for the fault's duration, then free it."""

    @contextlib.contextmanager
    def full(fault: Fault) -> Iterator[Any]:
        fill()
        try:
            yield None
        finally:
            free()
    return full
