"""``python -m exactly.spark.class_archive_workload ARCHIVE``: the run whose loaded classes
become the driver's class archive (:mod:`exactly.spark.class_archive` starts it in a process
of its own)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from exactly.spark.class_archive import QUIET_JVM_OPTIONS


def workload(archive: Path) -> None:
    """Run what a driver of exactly runs (a batch job with Arrow, a streaming aggregation on
    RocksDB state from exactly's source into exactly's file sink), then end the JVM so that
    it writes the archive of every class it loaded."""
    from pyspark.sql import functions as F

    from exactly.spark.session import spark_session

    with tempfile.TemporaryDirectory(prefix="exactly-cds-run-") as tmp:
        spark = spark_session(conf={
            "spark.driver.extraJavaOptions":
                f"-XX:ArchiveClassesAtExit={archive} {QUIET_JVM_OPTIONS}",
            "spark.sql.streaming.stateStore.providerClass":
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"})
        spark.range(1000).groupBy((F.col("id") % 7).alias("k")).count().toPandas()
        events = (spark.readStream.format("exactly.datagen")
                  .option("rowsPerSecond", "0").option("totalRows", "2000").load())
        written = (events.dropDuplicates(["id"]).writeStream.format("exactly.files")
                   .option("path", f"{tmp}/out").option("checkpointLocation", f"{tmp}/ck1")
                   .trigger(availableNow=True).start())
        counted = (events.groupBy("key").agg(F.count("*").alias("n")).writeStream
                   .format("noop").outputMode("update")
                   .option("checkpointLocation", f"{tmp}/ck2")
                   .trigger(availableNow=True).start())
        written.awaitTermination()
        counted.awaitTermination()
        spark.stop()
        gateway = spark.sparkContext._gateway
        proc = getattr(gateway, "proc", None)
        if proc is not None and proc.stdin is not None:
            proc.stdin.close()  # the gateway JVM exits when its stdin closes, writing the archive
            proc.wait(timeout=300)



if __name__ == "__main__":
    workload(Path(sys.argv[1]))
