"""Runs one scenario of a Connect test module in a process of its own:
``python client.py URL MODULE FUNCTION KWARGS_JSON`` opens a Spark Connect session to ``URL``
and calls ``MODULE.FUNCTION(spark, **KWARGS)``; exit 0 when it returned, 1 with the traceback
when it raised (a failed assertion included).

A Python process cannot open a Spark Connect session while it holds a classic one (PySpark
refuses: ``SESSION_ALREADY_EXIST``), nor the other way round once Connect mode is on; a
pytest worker may hold a classic session from another test file.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> int:
    url, module, function, kwargs = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(
        sys.argv[4])
    from exactly.spark.session import spark_session

    spark = spark_session(remote=url, app_name="exactly-connect-tests")
    try:
        getattr(importlib.import_module(module), function)(spark, **kwargs)
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # the Connect client's threads (listener, gRPC) can keep the interpreter from exiting
    os._exit(code)
