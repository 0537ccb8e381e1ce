"""What a newcomer hits when starting a query, caught by start_query before Spark starts:
misspelt option names of sources and sinks, sink settings the sink refuses, a memory
checkpoint that meets another query's sink log, output mode update into files; and a real
start of spark_session with non-default settings. Real Spark, local[2]."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from exactly.audit import data_files
from exactly.config import CheckpointConfig
from exactly.errors import ConfigError, OwnershipError
from exactly.ops.query import source_options, start_query


def datagen(spark, total: int = 100, **extra: str):
    reader = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
              .option("totalRows", total))
    for key, value in extra.items():
        reader = reader.option(key, value)
    return reader.load()


def active_ids(spark) -> set[str]:
    return {str(q.id) for q in spark.streams.active}


def test_source_options_reads_each_exactly_source_of_the_plan_as_spelt(spark, tmp_path):
    files = (spark.readStream.format("exactly.files").schema("id long")
             .option("format", "json").option("maxFilePerTrigger", 2).load(str(tmp_path)))
    df = datagen(spark, maxRowsPerTrigger="10").select("id").union(files)
    found = dict(source_options(df))
    assert found["exactly.datagen"] == {"rowsPerSecond": "0", "totalRows": "100",
                                        "maxRowsPerTrigger": "10"}
    assert found["exactly.files"] == {"format": "json", "maxFilePerTrigger": "2",
                                      "path": str(tmp_path)}


def test_a_misspelt_source_option_fails_start_query_before_spark_starts(spark, tmp_path):
    (tmp_path / "in").mkdir()
    df = (spark.readStream.format("exactly.files").schema("id long").option("format", "json")
          .option("maxFilePerTrigger", 2).load(str(tmp_path / "in")))
    before = active_ids(spark)
    with pytest.raises(ConfigError) as err:
        start_query(df, sink_format="exactly.files", path=str(tmp_path / "out"),
                    checkpoint=CheckpointConfig(storage=str(tmp_path / "ck")))
    assert str(err.value).startswith("exactly.files source: unknown option "
                                     "'maxFilePerTrigger'; did you mean 'maxFilesPerTrigger'?")
    assert active_ids(spark) == before
    assert not (tmp_path / "ck").exists()


def test_a_misspelt_sink_option_fails_start_query_before_spark_starts(spark, tmp_path):
    with pytest.raises(ConfigError, match=r"exactly\.files sink: unknown option 'formt'; did "
                                          r"you mean 'format'"):
        start_query(datagen(spark), sink_format="exactly.files", path=str(tmp_path / "out"),
                    options={"formt": "json"},
                    checkpoint=CheckpointConfig(storage=str(tmp_path / "ck")))
    assert not (tmp_path / "ck" / "offsets").exists()


def test_a_plain_readstream_with_a_misspelt_option_fails_in_the_reader(spark, tmp_path):
    """Without start_query the reader's constructor refuses the name (defence in depth)."""
    query = (datagen(spark, maxRowPerTrigger="10").writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    with pytest.raises(Exception, match="did you mean 'maxRowsPerTrigger'"):
        query.awaitTermination()


@pytest.mark.parametrize(("fmt", "path", "options", "expected"), [
    ("exactly.postgres", None, {"table": "t"}, "set option dsn"),
    ("exactly.postgres", None, {"dsn": "host=127.0.0.1 port=1"}, "set option table"),
    ("exactly.files", "", {}, "set the output directory"),
])
def test_a_missing_sink_setting_fails_start_query_before_the_first_epoch(
        spark, tmp_path, fmt, path, options, expected):
    before = active_ids(spark)
    with pytest.raises(ConfigError, match=expected) as err:
        start_query(datagen(spark), sink_format=fmt, path=path, options=options,
                    checkpoint=CheckpointConfig(storage=str(tmp_path / "ck")))
    assert "\n" not in str(err.value)
    assert active_ids(spark) == before
    assert not (tmp_path / "ck" / "offsets").exists()


def test_update_mode_into_the_file_sink_is_refused_before_start(spark, tmp_path):
    counts = datagen(spark).groupBy("key").count()
    with pytest.raises(ConfigError, match="files are append-only"):
        start_query(counts, sink_format="exactly.files", path=str(tmp_path / "out"),
                    output_mode="update",
                    checkpoint=CheckpointConfig(storage=str(tmp_path / "ck")))


# -- memory storage --------------------------------------------------------------------
def test_a_memory_checkpoint_warns_and_a_second_run_is_refused_naming_the_storage(
        spark, tmp_path, caplog):
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="exactly.ops.query"):
        first = start_query(datagen(spark), sink_format="exactly.files", path=str(out),
                            checkpoint=CheckpointConfig(), available_now=True)
        first.await_termination()
    warnings = [json.loads(r.getMessage()) for r in caplog.records
                if r.name == "exactly.ops.query" and r.levelno == logging.WARNING]
    assert any(w["event"] == "memory_checkpoint" and w["storage"] == "memory"
               and "storage=DIR" in w["fix"] for w in warnings), warnings
    committed = sorted(f.parent.name for f in data_files(out))
    assert committed

    before = active_ids(spark)
    with pytest.raises(OwnershipError) as err:  # the same job again: a new query
        start_query(datagen(spark), sink_format="exactly.files", path=str(out),
                    checkpoint=CheckpointConfig(), available_now=True)
    message = str(err.value)
    assert "memory storage" in message and "storage=DIR" in message
    assert str(first.query.id) in message
    assert "\n" not in message
    assert active_ids(spark) == before
    assert sorted(f.parent.name for f in data_files(out)) == committed


def test_a_durable_checkpoint_resumes_the_same_sink_without_a_memory_warning(
        spark, tmp_path, caplog):
    config = CheckpointConfig(storage=str(tmp_path / "ck"))
    with caplog.at_level(logging.WARNING, logger="exactly.ops.query"):
        for total in (100, 200):  # the second run resumes and adds rows 100..199
            start_query(datagen(spark, total), sink_format="exactly.files",
                        path=str(tmp_path / "out"), checkpoint=config,
                        available_now=True).await_termination()
    assert not [r for r in caplog.records if "memory_checkpoint" in r.getMessage()]
    import pyarrow.dataset as ds

    ids = ds.dataset([str(f) for f in data_files(tmp_path / "out")]).to_table()["id"]
    assert sorted(ids.to_pylist()) == list(range(200))


# -- spark_session ----------------------------------------------------------------------
def test_spark_session_starts_with_the_masters_cores_as_shuffle_partitions(tmp_path):
    """A real start in a fresh process (this one already has a session): the master from
    EXACTLY_SPARK_MASTER with one shuffle partition per local core; then, after a stop, a
    session with an explicit count."""
    script = textwrap.dedent("""
        import json
        from exactly.spark.session import spark_session
        for extra in ({}, {"shuffle_partitions": 5}):
            spark = spark_session(app_name="exactly-session-test", **extra)
            df = spark.range(100)
            counts = df.groupBy((df.id % 10).alias("k")).count()
            print(json.dumps({
                "master": spark.sparkContext.master,
                "shuffle": spark.conf.get("spark.sql.shuffle.partitions"),
                "adaptive": spark.conf.get("spark.sql.adaptive.enabled"),
                "ui": spark.sparkContext.uiWebUrl,
                "partitions": counts.rdd.getNumPartitions(),
            }))
            spark.stop()
    """)
    env = {**os.environ, "EXACTLY_SPARK_MASTER": "local[3]",
           "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert seen[0] == {"master": "local[3]", "shuffle": "3", "adaptive": "false", "ui": None,
                       "partitions": 3}
    assert seen[1]["shuffle"] == "5" and seen[1]["partitions"] == 5


def test_an_s3a_checkpoint_on_a_session_without_s3a_is_refused_naming_the_setting(spark,
                                                                                   tmp_path):
    with pytest.raises(ConfigError, match=r"spark_session\(s3a=True\)"):
        start_query(datagen(spark), sink_format="exactly.files", path=str(tmp_path / "out"),
                    checkpoint=CheckpointConfig(storage="s3a://bucket/ck"))



@pytest.mark.parametrize(("setting", "shown"), [
    ({"timeout": "1min"}, "timeout='1min'"),
    ({"tolerable_failed_checkpoints": 2}, "tolerable_failed_checkpoints=2"),
    ({"min_pause_between_checkpoints": "2s"}, "min_pause_between_checkpoints='2s'"),
    ({"target_epoch_duration": "5s"}, "target_epoch_duration='5s'"),
    ({"unaligned": True, "aligned_checkpoint_timeout": "3s"}, "unaligned=True"),
])
def test_a_policy_start_query_cannot_apply_is_refused_before_spark_starts(
        spark, tmp_path, setting, shown):
    """start_query applies no policy between epochs: it refuses it, naming exactly run and
    run_job, which do; nothing starts and the checkpoint is not created."""
    before = active_ids(spark)
    with pytest.raises(ConfigError) as err:
        start_query(datagen(spark), sink_format="exactly.files", path=str(tmp_path / "out"),
                    checkpoint=CheckpointConfig(storage=str(tmp_path / "ck"), **setting))
    assert f"start_query does not apply {shown}" in str(err.value)
    assert "exactly run" in str(err.value) and "run_job" in str(err.value)
    assert active_ids(spark) == before
    assert not (tmp_path / "ck").exists() and not (tmp_path / "out").exists()


def test_a_sink_interval_option_that_disagrees_with_the_checkpoint_interval_is_refused(
        spark, tmp_path):
    """start_query tells the sink the trigger interval for its start checks (the Kafka
    transaction timeout); a hand-set exactly.checkpointIntervalMs that differs would make them
    judge a stale interval, so it is refused before anything starts; an equal one is fine."""
    before = active_ids(spark)
    with pytest.raises(ConfigError, match=r"exactly\.checkpointIntervalMs='5000' disagrees "
                                          r"with CheckpointConfig\(interval='10s'\)"):
        start_query(datagen(spark), sink_format="exactly.files", path=str(tmp_path / "out"),
                    options={"exactly.checkpointIntervalMs": "5000"},
                    checkpoint=CheckpointConfig(interval="10s", storage=str(tmp_path / "ck")))
    assert active_ids(spark) == before and not (tmp_path / "ck").exists()
    query = start_query(datagen(spark, 10), sink_format="exactly.files",
                        path=str(tmp_path / "out"), available_now=True,
                        options={"exactly.checkpointintervalms": "10000"},
                        checkpoint=CheckpointConfig(interval="10s",
                                                    storage=str(tmp_path / "ck")))
    query.await_termination()
    assert len(data_files(tmp_path / "out")) >= 1


def test_read_kafka_on_a_session_without_the_connector_names_kafka_true(spark):
    from exactly.connectors.kafka.source import read_kafka

    with pytest.raises(ConfigError, match=r"spark_session\(kafka=True\)") as error:
        read_kafka(spark, "127.0.0.1:9", topics="never-read")
    assert "exactly packages --kafka" in str(error.value)


def test_a_package_spark_cannot_resolve_fails_the_start_naming_the_offline_override(tmp_path):
    script = textwrap.dedent(f"""
        from exactly.spark.session import spark_session
        spark_session(conf={{"spark.jars.packages": "dev.exactly.missing:nothing:0.0.1",
                             "spark.jars.ivy": {str(tmp_path / "ivy")!r}}})
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("exactly.errors.ConfigError: Spark's driver did not start"), last
    assert "dev.exactly.missing:nothing:0.0.1" in last and "EXACTLY_S3A_JARS" in last
    assert "unresolved dependency: dev.exactly.missing#nothing" in done.stderr
