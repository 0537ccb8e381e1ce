"""A supervised test job: exactly.datagen -> a Python UDF -> an exactly sink.

``JOB_SOURCE=kafka`` reads JSON records from ``JOB_SOURCE_TOPIC`` with exactly's Kafka
reader instead of the generator. ``JOB_SINK`` picks the sink: ``files`` (default;
``JOB_OUT``), ``postgres`` (the 2PC sink; ``JOB_DSN``, ``JOB_TABLE``), ``wal`` (the
write-ahead sink into PostgreSQL; ``JOB_DSN``, ``JOB_TABLE``), ``kafka`` (``JOB_BOOTSTRAP``,
``JOB_TOPIC``; JSON values; ``JOB_KAFKA_CALL_TIMEOUT_MS``: its
``exactly.kafka.callTimeoutMs``; ``JOB_KAFKA_SHARES``: its ``exactly.kafka.publishShares``),
``delta`` (``JOB_DELTA_PATH``: a local path or an ``s3://`` URI; S3 settings from the
``AWS_*`` environment) or ``iceberg`` (``JOB_ICEBERG``: the table's
address, ``iceberg:CATALOG?table=NS.NAME[&warehouse=...]`` as ``exactly pipeline --output``
takes it; S3 settings from the ``AWS_*`` environment).

Configured by environment variables (the test sets them for ``exactly run``):
``JOB_OUT`` output directory, ``JOB_ROWS`` total rows, ``JOB_RATE`` rows per second (0: all
at once), ``JOB_MAX_ROWS`` rows per epoch cap, ``JOB_INTERVAL`` checkpoint interval,
``JOB_FAIL_IDS`` ids whose first processing raises (one marker file each in
``JOB_MARKERS``), ``JOB_SLOW_MS`` sleep per row batch, ``JOB_ROW_COST_US`` sleep per
row, ``JOB_CHECKPOINT_*`` CheckpointConfig options (``TIMEOUT``, ``TOLERABLE``,
``MIN_PAUSE``, ``TARGET``, ``CLEANUP``, ``STORAGE``: the job names its checkpoint).
``JOB_FAIL_FILE``: while this file exists, the first task that renames it away raises (the
recovery benchmark's query failure).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pandas as pd
from pyspark.sql import functions as F
from pyspark.sql.functions import pandas_udf

from exactly import CheckpointConfig, Job


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def build(spark):
    rows = int(_env("JOB_ROWS", "2000"))
    if _env("JOB_SOURCE") == "kafka":  # JSON records {"id": ..., "key": ..., "amount": ...}
        reader = (spark.readStream.format("exactly.kafka")
                  .option("kafka.bootstrap.servers", _env("JOB_BOOTSTRAP"))
                  .option("subscribe", _env("JOB_SOURCE_TOPIC")))
        if _env("JOB_MAX_ROWS"):
            reader = reader.option("maxOffsetsPerTrigger", _env("JOB_MAX_ROWS"))
        parsed = reader.load().select(F.from_json(F.col("value").cast("string"),
                                                  "id long, key string, amount double")
                                      .alias("e"))
        events = parsed.select("e.*")
    else:
        reader = (spark.readStream.format("exactly.datagen")
                  .option("rowsPerSecond", _env("JOB_RATE", "400"))
                  .option("totalRows", rows))
        if _env("JOB_MAX_ROWS"):
            reader = reader.option("maxRowsPerTrigger", _env("JOB_MAX_ROWS"))
        events = reader.load()
    fail_ids = {int(x) for x in (_env("JOB_FAIL_IDS") or "").split(",") if x}
    markers = Path(_env("JOB_MARKERS", "/tmp")) if fail_ids else None
    fail_file = _env("JOB_FAIL_FILE")
    slow_s = float(_env("JOB_SLOW_MS", "0")) / 1000
    row_cost_s = float(_env("JOB_ROW_COST_US", "0")) / 1e6

    @pandas_udf("long")
    def checked(ids: pd.Series) -> pd.Series:
        if slow_s or row_cost_s:
            time.sleep(slow_s + row_cost_s * len(ids))
        if fail_file and os.path.exists(fail_file):
            try:  # the first task to rename it away fails, once per file created
                os.rename(fail_file, f"{fail_file}.taken-{os.getpid()}-{time.time_ns()}")
            except FileNotFoundError:
                pass
            else:
                raise RuntimeError(f"injected UDF failure ({fail_file} was present)")
        for bad in fail_ids & set(ids.tolist()):
            marker = markers / f"failed-{bad}"  # type: ignore[operator]
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                continue
            os.close(fd)
            raise RuntimeError(f"injected UDF failure at id {bad}")
        return ids

    out = events.select(checked(F.col("id")).alias("id"), "key", "amount")
    config = {"interval": _env("JOB_INTERVAL", "1s")}
    for option, var in (("timeout", "TIMEOUT"), ("min_pause_between_checkpoints", "MIN_PAUSE"),
                        ("target_epoch_duration", "TARGET"),
                        ("externalized_cleanup", "CLEANUP"), ("storage", "STORAGE")):
        if _env(f"JOB_CHECKPOINT_{var}"):
            config[option] = _env(f"JOB_CHECKPOINT_{var}")
    if _env("JOB_CHECKPOINT_TOLERABLE"):
        config["tolerable_failed_checkpoints"] = int(_env("JOB_CHECKPOINT_TOLERABLE"))
    checkpoint = CheckpointConfig(**config)
    sink = _env("JOB_SINK", "files")
    if sink == "postgres":
        return Job(out, sink_format="exactly.postgres", checkpoint=checkpoint,
                   options={"dsn": _env("JOB_DSN"), "table": _env("JOB_TABLE"),
                            "retrySeconds": "5"})
    if sink == "wal":
        return Job(out, sink_format="exactly.wal", checkpoint=checkpoint,
                   options={"dsn": _env("JOB_DSN"), "table": _env("JOB_TABLE"),
                            "retrySeconds": "5"})
    if sink == "delta":
        return Job(out, sink_format="exactly.delta", path=_env("JOB_DELTA_PATH"),
                   checkpoint=checkpoint)
    if sink == "iceberg":
        from exactly.connectors.iceberg.catalog import IcebergAddress

        return Job(out, sink_format="exactly.iceberg", checkpoint=checkpoint,
                   options=IcebergAddress.parse(_env("JOB_ICEBERG") or "").sink_options())
    if sink == "kafka":
        values = out.select(F.to_json(F.struct("id", "key", "amount")).alias("value"))
        return Job(values, sink_format="exactly.kafka", checkpoint=checkpoint,
                   options={"kafka.bootstrap.servers": _env("JOB_BOOTSTRAP"),
                            "topic": _env("JOB_TOPIC"),
                            "transactionalIdPrefix": f"ops-{_env('JOB_TOPIC')}",
                            **({"exactly.kafka.callTimeoutMs": _env("JOB_KAFKA_CALL_TIMEOUT_MS")}
                               if _env("JOB_KAFKA_CALL_TIMEOUT_MS") else {}),
                            **({"exactly.kafka.publishShares": _env("JOB_KAFKA_SHARES")}
                               if _env("JOB_KAFKA_SHARES") else {})})
    return Job(out, sink_format="exactly.files", path=_env("JOB_OUT"),
               options={"format": "parquet"}, checkpoint=checkpoint)
