"""S3A the Spark way: ``spark_session(s3a=True)`` with an empty Ivy directory resolves
hadoop-aws and the AWS SDK modules it loads from Maven Central (``spark.jars.packages``), and
a stateful query keeps its checkpoint (offsets, commits, state) on ``s3a://`` (S3Proxy): a
second run continues from it, reading only the new input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyspark
import pytest

pytestmark = pytest.mark.server

SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from exactly.spark.session import spark_session

    ivy, source, checkpoint = sys.argv[1:4]
    spark = spark_session(app_name="exactly-s3a-packages", s3a=True,
                          conf={"spark.jars.ivy": ivy})
    runs = []
    try:
        for name, ids in (("a.json", range(10)), ("b.json", range(5, 15))):
            Path(source, name).write_text("".join(f'{{"id": {i}}}\\n' for i in ids))
            seen = []
            events = spark.readStream.schema("id long").json(source).dropDuplicates(["id"])
            query = (events.writeStream.outputMode("append")
                     .foreachBatch(lambda b, _: seen.extend(r.id for r in b.collect()))
                     .option("checkpointLocation", checkpoint).trigger(availableNow=True)
                     .start())
            query.awaitTermination()
            runs.append(sorted(seen))
        executors = str(spark.sparkContext._jsc.sc().listJars().mkString(","))
    finally:
        spark.stop()
    print(json.dumps({"runs": runs, "executor_jars": executors.split(",")}))
""")


# CI budget (28-41 s): every S3 test of the default lane (tests/ops/test_run_on_s3.py, the
# savepoint and checkpoint-store tests on S3, the cluster lane) gets S3A through
# spark.jars.packages too, from the shared Ivy cache; this one adds the empty cache
@pytest.mark.slow
def test_s3a_true_resolves_s3a_from_maven_central_and_keeps_the_checkpoint_on_s3(
        s3_server, s3_bucket, tmp_path):
    ivy, source = tmp_path / "ivy", tmp_path / "in"
    source.mkdir()
    checkpoint = f"s3a://{s3_bucket}/ck"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(ivy), str(source), checkpoint],
                          capture_output=True, text=True, timeout=600, env=os.environ.copy())
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    first, second = found["runs"]
    assert first == list(range(10))
    # the second query starts from the checkpoint on S3: only the new file's ids, and the
    # ids 5..9 dropped by the deduplication state written there by the first
    assert second == list(range(10, 15))

    resolved = sorted(p.name for p in (ivy / "jars").glob("*.jar"))
    assert "org.apache.hadoop_hadoop-aws-3.5.0.jar" in resolved
    assert not any("bundle" in name or "netty-common" in name for name in resolved)
    pyspark_jars = {p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    assert not {name.split("_", 1)[-1] for name in resolved} & pyspark_jars
    # the executors get them too, not only the driver
    assert set(resolved) <= {j.rsplit("/", 1)[-1] for j in found["executor_jars"]}

    listed = s3_server.boto3_client().list_objects_v2(Bucket=s3_bucket, Prefix="ck/")
    keys = {o["Key"] for o in listed.get("Contents", [])}
    assert {"ck/offsets/0", "ck/commits/0", "ck/offsets/1", "ck/commits/1"} <= keys
    assert any(k.startswith("ck/state/") for k in keys)
