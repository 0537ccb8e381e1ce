"""Option names: every exactly source and sink reads only the names it declares in
exactly.options, and a misspelt one fails with the closest known name; sink settings fail
when the sink is built (``check_sink``), before any epoch; output mode update is refused for
sinks that cannot change a row in place. No Spark session, no server."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict, DataSource
from pyspark.sql.types import LongType, StructField, StructType

from exactly import options as opt
from exactly.connectors.datagen import DatagenStreamReader
from exactly.connectors.files.sink import FileSink
from exactly.connectors.files.source import FilesStreamReader
from exactly.connectors.postgres.source import PostgresTableStreamReader
from exactly.connectors.postgres.two_phase import PostgresTwoPhaseSink
from exactly.errors import ConfigError
from exactly.spark.formats import (
    DATA_SOURCES,
    FilesDataSource,
    check_output_mode,
    check_sink,
    sink_for,
)

SCHEMA = StructType([StructField("id", LongType())])
#: a DSN nothing listens on: building a sink must not connect
NOWHERE = "host=127.0.0.1 port=1 dbname=none connect_timeout=1"


def test_a_misspelt_option_names_the_format_the_option_and_the_closest_known_name():
    with pytest.raises(ConfigError) as err:
        opt.check_option_names("exactly.files", {"path": "/in", "maxFilePerTrigger": "2"},
                               "source")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("exactly.files source: unknown option 'maxFilePerTrigger'")
    assert "did you mean 'maxFilesPerTrigger'?" in message
    assert "known options: deadLetterPath, format, maxFilesPerTrigger, path" in message


def test_option_names_compare_case_insensitively_and_spark_own_names_pass():
    opt.check_option_names("exactly.datagen", ["ROWSPERSECOND", "totalrows", "path",
                                               "checkpointLocation", "queryname"], "source")
    opt.check_option_names("exactly.files", ["PATH", "Format", "exactly.logdir", "MODE"],
                           "sink")


def test_a_name_without_a_close_match_lists_the_known_names_only():
    with pytest.raises(ConfigError, match=r"unknown option 'zzz'; known options: keys, "
                                          r"maxRowsPerTrigger") as err:
        opt.check_option_names("exactly.datagen", ["zzz"], "source")
    assert "did you mean" not in str(err.value)


def test_kafka_client_options_pass_on_the_kafka_formats_only():
    opt.check_option_names("exactly.kafka", ["kafka.bootstrap.servers", "subscribe",
                                             "kafka.security.protocol"], "source")
    opt.check_option_names("exactly.kafka", ["kafka.compression.type", "topic"], "sink")
    with pytest.raises(ConfigError, match="did you mean 'subscribe'"):
        opt.check_option_names("exactly.kafka", ["subscibe"], "source")
    with pytest.raises(ConfigError, match=r"unknown option 'kafka\.bootstrap\.servers'"):
        opt.check_option_names("exactly.files", ["kafka.bootstrap.servers"], "sink")


def test_formats_that_are_not_exactly_are_not_checked():
    opt.check_option_names("socket", ["host", "port"], "source")
    opt.check_option_names("console", ["truncate"], "sink")
    opt.check_option_names("exactly.wal", ["anything"], "source")  # wal has no reader


def _overrides(cls: type, method: str) -> bool:
    return inspect.getattr_static(cls, method) is not inspect.getattr_static(DataSource, method)


def test_every_exactly_data_source_declares_the_option_names_of_each_side_it_has():
    for source in DATA_SOURCES:
        name = source.name()
        if _overrides(source, "streamWriter"):
            assert name in opt.SINK_OPTIONS, name
        if _overrides(source, "streamReader"):
            assert name in opt.SOURCE_OPTIONS, name
        assert name in opt.SINK_OPTIONS or name in opt.SOURCE_OPTIONS, name


# -- readers refuse unknown names in their constructors (the worker side) -----------------
def test_the_files_reader_refuses_a_misspelt_option(tmp_path: Path):
    with pytest.raises(ConfigError, match="did you mean 'maxFilesPerTrigger'"):
        FilesStreamReader({"path": str(tmp_path), "maxFilePerTrigger": "2"}, SCHEMA)


def test_the_datagen_reader_refuses_a_misspelt_option():
    with pytest.raises(ConfigError, match="did you mean 'maxRowsPerTrigger'"):
        DatagenStreamReader({"rowsPerSecond": "0", "totalRows": "5", "maxRowPerTrigger": "1"})


def test_the_postgres_reader_refuses_a_misspelt_option_without_connecting():
    with pytest.raises(ConfigError, match="did you mean 'keyColumn'"):
        PostgresTableStreamReader(NOWHERE, {"table": "t", "keyColum": "id"}, SCHEMA)


def test_readers_take_the_lowercased_options_spark_hands_to_workers():
    reader = DatagenStreamReader(CaseInsensitiveDict(
        {"rowsPerSecond": "0", "totalRows": "5", "maxRowsPerTrigger": "2"}))
    assert (reader.total, reader.max_rows) == (5, 2)


# -- sinks: one factory, checked before the first epoch -----------------------------------
def test_the_data_source_writer_and_the_factory_build_the_same_sink(tmp_path: Path):
    options = {"path": str(tmp_path / "out"), "format": "json", "checkpointLocation": "/ck"}
    writer = FilesDataSource(CaseInsensitiveDict(options)).streamWriter(SCHEMA, False)
    built = sink_for("exactly.files", options, SCHEMA)
    assert isinstance(writer.sink, FileSink) and isinstance(built.sink, FileSink)
    assert (writer.sink.root, writer.sink.extension) == (built.sink.root, built.sink.extension)
    assert writer.settings == built.settings


def test_a_misspelt_sink_option_is_refused_when_the_sink_is_built(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"exactly\.files sink: unknown option 'formt'; did "
                                          r"you mean 'format'"):
        check_sink("exactly.files", str(tmp_path), {"formt": "json"})


@pytest.mark.parametrize(("fmt", "options", "expected"), [
    ("exactly.postgres", {"table": "t"}, "set option dsn"),
    ("exactly.postgres", {"dsn": NOWHERE}, "set option table"),
    ("exactly.upsert", {"dsn": NOWHERE, "table": "t"}, "set option keyColumns"),
    ("exactly.wal", {"dsn": NOWHERE}, "set option table"),
    ("exactly.files", {}, "set the output directory"),
    ("exactly.files", {"path": "/out", "format": "csv"}, "format 'csv' is not one of"),
    ("exactly.kafka", {"topic": "t"}, "set option kafka.bootstrap.servers"),
    ("exactly.kafka", {"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t"},
     "exactly_once needs option transactionalIdPrefix"),
])
def test_check_sink_refuses_a_missing_or_wrong_setting_without_connecting(fmt, options,
                                                                           expected):
    full = {"checkpointLocation": "/ck", "exactly.logDir": "/ck/log", **options}
    with pytest.raises(ConfigError, match=expected) as err:
        check_sink(fmt, None, full)
    assert "\n" not in str(err.value)


def test_check_sink_builds_a_valid_postgres_sink_without_connecting():
    built = check_sink("exactly.postgres", None, {
        "dsn": NOWHERE, "table": "t", "exactly.logDir": "/ck/log", "partitions": "3"})
    assert built is not None
    assert isinstance(built.sink, PostgresTwoPhaseSink)
    assert built.partitions == 3


def test_check_sink_passes_formats_that_are_not_exactly_sinks():
    assert check_sink("console", None, {"truncate": "false"}) is None


# -- output mode update ---------------------------------------------------------------
@pytest.mark.parametrize(("fmt", "options", "expected"), [
    ("exactly.files", {}, "files are append-only"),
    ("exactly.wal", {}, "appends every update as a new row"),
    ("exactly.postgres", {}, "set options writeMode=upsert and keyColumns"),
    ("exactly.postgres", {"writeMode": "append"}, "writeMode=append appends a row"),
])
def test_update_mode_is_refused_for_sinks_that_cannot_change_a_row_in_place(fmt, options,
                                                                             expected):
    with pytest.raises(ConfigError, match=expected):
        check_output_mode(fmt, "update", options)


def test_update_mode_is_accepted_for_keyed_sinks_and_other_modes_everywhere():
    check_output_mode("exactly.postgres", "update", {"WRITEMODE": "upsert", "keyColumns": "k"})
    check_output_mode("exactly.upsert", "update", {"keyColumns": "k"})
    check_output_mode("exactly.files", "append", {})
    check_output_mode("exactly.files", "complete", {})
    check_output_mode("console", "update", {})


def test_the_driver_side_check_accepts_every_name_the_kafka_reader_reads():
    from exactly.connectors.kafka.reader import READER_OPTIONS

    opt.check_option_names("exactly.kafka", sorted(READER_OPTIONS), "source")


def test_check_sink_reads_option_values_as_writestream_passes_them(tmp_path: Path):
    built = check_sink("exactly.postgres", None, {
        "dsn": NOWHERE, "table": "t", "exactly.logDir": str(tmp_path), "partitions": 2,
        "retrySeconds": 1.5})
    assert built is not None and built.partitions == 2
