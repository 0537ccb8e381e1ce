"""The child process of a restore's state rewrite for a Spark Connect client
(:mod:`~exactly.savepoints.rewrite`): ``python -m exactly.savepoints.rewrite_child`` reads the
request (the restore plan, the destination, the query id, the parent's pid) as JSON on stdin,
writes the checkpoint's files with a classic ``local[1]`` Spark, and answers one JSON line on
stdout. It exits at once when its parent dies, its JVM with it."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from exactly.errors import ExactlyError
from exactly.savepoints.manifest import Manifest
from exactly.savepoints.operators import JobOperator
from exactly.savepoints.restore import Method, Move, RestorePlan, write_checkpoint


def plan_from_json(data: dict[str, Any]) -> RestorePlan:
    manifest = Manifest.from_json(data["manifest"])
    by_id = {op.operator_id: op for op in manifest.operators}
    return RestorePlan(
        Path(data["savepoint"]), manifest, int(data["partitions"]), str(data["backend"]),
        moves=[Move(by_id[m["old"]], JobOperator(**m["new"]), Method(m["method"]))
               for m in data["moves"]],
        dropped=[by_id[i] for i in data["dropped"]],
        new=[JobOperator(**op) for op in data["new"]])


def _watch_parent(parent: int) -> None:
    """Exit this process (and with it its JVM, which ends when its Python goes) as soon as
    the parent is gone."""
    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(0.5)

    threading.Thread(target=watch, name="exactly-rewrite-parent", daemon=True).start()


def main() -> int:
    request = json.loads(sys.stdin.read())
    _watch_parent(int(request["parent"]))
    from exactly.spark.session import spark_session

    plan = plan_from_json(request["plan"])
    spark = spark_session(master="local[1]", app_name="exactly-restore",
                          shuffle_partitions=plan.partitions)
    try:
        write_checkpoint(spark, plan, Path(request["dest"]), str(request["query_id"]))
    except ExactlyError as exc:  # a refusal that names its cause and fix
        print(json.dumps({"error": str(exc)}), flush=True)
        return 2
    finally:
        spark.stop()
    print(json.dumps({"done": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
