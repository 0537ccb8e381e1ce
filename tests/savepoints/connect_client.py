"""The Spark Connect side of the savepoint tests, run as a child process of the test
(``python connect_client.py REQUEST_JSON``): a Python process cannot open a Spark Connect
session once it holds a classic one, and the test process may (the ``spark`` fixture).

Requests (``{"url": "sc://...", "command": ..., "env": {...}}``), answered as one JSON line
on stdout:

* ``operators``: the stateful test job's operators (``job_operators``) on Connect;
* ``stages``: for each of ``stages`` (``{"checkpoint", "rows", "savepoint", "options",
  "env"}``, ``savepoint`` null or ``"previous"``): restore, run, take a savepoint
  (:func:`savepoint_jobs.stage`); answers what every restore did and every savepoint's path.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from savepoint_jobs import StatefulJob, stage

from exactly.spark.session import spark_session


def main() -> None:
    request = json.loads(sys.argv[1])
    spark = spark_session(remote=request["url"], app_name="exactly-connect-savepoints")
    env = request.get("env", {})
    if request["command"] == "operators":
        job = StatefulJob(spark, Path(request["checkpoint"]), **env)
        answer: dict = {"operators": [asdict(op) for op in job.operators()]}
    else:
        answer = {"stages": []}
        previous = None
        for step in request["stages"]:
            savepoint = Path(previous) if step.get("savepoint") == "previous" else None
            done, sp = stage(spark, Path(step["checkpoint"]), {**env, **step.get("env", {})},
                             savepoint, int(step["rows"]), Path(request["savepoints"]),
                             **step.get("options", {}))
            previous = str(sp)
            answer["stages"].append({"done": done, "savepoint": previous})
    print(json.dumps(answer, default=str), flush=True)


if __name__ == "__main__":
    main()
    # the Connect client's threads (query listener, gRPC) can keep the interpreter from
    # exiting once the answer is out
    os._exit(0)
