"""The Spark Connect side of the savepoint tests, run as a child process of the test
(``python connect_client.py REQUEST_JSON``): a Python process cannot open a Spark Connect
session once it holds a classic one, and the test process may (the ``spark`` fixture).

Requests (``{"url": "sc://...", "command": ..., "env": {...}}``), answered as one JSON line
on stdout:

* ``operators``: the stateful test job's operators (``job_operators``) on Connect, and what
  ``exactly.uid`` says to a step without state and to a second name for a named step;
* ``stages``: for each of ``stages`` (``{"checkpoint", "rows", "savepoint", "options",
  "env"}``, ``savepoint`` null or ``"previous"``): restore, run, take a savepoint
  (:func:`savepoint_jobs.stage`; the last stage takes none); answers what every restore did
  and every savepoint's path.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from savepoint_jobs import StatefulJob, stage

import exactly
from exactly.errors import ConfigError
from exactly.spark.session import spark_session


def main() -> None:
    request = json.loads(sys.argv[1])
    spark = spark_session(remote=request["url"], app_name="exactly-connect-savepoints")
    env = request.get("env", {})
    if request["command"] == "operators":
        job = StatefulJob(spark, Path(request["checkpoint"]), **env)
        answer: dict = {"operators": [asdict(op) for op in job.operators()]}
        rows = spark.readStream.format("rate").load()
        counts = exactly.uid("counts", rows.groupBy("value").count())
        for name, make in (("stateless", lambda: exactly.uid("x", rows.select("value"))),
                           ("renamed", lambda: exactly.uid("other", counts.select("count")))):
            try:
                make()
                answer[name] = None
            except ConfigError as exc:
                answer[name] = str(exc)
    else:
        answer = {"stages": []}
        previous = None
        stages = request["stages"]
        for step in stages[:-1]:
            savepoint = Path(previous) if step.get("savepoint") == "previous" else None
            done, sp = stage(spark, Path(step["checkpoint"]), {**env, **step.get("env", {})},
                             savepoint, int(step["rows"]), Path(request["savepoints"]),
                             **step.get("options", {}))
            previous = str(sp)
            answer["stages"].append({"done": done, "savepoint": previous})
        last = stages[-1]
        job = StatefulJob(spark, Path(last["checkpoint"]), **{**env, **last.get("env", {})})
        done = job.restore(Path(previous), int(last["rows"]), **last.get("options", {})) \
            if previous is not None else None
        job.run(int(last["rows"]))
        answer["stages"].append({"done": done})
    print(json.dumps(answer, default=str), flush=True)


if __name__ == "__main__":
    main()
    # the Connect client's threads (query listener, gRPC) can keep the interpreter from
    # exiting once the answer is out
    os._exit(0)
