"""Rewriting a restore's state for a Spark Connect client, in a classic Spark of its own.

A restore that rescales (other partitions) or switches the state backend writes state through
Spark's providers with exactly's JVM class (:mod:`~exactly.savepoints.state_writer`) or
Spark's offline repartition: both need a driver JVM in the restoring process (Py4J), which a
Spark Connect client has not, and a Python process cannot hold a classic session beside a
Connect one. So the client runs that part -- writing the new checkpoint's files from the
savepoint -- in a child process: ``python -m exactly.savepoints.rewrite`` with the restore
plan as JSON on stdin, a short-lived classic ``local[1]`` Spark session (Spark Connect
settings removed from its environment; :mod:`~exactly.savepoints.rewrite_child`), and the
answer as one JSON line on stdout.

That works where the savepoint (a local copy) and the new checkpoint are files of the client's
host: a local or shared file system, the condition a checkpoint on Connect already has
(object-storage checkpoints are refused there). A restore that only copies files (same
partitions and backend, no new operator) needs no Spark at all and runs in the client.

The child watches its parent: when the client dies (a crash, SIGKILL) it exits at once, its
JVM with it, so a restarted client that redoes the interrupted restore never races it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from exactly.errors import SavepointError

#: environment variables that would make the child's session a Connect one (or reuse the
#: parent's gateway)
CONNECT_ENV = ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE",
               "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "SPARK_API_MODE")
#: the child's module (``python -m``): it imports the restore, which imports this one
CHILD = "exactly.savepoints.rewrite_child"
#: how many of the child's last output lines an error quotes
TAIL_LINES = 30


def plan_to_json(plan: Any) -> dict[str, Any]:
    """A :class:`~exactly.savepoints.restore.RestorePlan` as JSON, for the child."""
    return {"savepoint": str(plan.savepoint), "manifest": plan.manifest.to_json(),
            "partitions": plan.partitions, "backend": plan.backend,
            "moves": [{"old": m.old.operator_id, "new": asdict(m.new),
                       "method": m.method.value} for m in plan.moves],
            "dropped": [o.operator_id for o in plan.dropped],
            "new": [asdict(op) for op in plan.new]}


def child_env() -> dict[str, str]:
    """The child's environment: this one without Spark Connect, importing the same exactly
    (this process's ``sys.path``) with this interpreter."""
    env = {k: v for k, v in os.environ.items() if k not in CONNECT_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and Path(p).is_dir())
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return env


def write_in_child(plan: Any, dest: Path, query_id: str) -> None:
    """Write ``plan``'s checkpoint files into the local directory ``dest`` in a child
    process's classic Spark (module docstring). Raises SavepointError with the child's
    reason when it fails."""
    request = {"plan": plan_to_json(plan), "dest": str(dest.absolute()),
               "query_id": query_id, "parent": os.getpid()}
    proc = subprocess.run([sys.executable, "-m", CHILD],
                          input=json.dumps(request), capture_output=True, text=True,
                          env=child_env(), check=False)
    answer = _answer(proc.stdout)
    if proc.returncode == 0 and answer.get("done"):
        return
    if answer.get("error"):
        raise SavepointError(str(answer["error"]))
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-TAIL_LINES:])
    raise SavepointError(
        "the state rewrite of this restore (a classic local Spark in a child process, since a "
        f"Spark Connect client has no JVM of its own) failed with exit code {proc.returncode}; "
        f"its output ends:\n{tail}\nFix the cause and run the job again: the restore starts "
        "over")


def _answer(stdout: str) -> dict[str, Any]:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return {}
