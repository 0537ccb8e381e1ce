"""A program run by ``spark-submit`` gets the master ``spark-submit --master`` names from
``exactly.spark_session()`` (not exactly's own default, ``local[2]``), with the defaults that
fit it and exactly's sources registered."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

APP = """
import exactly
spark = exactly.spark_session()
stream = spark.readStream.format("exactly.datagen").load()  # fails unless registered
print("MASTER", spark.sparkContext.master, spark.conf.get("spark.sql.shuffle.partitions"),
      "STREAM", stream.isStreaming, "ROWS", spark.range(7).count(), flush=True)
spark.stop()
"""


def test_spark_session_under_spark_submit_keeps_the_master_spark_submit_was_given(tmp_path):
    app = tmp_path / "app.py"
    app.write_text(APP)
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("EXACTLY_SPARK_MASTER", None)
    done = subprocess.run([str(bin_dir / "spark-submit"), "--master", "local[3]", str(app)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("MASTER")]
    # local[3] with the defaults of a local master: one shuffle partition per core
    assert line.split() == ["MASTER", "local[3]", "3", "STREAM", "True", "ROWS", "7"]
